"""State node settings: one `[[state_nodes]]` entry of the config, each limit named with its
default (documented in docs/state-node.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from chainstate.config import ConfigError

KINDS = ("state", "archive")

DEFAULT_KEY = "state-1"
DEFAULT_KIND = "state"
DEFAULT_WINDOW = 128  # blocks of history a `state` node answers (head included)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8665
DEFAULT_POLL_INTERVAL = 0.25  # seconds between polls of the source head when caught up
DEFAULT_FETCH_CONCURRENCY = 8  # trace_vendorBlock requests in flight while catching up
DEFAULT_REQUEST_TIMEOUT = 30.0  # seconds per request to the source
DEFAULT_BACKOFF_INITIAL = 0.2  # seconds, first wait after a source error
DEFAULT_BACKOFF_MAX = 5.0  # seconds, longest wait after repeated source errors
# Failed ingest rounds in a row after which the node reports itself stalled (/health 503):
# with the default back-off, about 6 s of failing.
DEFAULT_STALL_FAILURES = 5
DEFAULT_MAP_SIZE_MB = 65536  # LMDB map size (address space reserved, not disk used)
DEFAULT_MAX_VALIDATION_COUNT = 1000  # blockx_getValidation `count` limit
DEFAULT_MAX_BATCH = 1000  # JSON-RPC batch length limit
DEFAULT_HOT_BLOCKS = 128  # newest blocks whose written values the hot view keeps in memory
DEFAULT_HOT_CACHE_ENTRIES = 262_144  # values as of just below the hot blocks, cached by reads
DEFAULT_LEADER_POLL_INTERVAL = 1.0  # seconds between Leader lookups (when leader_from is set)
# eth_blobBaseFee's BLOB_BASE_FEE_UPDATE_FRACTION: Cancun's (EIP-4844; the devnet's fork);
# Prague's is 5007716 (EIP-7691).
DEFAULT_BLOB_FEE_UPDATE_FRACTION = 3_338_477


@dataclass(frozen=True, slots=True)
class StateSettings:
    key: str = DEFAULT_KEY
    kind: str = DEFAULT_KIND
    window: int = DEFAULT_WINDOW
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    source: str | None = None  # write node URL: inproc://name or http://host:port
    chain_id: int | None = None  # default: asked from the source (eth_chainId) once
    poll_interval: float = DEFAULT_POLL_INTERVAL
    fetch_concurrency: int = DEFAULT_FETCH_CONCURRENCY
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX
    stall_failures: int = DEFAULT_STALL_FAILURES
    map_size_mb: int = DEFAULT_MAP_SIZE_MB
    verify_pre: bool = True  # reject a block whose `pre` values differ from the stored state
    verify_hash: bool = True  # reject a block whose ValidationHash does not match its content
    max_validation_count: int = DEFAULT_MAX_VALIDATION_COUNT
    max_batch: int = DEFAULT_MAX_BATCH
    hot_blocks: int = DEFAULT_HOT_BLOCKS  # 0 turns the hot view off
    hot_cache_entries: int = DEFAULT_HOT_CACHE_ENTRIES
    blob_fee_update_fraction: int = DEFAULT_BLOB_FEE_UPDATE_FRACTION
    # The proxy admin's `GET /{chain}/writers/leader` URL: follow whichever write node is
    # the Leader. The admin token, when needed, is read from the env var named here.
    leader_from: str | None = None
    leader_poll_interval: float = DEFAULT_LEADER_POLL_INTERVAL
    leader_token_env: str | None = None
    evm: dict[str, Any] = field(default_factory=dict)  # the EVM helper's [evm] settings
    logs: dict[str, Any] = field(default_factory=dict)  # eth_getLogs limits (docs/events.md)

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> StateSettings:
        """Parse one `[[state_nodes]]` table; unknown keys are an error (typos fail loudly)."""
        known = {f.name: f for f in fields(cls)}
        unknown = set(section) - set(known) - {"__dir__"}
        if unknown:
            raise ConfigError(f"[[state_nodes]]: unknown settings {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, value in section.items():
            if name not in known:
                continue
            values[name] = _coerce(name, value, cls.__dataclass_fields__[name].default)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        where = f"state node {self.key!r}"
        if self.kind not in KINDS:
            raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}")
        if self.window < 1:
            raise ConfigError(f"{where}: window must be at least 1 block")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"{where}: port must be 0..65535")
        if self.source is not None and not self.source.startswith(
            ("inproc://", "http://", "https://")
        ):
            raise ConfigError(f"{where}: source must be an inproc://, http:// or https:// URL")
        if self.chain_id is not None and self.chain_id < 0:
            raise ConfigError(f"{where}: chain_id must be non-negative")
        if self.leader_from is not None and not self.leader_from.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(f"{where}: leader_from must be an http:// or https:// URL")
        names = ("poll_interval", "request_timeout", "backoff_initial", "backoff_max")
        for name in (*names, "leader_poll_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{where}: {name} must be positive")
        for name in (
            "fetch_concurrency",
            "map_size_mb",
            "max_validation_count",
            "max_batch",
            "stall_failures",
            "blob_fee_update_fraction",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}: {name} must be at least 1")
        for name in ("hot_blocks", "hot_cache_entries"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}: {name} must not be negative")


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Check a config value against the type of its default."""
    if name in ("evm", "logs"):
        if not isinstance(value, dict):
            raise ConfigError(f"state node setting {name} must be a table")
        return dict(value)
    if name in ("source", "chain_id", "leader_from", "leader_token_env"):
        if value is None:
            return None
        if name == "chain_id":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"state node setting {name} must be an integer")
            return value
        if not isinstance(value, str):
            raise ConfigError(f"state node setting {name} must be a string")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"state node setting {name} must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"state node setting {name} must be an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"state node setting {name} must be a number")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"state node setting {name} must be a string")
    return value

"""Write node settings: one `[[writers]]` entry (or the single `[writer]` section of older
configs), each setting with a documented default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chainstate.config import REPO_CONFIGS, ConfigError

DEFAULT_KEY = "writer-1"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8664
DEFAULT_POLL_INTERVAL = 0.5  # seconds between polls of the execution client's head
DEFAULT_MAX_BLOCKS_PER_POLL = 64  # blocks built per poll before yielding to the next poll
DEFAULT_REQUEST_TIMEOUT = 30.0  # seconds per JSON-RPC request to the execution client
DEFAULT_READ_BATCH = 500  # state reads per batch request to the execution client
DEFAULT_MAX_BACKOFF = 5.0  # seconds, longest wait after repeated execution client errors
DEFAULT_MAX_REORG_DEPTH = 1024  # deeper forks stop the node: its store is another chain
DEFAULT_MAX_RETRIES = 8  # failed polls in a row before the node reports itself stalled
DEFAULT_STALL_BLOCKS = 16  # client blocks without one stored before the node is unhealthy
DEFAULT_GENESIS = REPO_CONFIGS / "genesis.json"
DEFAULT_TRACER = "auto"  # Parity stateDiff replays when the client has them, else prestateTracer
TRACERS = ("auto", "parity", "prestate")


@dataclass(frozen=True, slots=True)
class WriterSettings:
    execution_url: str
    key: str = DEFAULT_KEY
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    genesis: Path = DEFAULT_GENESIS
    poll_interval: float = DEFAULT_POLL_INTERVAL
    max_blocks_per_poll: int = DEFAULT_MAX_BLOCKS_PER_POLL
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    read_batch: int = DEFAULT_READ_BATCH
    max_backoff: float = DEFAULT_MAX_BACKOFF
    max_reorg_depth: int = DEFAULT_MAX_REORG_DEPTH
    max_retries: int = DEFAULT_MAX_RETRIES
    stall_blocks: int = DEFAULT_STALL_BLOCKS
    tracer: str = DEFAULT_TRACER

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> WriterSettings:
        """Parse `[writer]`. A relative `genesis` path is resolved against the section's
        `__dir__` (the config file's folder, when the caller sets it) or `configs/`."""
        url = section.get("execution_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError("[writer] execution_url must be an http(s):// URL")
        genesis = Path(section.get("genesis", DEFAULT_GENESIS))
        if not genesis.is_absolute():
            genesis = Path(section.get("__dir__", REPO_CONFIGS)) / genesis
        settings = cls(
            execution_url=url,
            key=str(section.get("key", DEFAULT_KEY)),
            host=str(section.get("host", DEFAULT_HOST)),
            port=_number(section, "port", DEFAULT_PORT, int),
            genesis=genesis,
            poll_interval=_number(section, "poll_interval", DEFAULT_POLL_INTERVAL, float),
            max_blocks_per_poll=_number(
                section, "max_blocks_per_poll", DEFAULT_MAX_BLOCKS_PER_POLL, int
            ),
            request_timeout=_number(section, "request_timeout", DEFAULT_REQUEST_TIMEOUT, float),
            read_batch=_number(section, "read_batch", DEFAULT_READ_BATCH, int),
            max_backoff=_number(section, "max_backoff", DEFAULT_MAX_BACKOFF, float),
            max_reorg_depth=_number(section, "max_reorg_depth", DEFAULT_MAX_REORG_DEPTH, int),
            max_retries=_number(section, "max_retries", DEFAULT_MAX_RETRIES, int),
            stall_blocks=_number(section, "stall_blocks", DEFAULT_STALL_BLOCKS, int),
            tracer=section.get("tracer", DEFAULT_TRACER),
        )
        if settings.tracer not in TRACERS:
            raise ConfigError(f"[writer] tracer must be one of {', '.join(TRACERS)}")
        if not settings.genesis.is_file():
            raise ConfigError(f"[writer] genesis file not found: {settings.genesis}")
        return settings


def writer_sections(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The write nodes a config declares, in order: `[[writers]]`, or the one `[writer]` of
    configs written before a chain had several. Each gets the config's `__dir__`, so relative
    paths in it resolve against the config file's folder."""
    many, one = config.get("writers"), config.get("writer")
    if many is not None and one is not None:
        raise ConfigError("use [[writers]] (a list) or [writer] (one write node), not both")
    if one is not None:
        if not isinstance(one, dict):
            raise ConfigError("[writer] must be a table")
        many = [one]
    if many is None:
        return []
    if not isinstance(many, list) or not all(isinstance(w, dict) for w in many):
        raise ConfigError("[[writers]] must be a list of tables")
    sections = [{"__dir__": config.get("__dir__", str(REPO_CONFIGS)), **w} for w in many]
    _unique(sections, "key", DEFAULT_KEY)
    _unique(sections, "port", DEFAULT_PORT)
    return sections


def pick_writer(sections: list[dict[str, Any]], key: str | None) -> tuple[int, dict[str, Any]]:
    """The position and section of the writer named `key` (None: the first one)."""
    if not sections:
        raise ConfigError("the config declares no write node ([[writers]] or [writer])")
    if key is None:
        return 0, sections[0]
    for index, sect in enumerate(sections):
        if sect.get("key", DEFAULT_KEY) == key:
            return index, sect
    known = ", ".join(str(s.get("key", DEFAULT_KEY)) for s in sections)
    raise ConfigError(f"no write node {key!r} in the config (it has: {known})")


def writer_data_dir(root: Path, sections: list[dict[str, Any]], index: int) -> Path:
    """Where a writer of a shared data dir keeps its blocks: `<root>/<key>`. The first writer
    keeps using `<root>/writer` when that exists (data dirs of the single-writer layout), so
    an existing chain is not traced again."""
    legacy = root / "writer"
    key = str(sections[index].get("key", DEFAULT_KEY))
    own = root / key
    if index == 0 and (len(sections) == 1 or legacy.exists()) and not own.exists():
        return legacy
    return own


def _unique(sections: list[dict[str, Any]], name: str, default: Any) -> None:
    seen: set[Any] = set()
    for sect in sections:
        value = sect.get(name, default)
        if value in seen:
            raise ConfigError(f"[[writers]]: two write nodes have {name} = {value!r}")
        seen.add(value)


def _number(section: dict[str, Any], name: str, default: Any, kind: type) -> Any:
    value = section.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"[writer] {name} must be a positive number, got {value!r}")
    if kind is int and value != int(value):
        raise ConfigError(f"[writer] {name} must be a whole number, got {value!r}")
    return kind(value)

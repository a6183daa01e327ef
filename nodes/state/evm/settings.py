"""Every user-facing limit of EVM execution, as named settings with documented defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from chainstate.config import ConfigError

DEFAULT_GAS_CAP = 50_000_000  # geth's --rpc.gascap default
DEFAULT_CALL_TIMEOUT = 5.0  # seconds of wall clock for one job (a call, a batch, a trace)
DEFAULT_MAX_CALLS = 1000  # calls per eth_multiCall/contractMultiCall/simulateTransactions
DEFAULT_TRACE_TIMEOUT = 20.0  # seconds for one pre_trace* job (pyrevm traces ~650 steps/s)
DEFAULT_MAX_TRACE_STEPS = 10_000  # struct-log entries per traced call
DEFAULT_MAX_TRACE_BYTES = 16 * 1024 * 1024  # raw EIP-3155 output per traced call
DEFAULT_MAX_RETURN_BYTES = 1024 * 1024  # return data per call
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # return data of all calls of one request
DEFAULT_WARM_MAX_CALLS = 200_000  # calls a warm EVM serves before it is rebuilt (memory)
DEFAULT_MAX_BSRB_READS = 10_000  # reads per blockx_stateReadBatch payload
DEFAULT_WARM_BLOCKS = 256  # per worker: blocks whose fetched state stays cached (~150 KB each)
# By default at least this many over all of a node's workers (what two workers keep): a node
# given one core runs one worker (`usable_cores`), which keeps them all.
NODE_WARM_BLOCKS = 512
DEFAULT_WARM_MEMORY_MB = 1024  # per worker: own memory (not file pages) past which warm EVMs go
DEFAULT_QUEUE_LIMIT = 1024  # jobs (or single calls) waiting for a worker before -32005 "busy"
DEFAULT_MAX_TRACE_FILTER_BLOCKS = 300  # blocks after fromBlock in one trace_filter (anvil's)
DEFAULT_COALESCE_MAX = 256  # single calls run together as one worker job (one or more blocks)
DEFAULT_WARM_ANSWERS = 256  # per warm block: answers of calls kept (return data up to 1 KiB)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a cpuset, `taskset`), not the
    machine's count. A worker beyond them runs on a core another worker runs on: it only
    takes turns with it, and the calls waiting for a worker go as two jobs, two pipe round
    trips and two wake-ups instead of one (on a node pinned to one core, two workers cost
    20-30 % more CPU per eth_call at old heights than one: `python -m bench.portcalls`)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (no affinity on this platform)
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class EvmSettings:
    """Limits and sizing of the executor; `[evm]` in the node config overrides any field."""

    gas_cap: int = DEFAULT_GAS_CAP
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    max_calls: int = DEFAULT_MAX_CALLS
    trace_timeout: float = DEFAULT_TRACE_TIMEOUT
    max_trace_steps: int = DEFAULT_MAX_TRACE_STEPS
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES
    max_return_bytes: int = DEFAULT_MAX_RETURN_BYTES
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    warm_max_calls: int = DEFAULT_WARM_MAX_CALLS
    max_bsrb_reads: int = DEFAULT_MAX_BSRB_READS
    warm_blocks: int = 0  # per worker; 0: `worker_warm_blocks`' default
    warm_memory_mb: int = DEFAULT_WARM_MEMORY_MB
    queue_limit: int = DEFAULT_QUEUE_LIMIT
    coalesce_max: int = DEFAULT_COALESCE_MAX
    warm_answers: int = DEFAULT_WARM_ANSWERS
    max_trace_filter_blocks: int = DEFAULT_MAX_TRACE_FILTER_BLOCKS
    workers: int = 0  # 0 = one per CPU core the node may run on (`usable_cores`)
    chain_id: int = 1337
    spec_id: str = "Cancun"  # pyrevm spec names are CamelCase; others silently mean latest
    feed: str = "process"  # where workers read block state: "process" (LMDB store) or "loop"

    @property
    def worker_count(self) -> int:
        return self.workers if self.workers > 0 else usable_cores()

    @property
    def worker_warm_blocks(self) -> int:
        """Warm blocks each worker keeps: `warm_blocks`, by default DEFAULT_WARM_BLOCKS and
        at least NODE_WARM_BLOCKS over the node's workers."""
        if self.warm_blocks > 0:
            return self.warm_blocks
        return max(DEFAULT_WARM_BLOCKS, -(-NODE_WARM_BLOCKS // self.worker_count))

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> EvmSettings:
        """Build from a config table, rejecting unknown keys and wrong types."""
        cfg = dict(cfg or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(cfg) - set(known))
        if unknown:
            raise ConfigError(f"[evm]: unknown settings {unknown}")
        for name, value in cfg.items():
            want = type(getattr(cls(), name))
            ok = isinstance(value, want) or (want is float and isinstance(value, int))
            if not ok or isinstance(value, bool):
                raise ConfigError(f"[evm].{name}: expected {want.__name__}, got {value!r}")
            if want in (int, float) and value < 0:
                raise ConfigError(f"[evm].{name}: must not be negative")
        for name in POSITIVE:
            if name in cfg and cfg[name] <= 0:
                raise ConfigError(f"[evm].{name}: must be positive")
        if cfg.get("spec_id", "Cancun") not in SPEC_IDS:
            raise ConfigError(f"[evm].spec_id: one of {sorted(SPEC_IDS)}")
        if cfg.get("feed", "process") not in FEEDS:
            raise ConfigError(f"[evm].feed: one of {sorted(FEEDS)}")
        return cls(**cfg)


POSITIVE = (
    "gas_cap",
    "call_timeout",
    "trace_timeout",
    "max_calls",
    "max_trace_steps",
    "max_trace_bytes",
    "max_return_bytes",
    "max_response_bytes",
    "warm_max_calls",
    "max_bsrb_reads",
    "warm_blocks",
    "warm_memory_mb",
    "queue_limit",
    "coalesce_max",
    "max_trace_filter_blocks",
)
FEEDS = frozenset({"process", "loop"})
SPEC_IDS = frozenset({"Berlin", "London", "Merge", "Shanghai", "Cancun", "Prague"})

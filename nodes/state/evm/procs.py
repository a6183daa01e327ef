"""How a node starts its EVM processes (workers and the feed process): forks of one
forkserver that imported what they run once.

A spawned process imports pyrevm and py-evm again (~0.8 s of CPU), for every worker, every
replacement of a killed one and every node start. The forkserver is a fresh single-threaded
interpreter, one per node process and shared by every node in it, that never opens the store
nor runs an event loop, so its forks are as isolated as spawned processes.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

# What the forkserver imports before its first fork (a module it cannot import is skipped
# there and imported by the process that needs it).
PRELOAD = [
    "nodes.state.evm.worker",
    "nodes.state.evm.pyevm",
    "nodes.state.evm.tracing",
    "nodes.state.evm.feed",
    "uvloop",
]


def context() -> Any:
    """The multiprocessing context EVM processes are started with."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx

"""Per-run limits: what one run may use (CPU, memory, processes, output, files it writes).

Each field is a documented setting (docs/compute.md, `function_<field>` / `instance_<field>`).
The rlimits are applied in the child just before it executes the program; the write budget
is the size of the run's own tmpfs (see `workspace.compute.sandbox.rundirs`).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import psutil

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class Limits:
    """Per-run limits; every field is a documented setting (docs/compute.md)."""

    wall_seconds: float = 10.0  # wall clock from spawn to kill
    cpu_seconds: int = 20  # RLIMIT_CPU, all threads (SIGXCPU, then SIGKILL a second later)
    memory_bytes: int = 512 * MiB  # RLIMIT_DATA: heap/anonymous memory (Go/Node start fine)
    file_size_bytes: int = 16 * MiB  # RLIMIT_FSIZE: largest file the run may write
    open_files: int = 256  # RLIMIT_NOFILE
    processes: int = 64  # RLIMIT_NPROC for the run's own uid (threads count too)
    output_bytes: int = 256 * KiB  # stdout+stderr kept in the record
    output_hard_bytes: int | None = 16 * MiB  # more than this in total kills the run
    result_bytes: int = 8 * MiB  # largest JSON result accepted on the result fd
    cpu_percent: int | None = None  # 100 = one vCPU; enforced through a cpu cgroup
    write_bytes: int = 64 * MiB  # everything the run writes: its folder and temp folders
    write_files: int = 10_000  # files and folders the run may create (tmpfs inodes)


def apply_rlimits(limits: Limits, nproc: int | None) -> None:
    """Set the run's rlimits; called in the child, last before exec."""
    cpu = max(1, int(limits.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_bytes, limits.memory_bytes))
    size = limits.file_size_bytes
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def nproc_budget(uid: int | None, processes: int) -> int | None:
    """RLIMIT_NPROC for a run. With its own uid: the run's limit. Sharing the server's
    (non-root) uid, the limit counts every process of that user, so the budget is what the
    user runs now plus the run's limit. Root without a uid of its own: not enforceable."""
    if uid is not None:
        return processes
    if os.geteuid() == 0:
        return None
    me = os.getuid()
    mine = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        ids = p.info.get("uids")
        if ids is not None and ids.real == me:
            mine += p.info.get("num_threads") or 1
    return mine + processes

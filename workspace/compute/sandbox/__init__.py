"""Isolated subprocess runs for user code (Functions and Notebook instances).

Every run is a subprocess with a clean environment; its own folders (a tmpfs of its own as
root), the only place it may write, with private `/tmp`, `/var/tmp`, `/run` and `/dev/shm`
and the machine's other files read-only; rlimits; a wall-clock limit; output captured while
streaming with a cap; the network off through a new network namespace; and the machine's
other processes out of sight (its own PID namespace through bubblewrap, or a hidepid=2
/proc). As root each concurrent run gets its own unprivileged uid, so `RLIMIT_NPROC` bounds
a fork bomb and everything a run left can be found by uid. What the machine allows is probed
once at start and reported; a missing feature is a warning, never skipped silently.

Modules by concern:
- `limits`: per-run limits and the rlimits applied in the child;
- `namespaces`: the bubblewrap command and the mount-namespace fallback (the run's view);
- `rundirs`: the run's folders (a sized tmpfs as root), created and removed;
- `uids`: the uid pool, the lock a server holds on its uids, killing a run's processes,
  removing a uid's leftover files;
- `probe`: what this machine allows (`Isolation`);
- `process`: a spawned run (output, result, wall clock, exit);
- `spawn`: `Job` and `Sandbox`, which puts it all together;
- `pool`: the worker pool of Function runs.
"""

from workspace.compute.sandbox.limits import GiB, KiB, Limits, MiB
from workspace.compute.sandbox.pool import QueueFull, WorkerPool
from workspace.compute.sandbox.probe import Isolation, probe_isolation, release_isolation
from workspace.compute.sandbox.process import RunResult, SandboxProcess
from workspace.compute.sandbox.spawn import RESULT_FD_ENV, Job, Sandbox
from workspace.compute.sandbox.uids import UidPool, sweep_uids

__all__ = [
    "RESULT_FD_ENV",
    "GiB",
    "Isolation",
    "Job",
    "KiB",
    "Limits",
    "MiB",
    "QueueFull",
    "RunResult",
    "Sandbox",
    "SandboxProcess",
    "UidPool",
    "WorkerPool",
    "probe_isolation",
    "release_isolation",
    "sweep_uids",
]

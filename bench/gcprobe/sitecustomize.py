"""Loaded by every Python process started with this folder on PYTHONPATH (`bench.realprocs
gc` does that for the suite's services): with GCPROBE_DIR set, counts and times the garbage
collector's passes per generation (`gc.callbacks`) and, on SIGUSR1, appends them with the
heap's size and the process's CPU seconds to GCPROBE_DIR/gc-PID.jsonl. Measurement only."""

from __future__ import annotations

import os

_DIR = os.environ.get("GCPROBE_DIR")
if _DIR:
    import gc
    import json
    import signal
    import sys
    import time
    from typing import Any

    _passes = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}  # generation: [passes, seconds]
    _started = [0.0]

    def _on_pass(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
        else:
            entry = _passes[info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - _started[0]

    def _dump(signum: int, frame: Any) -> None:
        times = os.times()
        record = {
            "argv": sys.argv[:3],
            "pid": os.getpid(),
            "passes": {g: list(v) for g, v in _passes.items()},
            "objects": [len(gc.get_objects(g)) for g in range(3)],
            "cpu": times.user + times.system,
        }
        with open(os.path.join(_DIR, f"gc-{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps(record) + "\n")

    gc.callbacks.append(_on_pass)
    signal.signal(signal.SIGUSR1, _dump)

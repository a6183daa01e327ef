"""Two servers on one machine never sweep each other: a server holds its sandbox uids (a lock
in the work root) for its life, sweeps their leftovers only once it holds them, and a second
live server configured onto the same uids refuses to start instead of killing the first's
runs and removing their folders."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.compute.conftest import running_stack
from workspace.compute.sandbox import Limits, Sandbox
from workspace.compute.sandbox.rundirs import (
    create_run_dirs,
    remove_leftover_run_dirs,
    remove_run_dirs,
)
from workspace.compute.sandbox.uids import UidsInUse, claim_uids, sweep_free_blocks

BASE = 2_400_000  # a uid block no port-derived one reaches (those start at 2_000_000 + 64 × port)
SLOW = "import time\n\ndef main():\n    time.sleep(1.0)\n    return 'done'\n"


@pytest.fixture
def root_server() -> None:
    if os.geteuid() != 0:
        pytest.skip("sandbox uids (and their sweep at start) need a root server")


async def test_a_second_server_on_the_same_uids_leaves_the_first_ones_run_alone(
    root_server: None, tmp_path: Path, upstream: str
) -> None:
    async with running_stack(tmp_path / "first", upstream, uid_base=BASE) as first:
        body = {"language": "python", "code": SLOW}
        run = asyncio.create_task(first.alice.ok("POST", "/v1/function/run", body))
        for _ in range(100):  # until the run holds a worker (its uid, its folder)
            if first.svc.pool.running:
                break
            await asyncio.sleep(0.05)
        assert first.svc.pool.running == 1, run.done() and run.result()
        with pytest.raises(UidsInUse, match=f"uids {BASE}..{BASE + 63} are used by another"):
            async with running_stack(tmp_path / "second", upstream, uid_base=BASE):
                pass
        rec = await run
        assert (rec["status"], rec["return_value"]) == ("succeeded", "done"), rec["output"]
        # the first server keeps running Functions with its uids
        again = await first.alice.ok("POST", "/v1/function/run", body)
        assert again["status"] == "succeeded", again
    # once the first server is closed its uids are free: the next one takes them
    async with running_stack(tmp_path / "third", upstream, uid_base=BASE) as third:
        rec = await third.alice.ok("POST", "/v1/function/run", body)
        assert rec["status"] == "succeeded", rec


def test_the_claim_is_free_again_when_its_holder_is_gone(tmp_path: Path) -> None:
    """The lock goes with the descriptor (and with the process: the kernel drops it), so a
    dead server's uids are free for its successor, which then sweeps what it left."""
    uids = range(BASE, BASE + 64)
    held = claim_uids(tmp_path, uids)
    with pytest.raises(UidsInUse):
        claim_uids(tmp_path, uids)
    other = claim_uids(tmp_path, range(BASE + 64, BASE + 128))  # another block: no conflict
    os.close(held)
    os.close(claim_uids(tmp_path, uids))
    os.close(other)


def test_a_gone_servers_folders_are_swept_and_a_live_ones_left(sandbox: Sandbox) -> None:
    """At start a server also clears the kept folders of blocks whose lock is free (their
    server closed or died, on another port): a crashed run's tmpfs is unmounted and emptied
    (its folder, unmounted just now, goes at a later start, and the lock file with it), an
    unmounted folder goes; a live server's block is not touched."""
    if not sandbox.isolation.run_tmpfs:
        pytest.skip("no tmpfs per run here")
    root = sandbox.work_root
    root.mkdir(parents=True, exist_ok=True)
    live, gone = range(BASE, BASE + 64), range(BASE + 64, BASE + 128)
    live_lock, gone_lock = claim_uids(root, live), claim_uids(root, gone)
    live_run = create_run_dirs(root, live[0], Limits(), tmpfs=True)
    crashed = create_run_dirs(root, gone[0], Limits(), tmpfs=True)
    (crashed.home / "file").write_text("x")
    finished = create_run_dirs(root, gone[1], Limits(), tmpfs=True)
    remove_run_dirs(finished)
    os.close(gone_lock)  # that server is gone

    def sweep() -> None:
        sweep_free_blocks(root, lambda block: remove_leftover_run_dirs(root, block, keep=False))

    try:
        sweep()
        assert os.path.ismount(live_run.root) and live_run.home.is_dir()
        assert not os.path.ismount(crashed.root) and os.listdir(crashed.root) == []
        assert not finished.root.exists()
        sweep()
        assert not crashed.root.exists() and os.path.ismount(live_run.root)
        assert sorted(p.name for p in root.glob("uids-*")) == [f"uids-{BASE}-{BASE + 63}.lock"]
    finally:
        remove_run_dirs(live_run)
        os.close(live_lock)

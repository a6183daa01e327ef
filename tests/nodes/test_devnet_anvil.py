"""anvil is found, starts from configs/genesis.json, answers JSON-RPC and stops cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from nodes.devnet.anvil import (
    GENESIS,
    TOOL_DIR,
    AnvilProcess,
    DevnetError,
    ensure_anvil,
    ensure_openzeppelin,
)
from nodes.devnet.genesis import header_hash
from tests.conftest import free_port


async def rpc(url: str, method: str, params: list | None = None):
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        return (await resp.json())["result"]


def live_group_members(pgid: int) -> list[int]:
    """Processes of a process group that still run (zombies awaiting reaping do not)."""
    live = []
    for p in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                live.append(p.pid)
    return live


def test_ensure_anvil_finds_the_pinned_binary() -> None:
    path = ensure_anvil()
    assert path.name == "anvil" and path.exists()


def test_openzeppelin_artifacts_present() -> None:
    artifact = ensure_openzeppelin() / "ERC20PresetFixedSupply.json"
    assert json.loads(artifact.read_text())["bytecode"].startswith("0x60")


async def test_genesis_allocation_is_the_known_one(anvil_url: str) -> None:
    """The genesis file lists every account anvil has at block 0: the 10 test-mnemonic
    accounts and the CREATE2 deployer anvil always installs."""
    genesis = json.loads(GENESIS.read_text())
    alloc = {"0x" + a: entry for a, entry in genesis["alloc"].items()}
    assert await rpc(anvil_url, "eth_chainId") == "0x539"
    accounts = await rpc(anvil_url, "eth_accounts")
    assert accounts == list(alloc)[:10]
    assert all(alloc[a]["balance"] == hex(10_000 * 10**18) for a in accounts)
    for addr, entry in alloc.items():
        assert await rpc(anvil_url, "eth_getBalance", [addr, "0x0"]) == entry["balance"]
        assert await rpc(anvil_url, "eth_getCode", [addr, "0x0"]) == entry.get("code", "0x")
    dump = json.loads(gzip.decompress(bytes.fromhex((await rpc(anvil_url, "anvil_dumpState"))[2:])))
    assert sorted(dump["accounts"]) == sorted(alloc)


async def test_block_time_mines_without_transactions() -> None:
    async with AnvilProcess(port=free_port(), genesis=GENESIS, block_time=0.2) as proc:
        await asyncio.sleep(0.7)
        assert int(await rpc(proc.url, "eth_blockNumber"), 16) >= 2
        pid = proc.pid
    assert proc.pid is None and pid is not None
    assert live_group_members(pid) == []


def test_the_npm_wrapper_is_stopped_with_its_child(tmp_path) -> None:
    """Through the node wrapper (`.bin/anvil`) the real anvil is a grandchild: it must stop."""
    wrapper = TOOL_DIR / "node_modules" / ".bin" / "anvil"
    proc = AnvilProcess(port=free_port(), genesis=GENESIS, binary=wrapper)
    proc.start_blocking()
    pid = proc.pid
    assert pid is not None
    assert len(live_group_members(pid)) == 2  # node and the real anvil
    proc.stop_blocking()
    assert live_group_members(pid) == []


async def test_state_path_keeps_the_chain_across_restarts(tmp_path) -> None:
    state = tmp_path / "anvil-state.json"
    port = free_port()
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state) as proc:
        genesis_block = await rpc(proc.url, "eth_getBlockByNumber", ["0x0", False])
        await rpc(proc.url, "evm_mine")
        block1 = await rpc(proc.url, "eth_getBlockByNumber", ["0x1", False])
    assert state.exists()
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state) as proc:
        assert await rpc(proc.url, "eth_getBlockByNumber", ["0x1", False]) == block1
    # anvil 1.7.1 after loading a state file sometimes answers block 0 with a fresh genesis
    # hash; the chain itself (block 1's parent) is the loaded one.
    assert block1["parentHash"] == genesis_block["hash"]


async def test_block_zero_is_the_genesis_files_on_every_restart(tmp_path) -> None:
    """anvil 1.7.1 loaded from a state file adds a genesis of its own, dumps it next to the
    chain's block 0 in hash-map order, and on the next load takes the last block 0 listed:
    with the head at 0 it answered that block and mined on it (a devnet killed in its first
    seconds: the write nodes saw another chain). Listed last here on purpose: the start
    keeps one block 0, the genesis file's, and the chain goes on from it."""
    state = tmp_path / "anvil-state.json"
    port = free_port()
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state) as proc:
        genesis_block = await rpc(proc.url, "eth_getBlockByNumber", ["0x0", False])
    AnvilProcess(port=port, genesis=GENESIS, state_path=state).settle_previous()
    dumped = json.loads(state.read_text())
    zeros = [b for b in dumped["blocks"] if b["header"]["number"] == "0x0"]
    assert len(zeros) == 1  # pinned when the dump was taken over
    fresh = dict(zeros[0], header=dict(zeros[0]["header"], timestamp=hex(int(time.time()))))
    dumped["blocks"].append(fresh)  # another block 0, listed after the chain's
    state.write_text(json.dumps(dumped))
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state) as proc:
        assert await rpc(proc.url, "eth_getBlockByNumber", ["0x0", False]) == genesis_block
        await rpc(proc.url, "evm_mine")
        block1 = await rpc(proc.url, "eth_getBlockByNumber", ["0x1", False])
        assert block1["parentHash"] == genesis_block["hash"]
        assert await rpc(proc.url, "eth_getBlockByNumber", ["earliest", False]) == genesis_block


async def test_header_hash_is_the_block_hash_anvil_gives(tmp_path) -> None:
    """The hash of a dumped header: what tells which of a dump's blocks 0 block 1 is on."""
    async with AnvilProcess(port=free_port(), genesis=GENESIS) as proc:
        for _ in range(2):
            await rpc(proc.url, "evm_mine")
        hashes = [
            (await rpc(proc.url, "eth_getBlockByNumber", [hex(n), False]))["hash"] for n in range(3)
        ]
        raw = await rpc(proc.url, "anvil_dumpState")
    blocks = json.loads(gzip.decompress(bytes.fromhex(raw[2:])))["blocks"]
    got = sorted((int(b["header"]["number"], 16), header_hash(b["header"])) for b in blocks)
    assert got == list(enumerate(hashes))


async def test_state_file_is_written_periodically(tmp_path) -> None:
    """After a kill -9 the chain is back up to the last periodic dump."""
    state = tmp_path / "anvil-state.json"
    port = free_port()
    proc = AnvilProcess(port=port, genesis=GENESIS, state_path=state, state_interval=1)
    await proc.start()
    try:
        await rpc(proc.url, "evm_mine")
        block1 = await rpc(proc.url, "eth_getBlockByNumber", ["0x1", False])
        await asyncio.sleep(1.5)
        assert proc.pid is not None
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        await proc.stop()
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state) as again:
        assert await rpc(again.url, "eth_getBlockByNumber", ["0x1", False]) == block1


async def test_port_in_use_is_a_clear_error(anvil) -> None:
    other = AnvilProcess(port=anvil.port, genesis=GENESIS, start_timeout=5)
    with pytest.raises(DevnetError, match=r"exited|did not answer"):
        await other.start()
    assert other.pid is None


def test_anvil_dies_with_the_process_that_started_it() -> None:
    """A crashed parent (here: os._exit without stop) leaves no anvil behind."""
    code = (
        "import os; from nodes.devnet.anvil import AnvilProcess, GENESIS; "
        "from tests.conftest import free_port; "
        "a = AnvilProcess(port=free_port(), genesis=GENESIS); a.start_blocking(); "
        "print(a.pid, flush=True); os._exit(0)"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60
    )
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 5
    while live_group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_group_members(pid) == []


def test_without_npm_installing_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DevnetError, match="npm is needed"):
        ensure_anvil(tmp_path / "tools")
    assert not (tmp_path / "tools" / "node_modules").exists()


def test_installed_package_of_the_pinned_version_is_reused(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "node_modules" / "@openzeppelin" / "contracts"
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"version": "4.9.6"}))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # npm would be needed otherwise
    assert ensure_openzeppelin(tmp_path) == package / "build" / "contracts"
    (package / "package.json").write_text(json.dumps({"version": "4.9.5"}))
    with pytest.raises(DevnetError, match="npm is needed"):
        ensure_openzeppelin(tmp_path)


async def test_damaged_state_file_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "anvil-state.json"
    state.write_text("{not json")
    proc = AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state)
    with pytest.raises(DevnetError, match="remove it"):
        await proc.start()
    assert proc.pid is None


def test_anvil_of_a_killed_run_is_waited_for_and_its_last_dump_taken(tmp_path: Path) -> None:
    """The process that ran anvil dies with SIGKILL: anvil gets SIGTERM, writes its state and
    exits. A start right away on the same state file waits for it (the port and the dump are
    its until then) and loads what it wrote: no block is lost."""
    state, port = tmp_path / "anvil-state.json", free_port()
    code = (
        "import json, os, signal, sys, urllib.request\n"
        "from pathlib import Path\n"
        "from nodes.devnet.anvil import AnvilProcess, GENESIS\n"
        f"a = AnvilProcess(port={port}, genesis=GENESIS, state_path=Path({str(state)!r}))\n"
        "a.start_blocking()\n"
        "for _ in range(3):\n"
        "    body = json.dumps({'jsonrpc': '2.0', 'id': 1, 'method': 'evm_mine', 'params': []})\n"
        "    head = {'content-type': 'application/json'}\n"
        "    req = urllib.request.Request(a.url, body.encode(), head)\n"
        "    urllib.request.urlopen(req).read()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=repo, timeout=60, check=False)
    again = AnvilProcess(port=port, genesis=GENESIS, state_path=state)
    again.start_blocking()
    try:
        head = asyncio.run(rpc(again.url, "eth_blockNumber"))
        assert int(head, 16) == 3
    finally:
        again.stop_blocking()
    assert not again.pid_path.exists()  # type: ignore[union-attr]


def test_a_left_over_anvil_whose_parent_runs_is_refused(tmp_path: Path) -> None:
    """A live process still runs anvil on this state file (another stack): a clear error,
    and it is left alone."""
    state = tmp_path / "anvil-state.json"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(state)])
    try:
        (tmp_path / "anvil-state.pid").write_text(str(other.pid))
        proc = AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state, left_over_wait=0.2)
        with pytest.raises(DevnetError, match="another chainstate is using this data dir"):
            proc.start_blocking()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_cut_dump_is_set_aside_and_the_previous_state_loaded(tmp_path: Path) -> None:
    state = tmp_path / "anvil-state.json"
    port = free_port()
    first = AnvilProcess(port=port, genesis=GENESIS, state_path=state)
    first.start_blocking()
    asyncio.run(rpc(first.url, "evm_mine"))
    first.stop_blocking()  # SIGTERM: anvil dumps into the dump file; the next start takes it
    again = AnvilProcess(port=port, genesis=GENESIS, state_path=state)
    assert again.settle_previous() is None
    assert again.dump_path is not None and not again.dump_path.exists()
    again.dump_path.write_text('{"block": {"number": "0x7"}, "accou')  # killed mid-dump
    said = again.settle_previous()
    assert said is not None and "cut short" in said
    assert (tmp_path / "anvil-state.damaged.json").exists()
    again.start_blocking()
    try:
        assert asyncio.run(rpc(again.url, "eth_blockNumber")) == "0x1"
    finally:
        again.stop_blocking()

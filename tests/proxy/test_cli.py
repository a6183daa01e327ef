"""`chainstate proxy` as its own process: starts with no config, nodes come from the admin API."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import aiohttp
import pytest

from tests.conftest import free_port

ADDR = "0x" + "22" * 20


@pytest.fixture
async def proxy_process(tmp_path):
    port = free_port()
    cmd = [
        sys.executable, "-m", "stack.cli", "proxy", "--port", str(port),
        "--store", str(tmp_path / "store.json"), "--admin-token", "t0ken",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                try:
                    token = {"Authorization": "Bearer t0ken"}  # /metrics is the admin's
                    async with s.get(f"{url}/metrics", headers=token) as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            else:
                proc.kill()
                _, err = await proc.communicate()
                raise AssertionError(f"proxy did not start: {err.decode()}")
        yield url, proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)


async def test_proxy_command_routes_as_debug_choose_says(proxy_process, fake_nodes) -> None:
    url, proc = proxy_process
    state = await fake_nodes("state-1", "state")
    archive = await fake_nodes("archive-1", "archive")
    auth = {"Authorization": "Bearer t0ken"}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/1337/addNode", json=state.entry()) as resp:
            assert resp.status == 401
        for node in (state, archive):
            async with s.post(f"{url}/0x539/addNode", json=node.entry(), headers=auth) as resp:
                assert resp.status == 201
        for _ in range(100):  # heads arrive with the first poll (1 s interval)
            async with s.get(f"{url}/1337/getAllNodes", headers=auth) as resp:
                nodes = (await resp.json())["nodes"]
            if all(n["head"] == 1000 for n in nodes):
                break
            await asyncio.sleep(0.05)
        choices = {}
        for block in ("latest", "0x10"):
            params = {"method": "eth_getBalance", "block": block}
            async with s.get(f"{url}/1337/debug_chooseOneNode", params=params, headers=auth) as r:
                choices[block] = (await r.json())["node"]["key"]
        assert choices == {"latest": "state-1", "0x10": "archive-1"}
        batch = [
            {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [ADDR, block]}
            for i, block in enumerate(["latest", "0x10", "latest", "0x3e7", "0x1"])
        ]
        async with s.post(f"{url}/1337", json=batch) as resp:
            answers = await resp.json()
    assert [a["id"] for a in answers] == [0, 1, 2, 3, 4]
    assert [a["result"]["node"] for a in answers] == [
        "state-1",
        "archive-1",
        "state-1",
        "state-1",
        "archive-1",
    ]
    proc.terminate()
    out, _ = await asyncio.wait_for(proc.communicate(), 10)
    assert b"listening on" in out and b"curl" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--config", "{config}"], "max_attempts"),
        (["--port", "99999"], "TCP port"),
        (["--port", "{taken}", "--store", ":memory:"], "cannot listen"),
        (["--store", "{bad_store}"], "unreadable"),
        (["--workers", "2"], "etcd"),
        # `--admin-token "$TOKEN"` with TOKEN unset: a locked admin API, or worse, an open one
        (["--port", "{free}", "--store", ":memory:", "--admin-token", ""], "admin_token"),
        (["--port", "{free}", "--store", ":memory:", "--admin-token", "tw o"], "admin_token"),
        (["--port", "{free}", "--admin-port", "{free}", "--store", ":memory:"], "data port"),
    ],
)
def test_proxy_command_refuses_bad_settings(tmp_path, args, says) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text("[proxy]\nmax_attempts = 0\n")
    bad_store = tmp_path / "store.json"
    bad_store.write_text("{broken")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        values = {
            "config": config,
            "taken": taken.getsockname()[1],
            "bad_store": bad_store,
            "free": free_port(),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "stack.cli", "proxy", *(a.format(**values) for a in args)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr


def test_workers_refuse_an_unusable_trace_exporter_before_forking() -> None:
    """Without the OTLP package, `--workers` must fail at once like one process does, not
    fork workers that crash-loop until the supervisor gives up."""
    import importlib

    try:
        importlib.import_module("opentelemetry.exporter.otlp")
        pytest.skip("the OTLP exporter package is installed here")
    except ImportError:
        pass
    args = ["--workers", "2", "--trace", "otlp", "--store", "etcd://127.0.0.1:1/x/"]
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "proxy", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "OTLP exporter package" in proc.stderr, proc.stderr
    assert "worker" not in proc.stderr


async def test_a_second_proxy_on_the_same_store_file_is_refused(proxy_process, tmp_path) -> None:
    """Two processes on one file store would overwrite each other's admin changes."""
    store = tmp_path / "store.json"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "stack.cli", "proxy", "--port", str(free_port())],
        *["--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:  # it started: the defect; do not leave it running
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2, err.decode()
    assert "in use by another process" in err.decode() and "etcd://" in err.decode()

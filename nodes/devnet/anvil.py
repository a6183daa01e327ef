"""anvil, the devnet's execution client: found or installed with npm, run as a child process.

`ensure_anvil()` looks on PATH, then in the project's tool folder (`<repo>/.tools`), and
installs the pinned `@foundry-rs/anvil` there with npm when it is absent. `AnvilProcess`
starts anvil from the genesis file in `configs/` (so the allocation is known), waits until it
answers JSON-RPC, and stops it (terminate, then kill). With `state_path` the chain survives a
restart: anvil loads that file at start and writes its state (with the state of its last
`state_history` blocks, so blocks nobody traced yet can still be replayed) to a separate dump
file every `state_interval` seconds and on exit. anvil does not write that file atomically,
so the next start takes the dump only when it is complete, else keeps the previous file; an
anvil left over from a crashed run (still writing its last dump) is waited for first, and
the file keeps one block 0 before anvil loads it (`nodes/devnet/genesis.py`). After a
kill -9 of anvil itself the file misses its last seconds of chain; `chainstate up` puts them
back from the write nodes' stores (`nodes/devnet/recovery.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson
import psutil

from nodes.devnet.genesis import pin_genesis

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOL_DIR = REPO_ROOT / ".tools"
GENESIS = REPO_ROOT / "configs" / "genesis.json"

ANVIL_PACKAGE = "@foundry-rs/anvil"
ANVIL_VERSION = "1.7.1"
OPENZEPPELIN_PACKAGE = "@openzeppelin/contracts"
OPENZEPPELIN_VERSION = "4.9.6"

DEFAULT_START_TIMEOUT = 30.0  # seconds to wait for anvil to answer eth_chainId
DEFAULT_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL
DEFAULT_STATE_INTERVAL = 10.0  # seconds between anvil's dumps of its state file
DEFAULT_STATE_HISTORY = 64  # recent blocks whose state anvil keeps (and dumps with its state)
LEFT_OVER_WAIT = 10.0  # seconds to wait for an anvil of a crashed run to finish its last dump


class DevnetError(RuntimeError):
    """anvil could not be found, installed or started; the message says what to do."""


def _npm_install(tool_dir: Path, spec: str) -> None:
    """Install `spec` into `tool_dir/node_modules`, showing npm's progress on stderr."""
    npm = shutil.which("npm")
    if npm is None:
        raise DevnetError(
            f"npm is needed to install {spec} (install Node.js and npm, e.g. "
            "`apt-get install npm`), or put anvil on PATH"
        )
    tool_dir.mkdir(parents=True, exist_ok=True)
    print(f"[chainstate] installing {spec} into {tool_dir} with npm…", file=sys.stderr, flush=True)
    cmd = [npm, "install", "--prefix", str(tool_dir), "--no-audit", "--no-fund", spec]
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if result.returncode != 0:
        raise DevnetError(f"`{' '.join(cmd)}` failed with exit code {result.returncode}")


def _installed_version(package_dir: Path) -> str | None:
    try:
        return json.loads((package_dir / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        return None


def ensure_npm_package(name: str, version: str, tool_dir: Path | None = None) -> Path:
    """The folder of npm package `name@version` under the tool folder, installed if absent."""
    tool_dir = tool_dir or TOOL_DIR
    package_dir = tool_dir / "node_modules" / name
    if _installed_version(package_dir) != version:
        _npm_install(tool_dir, f"{name}@{version}")
        if _installed_version(package_dir) != version:
            raise DevnetError(f"npm did not install {name}@{version} into {package_dir}")
    return package_dir


def ensure_anvil(tool_dir: Path | None = None) -> Path:
    """Path of an anvil binary: on PATH, in the tool folder, or freshly installed there."""
    on_path = shutil.which("anvil")
    if on_path:
        return Path(on_path)
    tool_dir = tool_dir or TOOL_DIR
    found = _tool_anvil(tool_dir)
    if found is not None:
        return found
    ensure_npm_package(ANVIL_PACKAGE, ANVIL_VERSION, tool_dir)
    found = _tool_anvil(tool_dir)
    if found is None:
        raise DevnetError(f"npm installed {ANVIL_PACKAGE} but no anvil binary is in {tool_dir}")
    return found


def _tool_anvil(tool_dir: Path) -> Path | None:
    """anvil in the tool folder: the native binary of the platform package when present
    (`.bin/anvil` is a node wrapper that would sit between us and the real process)."""
    modules = tool_dir / "node_modules"
    candidates = sorted(modules.glob("@foundry-rs/anvil-*/bin/anvil"))
    candidates.append(modules / ".bin" / "anvil")
    for binary in candidates:
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def ensure_openzeppelin(tool_dir: Path | None = None) -> Path:
    """The compiled OpenZeppelin contract artifacts folder (`build/contracts`)."""
    package = ensure_npm_package(OPENZEPPELIN_PACKAGE, OPENZEPPELIN_VERSION, tool_dir)
    return package / "build" / "contracts"


def _with_parent_death_signal(cmd: list[str]) -> list[str]:
    """Have anvil terminated when the process that started it dies without stopping it
    (kill -9, a crashed test run): `setpriv --pdeathsig` where util-linux has it."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *cmd] if setpriv else cmd


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the process group that `proc` leads (started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def damaged_state_path(state_path: Path) -> Path:
    """Where a damaged state file (or dump) is kept for inspection, out of anvil's way."""
    return state_path.with_name(state_path.stem + ".damaged.json")


def _wait_for_left_over(pid_path: Path | None, state_path: Path, within: float) -> str | None:
    """An anvil of an earlier run on `state_path` may still be alive: after its parent died
    (kill -9) it got SIGTERM and is writing its last dump. Wait for it; an orphan that does
    not exit is stopped; one whose parent still runs belongs to another stack: an error."""
    if pid_path is None or not pid_path.exists():
        return None
    try:
        fields = pid_path.read_text().split()
        proc = psutil.Process(int(fields[0]))
        if len(fields) > 1:  # pid and start time: the same process, not a reused pid
            same = abs(proc.create_time() - float(fields[1])) < 0.01
        else:
            same = str(state_path) in " ".join(proc.cmdline())
        if not same:
            raise psutil.NoSuchProcess(proc.pid)  # the pid was reused by something else
    except (ValueError, OSError, psutil.Error):
        pid_path.unlink(missing_ok=True)
        return None
    if _ended(proc, within):
        pid_path.unlink(missing_ok=True)
        return f"waited for anvil (pid {proc.pid}) of the previous run to write its state"
    parent = _parent(proc)
    if parent is not None and parent.pid != 1:
        raise DevnetError(
            f"anvil pid {proc.pid} (started by pid {parent.pid}) still runs on {state_path}: "
            "another chainstate is using this data dir; stop it first"
        )
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    _ended(proc, DEFAULT_STOP_TIMEOUT)
    pid_path.unlink(missing_ok=True)
    return f"stopped anvil (pid {proc.pid}) left over from the previous run"


def _ended(proc: psutil.Process, within: float) -> bool:
    """Wait until `proc` (not our child) has exited; a zombie counts as exited."""
    deadline = time.monotonic() + within
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _parent(proc: psutil.Process) -> psutil.Process | None:
    try:
        return proc.parent()
    except psutil.Error:
        return None


class AnvilProcess:
    """One anvil child process with an explicit lifecycle (`start`/`stop`, or `async with`).

    `block_time=None` means automine (one block per transaction; deterministic for tests).
    """

    def __init__(
        self,
        port: int,
        chain_id: int = 1337,
        block_time: float | None = None,
        genesis: Path | None = None,
        hardfork: str = "cancun",
        host: str = "127.0.0.1",
        state_path: Path | None = None,
        binary: Path | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        state_interval: float = DEFAULT_STATE_INTERVAL,
        state_history: int = DEFAULT_STATE_HISTORY,
        left_over_wait: float = LEFT_OVER_WAIT,
    ) -> None:
        self.port = port
        self.chain_id = chain_id
        self.block_time = block_time
        self.genesis = genesis
        self.hardfork = hardfork
        self.host = host
        self.state_path = state_path
        self.binary = binary
        self.start_timeout = start_timeout
        self.state_interval = state_interval
        self.state_history = state_history
        self.left_over_wait = left_over_wait
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def exit_code(self) -> int | None:
        """The started process's exit code once it has ended on its own (negative: the
        signal), else None (running, or never started)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def dump_path(self) -> Path | None:
        """Where anvil writes its state (the next start loads it once it is complete)."""
        return self._beside_state(".dump.json")

    @property
    def pid_path(self) -> Path | None:
        """The running anvil's pid, so the next start can wait for a left-over one."""
        return self._beside_state(".pid")

    def _beside_state(self, suffix: str) -> Path | None:
        if self.state_path is None:
            return None
        return self.state_path.with_name(self.state_path.stem + suffix)

    def command(self, binary: Path) -> list[str]:
        cmd = [str(binary), "--host", self.host, "--port", str(self.port)]
        cmd += ["--chain-id", str(self.chain_id), "--hardfork", self.hardfork]
        if self.block_time:
            cmd += ["--block-time", str(self.block_time)]
        if self.state_path is not None and self.state_path.exists():
            # anvil loads the file, and dumps into another one every state_interval seconds
            # and on exit, with the state of its recent blocks (bounded by --prune-history).
            cmd += ["--load-state", str(self.state_path), "--dump-state", str(self.dump_path)]
            cmd += ["--state-interval", str(max(1, round(self.state_interval)))]
            cmd += ["--preserve-historical-states", "--prune-history", str(self.state_history)]
        elif self.genesis is not None:
            cmd += ["--init", str(self.genesis)]
        return cmd

    def settle_previous(self) -> str | None:
        """Before a start on `state_path`: wait for an anvil of an earlier run that is still
        writing its last dump, then take that dump if it is complete. Returns a line to show
        when there was something to say."""
        if self.state_path is None:
            return None
        said = _wait_for_left_over(self.pid_path, self.state_path, self.left_over_wait)
        dump = self.dump_path
        assert dump is not None
        if dump.exists():
            try:
                orjson.loads(dump.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                damaged = damaged_state_path(self.state_path)
                dump.replace(damaged)  # the previous (complete) state file stays
                said = (
                    f"anvil's last dump was cut short (kept as {damaged.name}); "
                    "using the one before"
                )
            else:
                dump.replace(self.state_path)
        # Every reload adds a block 0 of anvil's own to its next dump: keep the chain's.
        pin_genesis(self.state_path, self.genesis)
        return said

    def start_blocking(self) -> None:
        """Start and wait without an event loop (session/module test fixtures use this)."""
        binary = self.binary or ensure_anvil()
        self.settle_previous()
        if self.state_path is not None and not self.state_path.exists():
            # anvil refuses --init together with --state: the first start runs from the
            # genesis file once, dumps it as the state file, then runs on that file.
            self._spawn(binary)
            self.dump_state()
            self.stop_blocking()
        self._spawn(binary)
        assert self._proc is not None
        log.info("anvil started", extra={"url": self.url, "pid": self._proc.pid})

    def _spawn(self, binary: Path) -> None:
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self._proc = subprocess.Popen(
            _with_parent_death_signal(self.command(binary)),
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a wrapper's child stops with it
        )
        self._record_pid(self._proc.pid)
        deadline = time.monotonic() + self.start_timeout
        try:
            while not self._probe():
                if time.monotonic() > deadline:
                    raise DevnetError(f"anvil did not answer within {self.start_timeout}s")
                time.sleep(0.05)
        except BaseException:
            self.stop_blocking()
            raise

    def _record_pid(self, pid: int) -> None:
        """Note the process as soon as it runs: a kill of ours while anvil still starts
        leaves an anvil that the next start must wait for (it holds the port, and dumps its
        state on the way out)."""
        if self.pid_path is None:
            return
        with contextlib.suppress(psutil.Error):
            self.pid_path.write_text(f"{pid} {psutil.Process(pid).create_time()!r}")

    async def start(self) -> None:
        await asyncio.to_thread(self.start_blocking)

    def _probe(self) -> bool:
        """True once our process answers eth_chainId with the expected chain id."""
        assert self._proc is not None
        if self._proc.poll() is not None:
            hint = ""
            if self.state_path is not None and self.state_path.exists():
                hint = f" (if its state file {self.state_path} is damaged, remove it)"
            raise DevnetError(f"anvil exited at start{hint}: {self.output_tail()}")
        # Another process may own the port: trust an answer only once ours has bound it.
        if "Listening on" not in self.output_tail(limit=1 << 20):
            return False
        try:
            got = int(self._rpc("eth_chainId", timeout=1.0), 16)
        except (OSError, ValueError, KeyError):
            return False
        if got != self.chain_id:
            raise DevnetError(f"anvil at {self.url} answers chain id {got}, not {self.chain_id}")
        return True

    def _rpc(self, method: str, timeout: float) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": []})
        req = urllib.request.Request(
            self.url, data=body.encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())["result"]

    def output_tail(self, limit: int = 2000) -> str:
        if self._output is None:
            return ""
        self._output.seek(0)
        return self._output.read().decode(errors="replace")[-limit:].strip()

    def dump_state(self) -> None:
        """Write anvil's state (blocks included) to `state_path`."""
        if self.state_path is None:
            return
        raw = bytes.fromhex(self._rpc("anvil_dumpState", timeout=30.0)[2:])
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_bytes(gzip.decompress(raw))
        tmp.replace(self.state_path)

    def stop_blocking(self) -> None:
        """SIGTERM (anvil then writes its state file, if any), SIGKILL after a grace time."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(DEFAULT_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            # A wrapper may exit before its child: make sure nothing of the group is left.
            _signal_group(proc, signal.SIGKILL)
        if proc is not None and self.pid_path is not None:
            self.pid_path.unlink(missing_ok=True)
        if self._output is not None:
            self._output.close()
            self._output = None

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_blocking)

    async def __aenter__(self) -> AnvilProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

"""Workspace fixtures: one real `chainstate workspace` process per test module and backend
(SQLite file, or a fresh PostgreSQL schema), a stand-in chain-state upstream (the bench's
fake node, a real HTTP JSON-RPC server), and a small HTTP client for the /v1 API."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import requests

from tests.conftest import free_port
from workspace import auth
from workspace.app import migrate_all
from workspace.db import Database, open_database
from workspace.settings import WorkspaceSettings

START_TIMEOUT = 20.0
FAKE_HEAD = 500  # the stand-in upstream's chain height


def pg_base_url() -> str | None:
    url = os.environ.get("CHAINSTATE_TEST_PG")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CHAINSTATE_TEST_PG is not set in CI: the PostgreSQL half must run")
        pytest.skip("CHAINSTATE_TEST_PG not set (./dev test starts PostgreSQL)")
    return url


@dataclass
class Api:
    """Calls the /v1 API as one credential; returns (HTTP status, envelope)."""

    base: str
    headers: dict[str, str]
    session: requests.Session

    def get(self, path: str, **params: Any) -> tuple[int, Any]:
        r = self.session.get(self.base + path, params=params, headers=self.headers, timeout=30)
        return r.status_code, r.json()

    def post(self, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        headers = {**self.headers, "Content-Type": "application/json"}
        data = raw if raw is not None else None
        r = self.session.post(
            self.base + path,
            json=None if raw is not None else (body or {}),
            data=data,
            headers=headers,
            timeout=30,
        )
        return r.status_code, r.json() if r.content else None

    def ok(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        status, env = self.get(path, **params) if method == "GET" else self.post(path, body)
        assert status == 200 and env["code"] == 0, (status, env)
        assert env["message"] == "ok"
        return env["data"]

    def as_(self, headers: dict[str, str]) -> Api:
        return Api(self.base, headers, self.session)


@dataclass
class Workspace:
    """A running workspace server and direct access to its database."""

    base: str
    settings: WorkspaceSettings
    proc: subprocess.Popen[bytes]
    args: list[str]
    db: Database
    alice: Api  # personal account owning the test Spaces
    bob: Api  # another personal account
    anon: Api  # no credentials
    ids: dict[str, str]
    secrets: dict[str, str]

    def stop(self) -> None:
        stop_proc(self.proc)

    def start(self) -> None:
        self.proc = start_proc(self.args, self.base)

    def api(self, secret: str, account: str | None) -> Api:
        headers = {"Authorization": f"Bearer {secret}"}
        if account:
            headers["X-Account-ID"] = account
        return self.alice.as_(headers)


def start_proc(args: list[str], base: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"workspace exited: {err}")
        try:
            if requests.get(base + "/v1/openapi.json", timeout=1).status_code == 200:
                return proc
        except requests.ConnectionError:
            time.sleep(0.05)
    stop_proc(proc)
    raise RuntimeError("workspace did not start")


def stop_proc(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr:
        proc.stderr.close()


@pytest.fixture(scope="session")
def upstream() -> Iterator[str]:
    """A stand-in for the routing proxy: the bench fake node answering JSON-RPC over HTTP."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench", "fake-node", "--port", str(port)]
    cmd += ["--head", str(FAKE_HEAD)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                requests.post(url + "/1337", json={}, timeout=1)
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        stop_proc(proc)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The database setting: "sqlite", or a URL to a fresh PostgreSQL schema (dropped after)."""
    if request.param == "sqlite":
        yield "sqlite"
        return
    with pg_schema() as url:
        yield url


@contextmanager
def pg_schema() -> Iterator[str]:
    """A URL to a fresh PostgreSQL schema of the test database, dropped afterwards."""
    base = pg_base_url()
    assert base is not None
    schema = "ws_" + uuid.uuid4().hex[:12]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def make_workspace(
    backend: str, data_dir: Path, upstream: str, extra_config: str = ""
) -> Workspace:
    port = free_port()
    config = data_dir / "ws.toml"
    config.write_text(f'data_dir = "."\n[workspace]\nport = {port}\n{extra_config}\n')
    settings = WorkspaceSettings.from_config(
        {"data_dir": str(data_dir), "workspace": {"port": port}}
    ).with_overrides(database=backend)
    db = open_database(settings)
    migrate_all(db)

    def setup(conn: Any) -> dict[str, str]:
        ids: dict[str, str] = {}
        for name in ("alice", "bob", "carol"):
            ids[name] = auth.create_account(conn, "personal", name, name.title())["id"]
        ids["org"] = auth.create_account(conn, "org", "acme", "Acme")["id"]
        auth.add_member(conn, ids["org"], ids["bob"])
        for name in ("alice", "bob", "carol"):
            ids[f"{name}_token"] = auth.create_credential(conn, "token", ids[name])[1]
        ids["alice_key"] = auth.create_credential(conn, "key", ids["alice"])[1]
        return ids

    ids = db.run_sync(setup)
    args = [
        sys.executable,
        "-m",
        "stack.cli",
        "workspace",
        "--config",
        str(config),
        "--database",
        backend,
        "--proxy-url",
        upstream,
        "--no-local-account",
    ]
    base = f"http://127.0.0.1:{port}"
    proc = start_proc(args, base)
    session = requests.Session()
    anon = Api(base, {}, session)
    ws = Workspace(base, settings, proc, args, db, anon, anon, anon, ids, {})
    ws.alice = ws.api(ids["alice_token"], ids["alice"])
    ws.bob = ws.api(ids["bob_token"], ids["bob"])
    return ws


@pytest.fixture(scope="module")
def ws(
    backend: str, tmp_path_factory: pytest.TempPathFactory, upstream: str
) -> Iterator[Workspace]:
    w = make_workspace(backend, tmp_path_factory.mktemp("ws"), upstream)
    try:
        yield w
    finally:
        w.stop()
        w.db.close_sync()


def uid(prefix: str = "s") -> str:
    """A fresh Space id so tests sharing a server do not interfere."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"

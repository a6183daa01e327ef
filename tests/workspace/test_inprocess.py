"""The `chainstate up` wiring: the workspace app forwarding /v1/chainstate in process to the
real routing proxy app (its engine), the proxy reaching a JSON-RPC node over HTTP; and the
local account/token that `chainstate up` prints."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from chainstate.config import ConfigError
from tests.workspace.conftest import FAKE_HEAD
from workspace.app import create_app, ensure_local_account
from workspace.settings import WorkspaceSettings


@pytest.fixture
async def stack(
    tmp_path: Path, upstream: str
) -> AsyncIterator[tuple[TestClient, WorkspaceSettings]]:
    from proxy.app import create_app as create_proxy_app
    from proxy.app import get_engine
    from proxy.settings import ProxySettings
    from proxy.store_file import FileStore

    config: dict[str, Any] = {
        "data_dir": str(tmp_path),
        "proxy": {"nodes": [{"chain": "1337", "key": "n1", "url": upstream, "kind": "state"}]},
        "workspace": {"port": 1},
    }
    proxy_app = create_proxy_app(
        ProxySettings.from_config(config), store=FileStore(tmp_path / "proxy-store.json")
    )
    proxy_server = TestServer(proxy_app)
    await proxy_server.start_server()

    async def forward(chain_id: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        return await get_engine(proxy_app).handle(chain_id, body, headers)

    settings = WorkspaceSettings.from_config(config)
    client = TestClient(TestServer(create_app(settings, chainstate_forward=forward)))
    await client.start_server()
    try:
        yield client, settings
    finally:
        await client.close()
        await proxy_server.close()


async def test_chainstate_in_process(stack: tuple[TestClient, WorkspaceSettings]) -> None:
    client, settings = stack
    account, token = ensure_local_account(settings)
    headers = {"Authorization": f"Bearer {token}", "X-Account-ID": account}
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
    resp = await client.post("/v1/chainstate/1337", json=body, headers=headers)
    assert resp.status == 200
    assert (await resp.json())["result"] == hex(FAKE_HEAD)
    resp = await client.post("/v1/chainstate/999", json=body, headers=headers)
    assert resp.status == 404  # the proxy's own answer for an unknown chain, passed through
    assert "error" in await resp.json()
    resp = await client.post("/v1/space/create", json={"id": "mine"}, headers=headers)
    assert (await resp.json())["data"]["account"]["slug"] == "local"


def test_local_account_is_stable(tmp_path: Path) -> None:
    settings = WorkspaceSettings.from_config({"data_dir": str(tmp_path)})
    first = ensure_local_account(settings)
    assert ensure_local_account(settings) == first  # same token after a restart
    mode = stat.S_IMODE(settings.local_token_file.stat().st_mode)
    assert mode == 0o600
    assert len(first[0]) == 32 and first[1].startswith("cspat_")


@pytest.mark.parametrize(
    "workspace",
    [
        {"bogus": 1},
        {"port": "80"},
        {"query_timeout_ms": 0},
        {"database": "mysql://x"},
        {"max_columns": True},
    ],
)
def test_settings_are_checked(workspace: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        WorkspaceSettings.from_config({"workspace": workspace})


def test_settings_defaults() -> None:
    s = WorkspaceSettings.from_config({"workspace": {"forward_timeout_s": 5}})
    assert s.forward_timeout_s == 5.0 and s.query_max_rows == 10000 and s.port == 8668


def test_unreachable_postgres_is_a_clear_config_error(tmp_path: Path) -> None:
    from tests.conftest import free_port
    from workspace.db import open_database

    url = f"postgresql://u:hunter2@127.0.0.1:{free_port()}/db"
    settings = WorkspaceSettings.from_config({"data_dir": str(tmp_path)}).with_overrides(
        database=url
    )
    with pytest.raises(ConfigError) as info:
        open_database(settings)
    assert "hunter2" not in str(info.value) and "cannot connect" in str(info.value)

"""Credentials, visibility and Spaces."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.workspace.conftest import Workspace, uid
from workspace import auth


def test_missing_and_bad_credentials(ws: Workspace) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer nope", "X-Account-ID": ws.ids["alice"]},
        {"Authorization": f"Bearer {ws.ids['alice_token']}"},  # no X-Account-ID
        {"Authorization": f"Basic {ws.ids['alice_token']}", "X-Account-ID": ws.ids["alice"]},
        {"Authorization": f"Bearer {ws.ids['alice_token']}", "AccessKey": ws.ids["alice_key"]},
    ):
        status, env = ws.anon.as_(headers).get("/v1/space/list")
        assert status == 401 and env["code"] == 40100 and env["data"] is None, headers
        assert env["message"]


def test_account_switch_needs_membership(ws: Workspace) -> None:
    status, env = ws.api(ws.ids["alice_token"], ws.ids["bob"]).get("/v1/space/list")
    assert status == 403 and env["code"] == 40300
    # bob is a member of the org: he may act as it
    as_org = ws.api(ws.ids["bob_token"], ws.ids["org"])
    space = as_org.ok("POST", "/v1/space/create", {"id": uid(), "visibility": "org"})
    assert space["account_id"] == ws.ids["org"]
    assert space["account"]["type"] == "org" and space["account"]["slug"] == "acme"


def test_access_key_reach(ws: Workspace) -> None:
    key = ws.anon.as_({"AccessKey": ws.ids["alice_key"]})
    status, env = key.get("/v1/space/list")
    assert status == 403 and "access keys reach only" in env["message"]
    status, env = key.post("/v1/space/create", {"id": uid()})
    assert status == 403
    wrong = ws.anon.as_({"AccessKey": ws.ids["alice_key"], "X-Account-ID": ws.ids["bob"]})
    status, env = wrong.post(
        "/v1/chainstate/1337", raw=b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}'
    )
    assert status == 403 and env["code"] == 40300


def test_revoked_token_and_cli(ws: Workspace) -> None:
    base = [sys.executable, "-m", "stack.cli", "token"]
    db_args = ["--data-dir", str(ws.settings.data_dir), "--database", ws.settings.database]
    out = subprocess.run(
        [*base, "create", "--account", ws.ids["carol"], "--name", "ci", *db_args],
        capture_output=True,
        text=True,
        check=True,
    )
    made = json.loads(out.stdout)
    carol = ws.api(made["token"], ws.ids["carol"])
    assert carol.ok("GET", "/v1/space/list")["items"] is not None
    listed = subprocess.run(
        [*base, "list", "--account", ws.ids["carol"], *db_args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert made["id"] in listed and made["token"] not in listed
    subprocess.run([*base, "revoke", made["id"], *db_args], check=True, capture_output=True)
    status, env = carol.get("/v1/space/list")
    assert status == 401 and "revoked" in env["message"]
    # tokens are stored hashed only
    row = ws.db.run_sync(lambda c: c.all("SELECT secret_hash FROM ws_credentials"))
    assert all(made["token"] not in r["secret_hash"] for r in row)
    assert any(r["secret_hash"] == auth.hash_secret(made["token"]) for r in row)


def test_space_create_get_list(ws: Workspace) -> None:
    a = ws.alice
    ids = [uid("l") for _ in range(3)]
    for i, sid in enumerate(ids):
        a.ok(
            "POST", "/v1/space/create", {"id": sid, "description": f"d{i}", "visibility": "public"}
        )
    got = a.ok("GET", "/v1/space", id=ids[0])
    assert got["id"] == ids[0] and got["description"] == "d0" and got["status"] == "active"
    assert got["dep_count"] == 0 and got["content_count"] == 0
    assert isinstance(got["created_at"], float)
    assert a.ok("GET", "/v1/space", id="does-not-exist") is None
    page = a.ok(
        "GET",
        "/v1/space/list",
        account_id=ws.ids["alice"],
        order_by="id",
        direction="asc",
        limit=1000,
    )
    mine = [s["id"] for s in page["items"]]
    assert mine == sorted(mine) and set(ids) <= set(mine)
    assert page["total_count"] == len(mine) and all("table_count" in s for s in page["items"])
    one = a.ok(
        "GET",
        "/v1/space/list",
        account_id=ws.ids["alice"],
        limit=1,
        start=1,
        order_by="id",
        direction="asc",
    )
    assert [s["id"] for s in one["items"]] == mine[1:2] and one["start"] == 1
    status, env = a.post("/v1/space/create", {"id": ids[0]})
    assert status == 409 and env["code"] == 40900


def test_space_validation(ws: Workspace) -> None:
    a = ws.alice
    cases = [
        ("GET", "/v1/space/list", {"limit": 0}),
        ("GET", "/v1/space/list", {"limit": 1001}),
        ("GET", "/v1/space/list", {"start": -1}),
        ("GET", "/v1/space/list", {"limit": "ten"}),
        ("GET", "/v1/space/list", {"order_by": "name"}),
        ("GET", "/v1/space/list", {"direction": "up"}),
        ("GET", "/v1/space/list", {"account_id": "ABC"}),
        ("GET", "/v1/space/list", {"bogus": 1}),
        ("GET", "/v1/space", {}),
        ("GET", "/v1/space", {"id": "x" * 65}),
        ("POST", "/v1/space/create", {"id": "Bad Id"}),
        ("POST", "/v1/space/create", {"id": ""}),
        ("POST", "/v1/space/create", {"id": uid(), "visibility": "secret"}),
        ("POST", "/v1/space/create", {"id": uid(), "description": "x" * 256}),
        ("POST", "/v1/space/create", {"id": 5}),
    ]
    for method, path, params in cases:
        status, env = a.get(path, **params) if method == "GET" else a.post(path, params)
        assert status == 400 and env["code"] == 40000 and env["data"] is None, (params, env)
    status, env = a.post("/v1/space/create", raw=b"{not json")
    assert status == 400 and env["code"] == 40001
    status, env = a.post("/v1/space/create", raw=b"[1]")
    assert status == 400 and env["code"] == 40001
    status, env = a.get("/v1/nope")
    assert status == 404 and env["code"] == 40400
    status, env = a.get("/v1/space/create")
    assert status == 405 and env["code"] == 40500
    r = a.session.post(
        a.base + "/v1/space/create",
        data="id=x",
        headers={**a.headers, "Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    assert r.status_code == 415 and r.json()["code"] == 41500
    big = b'{"id": "' + b"x" * (8 * 1024 * 1024) + b'"}'
    status, env = a.post("/v1/space/create", raw=big)
    assert status == 413 and env["code"] == 41300


def test_visibility(ws: Workspace) -> None:
    a, b = ws.alice, ws.bob
    priv, pub = uid("p"), uid("q")
    a.ok("POST", "/v1/space/create", {"id": priv, "visibility": "private"})
    a.ok("POST", "/v1/space/create", {"id": pub, "visibility": "public"})
    assert b.ok("GET", "/v1/space", id=priv) is None
    assert b.ok("GET", "/v1/space", id=pub)["id"] == pub
    seen = {s["id"] for s in b.ok("GET", "/v1/space/list", limit=1000)["items"]}
    assert pub in seen and priv not in seen
    # org Space: visible to members acting as themselves, not to outsiders
    org = ws.api(ws.ids["bob_token"], ws.ids["org"])
    osp = uid("o")
    org.ok("POST", "/v1/space/create", {"id": osp, "visibility": "org"})
    assert b.ok("GET", "/v1/space", id=osp)["id"] == osp
    assert a.ok("GET", "/v1/space", id=osp) is None
    # a public Space is read-only to others
    status, env = b.post("/v1/table/create", {"space": pub, "name": "x", "table_type": "normal"})
    assert status == 403 and env["code"] == 40300
    status, env = b.post("/v1/table/create", {"space": priv, "name": "x", "table_type": "normal"})
    assert status == 404 and env["code"] == 40400


def test_cli_accounts_and_access_keys(ws: Workspace) -> None:
    db_args = ["--data-dir", str(ws.settings.data_dir), "--database", ws.settings.database]
    cli = [sys.executable, "-m", "stack.cli"]

    def run(*args: str) -> dict:
        out = subprocess.run([*cli, *args, *db_args], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.splitlines()[-1])

    org = run("account", "create", "--type", "org", "--slug", uid("org"))
    dave = run("account", "create", "--slug", uid("dave"), "--member-of", org["id"])
    assert org["type"] == "org" and len(dave["id"]) == 32
    token = run("token", "create", "--account", dave["id"])["token"]
    key = run("access-key", "create", "--account", org["id"])["access_key"]
    as_org = ws.api(token, org["id"])
    as_org.ok("POST", "/v1/space/create", {"id": uid()})
    r = as_org.session.post(
        f"{ws.base}/v1/chainstate/1337",
        data=b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}',
        headers={"AccessKey": key, "X-Account-ID": org["id"]},
        timeout=10,
    )
    assert r.status_code == 200 and "result" in r.json()
    bad = subprocess.run(
        [*cli, "token", "create", "--account", "0" * 32, *db_args], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "does not exist" in bad.stderr
    dup = subprocess.run(
        [*cli, "account", "create", "--slug", "alice", *db_args], capture_output=True, text=True
    )
    assert dup.returncode == 1 and "already exists" in dup.stderr


def test_tables_rows_and_stats_follow_space_visibility(ws: Workspace) -> None:
    a, b = ws.alice, ws.bob
    priv, pub = uid("vp"), uid("vq")
    for sid, vis in ((priv, "private"), (pub, "public")):
        a.ok("POST", "/v1/space/create", {"id": sid, "visibility": vis})
        a.ok("POST", "/v1/table/create", {"space": sid, "name": "t", "table_type": "normal"})
        a.ok("POST", "/v1/table/init", {"id": f"{sid}.t"})
        a.ok("POST", "/v1/table/row/create", {"table_id": f"{sid}.t", "data": {"id": "r"}})
    reads = [
        ("GET", "/v1/table", {"id": "{t}"}),
        ("GET", "/v1/table/row/list", {"table_id": "{t}"}),
        ("POST", "/v1/table/row/get", {"table_id": "{t}", "pks": ["r"]}),
        ("POST", "/v1/table/row/query", {"table_id": "{t}", "sql": "SELECT * FROM t"}),
        ("GET", "/v1/table/stats/minute", {"id": "{t}"}),
        ("GET", "/v1/table/stats/daily", {"id": "{t}", "year": 2026}),
    ]
    for method, path, params in reads:
        for sid, want in ((priv, 404), (pub, 200)):
            filled = {
                k: (v.format(t=f"{sid}.t") if isinstance(v, str) else v) for k, v in params.items()
            }
            status, env = b.get(path, **filled) if method == "GET" else b.post(path, filled)
            assert status == want, (path, sid, env)
    listed = {t["id"] for t in b.ok("GET", "/v1/table/list", limit=100)["items"]}
    assert f"{pub}.t" in listed and f"{priv}.t" not in listed
    for path, body in (
        ("/v1/table/row/update", {"table_id": f"{pub}.t", "id": "r", "data": {}}),
        ("/v1/table/row/delete", {"table_id": f"{pub}.t", "id": "r"}),
        ("/v1/table/columns/update", {"id": f"{pub}.t", "columns": []}),
        ("/v1/table/indexes/update", {"id": f"{pub}.t", "indexes": []}),
        ("/v1/table/view/update", {"id": f"{pub}.t", "view": None}),
    ):
        status, env = b.post(path, body)
        assert status == 403 and env["code"] == 40300, path
    assert a.ok("POST", "/v1/table/row/get", {"table_id": f"{pub}.t", "pks": ["r"]})["rows"]

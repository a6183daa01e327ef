"""Lying replicas: the checker's verdicts take a diverged node out of rotation.

First against a fake checker (the proxy's side alone: verdicts, override, outage), then end to
end: three real state nodes, one fed a corrupted StateDiff by its source (as the checker's
own tests do), the real consistency checker, and the proxy reading `checker_status`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from chainstate.inproc import InprocRegistry
from nodes.checker.service import CheckerNode
from nodes.checker.settings import CheckerSettings
from nodes.state.service import StateNode
from nodes.state.vendor import compute_validation_hash
from proxy.settings import CheckerSource
from tests.conftest import free_port
from tests.nodes.test_state_chain import ChainSource, SyntheticChain, random_chain
from tests.proxy.conftest import fast_settings, wait_until
from tests.proxy.test_failsafe import load, node_of, pool_of


class FakeChecker:
    """Answers `checker_status` with the replicas' verdicts a test sets (tests only)."""

    def __init__(self) -> None:
        self.diverged: dict[str, int] = {}  # replica URL → height
        self.urls: list[str] = []
        self.down = False
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeChecker:
        app = web.Application()
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        if self.down:
            return web.Response(status=503)
        body = orjson.loads(await request.read())
        replicas = [
            {"replica": u, "up": True, "latest": 1000, "diverged_at": self.diverged.get(u)}
            for u in self.urls
        ]
        status = {"confirmed": 998, "disputed": None, "replicas": replicas}
        answer = {"jsonrpc": "2.0", "id": body["id"], "result": status}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")


@pytest.fixture
async def checker() -> AsyncIterator[FakeChecker]:
    fake = await FakeChecker().start()
    yield fake
    await fake.stop()


async def load_until_it_serves(api: Any, node: Any, rounds: int = 20) -> None:
    """Load in rounds until `node` serves some: a node back in rotation may first have to
    outlive the latency it showed on a busy machine (its cost decays), so no fixed count."""
    for _ in range(rounds):
        await load(api, 30, concurrency=3)
        if node.received:
            return
    raise AssertionError(f"{rounds * 30} requests and none reached {node.url}")


async def test_a_flagged_node_gets_no_traffic_until_cleared_or_overridden(
    make_api, fake_nodes, checker, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy")
    settings = fast_settings(
        checkers=(CheckerSource("1337", checker.url),),
        checker_poll_interval=0.05,
        latency_decay=0.5,  # a node back in rotation is not kept out by a busy moment's cost
    )
    api = await make_api(settings)
    a, liar, c = await pool_of(api, fake_nodes, "a", "liar", "c")
    checker.urls = [a.url, liar.url + "/", c.url]  # (a trailing slash is the same URL)
    await load(api, 30, concurrency=3)
    assert liar.received  # trusted: it takes its share
    checker.diverged[liar.url + "/"] = 42
    await wait_until(lambda: node_of(api, "liar").diverged is not None)
    liar.received.clear()
    answers = await load(api, 60, concurrency=3)
    assert all("result" in x for x in answers) and liar.received == []
    _, nodes = await api.get("/1337/getAllNodes")
    shown = {n["key"]: n for n in nodes["nodes"]}
    assert shown["liar"]["routable"] is False
    assert shown["liar"]["diverged"] == {"height": 42, "checker": checker.url}
    assert shown["a"]["diverged"] is None and shown["a"]["routable"] is True
    assert nodes["checker"]["confirmed"] == 998 and nodes["checker"]["error"] is None
    flagged = [r.getMessage() for r in caplog.records if "flags it as diverged" in r.getMessage()]
    assert len(flagged) == 1 and "height 42" in flagged[0]
    text = await (await api.client.get("/metrics")).text()
    assert 'chainstate_proxy_node_diverged{kind="state",node="liar",pool="1337"} 1.0' in text

    # The operator's override: the entry says ignore_checker.
    status, body = await api.post("/1337/updateNode/liar", {"ignore_checker": True})
    assert status == 200 and body["node"]["ignore_checker"] is True
    await load_until_it_serves(api, liar)  # routed again, verdict or not
    status, body = await api.post("/1337/updateNode/liar", {"ignore_checker": False})
    assert "ignore_checker" not in body["node"]  # stored only when set
    liar.received.clear()
    await load(api, 30, concurrency=3)
    assert liar.received == []

    # The checker goes away: its last verdicts stand.
    checker.down = True
    await wait_until(lambda: api.proxy.state.pools["1337"].verdicts["error"] is not None)
    await load(api, 30, concurrency=3)
    assert liar.received == []
    # It comes back and clears the node: back in rotation.
    checker.down = False
    del checker.diverged[liar.url + "/"]
    await wait_until(lambda: node_of(api, "liar").diverged is None)
    await load_until_it_serves(api, liar)
    outage = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(outage) == 1  # one line per outage, not per poll


def test_checker_sources_are_checked() -> None:
    from chainstate.config import ConfigError
    from proxy.settings import ProxySettings

    config = {"proxy": {"checkers": [{"chain": "0x539", "url": "http://127.0.0.1:8667"}]}}
    assert ProxySettings.from_config(config).checkers == (
        CheckerSource("1337", "http://127.0.0.1:8667"),
    )
    for bad in ({"chain": "x", "url": "http://c"}, {"chain": "1", "url": "ftp://c"}, {"url": 1}):
        with pytest.raises(ConfigError, match=r"proxy\.checkers"):
            ProxySettings.from_config({"proxy": {"checkers": [bad]}})


# ---- end to end: a state node fed a corrupted StateDiff -------------------------------------

BAD_AT = 8
LAST = BAD_AT + 6
FAST_NODE = {"poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.1}


def chains() -> tuple[SyntheticChain, SyntheticChain, str]:
    """A chain whose block BAD_AT pays an account 12345 (never touched again), and a copy
    where it pays 12346 (ValidationHash recomputed to fit, so the state node cannot tell)."""
    chain, addrs = random_chain(seed=71, blocks=BAD_AT)
    payee = "0x" + "77" * 20
    chain.add_block({payee: {"balance": 12345}})
    for _ in range(LAST - BAD_AT):
        chain.add_block({addrs[1]: {"nonce": len(chain.blocks)}})
    bad = SyntheticChain(chain.tag)
    bad.blocks, bad.states = list(chain.blocks), list(chain.states)
    block = copy.deepcopy(chain.blocks[BAD_AT])
    block["StateDiff"]["post"][payee]["balance"] = hex(12346)
    block["ValidationHash"] = compute_validation_hash(block["Header"], block["StateDiff"])
    bad.blocks[BAD_AT] = block
    return chain, bad, payee


class Counted:
    """An in-process node's handler that counts the data requests it answers (not the
    proxy's polls nor the checker's reads)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.data = 0

    async def __call__(self, body: bytes) -> bytes:
        if b"blockx_" not in body:
            self.data += 1
        return await self.handle(body)


async def test_a_corrupted_replica_stops_getting_traffic_once_the_checker_flags_it(
    make_api, tmp_path: Path
) -> None:
    chain, bad, payee = chains()
    registry = InprocRegistry()
    good_src, bad_src = ChainSource(chain, visible=BAD_AT - 1), ChainSource(bad, visible=BAD_AT - 1)
    registry.register("good", good_src.handle_body)
    registry.register("bad", bad_src.handle_body)
    made: list[Any] = []
    counted: list[Counted] = []
    try:
        for i, source in enumerate(("good", "good", "bad")):
            section = {"key": f"r{i}", "source": f"inproc://{source}", "kind": "archive"}
            node = StateNode.from_config(
                {**section, **FAST_NODE}, data_dir=tmp_path / f"r{i}", registry=registry
            )
            await node.start()
            made.append(node)
            await node.ingest.wait_for_height(BAD_AT - 1, within=10)
            count = Counted(node.handle_body)
            counted.append(count)
            registry.register(f"replica-{i}", count)
        urls = [f"inproc://replica-{i}" for i in range(3)]
        checker = CheckerNode(
            CheckerSettings(replicas=urls, poll_interval=0.05),
            data_dir=tmp_path / "checker",
            registry=registry,
        )
        await checker.start()
        made.append(checker)
        registry.register("checker", checker.handle_body)
        settings = fast_settings(
            checkers=(CheckerSource("1337", "inproc://checker"),), checker_poll_interval=0.05
        )
        api = await make_api(settings, registry=registry)
        for i, url in enumerate(urls):
            status, _ = await api.post("/1337/addNode", {"key": f"r{i}", "url": url})
            assert status == 201
        await api.heads_known("1337")

        wrong_before, wrong_after = [], []  # wrong answers to requests sent before/after
        flagged_at: list[int] = []  # the newest block when the proxy took the liar out
        good_at_flag: list[int] = []  # the good replicas' requests then
        liar = node_of(api, "r2")
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                if liar.diverged is not None and not flagged_at:
                    flagged_at.append(good_src.visible)
                    good_at_flag.append(counted[0].data + counted[1].data)
                sent_after = bool(flagged_at)
                _, answer = await api.rpc("1337", balance_of(payee))
                assert "result" in answer, answer
                if answer["result"] == hex(12346):
                    (wrong_after if sent_after else wrong_before).append(good_src.visible)

        clients = [asyncio.create_task(client()) for _ in range(4)]
        for height in range(BAD_AT, LAST + 1):  # a block every 0.3 s
            good_src.visible = bad_src.visible = height
            await asyncio.sleep(0.3)
        before = counted[2].data
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*clients)

        assert checker.health()["diverged"] == {"inproc://replica-2": BAD_AT}
        assert flagged_at, "the proxy never took the liar out"
        # Out of rotation within 2 blocks of the checker confirming BAD_AT (the first height
        # at which it can tell), and nothing wrong served from then on.
        assert flagged_at[0] <= BAD_AT + 2, flagged_at
        assert wrong_after == []
        assert counted[2].data == before  # no traffic at all once flagged
        # The good replicas carried the traffic of the blocks after the flag (the latency-aware
        # choice may favour one of them for a whole run; the response cache answers repeated
        # reads of one block, so count from the flag, while blocks still arrive).
        assert counted[0].data + counted[1].data > good_at_flag[0]
        await api.proxy.verdicts.close()
    finally:
        for item in reversed(made):
            await item.close()


def balance_of(address: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [address, "latest"]}

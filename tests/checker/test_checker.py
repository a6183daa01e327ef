"""The checker confirms what a quorum of replicas agree on, and nothing else.

Replicas here are in-process models answering the two `blockx_*` methods the checker
reads; the end-to-end test with real state nodes lives with the write pipeline tests.
"""

from __future__ import annotations

import orjson
import pytest

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import Dispatcher, JsonRpcError
from nodes.checker.confirm import Vote, decide
from nodes.checker.service import CheckerNode
from nodes.checker.settings import CheckerSettings


def bhash(tag: str, height: int) -> str:
    return "0x" + f"{tag}{height:x}".encode().hex().ljust(64, "0")[:64]


def vhash(tag: str, height: int) -> str:
    return "0x" + (f"{height:016x}" + tag.encode().hex()).ljust(64, "e")[:64]


class Replica:
    """A state replica's view: height → (id, parent_id, validation_hash)."""

    def __init__(self, registry: InprocRegistry, name: str, head: int, tag: str = "a") -> None:
        self.name, self.earliest, self.down = name, 0, False
        self.refuse_below: int | None = None  # blockx_getValidation below it fails
        self.blocks: dict[int, tuple[str, str, str]] = {}
        self.extend(tag, 0, head)
        d = Dispatcher(name)
        d.update({"blockx_range": self._range, "blockx_getValidation": self._validation})
        self.dispatcher = d
        self.url = registry.register(name, self._body)

    def extend(self, tag: str, start: int, end: int) -> None:
        for h in range(start, end + 1):
            parent = self.blocks[h - 1][0] if h > 0 else "0x" + "00" * 32
            self.blocks[h] = (bhash(tag, h), parent, vhash(tag, h))
        for h in [h for h in self.blocks if h > end]:
            del self.blocks[h]

    def prune(self, earliest: int) -> None:
        """A `state` replica's window moved: heights below `earliest` are gone."""
        self.earliest = earliest
        for h in [h for h in self.blocks if h < earliest]:
            del self.blocks[h]

    def corrupt(self, height: int) -> None:
        bid, parent, _ = self.blocks[height]
        self.blocks[height] = (bid, parent, vhash("bad", height))

    async def _body(self, body: bytes) -> bytes:
        if self.down:
            raise ConnectionError("replica down")
        return await self.dispatcher.handle_body(body)

    async def _range(self, params):
        return {"earliest": self.earliest, "latest": max(self.blocks)}

    async def _validation(self, params):
        start, count = params
        if self.refuse_below is not None and start < self.refuse_below:
            raise JsonRpcError(-32603, "replica failed")
        return [
            {"height": h, "id": b[0], "parent_id": b[1], "validation_hash": b[2]}
            for h in range(start, start + count)
            if (b := self.blocks.get(h))
        ]


@pytest.fixture
def registry() -> InprocRegistry:
    return InprocRegistry()


async def make_checker(registry, replicas, tmp_path, quorum=0) -> CheckerNode:
    settings = CheckerSettings(replicas=[r.url for r in replicas], quorum=quorum, poll_interval=60)
    node = CheckerNode(settings, data_dir=tmp_path, registry=registry)
    await node.start()
    return node


async def rpc(node: CheckerNode, method: str, *params):
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    answer = orjson.loads(await node.handle_body(body))
    if "error" in answer:
        raise JsonRpcError(answer["error"]["code"], answer["error"]["message"])
    return answer["result"]


async def settle(node: CheckerNode, rounds: int = 5) -> None:
    for _ in range(rounds):
        await node.poller.poll_once()


def metric(node: CheckerNode, name: str, **labels) -> float | None:
    return node.metrics_registry.get_sample_value(name, labels or None)


async def test_agreeing_replicas_are_confirmed(registry, tmp_path):
    reps = [Replica(registry, f"r{i}", head=12) for i in range(3)]
    node = await make_checker(registry, reps, tmp_path)
    try:
        await settle(node)
        latest = await rpc(node, "getLatestBlock")
        assert latest == {
            "id": bhash("a", 12),
            "num": 12,
            "validation_hash": int(vhash("a", 12)[2:18], 16),
            "is_fork": False,
        }
        assert (await rpc(node, "getBlockByHeight", 3))["id"] == bhash("a", 3)
        assert (await rpc(node, "getBlockByHeight", "0x3"))["num"] == 3
        assert (await rpc(node, "getBlockById", bhash("a", 7)))["num"] == 7
        assert await rpc(node, "blockIsValid", bhash("a", 7)) is True
        assert metric(node, "checker_confirmed_height") == 12
        assert metric(node, "checker_confirmation_lag_blocks") == 0
    finally:
        await node.close()


async def test_corrupted_replica_is_reported_not_confirmed(registry, tmp_path):
    good, bad = Replica(registry, "good", head=8), Replica(registry, "bad", head=8)
    bad.corrupt(5)
    node = await make_checker(registry, [good, bad], tmp_path)  # majority of 2 = 2
    try:
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 4
        with pytest.raises(JsonRpcError) as err:
            await rpc(node, "getBlockByHeight", 5)
        assert err.value.code == -39005
        assert metric(node, "checker_disagreements_total") == 1  # counted once, not per round
        assert metric(node, "checker_confirmation_lag_blocks") == 4
        # Reported, with what each replica holds: GET /health and a gauge.
        assert metric(node, "checker_disputed_height") == 5
        health = node.health()
        assert health["status"] == "disagreement" and health["confirmed"] == 4
        assert health["disagreement"]["height"] == 5
        held = {v["replica"]: v["validation_hash"] for v in health["disagreement"]["votes"]}
        assert held == {good.url: vhash("a", 5), bad.url: vhash("bad", 5)}
        bad.extend("a", 0, 8)  # the replica is repaired (re-synced)
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 8
        assert node.health() == {
            "status": "ok",
            "confirmed": 8,
            "disagreement": None,
            "diverged": {},  # no quorum found either replica wrong: neither is flagged
        }
        assert metric(node, "checker_disputed_height") == -1
    finally:
        await node.close()


async def test_minority_corruption_and_fork_lose(registry, tmp_path):
    reps = [Replica(registry, f"r{i}", head=8) for i in range(3)]
    reps[1].corrupt(5)
    reps[2].extend("z", 6, 8)  # r2 forked from height 6
    node = await make_checker(registry, reps, tmp_path, quorum=2)
    try:
        await node.poller.poll_once()
        assert (await rpc(node, "getLatestBlock"))["num"] == 8
        fork = await rpc(node, "getBlockById", bhash("z", 6))
        assert fork["is_fork"] is True and fork["num"] == 6
        assert await rpc(node, "blockIsValid", bhash("z", 6)) is False
        assert await rpc(node, "blockIsValid", bhash("a", 6)) is True
        assert metric(node, "checker_disagreements_total") == 4  # heights 5, 6, 7, 8
    finally:
        await node.close()


async def test_diverged_replica_flagged(registry, tmp_path):
    reps = [Replica(registry, f"r{i}", head=3) for i in range(3)]
    reps[2].corrupt(3)
    node = await make_checker(registry, reps, tmp_path)
    try:
        await node.poller.poll_once()
        assert metric(node, "checker_replica_diverged", replica=reps[2].url) == 1
        assert (await rpc(node, "getLatestBlock"))["num"] == 3
    finally:
        await node.close()


async def test_divergence_below_the_head_stays_visible(registry, tmp_path):
    """A replica that disagrees at one height of a round is still flagged after the round
    confirmed the later heights it agrees on."""
    reps = [Replica(registry, f"r{i}", head=10) for i in range(3)]
    reps[2].corrupt(5)
    node = await make_checker(registry, reps, tmp_path)
    try:
        await node.poller.poll_once()
        assert (await rpc(node, "getLatestBlock"))["num"] == 10
        assert metric(node, "checker_replica_diverged", replica=reps[2].url) == 1
        assert metric(node, "checker_replica_diverged", replica=reps[0].url) == 0
        assert metric(node, "checker_replica_disagreements_total", replica=reps[2].url) == 1
        assert metric(node, "checker_replica_disagreements_total", replica=reps[0].url) is None
        for r in reps:
            r.extend("a", 11, 12)
        await node.poller.poll_once()  # a round where every replica agrees clears the flag
        assert metric(node, "checker_replica_diverged", replica=reps[2].url) == 0
        assert node.health()["status"] == "ok"
        # ... but the replica still holds the wrong block 5 (and the state it produced): the
        # verdict the proxy follows stays until it holds the confirmed block there again.
        assert metric(node, "checker_replica_diverged_at", replica=reps[2].url) == 5
        assert node.health()["diverged"] == {reps[2].url: 5}
        status = await rpc(node, "checker_status")
        by_replica = {r["replica"]: r for r in status["replicas"]}
        assert status["confirmed"] == 12 and status["disputed"] is None
        assert by_replica[reps[2].url] == {
            "replica": reps[2].url,
            "up": True,
            "latest": 12,
            "diverged_at": 5,
        }
        assert by_replica[reps[0].url]["diverged_at"] is None
        reps[2].extend("a", 0, 12)  # resynced
        await node.poller.poll_once()
        assert metric(node, "checker_replica_diverged_at", replica=reps[2].url) == -1
        assert (await rpc(node, "checker_status"))["replicas"][2]["diverged_at"] is None
    finally:
        await node.close()


async def test_a_diverged_verdict_survives_a_restart(registry, tmp_path):
    reps = [Replica(registry, f"r{i}", head=6) for i in range(3)]
    reps[1].corrupt(4)
    node = await make_checker(registry, reps, tmp_path)
    try:
        await node.poller.poll_once()
        assert node.health()["diverged"] == {reps[1].url: 4}
    finally:
        await node.close()
    node = await make_checker(registry, reps, tmp_path)
    try:
        assert (await rpc(node, "checker_status"))["replicas"][1]["diverged_at"] == 4
        with pytest.raises(JsonRpcError) as err:
            await rpc(node, "checker_status", 1)
        assert err.value.code == -39005
    finally:
        await node.close()


async def test_lagging_replica_holds_back_only_below_quorum(registry, tmp_path):
    a, b, c = (Replica(registry, n, head=10) for n in "abc")
    c.extend("a", 0, 6)
    node = await make_checker(registry, [a, b, c], tmp_path)
    try:
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 10
    finally:
        await node.close()
    node = await make_checker(registry, [a, b, c], tmp_path / "all", quorum=3)
    try:
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 6
        c.extend("a", 7, 10)
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 10
    finally:
        await node.close()


async def test_replica_down(registry, tmp_path):
    a, b, c = (Replica(registry, n, head=5) for n in "abc")
    c.down = True
    node = await make_checker(registry, [a, b, c], tmp_path)
    try:
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 5
        assert metric(node, "checker_replica_up", replica=c.url) == 0
        b.down = True  # below quorum: nothing new is confirmed, nothing is lost
        a.extend("a", 6, 9)
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 5
    finally:
        await node.close()


async def test_restart_keeps_confirmations(registry, tmp_path):
    reps = [Replica(registry, f"r{i}", head=6) for i in range(2)]
    node = await make_checker(registry, reps, tmp_path)
    await settle(node)
    await node.close()
    for r in reps:
        r.extend("a", 7, 9)
    node = await make_checker(registry, reps, tmp_path)
    try:
        assert (await rpc(node, "getLatestBlock"))["num"] == 6  # before any poll
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 9
    finally:
        await node.close()


async def test_reorg_below_confirmed_height(registry, tmp_path):
    reps = [Replica(registry, f"r{i}", head=10) for i in range(2)]
    node = await make_checker(registry, reps, tmp_path)
    try:
        await settle(node)
        for r in reps:
            r.extend("y", 9, 11)
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["id"] == bhash("y", 11)
        assert (await rpc(node, "getBlockByHeight", 9))["id"] == bhash("y", 9)
        assert await rpc(node, "blockIsValid", bhash("a", 10)) is False
        assert metric(node, "checker_reorgs_total") == 2
    finally:
        await node.close()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "Parse error"),
        (b"[]", "empty batch"),
        (b'{"jsonrpc":"2.0","id":1,"method":"getBlockByHeight","params":[-1]}', "invalid height"),
        (b'{"jsonrpc":"2.0","id":1,"method":"getBlockByHeight","params":["x"]}', "invalid height"),
        (b'{"jsonrpc":"2.0","id":1,"method":"getBlockByHeight","params":[99]}', "not a confirmed"),
        (b'{"jsonrpc":"2.0","id":1,"method":"getBlockById","params":["0x12"]}', "invalid block"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"blockIsValid","params":["0x' + b"1" * 64 + b'"]}',
            "unknown",
        ),
        (b'{"jsonrpc":"2.0","id":1,"method":"getLatestBlock","params":[]}', "no block"),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[]}', "Method not found"),
        (b'{"jsonrpc":"2.0","id":1,"method":"getBlockById","params":[1,2]}', "too many"),
    ],
)
async def test_every_error_is_39005(registry, tmp_path, body, fragment):
    node = await make_checker(registry, [Replica(registry, "r", head=0)], tmp_path)
    try:
        answer = orjson.loads(await node.handle_body(body))
        answer = answer[0] if isinstance(answer, list) else answer
        assert answer["error"]["code"] == -39005
        assert fragment in answer["error"]["message"]
    finally:
        await node.close()


def test_decide_quorum_rules():
    def v(replica, bid="b", vh="v"):
        return Vote(replica, 1, bid, "p", vh)

    assert decide([v("a"), v("b")], 2, 3).winner is not None
    assert decide([v("a"), v("b", vh="w")], 2, 2).winner is None
    d = decide([v("a"), v("b"), v("c", bid="x")], 2, 3)
    assert [x.replica for x in d.losers] == ["c"] and d.final
    assert decide([], 1, 1).winner is None


def test_settings_validation():
    from chainstate.config import ConfigError

    with pytest.raises(ConfigError):
        CheckerSettings.from_section({"replicas": []})
    with pytest.raises(ConfigError):
        CheckerSettings.from_section({"replicas": ["http://x"], "quorum": 2})
    with pytest.raises(ConfigError):
        CheckerSettings.from_section({"replicas": ["http://x"], "bogus": 1})
    s = CheckerSettings.from_section({"replicas": ["a", "b", "c"], "listen": ":9000"})
    assert (s.host, s.port, s.effective_quorum) == ("", 9000, 2)


async def test_reorg_to_a_shorter_chain_marks_the_lost_blocks_at_once(registry, tmp_path):
    """A write node rolled back after its execution client restarted on a shorter chain:
    the replicas follow it below the confirmed head. The lost blocks are marked is_fork in
    the next round, without waiting for the new chain to grow past the old head."""
    reps = [Replica(registry, f"r{i}", head=10) for i in range(2)]
    node = await make_checker(registry, reps, tmp_path)
    try:
        await settle(node)
        for r in reps:
            r.extend("z", 8, 8)  # the chain is now a0..a7, z8: shorter, with another 8
        await node.poller.poll_once()
        assert (await rpc(node, "getLatestBlock"))["id"] == bhash("z", 8)
        for h in (8, 9, 10):
            lost = await rpc(node, "getBlockById", bhash("a", h))
            assert lost["is_fork"] is True and lost["num"] == h
            assert await rpc(node, "blockIsValid", bhash("a", h)) is False
        assert await rpc(node, "blockIsValid", bhash("a", 7)) is True
        assert metric(node, "checker_reorgs_total") == 3
    finally:
        await node.close()


async def test_replicas_only_behind_keep_the_confirmed_blocks(registry, tmp_path):
    """Replicas restarted behind the confirmed head on the same chain are not a reorg."""
    reps = [Replica(registry, f"r{i}", head=10) for i in range(2)]
    node = await make_checker(registry, reps, tmp_path)
    try:
        await settle(node)
        for r in reps:
            r.extend("a", 0, 6)  # same blocks, fewer of them
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["id"] == bhash("a", 10)
        assert await rpc(node, "blockIsValid", bhash("a", 9)) is True
        assert metric(node, "checker_reorgs_total") in (None, 0.0)
    finally:
        await node.close()


async def pruned_past_the_checker(registry, tmp_path, states: int, archives: int, quorum=0):
    """`states` state replicas and `archives` archive replicas at head 4, confirmed by a
    checker; then the chain grows to 12 at once and the state replicas keep 9..12 only."""
    states_ = [Replica(registry, f"s{i}", head=4) for i in range(states)]
    archives_ = [Replica(registry, f"a{i}", head=4) for i in range(archives)]
    node = await make_checker(registry, [*states_, *archives_], tmp_path, quorum=quorum)
    await settle(node, 1)
    assert (await rpc(node, "getLatestBlock"))["num"] == 4
    for r in (*states_, *archives_):
        r.extend("a", 5, 12)
    for r in states_:
        r.prune(9)
    return node, states_, archives_


async def test_holders_of_pruned_heights_that_disagree_are_a_dispute(registry, tmp_path):
    """Heights 5..8 only the two archives hold (quorum 3 of 4): at 6 they hold the same
    block with other validation hashes, so nothing is confirmed by descent; the dispute is
    reported as at any height, and confirmation goes on once it is resolved."""
    node, _, archives = await pruned_past_the_checker(registry, tmp_path, 2, 2, quorum=3)
    try:
        archives[1].corrupt(6)
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 4
        health = node.health()
        assert health["status"] == "disagreement" and health["disagreement"]["height"] == 6
        archives[1].extend("a", 0, 12)  # resynced
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 12
        assert node.health()["status"] == "ok"
        assert metric(node, "checker_bridged_heights_total") == 4
    finally:
        await node.close()


async def test_a_holder_without_the_quorums_ancestor_is_a_dispute(registry, tmp_path):
    """The archive, the only replica still holding 5..8, holds at 7 another block than the
    one the quorum-confirmed 9 descends from: nothing is confirmed below 9 on its word."""
    node, _, archives = await pruned_past_the_checker(registry, tmp_path, 1, 1)
    try:
        _, parent, _ = archives[0].blocks[7]
        archives[0].blocks[7] = (bhash("z", 7), parent, vhash("z", 7))
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 4
        assert node.health()["disagreement"]["height"] == 7
        assert metric(node, "checker_skipped_heights_total") == 0
    finally:
        await node.close()


async def test_a_holder_that_does_not_answer_is_waited_for(registry, tmp_path):
    node, _, archives = await pruned_past_the_checker(registry, tmp_path, 1, 1)
    try:
        archives[0].refuse_below = 9  # it answers its range, not the heights below 9
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 4
        assert metric(node, "checker_skipped_heights_total") == 0
        archives[0].refuse_below = None
        await settle(node)
        assert (await rpc(node, "getLatestBlock"))["num"] == 12
    finally:
        await node.close()


async def test_a_reorg_below_heights_a_quorum_no_longer_holds(registry, tmp_path):
    """The replicas reorganised from height 3 while the state replica pruned to 9: the
    archive's blocks link the quorum's 9 down to y3, whose parent is a2, so a3 and a4 are
    demoted and 3..12 of the new chain confirmed."""
    state, archive = Replica(registry, "s", head=4), Replica(registry, "a", head=4)
    node = await make_checker(registry, [state, archive], tmp_path)
    try:
        await settle(node, 1)
        for r in (state, archive):
            r.extend("y", 3, 12)
        state.prune(9)
        await settle(node, 6)
        assert (await rpc(node, "getLatestBlock"))["id"] == bhash("y", 12)
        assert (await rpc(node, "getBlockByHeight", 3))["id"] == bhash("y", 3)
        assert (await rpc(node, "getBlockByHeight", 2))["id"] == bhash("a", 2)
        assert await rpc(node, "blockIsValid", bhash("a", 4)) is False
        assert await rpc(node, "blockIsValid", bhash("a", 3)) is False
        assert metric(node, "checker_reorgs_total") == 2
        assert metric(node, "checker_bridged_heights_total") == 9 - 3
    finally:
        await node.close()

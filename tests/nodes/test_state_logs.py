"""eth_getLogs on the state node: answers against a model of the chain's logs, reorgs, the
state window, limits, bad inputs, tampered receipts, and stores from before the log index.

The synthetic chain's blocks carry receipts with logs (a few emitters, topics drawn from a
small pool so filters overlap) and the matching header `logsBloom`; the model answer of a
filter is every log of the range that `LogFilter.matches`, in chain order.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from chainstate.inproc import InprocRegistry
from chainstate.logfilter import parse_filter
from nodes.state import logs as logs_module
from nodes.state.blocklogs import _bloom_bits
from nodes.state.service import StateNode
from nodes.state.store import StateStore
from nodes.state.vendor import keccak256, parse_vendor_block
from tests.nodes.test_state_chain import ChainSource, SyntheticChain, make_addresses

FAST = {"poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.1}
EMITTERS = make_addresses(4, "emitter")
TOPIC_POOL = [["0x" + keccak256(f"t{i}:{v}".encode()).hex() for v in range(4)] for i in range(4)]
_ids = itertools.count(1)


class LogChain(SyntheticChain):
    """A synthetic chain whose blocks have transactions with logs."""

    def add_logs_block(self, rng: random.Random, accounts: list[str]) -> None:
        block = self.add_block({rng.choice(accounts): {"balance": rng.randrange(1, 10**20)}})
        header = block["Header"]
        receipts, position, bloom = [], 0, 0
        for t in range(rng.randint(0, 3)):
            tx_hash = "0x" + keccak256(f"{header['hash']}:{t}".encode()).hex()
            logs = []
            for _ in range(rng.randint(0, 3)):
                count = rng.randint(0, 4)
                log = {
                    "address": rng.choice(EMITTERS),
                    "topics": [rng.choice(TOPIC_POOL[i]) for i in range(count)],
                    "data": "0x" + rng.randbytes(rng.choice([0, 32, 64])).hex(),
                    "blockHash": header["hash"],
                    "blockNumber": header["number"],
                    "blockTimestamp": header["timestamp"],
                    "transactionHash": tx_hash,
                    "transactionIndex": hex(t),
                    "logIndex": hex(position),
                    "removed": False,
                }
                position += 1
                bloom |= _bloom_bits(bytes.fromhex(log["address"][2:]))
                for topic in log["topics"]:
                    bloom |= _bloom_bits(bytes.fromhex(topic[2:]))
                logs.append(log)
            receipts.append({"transactionHash": tx_hash, "logs": logs})
        header["logsBloom"] = "0x" + bloom.to_bytes(256, "big").hex()
        self.set_receipts(block, receipts)

    def logs(self) -> list[tuple[int, dict[str, Any]]]:
        return [
            (height, log)
            for height, block in enumerate(self.blocks)
            for receipt in block["BlockFile"]["receipts"]
            for log in receipt["logs"]
        ]

    def fork(self, height: int, tag: str) -> LogChain:
        other = LogChain(tag)
        other.blocks = self.blocks[: height + 1]
        other.states = self.states[: height + 1]
        return other


def log_chain(seed: int, blocks: int, tag: str = "main") -> tuple[LogChain, list[str]]:
    rng = random.Random(seed)
    accounts = make_addresses(4, f"payer{seed}")
    chain = LogChain(tag)
    chain.add_block({a: {"balance": 10**18} for a in accounts})
    for _ in range(blocks - 1):
        chain.add_logs_block(rng, accounts)
    return chain, accounts


def model(chain: LogChain, flt: dict[str, Any], start: int, end: int) -> list[dict[str, Any]]:
    parsed = parse_filter(flt)
    return [log for h, log in chain.logs() if start <= h <= end and parsed.matches(log)]


def random_filter(rng: random.Random) -> dict[str, Any]:
    """Addresses: omitted, null, one, a list (maybe empty); topics: positions of null, one
    topic, OR-lists (maybe with null inside, maybe empty), trailing nulls."""
    flt: dict[str, Any] = {}
    shape = rng.randrange(5)
    if shape == 1:
        flt["address"] = rng.choice(EMITTERS)
    elif shape == 2:
        flt["address"] = rng.sample(EMITTERS, rng.randint(0, 3))
    elif shape == 3:
        flt["address"] = None
    if rng.random() < 0.8:
        topics: list[Any] = []
        for i in range(rng.randint(0, 4)):
            kind = rng.randrange(5)
            if kind == 0:
                topics.append(None)
            elif kind == 1:
                topics.append(rng.choice(TOPIC_POOL[i]))
            elif kind == 2:
                topics.append(rng.sample(TOPIC_POOL[i], rng.randint(1, 3)))
            elif kind == 3:
                topics.append([rng.choice(TOPIC_POOL[i]), None])
            else:
                topics.append([])
        flt["topics"] = topics
    return flt


async def call(node: StateNode, method: str, params: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
    return orjson.loads(await node.handle_body(orjson.dumps(body)))


async def get_logs(node: StateNode, flt: dict[str, Any]) -> list[dict[str, Any]]:
    answer = await call(node, "eth_getLogs", [flt])
    assert "error" not in answer, (flt, answer)
    return answer["result"]


async def error(node: StateNode, params: Any) -> tuple[int, str]:
    answer = await call(node, "eth_getLogs", params)
    assert "error" in answer, (params, answer)
    return answer["error"]["code"], answer["error"]["message"]


@pytest.fixture
async def make_node(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    nodes: list[StateNode] = []

    async def make(chain: SyntheticChain, key: str = "n", **settings: Any) -> StateNode:
        registry = InprocRegistry()
        source = ChainSource(chain)
        registry.register("writer", source.handle_body)
        section = {"key": key, "source": "inproc://writer", **FAST, **settings}
        node = StateNode.from_config(section, data_dir=tmp_path / key, registry=registry)
        node.test_source = source  # type: ignore[attr-defined]
        await node.start()
        nodes.append(node)
        await node.ingest.wait_for_height(chain.head, within=30)
        return node

    yield make
    for node in nodes:
        if node._started:  # a test may have closed (and restarted) it
            await node.close()


@pytest.mark.parametrize("inline", [(128, 256), (8, 3)], ids=["defaults", "small-inline-limits"])
async def test_answers_equal_the_model_for_a_grid_of_filters(
    make_node: Any, monkeypatch: pytest.MonkeyPatch, inline: tuple[int, int]
) -> None:
    """Small queries are answered on the loop, larger ones (by range or by logs) in a
    thread: the same answers either way."""
    monkeypatch.setattr(logs_module, "INLINE_BLOCKS", inline[0])
    monkeypatch.setattr(logs_module, "INLINE_LOGS", inline[1])
    chain, _ = log_chain(seed=1, blocks=60)
    assert len(chain.logs()) > 100
    node = await make_node(chain, kind="archive")
    rng = random.Random(7)
    head = chain.head
    ranges = [(0, head), (1, 1), (5, 20), (head, head), (head - 10, head), (30, 31)]
    checked = 0
    for start, end in ranges:
        for _ in range(25):
            flt = random_filter(rng) | {"fromBlock": hex(start), "toBlock": hex(end)}
            assert await get_logs(node, flt) == model(chain, flt, start, end), flt
            checked += 1
    # Tags: omitted = latest; earliest = 0; a block by hash.
    assert await get_logs(node, {}) == model(chain, {}, head, head)
    got = await get_logs(node, {"fromBlock": "earliest", "toBlock": "latest"})
    assert got == model(chain, {}, 0, head) and len(got) == len(chain.logs())
    for height in (3, 17, head):
        block_hash = chain.blocks[height]["Header"]["hash"]
        flt = {"blockHash": block_hash, "address": EMITTERS[:2]}
        assert await get_logs(node, flt) == model(chain, flt, height, height)
    # Mixed case in the request matches the lowercase logs, as in geth/anvil.
    upper = {"address": EMITTERS[0].upper().replace("0X", "0x"), "fromBlock": "0x0"}
    assert await get_logs(node, upper) == model(chain, {"address": EMITTERS[0]}, 0, head)
    assert checked == 150


async def test_a_reorg_replaces_the_logs_of_the_dropped_blocks(make_node: Any) -> None:
    chain, accounts = log_chain(seed=2, blocks=30)
    node = await make_node(chain, kind="archive")
    orphan = chain.blocks[25]["Header"]["hash"]
    fork = chain.fork(22, "side")
    rng = random.Random(5)
    for _ in range(10):
        fork.add_logs_block(rng, accounts)
    node.test_source.chain = fork
    await node.ingest.wait_for_height(fork.head, within=30)
    for _ in range(200):  # until the node holds the fork's head block
        if node.store.hash_at(fork.head) == fork.blocks[-1]["Header"]["hash"]:
            break
        await asyncio.sleep(0.02)
    everything = {"fromBlock": "0x0", "toBlock": hex(fork.head)}
    assert await get_logs(node, everything) == model(fork, everything, 0, fork.head)
    code, message = await error(node, [{"blockHash": orphan}])
    assert code == -39006 and "unknown block" in message


async def test_a_state_node_answers_inside_its_window_and_prunes_the_index(
    make_node: Any,
) -> None:
    chain, _ = log_chain(seed=3, blocks=80)
    node = await make_node(chain, kind="state", window=16)
    earliest = chain.head - 15
    inside = {"fromBlock": hex(earliest), "toBlock": "latest"}
    assert await get_logs(node, inside) == model(chain, inside, earliest, chain.head)
    for flt in (
        {"fromBlock": hex(earliest - 1)},
        {"fromBlock": "earliest", "toBlock": hex(earliest + 2)},
        {"blockHash": chain.blocks[3]["Header"]["hash"]},  # known, below the window
        {"fromBlock": hex(chain.head), "toBlock": hex(chain.head + 1)},  # beyond the head
    ):
        code, message = await error(node, [flt])
        assert code == -39006, (flt, message)
    # Only the window's logs are left in the index.
    env = node.logs.index.env
    with env.begin() as txn:
        stored = txn.stat(env.open_db(b"logs", txn=txn))["entries"]
        keys = txn.stat(env.open_db(b"logkeys", txn=txn))["entries"]
    in_window = [log for h, log in chain.logs() if h >= earliest]
    assert stored == len(in_window)
    assert keys == sum(1 + len(log["topics"]) for log in in_window)


async def test_limits_are_named_settings_with_a_clear_error(make_node: Any) -> None:
    chain, _ = log_chain(seed=4, blocks=40)
    limits = {"max_blocks_per_query": 10, "max_logs_per_response": 5, "max_log_query_list": 3}
    node = await make_node(chain, kind="archive", logs=limits)
    code, message = await error(node, [{"fromBlock": "0x1", "toBlock": "0xb"}])
    assert code == -32005 and "max block range 10" in message and "max_blocks_per_query" in message
    counts = [sum(len(r["logs"]) for r in b["BlockFile"]["receipts"]) for b in chain.blocks]
    small = next(h for h in range(1, 40) if 0 < counts[h] <= 5)
    assert len(await get_logs(node, {"fromBlock": hex(small), "toBlock": hex(small)})) > 0
    # Too many logs: the error names the limit and a range that fits.
    start = next(h for h in range(1, 30) if sum(counts[h : h + 10]) > 5 and counts[h] <= 5)
    code, message = await error(node, [{"fromBlock": hex(start), "toBlock": hex(start + 9)}])
    assert code == -32005 and "max results 5" in message and "max_logs_per_response" in message
    retry = message.rsplit("range ", 1)[1].split("-")
    fits = {"fromBlock": retry[0], "toBlock": retry[1]}
    assert len(await get_logs(node, fits)) <= 5
    code, message = await error(node, [{"address": EMITTERS}])
    assert code == -32005 and "max_log_query_list" in message
    code, _ = await error(node, [{"topics": [TOPIC_POOL[0]]}])
    assert code == -32005


BAD_INPUTS: list[tuple[Any, int, str]] = [
    ([{"fromBlock": "0x5", "toBlock": "0x2"}], -32602, "invalid block range params"),
    ([{"fromBlock": "latest", "toBlock": "0x2"}], -32602, "invalid block range params"),
    ([{"blockHash": "0x" + "11" * 32, "fromBlock": "0x1"}], -32602, "cannot specify both"),
    ([{"blockHash": "0x" + "11" * 32, "toBlock": "latest"}], -32602, "cannot specify both"),
    ([{"blockHash": "0x1234"}], -32602, "invalid blockHash"),
    ([{"topics": "0x12"}], -32602, "invalid topics"),
    ([{"topics": [[["0x" + "11" * 32]]]}], -32602, "invalid topic(s)"),
    ([{"topics": ["0x1234"]}], -32602, "invalid topic(s)"),
    ([{"topics": [None] * 5}], -32602, "exceed max topics"),
    ([{"topics": [{"a": 1}]}], -32602, "invalid topic(s)"),
    ([{"address": "0x12"}], -32602, "invalid address"),
    ([{"address": 5}], -32602, "invalid address"),
    ([{"address": ["0x" + "11" * 20, None]}], -32602, "invalid address"),
    ([{"fromBlock": "foo"}], -39007, "invalid fromBlock"),
    ([{"toBlock": 5}], -39007, "invalid toBlock"),
    ([{"fromBlock": {"blockNumber": "0x1"}}], -39007, "invalid fromBlock"),
    ([{"foo": 1}], -32602, "unknown field `foo`"),
    (["0x1"], -32602, "invalid filter"),
    ([], -32602, "missing required parameter: filter"),
    ([{}, {}], -32602, "too many params"),
]


async def test_bad_inputs_are_refused_like_geth_and_change_nothing(make_node: Any) -> None:
    chain, _ = log_chain(seed=5, blocks=20)
    node = await make_node(chain, kind="archive")
    before = await get_logs(node, {"fromBlock": "0x0"})
    for params, code, text in BAD_INPUTS:
        got_code, message = await error(node, params)
        assert (got_code, text in message) == (code, True), (params, got_code, message)
    assert await get_logs(node, {"fromBlock": "0x0"}) == before
    # What geth and anvil accept as wildcards.
    for flt in ({"address": []}, {"topics": [[]]}, {"topics": [[None]]}, {"topics": []}):
        assert await get_logs(node, flt | {"fromBlock": "0x0"}) == before, flt


async def test_receipts_that_do_not_fit_the_header_are_refused(make_node: Any) -> None:
    chain, accounts = log_chain(seed=6, blocks=10)
    rng = random.Random(1)
    while not chain.blocks[-1]["BlockFile"]["receipts"] or not chain.logs()[-1:]:
        chain.add_logs_block(rng, accounts)
    tampered = orjson.loads(orjson.dumps(chain.blocks[-1]))
    log = next(lg for r in tampered["BlockFile"]["receipts"] for lg in r["logs"])
    log["address"] = "0x" + "ee" * 20  # not in the header's bloom
    with pytest.raises(ValueError, match="logsBloom"):
        parse_vendor_block(tampered)
    log["address"] = EMITTERS[0].upper()  # not the encoding the node answers
    with pytest.raises(ValueError, match="lowercase"):
        parse_vendor_block(tampered)
    good_head = chain.head - 1
    chain.blocks[-1] = tampered
    node = await make_node(chain.fork(good_head, "main"), kind="archive")
    node.test_source.chain = chain
    for _ in range(100):
        if node.ingest.last_error:
            break
        await asyncio.sleep(0.02)
    assert "lowercase" in node.ingest.last_error
    assert node.store.bounds()[1] == good_head


def _apply_without_index(path: Path, chain: SyntheticChain) -> None:
    """A store filled by a state node from before the log index."""
    store = StateStore(path, kind="archive")
    store.open()
    for raw in chain.blocks:
        store.apply(parse_vendor_block(raw))
    store.close()


async def test_a_store_from_before_the_index_is_backfilled(make_node: Any, tmp_path: Path) -> None:
    chain, _ = log_chain(seed=7, blocks=50)
    old = chain.fork(39, "main")
    _apply_without_index(tmp_path / "old" / "lmdb", old)
    node = await make_node(chain, key="old", kind="archive")
    everything = {"fromBlock": "0x0", "toBlock": hex(chain.head)}
    for _ in range(500):
        if node.logs.backfill.done:
            break
        await asyncio.sleep(0.02)
    assert node.logs.backfill.done
    assert await get_logs(node, everything) == model(chain, everything, 0, chain.head)


async def test_a_range_not_indexed_yet_is_sent_elsewhere(tmp_path: Path) -> None:
    chain, _ = log_chain(seed=8, blocks=30)
    _apply_without_index(tmp_path / "old" / "lmdb", chain)
    registry = InprocRegistry()
    registry.register("writer", ChainSource(chain).handle_body)
    section = {"key": "old", "kind": "archive", "source": "inproc://writer", **FAST,
               "logs": {"backfill": False}}  # fmt: skip
    node = StateNode.from_config(section, data_dir=tmp_path / "old", registry=registry)
    await node.start()
    try:
        code, message = await error(node, [{"fromBlock": "0x0"}])
        assert code == -39006 and "no indexed logs yet" in message
    finally:
        await node.close()


async def test_the_index_survives_a_restart(make_node: Any, tmp_path: Path) -> None:
    chain, _ = log_chain(seed=9, blocks=25)
    node = await make_node(chain, key="again", kind="archive")
    await node.close()
    node = await make_node(chain, key="again", kind="archive")
    everything = {"fromBlock": "0x0", "toBlock": "latest"}
    assert await get_logs(node, everything) == model(chain, everything, 0, chain.head)
    assert node.logs.backfill._todo() is None


async def test_small_queries_are_answered_by_the_port_without_waiting(
    make_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small eth_getLogs is answered by the port's read loop (`answer_now`, no await),
    alone or in a batch with plain reads; a large one (by range or by logs) and a malformed
    one are answered the usual way, with the same answers. The proxy in the same process is
    not given eth_getLogs (it routes ranges itself)."""
    monkeypatch.setattr(logs_module, "INLINE_BLOCKS", 8)
    monkeypatch.setattr(logs_module, "INLINE_LOGS", 3)
    chain, accounts = log_chain(seed=10, blocks=40)
    node = await make_node(chain, kind="archive")
    head = chain.head

    def body(flt: Any, rid: int = 1) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": rid, "method": "eth_getLogs", "params": [flt]}

    def one(h: int) -> dict[str, Any]:
        return {"fromBlock": hex(h), "toBlock": hex(h)}

    at = next(h for h in range(head, 0, -1) if 1 <= len(model(chain, one(h), h, h)) <= 3)
    small = one(at)
    assert len(model(chain, small, at, at)) <= 3
    now = node.answer_now(orjson.dumps(body(small)))
    assert now is not None
    assert orjson.loads(now)["result"] == model(chain, small, at, at)
    balance = {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance",
               "params": [accounts[0], hex(head)]}  # fmt: skip
    batch = orjson.loads(node.answer_now(orjson.dumps([body(small), balance])) or b"null")
    assert [a["id"] for a in batch] == [1, 2] and "result" in batch[1]
    assert node.answer_items([body(small)]) is None  # the proxy's: plain reads only

    wide = {"fromBlock": "0x0", "toBlock": hex(head)}  # past INLINE_BLOCKS
    many = {"fromBlock": hex(head - 7), "toBlock": hex(head)}  # past INLINE_LOGS, in range
    assert len(model(chain, many, head - 7, head)) > 3
    for flt, lo in ((wide, 0), (many, head - 7)):
        assert node.answer_now(orjson.dumps(body(flt))) is None
        answers = orjson.loads(await node.handle_body(orjson.dumps([body(flt), balance])))
        assert answers[0]["result"] == model(chain, flt, lo, head)
        assert answers[1]["result"] == batch[1]["result"]

    bad = orjson.loads(node.answer_now(orjson.dumps(body({"fromBlock": "foo"}))) or b"null")
    assert bad["error"]["code"] == -39007
    outside = orjson.loads(node.answer_now(orjson.dumps(body(one(head + 1)))) or b"null")
    assert outside["error"]["code"] == -39006


async def test_a_port_read_after_a_commit_sees_the_new_block(make_node: Any) -> None:
    """The port's reads between two writes share the store's kept read transaction (and the
    log index cursor kept with it): once ingest commits, the same one-block queries of one
    emitter and a balance read answer from the new blocks: one replacing the head (a
    reorg) and one above the old head."""
    rng = random.Random(3)
    emitter = {"address": EMITTERS[0]}
    chain, accounts = log_chain(seed=12, blocks=20)
    while not model(chain, emitter, chain.head, chain.head):
        chain.add_logs_block(rng, accounts)  # a head block with the emitter's logs
    node = await make_node(chain, kind="archive")
    head = chain.head

    def one(height: int, rid: int) -> dict[str, Any]:
        flt = {**emitter, "fromBlock": hex(height), "toBlock": hex(height)}
        return {"jsonrpc": "2.0", "id": rid, "method": "eth_getLogs", "params": [flt]}

    balance = {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance",
               "params": [accounts[0], "latest"]}  # fmt: skip
    body = orjson.dumps([one(head, 1), one(head + 1, 2), balance])

    def port() -> list[dict[str, Any]]:
        raw = node.answer_now(body)
        assert raw is not None
        return orjson.loads(raw)

    first = port()
    assert first[0]["result"] == model(chain, emitter, head, head) != []
    assert first[1]["error"]["code"] == -39006  # not there yet
    assert first[2]["result"] == hex(chain.state(head)[accounts[0]].balance)

    fork = chain.fork(head - 1, "fork")
    while model(fork, emitter, head, head) in ([], first[0]["result"]):
        fork = chain.fork(head - 1, "fork")
        fork.add_logs_block(rng, accounts)  # other logs of the emitter in the head block
    while not model(fork, emitter, head + 1, head + 1):
        fork = fork.fork(head, "fork")
        fork.add_logs_block(rng, accounts)  # and a block above with some: the longer chain
    node.test_source.chain = fork  # type: ignore[attr-defined]
    await node.ingest.wait_for_height(head + 1, within=30)
    after = port()
    assert after[0]["result"] == model(fork, emitter, head, head)
    assert after[1]["result"] == model(fork, emitter, head + 1, head + 1)
    assert after[2]["result"] == hex(fork.state(head + 1)[accounts[0]].balance)


async def test_one_block_queries_equal_the_model_with_the_limits_of_any_range(
    make_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query over one block (by number, by hash or as `latest`) with one address or topic
    per criterion is read from that block's keys alone: every block of the chain answers as
    the model, through the port's loop and the dispatcher alike, and the logs limit, the
    inline budget and the covered range apply as to any range."""
    monkeypatch.setattr(logs_module, "INLINE_LOGS", 2)
    chain, _ = log_chain(seed=11, blocks=60)
    node = await make_node(chain, kind="archive", logs={"max_logs_per_response": 3})
    head = chain.head
    shapes: list[dict[str, Any]] = [
        {"address": EMITTERS[0]},
        {"address": EMITTERS[1], "topics": [TOPIC_POOL[0][1]]},
        {"topics": [TOPIC_POOL[0][2]]},
        {"topics": [None, TOPIC_POOL[1][0]]},
        {"address": [EMITTERS[2]], "topics": [TOPIC_POOL[0][0], None, [TOPIC_POOL[2][3]]]},
    ]
    seen = {"loop": 0, "dispatcher": 0, "too many": 0}
    for height in range(head + 1):
        for shape in shapes:
            for flt in (
                shape | {"fromBlock": hex(height), "toBlock": hex(height)},
                shape | {"blockHash": chain.blocks[height]["Header"]["hash"]},
            ):
                want = model(chain, flt, height, height)
                body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getLogs", "params": [flt]}
                raw = orjson.dumps(body)
                now, answer = node.answer_now(raw), orjson.loads(await node.handle_body(raw))
                if len(want) > 3:  # the limit: this block alone has more
                    seen["too many"] += 1
                    assert answer["error"]["code"] == -32005, flt
                    assert f"block {height:#x} alone has more" in answer["error"]["message"]
                    assert now is None  # (past INLINE_LOGS first: the dispatcher says so)
                    continue
                assert answer["result"] == want, flt
                if len(want) > 2:  # past INLINE_LOGS: answered by the dispatcher
                    seen["dispatcher"] += 1
                    assert now is None, flt
                else:
                    seen["loop"] += 1
                    assert orjson.loads(now or b"null")["result"] == want, flt
    assert min(seen.values()) > 0, seen
    latest = {"fromBlock": "latest", "toBlock": "latest"} | shapes[2]
    assert await get_logs(node, latest) == model(chain, latest, head, head)
    # A block the node does not hold: -39006, so the proxy asks another node.
    beyond = shapes[1] | {"fromBlock": hex(head + 1), "toBlock": hex(head + 1)}
    code, _ = await error(node, [beyond])
    assert code == -39006


async def test_a_poll_block_by_block_answers_and_refuses_as_a_new_filter(make_node: Any) -> None:
    """A filter that differs from one seen before only in its blocks (a dapp polling each new
    block) is answered from the criteria parsed then, with the blocks' own checks: the same
    answers, and the same errors in the same order, as a filter never seen."""
    chain, _ = log_chain(seed=12, blocks=30)
    node = await make_node(chain, kind="archive")
    head = chain.head
    criteria = [
        {"address": EMITTERS[3], "topics": [TOPIC_POOL[0][0]]},
        {"topics": [None, [TOPIC_POOL[1][1], TOPIC_POOL[1][2]]]},
        {"address": EMITTERS[:2]},
    ]
    for shape in criteria:
        for start in range(head + 1):
            for end in (start, min(start + 3, head)):
                flt = shape | {"fromBlock": hex(start), "toBlock": hex(end)}
                assert await get_logs(node, flt) == model(chain, flt, start, end), flt
        tail = shape | {"fromBlock": hex(head - 2)}  # toBlock omitted: latest
        assert await get_logs(node, tail) == model(chain, tail, head - 2, head)
        # The blocks' errors, with the criteria's kept: as a filter never seen.
        for blocks, code, text in (
            ({"fromBlock": "foo", "toBlock": "0x1"}, -39007, "invalid fromBlock"),
            ({"fromBlock": "0x1", "toBlock": 5}, -39007, "invalid toBlock"),
            ({"fromBlock": "0x5", "toBlock": "0x2"}, -32602, "invalid block range params"),
            ({"fromBlock": hex(head + 1), "toBlock": hex(head + 1)}, -39006, "outside"),
            ({"fromBlock": "0x1", "blockHash": "0x" + "11" * 32}, -32602, "cannot specify both"),
        ):
            got_code, message = await error(node, [shape | blocks])
            assert (got_code, text in message) == (code, True), (shape, blocks, message)
    # Criteria that fail are refused before the blocks, whichever blocks come with them.
    for blocks in ({"fromBlock": "0x1", "toBlock": "0x1"}, {"fromBlock": "foo"}):
        code, message = await error(node, [{"address": "0x12"} | blocks])
        assert code == -32602 and "invalid address" in message
        code, message = await error(node, [blocks | {"foo": 1}])
        assert code == -32602 and "unknown field `foo`" in message


async def test_kept_filters_that_differ_in_what_they_select_answer_apart(make_node: Any) -> None:
    """Parsed filters are kept by their JSON: filters that differ only in one selecting detail
    (an address list or a single one, a null or nested OR in the topics, a block by hash or
    by number) each answer their own logs, through the port's loop and the dispatcher, on
    first ask and again once kept; a bad filter like a kept one still answers its error."""
    chain, _ = log_chain(seed=13, blocks=30)
    node = await make_node(chain, kind="archive")
    t0, t1 = TOPIC_POOL[0][0], TOPIC_POOL[0][1]
    criteria: list[dict[str, Any]] = [
        {"address": EMITTERS[0]},
        {"address": [EMITTERS[0]]},
        {"address": [EMITTERS[0], EMITTERS[1]]},
        {"address": EMITTERS[0].upper().replace("0X", "0x")},
        {"topics": [t0]},
        {"topics": [[t0, t1]]},
        {"topics": [None, t0]},
        {"topics": [t0, None]},
        {"topics": [[t0], None, [TOPIC_POOL[2][0]]]},
        {},
    ]

    def distinct(h: int) -> int:
        return len({orjson.dumps(model(chain, c, h, h)) for c in criteria})

    height = max(range(chain.head + 1), key=distinct)
    assert distinct(height) >= 5  # the filters do select different logs
    one = {"fromBlock": hex(height), "toBlock": hex(height)}
    by_hash = {"blockHash": chain.blocks[height]["Header"]["hash"]}
    for _ in range(2):  # the second round is answered from kept filters
        for flt in [c | ends for c in criteria for ends in (one, by_hash)]:
            want = model(chain, flt, height, height)
            body = orjson.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "eth_getLogs", "params": [flt]}
            )
            now = node.answer_now(body)
            assert now is not None and orjson.loads(now)["result"] == want, flt
            assert orjson.loads(await node.handle_body(body))["result"] == want, flt
    bad = {"address": EMITTERS[0][:-1], **one}  # one hex digit short of a kept filter's
    code, _ = await error(node, [bad])
    assert code == -32602

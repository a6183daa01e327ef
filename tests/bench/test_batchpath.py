"""`python -m bench.batchpath` / `bench.inproccount` with `--method eth_getStorageAt`: the
storage reads `bench suite state` sends, answered with real values of the synthetic chain."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.batchpath import FAKE_HEAD, at_head
from bench.batchpath import main as batchpath
from bench.inproccount import read_bodies
from bench.nodereads import STORAGE_CONTRACT, STORAGE_SLOTS, bodies, synthetic_node


async def test_storage_bodies_read_written_slots_of_the_storage_contract(tmp_path: Path) -> None:
    """Slots 0..16 of one contract at random heights, as the suite's `storage*` cases; the
    synthetic chain writes them, so nearly every answer is a non-zero word (only slots not
    yet written at the lowest heights read zero)."""
    node, accounts = await synthetic_node(tmp_path, 60, {"map_size_mb": 64, "hot_blocks": 16})
    try:
        assert STORAGE_CONTRACT not in accounts
        batches = bodies("eth_getStorageAt", 10, 59, [STORAGE_CONTRACT], 20)
        singles = read_bodies("eth_getStorageAt", 100, 59, accounts)
        for payloads in (batches, singles):
            answers, slots = [], set()
            for body in payloads:
                sent = orjson.loads(body)
                sent = sent if type(sent) is list else [sent]
                got = orjson.loads(node.answer_now(body))
                got = got if type(got) is list else [got]
                assert [a["id"] for a in got] == [s["id"] for s in sent]
                assert {s["params"][0] for s in sent} == {STORAGE_CONTRACT}
                slots |= {int(s["params"][1], 16) for s in sent}
                answers += [int(a["result"], 16) for a in got]
            assert slots == set(range(STORAGE_SLOTS))
            assert sum(1 for value in answers if value) >= 0.9 * len(answers)
    finally:
        await node.close()


def test_batchpath_runs_the_storage_bodies_through_the_proxy(capsys) -> None:
    """Every answer is checked to be a batch of results with the request's ids."""
    argv = ["--path", "proxy", "--method", "eth_getStorageAt", "--batch", "10", "-n", "20"]
    assert batchpath([*argv, "--blocks", "40", "--settle", "0.3"]) == 0
    assert "proxy batch 10: 20 bodies" in capsys.readouterr().out


def test_head_bodies_have_exactly_k_items_at_the_head() -> None:
    """`--head K`: K items of each body name the fake node's head, the rest one below it;
    ids, methods and addresses as drawn."""
    items = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [f"0x{i:040x}", h]}
        for i, h in enumerate([hex(FAKE_HEAD)] * 3 + [hex(FAKE_HEAD - 5)] * 97)
    ]
    body = orjson.dumps(items)
    for k in (0, 1, 4):
        got = orjson.loads(at_head(body, k, 3))
        at = [it["params"][1] for it in got]
        assert at.count(hex(FAKE_HEAD)) == k
        assert set(at) <= {hex(FAKE_HEAD), hex(FAKE_HEAD - 1), hex(FAKE_HEAD - 5)}
        assert [(it["id"], it["params"][0]) for it in got] == [
            (it["id"], it["params"][0]) for it in items
        ]

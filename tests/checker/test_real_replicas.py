"""The checker over real state nodes, one of them fed a corrupted StateDiff by its write node.

The corrupted block carries a ValidationHash recomputed over the corrupted diff, so the state
node has no way to tell and applies it: only comparing replicas catches it.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from chainstate.inproc import InprocRegistry
from nodes.checker.service import CheckerNode
from nodes.checker.settings import CheckerSettings
from nodes.state.service import StateNode
from nodes.state.vendor import compute_validation_hash
from tests.checker.test_checker import metric, rpc, settle
from tests.nodes.test_state_chain import ChainSource, SyntheticChain, random_chain

FAST = {"poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.1}
BAD_AT = 9


def chain_and_corrupted(seed: int) -> tuple[SyntheticChain, SyntheticChain]:
    """A chain whose block BAD_AT pays an account, and a copy where it pays 1 wei more
    (ValidationHash recomputed to fit)."""
    chain, addrs = random_chain(seed=seed, blocks=BAD_AT)
    chain.add_block({addrs[0]: {"balance": 12345}})
    bad = SyntheticChain(chain.tag)
    bad.blocks, bad.states = list(chain.blocks), list(chain.states)
    block = copy.deepcopy(chain.blocks[BAD_AT])
    block["StateDiff"]["post"][addrs[0]]["balance"] = hex(12346)
    block["ValidationHash"] = compute_validation_hash(block["Header"], block["StateDiff"])
    bad.blocks[BAD_AT] = block
    return chain, bad


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Any]:
    made: list[StateNode | CheckerNode] = []

    async def make(registry: InprocRegistry, sources: list[str]) -> CheckerNode:
        urls = []
        for i, source in enumerate(sources):
            section = {"key": f"replica-{i}", "source": source, "kind": "archive", **FAST}
            node = StateNode.from_config(section, data_dir=tmp_path / f"r{i}", registry=registry)
            await node.start()
            made.append(node)
            await node.ingest.wait_for_height(BAD_AT, within=10)
            urls.append(f"inproc://replica-{i}")
        settings = CheckerSettings(replicas=urls, poll_interval=60)
        checker = CheckerNode(settings, data_dir=tmp_path / "checker", registry=registry)
        await checker.start()
        made.append(checker)
        return checker

    yield make
    for node in reversed(made):
        await node.close()


def sources(chain: SyntheticChain, bad: SyntheticChain) -> InprocRegistry:
    registry = InprocRegistry()
    registry.register("good", ChainSource(chain, visible=BAD_AT).handle_body)
    registry.register("bad", ChainSource(bad, visible=BAD_AT).handle_body)
    return registry


async def test_two_replicas_one_corrupted_is_reported_not_confirmed(replicas) -> None:
    chain, bad = chain_and_corrupted(61)
    checker = await replicas(sources(chain, bad), ["inproc://good", "inproc://bad"])
    await settle(checker)
    latest = await rpc(checker, "getLatestBlock")
    assert latest["num"] == BAD_AT - 1  # everything below is confirmed, the bad height not
    assert latest["id"] == chain.blocks[BAD_AT - 1]["Header"]["hash"]
    health = checker.health()
    assert health["status"] == "disagreement" and health["disagreement"]["height"] == BAD_AT
    held = {v["replica"]: v["validation_hash"] for v in health["disagreement"]["votes"]}
    assert held == {
        "inproc://replica-0": chain.blocks[BAD_AT]["ValidationHash"],
        "inproc://replica-1": bad.blocks[BAD_AT]["ValidationHash"],
    }
    assert metric(checker, "checker_disputed_height") == BAD_AT
    assert metric(checker, "checker_disagreements_total") == 1


async def test_a_corrupted_minority_is_outvoted_and_flagged(replicas) -> None:
    chain, bad = chain_and_corrupted(62)
    good = ["inproc://good", "inproc://good"]
    checker = await replicas(sources(chain, bad), [*good, "inproc://bad"])
    await settle(checker)
    latest = await rpc(checker, "getLatestBlock")
    assert latest["num"] == BAD_AT
    assert latest["validation_hash"] == int(chain.blocks[BAD_AT]["ValidationHash"][2:18], 16)
    assert metric(checker, "checker_replica_diverged", replica="inproc://replica-2") == 1
    assert metric(checker, "checker_replica_diverged", replica="inproc://replica-0") == 0
    assert metric(checker, "checker_replica_disagreements_total", replica="inproc://replica-2") == 1
    assert checker.health()["status"] == "ok"

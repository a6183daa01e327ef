"""The checker over real state nodes when a `state` replica prunes heights it has not
confirmed yet: a burst of blocks (anvil_mine) or a slow checker moves the replica's window
past the checker's next height, so fewer than a quorum of replicas will ever hold those
heights again. Confirmation must go on (docs/checker.md, "Heights a quorum no longer
holds")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import JsonRpcError
from nodes.checker.service import CheckerNode
from nodes.checker.settings import CheckerSettings
from nodes.state.service import StateNode
from tests.checker.test_checker import metric, rpc, settle
from tests.nodes.test_state_chain import ChainSource, SyntheticChain, random_chain

FAST = {"poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.1}
WINDOW = 16
FIRST = 4  # the height the checker confirmed before the burst
BURST = 20  # blocks mined at once (anvil_mine 20)
HEAD = FIRST + BURST


class Stack:
    """Real state nodes fed by one source in process, and a checker over them."""

    def __init__(self, tmp_path: Path, chain: SyntheticChain) -> None:
        self.tmp_path = tmp_path
        self.source = ChainSource(chain, visible=FIRST)
        self.registry = InprocRegistry()
        self.registry.register("source", self.source.handle_body)
        self.nodes: list[StateNode] = []
        self.checker: CheckerNode | None = None

    async def node(self, kind: str, source: str = "source") -> str:
        """A replica of `kind` ingesting from the registered `source`; its URL."""
        i = len(self.nodes)
        self.nodes.append(await self._start(i, kind, source))
        return f"inproc://replica-{i}"

    async def _start(self, i: int, kind: str, source: str = "source") -> StateNode:
        section: dict[str, Any] = {"key": f"replica-{i}", "source": f"inproc://{source}"}
        section.update(kind=kind, window=WINDOW, **FAST)
        path = self.tmp_path / f"r{i}"
        node = StateNode.from_config(section, data_dir=path, registry=self.registry)
        await node.start()
        return node

    async def stop(self, i: int) -> None:
        """Replica `i` stops answering (its process is down)."""
        await self.nodes[i].close()

    async def restart(self, i: int) -> None:
        """Replica `i` answers again, from its data dir, and catches up with the source."""
        self.nodes[i] = await self._start(i, self.nodes[i].settings.kind)
        await self.nodes[i].ingest.wait_for_height(self.source.head, within=20)

    async def start_checker(self, urls: list[str]) -> CheckerNode:
        settings = CheckerSettings(replicas=urls, poll_interval=60)
        path = self.tmp_path / "checker"
        self.checker = CheckerNode(settings, data_dir=path, registry=self.registry)
        await self.checker.start()
        return self.checker

    async def reach(self, height: int, skip: tuple[int, ...] = ()) -> None:
        """The source shows blocks up to `height`; every replica but `skip` ingested them."""
        self.source.visible = height
        for i, node in enumerate(self.nodes):
            if i not in skip:
                await node.ingest.wait_for_height(height, within=20)

    async def close(self) -> None:
        if self.checker is not None:
            await self.checker.close()
        for node in self.nodes:
            await node.close()


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Stack] = []

    def make(chain: SyntheticChain) -> Stack:
        made.append(Stack(tmp_path, chain))
        return made[-1]

    yield make
    for one in made:
        await one.close()


async def confirmed(checker: CheckerNode) -> int:
    return int((await rpc(checker, "getLatestBlock"))["num"])


async def test_heights_a_state_replica_pruned_are_confirmed_through_the_archive(stack) -> None:
    """A state replica (window 16) and an archive, quorum 2: after 20 blocks at once the
    state replica holds 9..24 while the checker is at 4. Heights 5..8 are held by the
    archive alone; they are confirmed by descent from the block both replicas confirm
    (9, whose parent chain the archive's blocks must form down to the confirmed 4), and
    confirmation goes on to the head."""
    chain, _ = random_chain(seed=71, blocks=HEAD + 1)
    up = stack(chain)
    urls = [await up.node("state"), await up.node("archive")]
    await up.reach(FIRST)
    checker = await up.start_checker(urls)
    await settle(checker, 2)
    assert await confirmed(checker) == FIRST
    await up.reach(HEAD)
    assert up.nodes[0].store.range()[0] == HEAD - WINDOW + 1 > FIRST + 1
    await settle(checker, 3)
    assert await confirmed(checker) == HEAD
    for height in range(FIRST, HEAD + 1):
        record = await rpc(checker, "getBlockByHeight", height)
        assert record["id"] == chain.blocks[height]["Header"]["hash"], height
        assert record["is_fork"] is False
    assert metric(checker, "checker_bridged_heights_total") == HEAD - WINDOW + 1 - (FIRST + 1)
    assert metric(checker, "checker_skipped_heights_total") == 0
    assert checker.health()["status"] == "ok"


async def test_heights_no_replica_holds_any_more_are_skipped_and_said_so(stack) -> None:
    """Two state replicas (window 16) and no archive: heights 5..8 are gone from both for
    good. They are skipped (recorded, never confirmed; getBlockByHeight says why) and
    confirmation goes on from 9, the lowest height the quorum holds."""
    chain, _ = random_chain(seed=72, blocks=HEAD + 1)
    up = stack(chain)
    urls = [await up.node("state"), await up.node("state")]
    await up.reach(FIRST)
    checker = await up.start_checker(urls)
    await settle(checker, 2)
    await up.reach(HEAD)
    await settle(checker, 3)
    assert await confirmed(checker) == HEAD
    earliest = HEAD - WINDOW + 1
    for height in (FIRST, earliest, HEAD):
        record = await rpc(checker, "getBlockByHeight", height)
        assert record["id"] == chain.blocks[height]["Header"]["hash"]
    for height in range(FIRST + 1, earliest):
        with pytest.raises(JsonRpcError) as err:
            await rpc(checker, "getBlockByHeight", height)
        assert err.value.code == -39005
        assert f"skipped (heights {FIRST + 1}..{earliest - 1}" in err.value.message
    assert metric(checker, "checker_skipped_heights_total") == earliest - (FIRST + 1)
    assert metric(checker, "checker_bridged_heights_total") == 0


async def test_a_replica_that_may_hold_the_heights_is_waited_for_not_skipped(stack) -> None:
    """Two state replicas and an archive that is down during the burst: heights 5..8 are
    not skipped while the archive does not answer (it may hold them); once it is back and
    caught up, they are confirmed by descent through it."""
    chain, _ = random_chain(seed=73, blocks=HEAD + 1)
    up = stack(chain)
    urls = [await up.node("state"), await up.node("state"), await up.node("archive")]
    await up.reach(FIRST)
    checker = await up.start_checker(urls)
    await settle(checker, 2)
    await up.stop(2)
    await up.reach(HEAD, skip=(2,))
    await settle(checker, 3)
    assert await confirmed(checker) == FIRST  # waits: nothing skipped, nothing guessed
    assert metric(checker, "checker_skipped_heights_total") == 0
    await up.restart(2)
    await settle(checker, 3)
    assert await confirmed(checker) == HEAD
    for height in range(FIRST, HEAD + 1):
        record = await rpc(checker, "getBlockByHeight", height)
        assert record["id"] == chain.blocks[height]["Header"]["hash"], height
    assert metric(checker, "checker_bridged_heights_total") == HEAD - WINDOW + 1 - (FIRST + 1)
    assert metric(checker, "checker_skipped_heights_total") == 0


async def test_a_lagging_archive_is_waited_for(stack) -> None:
    """The archive (fed by a slower write node) has ingested only up to 6 when the state
    replica's window is at 9..24: the checker waits (the heights are not skipped, no block
    is confirmed on one replica alone) and goes on once the archive caught up."""
    chain, _ = random_chain(seed=74, blocks=HEAD + 1)
    up = stack(chain)
    slow = ChainSource(chain, visible=FIRST)
    up.registry.register("slow", slow.handle_body)
    urls = [await up.node("state"), await up.node("archive", source="slow")]
    await up.reach(FIRST)
    checker = await up.start_checker(urls)
    await settle(checker, 2)
    slow.visible = FIRST + 2
    await up.reach(HEAD, skip=(1,))
    await up.nodes[1].ingest.wait_for_height(FIRST + 2, within=20)
    await settle(checker, 3)
    assert await confirmed(checker) == FIRST
    assert metric(checker, "checker_skipped_heights_total") == 0
    slow.visible = HEAD
    await up.nodes[1].ingest.wait_for_height(HEAD, within=20)
    await settle(checker, 3)
    assert await confirmed(checker) == HEAD
    assert metric(checker, "checker_bridged_heights_total") == HEAD - WINDOW + 1 - (FIRST + 1)

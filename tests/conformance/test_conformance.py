"""The proxy answers like a full node: every method of the execution-apis specification and the
common non-spec ones, sent through `chainstate up`'s proxy and to anvil on the same chain at
concrete heights, alone and in batches; every answer equal to anvil's, or different only in
a way listed (with its reason) in the table of docs/proxy.md, "Conformance with a full node".

One stack and one chain for the whole module (`harness.py`); each method is its own test, so
a failure names the method and lists its differences, grouped by kind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.cases import NON_SPEC_METHODS
from tests.conformance.harness import Run, conformance_config, conformance_run
from tests.conformance.report import owner, short, signature
from tests.conformance.rules import listed_rule_ids, rule_ids
from tests.conformance.spec import SPEC_DIR, methods, spec_requests
from tests.conformance.spec_cases import SKIPPED
from tests.e2e.stack import Stack

pytestmark = pytest.mark.timeout(300)

ALL_METHODS = sorted({*methods(), *NON_SPEC_METHODS})


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    stack = Stack(*conformance_config(tmp_path_factory.mktemp("conformance")))
    stack.start()
    try:
        yield conformance_run(stack)
    finally:
        assert stack.stop() == 0, "".join(stack.output[-50:])


def test_allowed_table_lists_every_rule() -> None:
    """The docs' table and the rules the test applies are the same set."""
    assert sorted(listed_rule_ids()) == sorted(rule_ids())


def test_every_spec_request_is_used_or_skipped_with_a_reason() -> None:
    files = {request.file for request in spec_requests()}
    on_disk = {f"{p.parent.name}/{p.name}" for p in (SPEC_DIR / "tests").glob("*/*.io")}
    assert files == on_disk
    assert set(SKIPPED) <= files, set(SKIPPED) - files
    assert all(reason for reason in SKIPPED.values())


def test_old_blocks_are_archive_heights_and_recent_ones_are_not(conformance: Run) -> None:
    """The cases at "archive" heights really are answered by the archive node."""
    chain = conformance.chain
    for name in ["genesis", *chain.archive_blocks]:
        assert conformance.routed[name] == "archive", (name, conformance.routed)
    for name in chain.recent_blocks:
        assert conformance.routed[name] == "state", (name, conformance.routed)


def test_every_method_has_cases(conformance: Run) -> None:
    sent = {case.method for case in conformance.cases}
    assert not set(ALL_METHODS) - sent, set(ALL_METHODS) - sent


@pytest.mark.parametrize("method", ALL_METHODS)
def test_method_answers_like_anvil(conformance: Run, method: str) -> None:
    outcomes = conformance.by_method().get(method, [])
    assert outcomes, f"no case sent for {method}"
    different = [o for o in outcomes if o.verdict == "different"]
    groups: dict[str, list[str]] = {}
    for o in different:
        groups.setdefault(signature(o), []).append(
            f"    {o.case.label}: ours {short(o.ours, 200)}\n      anvil {short(o.anvil, 200)}"
        )
    text = "\n".join(
        f"  {sig} ({len(rows)} of {len(outcomes)} cases, {owner(different[0])}):\n"
        + "\n".join(rows[:3])
        for sig, rows in groups.items()
    )
    assert not different, f"{method}: {len(different)} of {len(outcomes)} cases differ\n{text}"


def test_batches_answer_like_single_requests(conformance: Run) -> None:
    rows = [
        f"{o.case.key}: alone {short(o.ours)}, in a batch {short(o.batch)}"
        for o in conformance.batch_differences
    ]
    assert not rows, "\n".join(rows)

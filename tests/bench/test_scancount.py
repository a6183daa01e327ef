"""`python -m bench.scancount`: the suite's batch bodies and the fake node's answers to them
are the common batch both byte checks take (else it stops, so its counts are never of the
declined path), also with every item at one block."""

from __future__ import annotations

import orjson
import pytest

from bench.scancount import bodies, main


@pytest.mark.parametrize("step", ["scan", "rows", "check"])
@pytest.mark.parametrize("batch", [10, 100])
def test_both_steps_run_on_bodies_they_take(step: str, batch: int, capsys) -> None:
    assert main(["--step", step, "--batch", str(batch), "-n", "3"]) == 0
    assert capsys.readouterr().out == f"{step} batch {batch}: 3 calls\n"


def test_one_block_writes_every_item_at_its_first_items_block() -> None:
    body = orjson.loads(bodies(10, 1, True)[0])
    assert len(body) == 10 and len({it["params"][1] for it in body}) == 1
    assert len({it["params"][0] for it in body}) > 1


def test_a_size_out_of_range_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--step", "scan", "--batch", "101"])

"""One conformance run: `chainstate up` on a test config, the chain built, every case sent
to the proxy and to anvil (the list of differences: `report.py`).

The test config is the devnet's with a state window of 16 blocks (the node's `window` and the
proxy's `state_window`), so the chain's old blocks are archive heights after a few seconds
instead of 128 blocks, and with the proxy's head polls and the checker's rounds every
POLL s (defaults 1 s and 0.5 s): building the chain waits for each block to be confirmed,
which then takes a fraction of a second instead of up to 1.5 s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conformance.cases import Case, Cases
from tests.conformance.chain import Chain, ChainBuilder, wait_until_served
from tests.conformance.compare import Context, Outcome, run, run_batches, tag_heights
from tests.conformance.rpc import Rpc
from tests.conformance.rules import first_rule_that_allows
from tests.conformance.spec_cases import spec_cases
from tests.e2e.stack import Stack, get, write_config

STATE_WINDOW = 16
POLL = 0.1


def conformance_config(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    config, ports = write_config(tmp_path)
    text = config.read_text()
    text = re.sub(r"^window = \d+", f"window = {STATE_WINDOW}", text, flags=re.M)
    proxy = f"[proxy]\nstate_window = {STATE_WINDOW}\nhead_poll_interval = {POLL}\n"
    text = re.sub(r"^\[proxy\]\n", proxy, text, flags=re.M)
    text = re.sub(r"^\[checker\]\n", f"[checker]\npoll_interval = {POLL}\n", text, flags=re.M)
    config.write_text(text)
    return config, ports


@dataclass
class Run:
    chain: Chain
    cases: list[Case]
    outcomes: list[Outcome]
    batch_differences: list[Outcome]
    served: dict[str, Any] = field(default_factory=dict)  # what the proxy showed when it began
    tags: dict[str, dict[str, int]] = field(default_factory=dict)
    routed: dict[str, str] = field(default_factory=dict)  # named block -> node kind chosen

    def by_method(self) -> dict[str, list[Outcome]]:
        found: dict[str, list[Outcome]] = {}
        for outcome in self.outcomes:
            found.setdefault(outcome.case.method, []).append(outcome)
        return found


def conformance_run(stack: Stack) -> Run:
    proxy = Rpc(stack.url("8663") + "/1337")
    anvil = Rpc(stack.url("8545"))
    chain = ChainBuilder(anvil, proxy).build()
    served = wait_until_served(proxy, anvil, chain)
    ctx = Context(proxy, anvil, chain, tag_heights(proxy))
    cases = Cases(chain).build() + spec_cases(chain)
    outcomes = run(cases, ctx, first_rule_that_allows)
    batch = run_batches(outcomes, proxy)
    tags = {"ours": ctx.tag_heights, "anvil": tag_heights(anvil)}
    return Run(chain, cases, outcomes, batch, served, tags, routed_kinds(stack, chain))


def routed_kinds(stack: Stack, chain: Chain) -> dict[str, str]:
    """The node kind the proxy chooses for a state read at each named block (its admin
    `debug_chooseOneNode`): the old blocks must reach the archive node."""
    base = stack.url("8663") + "/1337/debug_chooseOneNode?method=eth_getBalance&block="
    return {name: get(base + hex(number))["kind"] for name, number in chain.blocks.items()}

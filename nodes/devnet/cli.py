"""`chainstate devnet …`: install anvil, run it alone, or drive the deterministic workload."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from chainstate.runner import run, wait_for_stop

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("devnet", help="the devnet's execution client (anvil) and workload")
    sub = p.add_subparsers(dest="devnet_command", metavar="ACTION", required=True)

    inst = sub.add_parser("install", help="find or install anvil and the OpenZeppelin artifacts")
    inst.set_defaults(func=cmd_install)

    anvil = sub.add_parser("anvil", help="run anvil alone from configs/genesis.json")
    anvil.add_argument("--host", default="127.0.0.1")
    anvil.add_argument("--port", type=int, default=8545)
    anvil.add_argument("--chain-id", type=int, default=1337)
    anvil.add_argument(
        "--block-time", type=float, default=None, help="seconds per block (default: automine)"
    )
    anvil.set_defaults(func=cmd_anvil)

    wl = sub.add_parser(
        "workload",
        help="send the deterministic workload (transfers, ERC20, storage, selfdestruct, reorgs)",
    )
    wl.add_argument("--url", default="http://127.0.0.1:8545", help="execution client JSON-RPC URL")
    wl.add_argument("--no-reorg", action="store_true", help="skip the snapshot/revert and reorg")
    wl.add_argument("--json", action="store_true", help="print the full record as JSON")
    wl.set_defaults(func=cmd_workload)


def cmd_install(args: argparse.Namespace) -> int:
    from nodes.devnet.anvil import ensure_anvil, ensure_openzeppelin

    print(f"anvil:        {ensure_anvil()}")
    print(f"OpenZeppelin: {ensure_openzeppelin()}")
    return 0


def cmd_anvil(args: argparse.Namespace) -> int:
    from nodes.devnet.anvil import GENESIS, AnvilProcess

    async def main() -> None:
        proc = AnvilProcess(
            port=args.port,
            chain_id=args.chain_id,
            block_time=args.block_time,
            genesis=GENESIS,
            host=args.host,
        )
        async with proc:
            print(f"anvil listening on {proc.url} (chain id {args.chain_id}); Ctrl-C stops it")
            print(f"next: chainstate devnet workload --url {proc.url}", flush=True)
            await wait_for_stop()

    run(main)
    return 0


def cmd_workload(args: argparse.Namespace) -> int:
    from chainstate.rpcclient import RpcUnavailable
    from nodes.devnet.workload import WorkloadError, run_workload

    try:
        record = _run(run_workload(args.url, reorg=not args.no_reorg))
    except (RpcUnavailable, WorkloadError) as exc:
        print(f"chainstate devnet workload: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record.to_json(), indent=2))
        return 0
    blocks = f"{record.first_block}..{record.last_block}"
    print(f"workload done on chain {record.chain_id}: blocks {blocks}")
    print(f"  transactions: {len(record.transactions)}, accounts touched: {len(record.accounts)}")
    print(f"  slots written: {len(record.storage_targets())}, reorgs: {len(record.reorgs)}")
    for name, address in record.contracts.items():
        print(f"  {name:<13} {address}")
    return 0


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine on uvloop and return its result."""
    import uvloop

    return uvloop.run(coro)

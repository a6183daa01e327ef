"""The spec's own example requests (`execution-apis/tests/*/*.io`), adapted to the devnet chain.

They were written for hive's test chain: its accounts, contracts, transactions, block hashes
and heights. Each one of those is replaced by the devnet chain's counterpart (`HIVE`: by
value, anywhere in the request; `HEIGHTS`: by position, where a hive height names a block of
the chain); the rest is sent as written. A request that has no counterpart on a Cancun
devnet is left out, with the reason, in `SKIPPED`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conformance.cases import FUTURE, TRANSFER_TOPIC, Case
from tests.conformance.chain import ADDRESSES, DEV, Chain
from tests.conformance.spec import spec_requests

# hive chain value -> the devnet chain's counterpart (a symbol resolved by `resolve`)
HIVE = {
    # accounts and contracts
    "0x7dcd17433742f4c0ca53122ab541d0ba67fc27df": "contract:erc20",  # a contract with storage
    "0x0300100f529a704d19736a8714837adbc934db7f": "account:0",  # an account that sent
    "0x0c2c51a0990aee1d73c1228de158688341557508": "account:1",  # a funded account
    "0x14e46043e63d0e3cdcf2530519f4cfaf35058cb2": "account:0",
    "0x9344b07175800259691961298ca11c824e65032d": "contract:callenv",  # echoes the call's env
    "0x17e7eedce4ac02ef114a7ed9fe6e2f33feba1667": "contract:callenv",  # any contract
    "0x0ee3ab1371c93e7c0c281cc0c2107cdebc8b1930": "contract:revert",  # reverts: Error / Panic
    # transactions
    "0x3fbac8b19b59077cd29bbacc3815d73577b45a4d976cae80b04c98c793684c07": "tx:legacy_transfer",
    "0xc1d605c6612a5fe84dc95810030bfe5b1d327652b381bc695e28f50d13b2b09e": "tx:legacy_create",
    "0x695ad02907c9e13ab7c69963f723fa46ac13cd5e2314f61eab2cb2f07b946faa": "tx:access_list_transfer",
    "0x205405746564cbcf1dd53fb5ac92c7622d3792d82f03c59d9baddf2443d91864": "tx:dynamic_fee_transfer",
    # blocks
    "0x44fd89d504659cd58f48f4796b77a7e7012cf296a2409afa2f6c3cb99b5b3d99": "hash:genesis",
    "0x80e911b62f552f563a2544dfef5eb39ec8863d9082c998ca6b657f76e19de38e": "hash:transfers",
    "0x98f797a6af91ea770ab3a99d89c17a3a46d14c76db6bb711b18156a3493d2c94": "hash:logs",
    "0xf69b05b90b7e50c0b5b9b74d2d63a983dee56dffbbd68a530f026f263d76810c": "hash:logs",
    "0xa38f2a6f7d276298d8e7a9bfa28625e4dc8948021f5a7369d0a04571879e98d2": "hash:deploys",
    "0xd226371d0b1551adb03fb52b71f08e3e11247fe9b1af994768af8cdaa8e7dcd7": "hash:head",
    # log topics: hive's event and its first indexed value -> ERC20 Transfer from dev
    "0x00000000000000000000000000000000000000000000000000000000656d6974": "topic:transfer",
    "0x95b7276947f6331672b0c63eca28c1d39f25286d5e2793d6a487837ff1475ba0": "topic:dev",
}

# file -> {hive value: symbol} where the file needs another counterpart than HIVE's: the
# access-list tests call hive's storage contract with calldata only it accepts (the ERC20
# would revert); callenv stores to a slot for any calldata.
HIVE_BY_FILE: dict[str, dict[str, str]] = {
    f"eth_createAccessList/{name}.io": {
        "0x7dcd17433742f4c0ca53122ab541d0ba67fc27df": "contract:callenv"
    }
    for name in ("create-al-contract", "create-al-contract-eip1559")
}

# file -> {position: symbol}: a hive height that names a kind of block, by where it stands
# (positions are dotted paths into the request: "params.0", "params.0.fromBlock").
HEIGHTS: dict[str, dict[str, str]] = {
    "debug_getRawBlock/get-block-n.io": {"params.0": "block:logs"},
    "debug_getRawHeader/get-block-n.io": {"params.0": "block:logs"},
    "debug_getRawReceipts/get-block-n.io": {"params.0": "block:logs"},
    "debug_traceBlockByNumber/trace-block-memory-encoding.io": {"params.0": "block:transfers"},
    "debug_traceBlockByNumber/trace-block-return-data-behavior.io": {"params.0": "block:transfers"},
    "debug_traceBlockByNumber/trace-block-storage-encoding.io": {"params.0": "block:logs"},
    "debug_traceBlockByNumber/trace-block-storage-snapshot-timing.io": {"params.0": "block:logs"},
    "debug_traceBlockByNumber/trace-block-with-transactions.io": {"params.0": "block:transfers"},
    # hive's fork blocks: the devnet is Cancun from genesis, so they name kinds of blocks
    "eth_getBlockByNumber/get-block-london-fork.io": {"params.0": "block:transfers"},
    "eth_getBlockByNumber/get-block-merge-fork.io": {"params.0": "block:empty_old"},
    "eth_getBlockByNumber/get-block-shanghai-fork.io": {"params.0": "block:deploys"},
    "eth_getBlockByNumber/get-block-cancun-fork.io": {"params.0": "block:mixed"},
    "eth_getBlockByNumber/get-block-prague-fork.io": {"params.0": "block:head"},
    "eth_getBlockReceipts/get-block-receipts-n.io": {"params.0": "block:transfers"},
    "eth_getBlockReceipts/get-block-receipts-future.io": {"params.0": "future"},
    "eth_getBlockTransactionCountByNumber/get-block-n.io": {"params.0": "block:transfers"},
    "eth_getTransactionByBlockNumberAndIndex/get-block-n.io": {"params.0": "block:transfers"},
    "eth_feeHistory/fee-history.io": {"params.1": "block:mixed"},
    "eth_getLogs/contract-addr.io": {
        "params.0.fromBlock": "block:transfers",
        "params.0.toBlock": "block:reverts",
    },
    "eth_getLogs/filter-error-future-block-range.io": {
        "params.0.fromBlock": "future",
        "params.0.toBlock": "future+6",
    },
    "eth_getLogs/filter-error-reversed-block-range.io": {
        "params.0.fromBlock": "block:mixed",
        "params.0.toBlock": "block:logs",
    },
    **{
        f"eth_getLogs/{name}.io": {
            "params.0.fromBlock": "block:deploys",
            "params.0.toBlock": "block:mixed",
        }
        for name in ("topic-exact-match", "topic-null-wildcard", "topic-wildcard")
    },
}

PRAGUE = "EIP-7702 (Prague): the devnet runs Cancun"
SKIPPED = {
    "eth_call/call-eip7702-delegation.io": PRAGUE,
    "eth_getCode/get-code-eip7702-delegation.io": PRAGUE,
    "eth_getTransactionCount/get-nonce-eip7702-account.io": PRAGUE,
    "eth_getTransactionByHash/get-setcode-tx.io": PRAGUE,
    "eth_getTransactionReceipt/get-setcode-tx.io": PRAGUE,
    "eth_getTransactionByHash/get-blob-tx.io": "no blob transaction on the devnet chain",
    "eth_getTransactionReceipt/get-blob-tx.io": "no blob transaction on the devnet chain",
}


def resolve(symbol: str, chain: Chain) -> str:
    kind, _, name = symbol.partition(":")
    if kind == "contract":
        return chain.contracts[name]
    if kind == "account":
        return ADDRESSES[int(name)]
    if kind == "tx":
        return chain.txs[name]
    if kind == "hash":
        return chain.hashes[name]
    if kind == "block":
        return hex(chain.blocks[name])
    if kind == "topic":
        return TRANSFER_TOPIC if name == "transfer" else "0x" + "00" * 12 + DEV[2:]
    if symbol.startswith("future"):
        return hex(chain.head + FUTURE + int(symbol[6:] or 0))
    raise ValueError(f"unknown symbol {symbol}")


def set_path(obj: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value


def adapt(file: str, request: dict[str, Any], chain: Chain) -> list[Any]:
    """The request's params on the devnet chain."""
    text = json.dumps(request.get("params", []))
    for hive, symbol in {**HIVE, **HIVE_BY_FILE.get(file, {})}.items():
        text = text.replace(f'"{hive}"', json.dumps(resolve(symbol, chain)))
    params = {"params": json.loads(text)}
    for path, symbol in HEIGHTS.get(file, {}).items():
        set_path(params, path, resolve(symbol, chain))
    return params["params"]


def spec_cases(chain: Chain) -> list[Case]:
    cases = []
    for n, item in enumerate(spec_requests()):
        if item.file in SKIPPED:
            continue
        method = item.request["method"]
        label = f"spec {item.file.split('/')[1]} #{item.request.get('id', n)}"
        params = adapt(item.file, item.request, chain)
        cases.append(Case(method, label, params, item.file, expected_error=item.expected_error))
    return cases

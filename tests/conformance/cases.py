"""Every case the conformance test sends, to the proxy and to anvil, on the built chain.

A case is one JSON-RPC request (method and params) with a label that says what it tries, or
a *flow*: a few requests whose later params come from earlier answers (filters, whose ids
differ between any two nodes). The heights are concrete blocks of the chain (`chain.py`):
genesis, old blocks outside the state window (archive), recent blocks, empty blocks, blocks
with transfers, deployments, reverts and logs; then the tags, EIP-1898 objects and blocks
or transactions that do not exist. The spec's own example requests are added by
`spec_cases.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nodes.devnet.workload import erc20_transfer_data, fresh_address, mapping_slot, slot_hex
from tests.conformance.chain import ADDRESSES, DEV, Chain
from tests.conformance.rpc import Rpc

UNKNOWN_HASH = "0x00000000000000000000000000000000000000000000000000000000deadbeef"
UNKNOWN_ACCOUNT = "0xc1cadaffffffffffffffffffffffffffffffffff"
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
TAGS = ("latest", "safe", "finalized", "pending", "earliest")
FUTURE = 100  # blocks past the head: a height the chain does not have


@dataclass(frozen=True)
class Case:
    method: str
    label: str
    params: list[Any] = field(default_factory=list)
    source: str = ""  # the spec `.io` file it was adapted from, if any
    flow: Callable[[Rpc], list[dict[str, Any]]] | None = None
    expected_error: dict[str, Any] | None = None  # the error the spec's test expects

    @property
    def missing(self) -> bool:
        """Asks for a block or transaction the chain does not have."""
        name = self.source.rsplit("/", 1)[-1]
        words = ("notfound", "not-found", "unknown-tx", "empty-hash", "empty-tx", "future")
        return "not found" in self.label or any(w in name for w in words)

    @property
    def invalid(self) -> bool:
        """Params the spec rejects."""
        return self.label.startswith("bad:")

    @property
    def key(self) -> str:
        return f"{self.method} [{self.label}]"

    @property
    def batchable(self) -> bool:
        """Sent again inside a batch: every plain read (not flows, not sends)."""
        return self.flow is None and self.method not in STATEFUL


STATEFUL = {
    "eth_sendRawTransaction", "eth_sendTransaction", "eth_newFilter", "eth_newBlockFilter",
    "eth_newPendingTransactionFilter", "eth_uninstallFilter", "eth_getFilterChanges",
    "eth_getFilterLogs",
}  # fmt: skip

# Methods outside the execution-apis spec that clients use and the issue names.
NON_SPEC_METHODS = (
    "web3_clientVersion", "web3_sha3", "net_listening", "net_peerCount", "eth_protocolVersion",
    "eth_getUncleCountByBlockHash", "eth_getUncleCountByBlockNumber",
    "eth_getUncleByBlockHashAndIndex", "eth_getUncleByBlockNumberAndIndex", "debug_traceCall",
    "trace_block", "trace_transaction", "trace_filter", "trace_replayBlockTransactions",
    "txpool_inspect",
)  # fmt: skip


class Cases:
    """Builds the case list from the chain's facts."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.out: list[Case] = []

    def add(self, method: str, label: str, *params: Any) -> None:
        self.out.append(Case(method, label, list(params)))

    def num(self, block: str) -> str:
        return hex(self.chain.blocks[block])

    def hash(self, block: str) -> str:
        return self.chain.hashes[block]

    def tx(self, name: str) -> str:
        return self.chain.txs[name]

    def block_ids(self) -> Iterator[tuple[str, Any]]:
        """Every way to name a block for a state read, with a label."""
        chain = self.chain
        yield "genesis", "0x0"
        for name in chain.archive_blocks:
            yield f"archive {name} {self.num(name)}", self.num(name)
        for name in chain.recent_blocks:
            yield f"recent {name} {self.num(name)}", self.num(name)
        for tag in TAGS:
            yield tag, tag
        yield "EIP-1898 blockHash archive", {"blockHash": self.hash("logs")}
        yield "EIP-1898 blockHash recent", {"blockHash": self.hash("mixed")}
        yield "EIP-1898 blockNumber archive", {"blockNumber": self.num("transfers")}
        yield (
            "EIP-1898 requireCanonical",
            {"blockHash": self.hash("head"), "requireCanonical": True},
        )
        yield "not found: future height", hex(chain.head + FUTURE)
        yield "not found: unknown blockHash", {"blockHash": UNKNOWN_HASH}

    def build(self) -> list[Case]:
        for part in (
            self.client, self.fees, self.state, self.calls, self.blocks, self.transactions,
            self.receipts, self.logs, self.filters, self.traces, self.pool_and_signing,
            self.sends, self.unserved,
        ):  # fmt: skip
            part()
        return self.out

    # -- client, fees ----------------------------------------------------------------------

    def client(self) -> None:
        for method in (
            "eth_chainId", "net_version", "net_listening", "net_peerCount", "web3_clientVersion",
            "eth_protocolVersion", "eth_syncing", "eth_coinbase", "eth_accounts",
            "eth_blockNumber", "eth_config", "eth_capabilities",
        ):  # fmt: skip
            self.add(method, "no params")
        self.add("web3_sha3", "bytes", "0x68656c6c6f20776f726c64")
        self.add("web3_sha3", "empty", "0x")
        self.add("web3_sha3", "bad: not hex", "hello")
        self.add("eth_chainId", "bad: extra param", "0x1")

    def fees(self) -> None:
        for method in (
            "eth_gasPrice",
            "eth_maxPriorityFeePerGas",
            "eth_baseFee",
            "eth_blobBaseFee",
        ):
            self.add(method, "no params")
        self.add("eth_feeHistory", "4 blocks to latest", "0x4", "latest", [10, 50, 90])
        self.add("eth_feeHistory", "2 blocks to a recent height", "0x2", self.num("mixed"), [50])
        self.add(
            "eth_feeHistory", "3 blocks to an archive height", "0x3", self.num("reverts"), [25, 75]
        )
        self.add("eth_feeHistory", "no percentiles", "0x1", self.num("logs"))
        self.add("eth_feeHistory", "pending", "0x2", "pending", [50])
        self.add("eth_feeHistory", "bad: percentiles not increasing", "0x2", "latest", [90, 10])

    # -- state -----------------------------------------------------------------------------

    def state(self) -> None:
        erc20 = self.chain.contracts["erc20"]
        callenv = self.chain.contracts["callenv"]
        for label, block in self.block_ids():
            self.add("eth_getBalance", f"dev account at {label}", DEV, block)
            self.add("eth_getTransactionCount", f"dev account at {label}", DEV, block)
            self.add("eth_getCode", f"erc20 at {label}", erc20, block)
            self.add("eth_getStorageAt", f"erc20 totalSupply at {label}", erc20, slot_hex(2), block)
        self.add("eth_getBalance", "default block", DEV)
        self.add(
            "eth_getBalance",
            "receiver before its transfer",
            fresh_address(1),
            hex(self.chain.blocks["transfers"] - 1),
        )
        self.add(
            "eth_getBalance", "receiver at its transfer", fresh_address(1), self.num("transfers")
        )
        self.add("eth_getBalance", "unknown account", UNKNOWN_ACCOUNT, "latest")
        self.add("eth_getBalance", "pending sender at pending", ADDRESSES[9], "pending")
        self.add("eth_getBalance", "bad: short address", "0x1234", "latest")
        self.add("eth_getBalance", "bad: block tag", DEV, "newest")
        self.add("eth_getTransactionCount", "pending sender at latest", ADDRESSES[9], "latest")
        self.add("eth_getTransactionCount", "pending sender at pending", ADDRESSES[9], "pending")
        self.add("eth_getTransactionCount", "reverting sender", ADDRESSES[5], self.num("reverts"))
        self.add("eth_getCode", "before deployment", erc20, hex(self.chain.blocks["deploys"] - 1))
        self.add("eth_getCode", "hand-assembled contract", callenv, "latest")
        self.add(
            "eth_getCode",
            "recent deployment, before",
            self.chain.contracts["callenv_recent"],
            hex(self.chain.blocks["mixed"] - 1),
        )
        self.add(
            "eth_getCode",
            "recent deployment",
            self.chain.contracts["callenv_recent"],
            self.num("mixed"),
        )
        holder = mapping_slot(ADDRESSES[8], 0)
        for block in ("deploys", "logs", "mixed", "head"):
            self.add(
                "eth_getStorageAt", f"erc20 balance slot at {block}", erc20, holder, self.num(block)
            )
        self.add(
            "eth_getStorageAt",
            "callenv slot 0 before its call",
            callenv,
            "0x0",
            hex(self.chain.blocks["reverts"] - 1),
        )
        self.add(
            "eth_getStorageAt", "callenv slot 0 after its call", callenv, "0x0", self.num("reverts")
        )
        self.add("eth_getStorageAt", "short slot key", erc20, "0x2", "latest")
        self.add("eth_getStorageAt", "bad: slot key of 33 bytes", erc20, "0x" + "00" * 33, "latest")
        slots = [slot_hex(2), holder]
        self.add("eth_getStorageValues", "two slots at latest", {erc20: slots}, "latest")
        self.add(
            "eth_getStorageValues",
            "two accounts at archive",
            {erc20: slots, callenv: [slot_hex(0)]},
            self.num("reverts"),
        )
        for label, block in (
            ("latest", "latest"),
            ("recent", self.num("mixed")),
            ("archive", self.num("logs")),
        ):
            self.add("eth_getProof", f"account without slots at {label}", DEV, [], block)
            self.add("eth_getProof", f"erc20 with slots at {label}", erc20, slots, block)
        self.add(
            "eth_getProof",
            "EIP-1898 blockHash",
            erc20,
            [slot_hex(2)],
            {"blockHash": self.hash("head")},
        )
        self.add("eth_getProof", "not found: future height", DEV, [], hex(self.chain.head + FUTURE))

    # -- execution -------------------------------------------------------------------------

    def calls(self) -> None:
        contracts = self.chain.contracts
        erc20, callenv, revert = contracts["erc20"], contracts["callenv"], contracts["revert"]
        balance_of = "0x70a08231" + "00" * 12 + ADDRESSES[8][2:]
        for label, block in self.block_ids():
            self.add(
                "eth_call", f"erc20 balanceOf at {label}", {"to": erc20, "input": balance_of}, block
            )
        env = {"from": DEV, "to": callenv, "input": "0x010203"}
        self.add("eth_call", "callenv, no fees", env, "latest")
        self.add(
            "eth_call", "callenv, legacy gasPrice", {**env, "gasPrice": "0x3b9aca00"}, "latest"
        )
        self.add(
            "eth_call",
            "callenv, 2930 accessList",
            {
                **env,
                "gasPrice": "0x3b9aca00",
                "accessList": [{"address": callenv, "storageKeys": [slot_hex(0)]}],
            },
            "latest",
        )
        fees = {"maxFeePerGas": "0x77359400", "maxPriorityFeePerGas": "0x5"}
        self.add("eth_call", "callenv, 1559 fees", {**env, **fees}, "latest")
        self.add(
            "eth_call",
            "callenv, 1559 fees at an archive height",
            {**env, **fees},
            self.num("reverts"),
        )
        self.add(
            "eth_call",
            "callenv, 1559 fees and value",
            {**env, **fees, "value": "0x17", "gas": "0xea60"},
            self.num("mixed"),
        )
        self.add(
            "eth_call",
            "callenv, maxFee below base fee",
            {**env, "maxFeePerGas": "0x1", "maxPriorityFeePerGas": "0x1"},
            "latest",
        )
        self.add("eth_call", "callenv from the zero address", {"to": callenv}, "latest")
        self.add(
            "eth_call",
            "callenv with data instead of input",
            {"to": callenv, "data": "0xff"},
            "latest",
        )
        self.add("eth_call", "revert with Error(string)", {"to": revert, "input": "0x01"}, "latest")
        self.add("eth_call", "revert with Panic(1)", {"to": revert, "input": "0x00"}, "latest")
        self.add(
            "eth_call",
            "revert at an archive height",
            {"to": revert, "input": "0x01"},
            self.num("reverts"),
        )
        overdraw = erc20_transfer_data(DEV, 10**30)
        self.add(
            "eth_call",
            "erc20 overdraw reverts with reason",
            {"from": ADDRESSES[5], "to": erc20, "input": overdraw},
            "latest",
        )
        self.add(
            "eth_call",
            "call to an account without code",
            {"to": UNKNOWN_ACCOUNT, "input": "0x01"},
            "latest",
        )
        self.add(
            "eth_call",
            "state override: code",
            {"to": UNKNOWN_ACCOUNT},
            "latest",
            {UNKNOWN_ACCOUNT: {"code": "0x600160005260206000f3"}},
        )
        self.add(
            "eth_call",
            "state override: balance read by callenv",
            {"to": callenv, "from": UNKNOWN_ACCOUNT},
            "latest",
            {callenv: {"balance": "0x1234"}},
        )
        self.add("eth_call", "out of gas", {"to": callenv, "gas": "0x5208"}, "latest")
        self.add("eth_call", "bad: not an object", "0x01", "latest")
        transfer = {"from": DEV, "to": erc20, "input": erc20_transfer_data(ADDRESSES[8], 1)}
        plain = {"from": DEV, "to": fresh_address(7), "value": "0x1"}
        self.add("eth_estimateGas", "plain transfer", plain)
        self.add("eth_estimateGas", "erc20 transfer at latest", transfer, "latest")
        self.add(
            "eth_estimateGas", "erc20 transfer at an archive height", transfer, self.num("logs")
        )
        self.add(
            "eth_estimateGas",
            "revert with reason",
            {"from": ADDRESSES[5], "to": erc20, "input": overdraw},
        )
        self.add("eth_estimateGas", "callenv with 1559 fees", {**env, **fees})
        for label, block in (
            ("latest", "latest"),
            ("archive", self.num("logs")),
            ("recent", self.num("mixed")),
        ):
            self.add("eth_createAccessList", f"erc20 transfer at {label}", transfer, block)
        self.add("eth_createAccessList", "callenv with 1559 fees", {**env, **fees}, "latest")
        self.add("eth_createAccessList", "plain transfer", plain, "latest")
        self.add(
            "eth_createAccessList",
            "reverting call",
            {"to": revert, "input": "0x01", "gas": "0x186a0"},
            "latest",
        )
        calls = [transfer, {"from": DEV, "to": callenv, "input": "0x01"}]
        self.add(
            "eth_simulateV1",
            "erc20 transfer and callenv at latest",
            {"blockStateCalls": [{"calls": calls}]},
            "latest",
        )
        self.add(
            "eth_simulateV1",
            "with traceTransfers at a recent height",
            {"blockStateCalls": [{"calls": [plain]}], "traceTransfers": True},
            self.num("mixed"),
        )
        self.add(
            "eth_simulateV1",
            "revert with validation",
            {
                "blockStateCalls": [{"calls": [{"to": revert, "input": "0x01"}]}],
                "validation": False,
            },
            "latest",
        )

    # -- blocks ------------------------------------------------------------------------------

    def named_blocks(self) -> list[str]:
        return ["genesis", *self.chain.archive_blocks, *self.chain.recent_blocks]

    def blocks(self) -> None:
        future = hex(self.chain.head + FUTURE)
        for name in self.named_blocks():
            for full in (False, True):
                self.add("eth_getBlockByNumber", f"{name} full={full}", self.num(name), full)
                self.add("eth_getBlockByHash", f"{name} full={full}", self.hash(name), full)
            self.add("eth_getBlockTransactionCountByNumber", name, self.num(name))
            self.add("eth_getBlockTransactionCountByHash", name, self.hash(name))
            self.add("eth_getBlockReceipts", f"{name} by number", self.num(name))
            self.add("eth_getUncleCountByBlockNumber", name, self.num(name))
            self.add("eth_getUncleCountByBlockHash", name, self.hash(name))
        for tag in TAGS:
            for full in (False, True):
                self.add("eth_getBlockByNumber", f"{tag} full={full}", tag, full)
            self.add("eth_getBlockTransactionCountByNumber", tag, tag)
            self.add("eth_getBlockReceipts", tag, tag)
        for name in ("transfers", "mixed"):
            self.add("eth_getBlockReceipts", f"{name} by hash", self.hash(name))
            self.add(
                "eth_getBlockReceipts", f"{name} EIP-1898 blockHash", {"blockHash": self.hash(name)}
            )
        self.add("eth_getBlockReceipts", "EIP-1898 blockNumber", {"blockNumber": self.num("logs")})
        for method, params in (
            ("eth_getBlockByNumber", [future, False]),
            ("eth_getBlockByHash", [UNKNOWN_HASH, False]),
            ("eth_getBlockTransactionCountByNumber", [future]),
            ("eth_getBlockTransactionCountByHash", [UNKNOWN_HASH]),
            ("eth_getBlockReceipts", [future]),
            ("eth_getBlockReceipts", [UNKNOWN_HASH]),
            ("eth_getUncleCountByBlockNumber", [future]),
            ("eth_getUncleCountByBlockHash", [UNKNOWN_HASH]),
        ):
            self.add(
                method,
                f"not found: {'future height' if params[0] == future else 'unknown hash'}",
                *params,
            )
        self.add("eth_getBlockByNumber", "bad: height without 0x", "12", False)
        self.add("eth_getBlockByNumber", "bad: missing full flag", "latest")
        self.add("eth_getBlockByHash", "bad: short hash", "0x1234", False)
        self.add(
            "eth_getUncleByBlockNumberAndIndex", "transfers index 0", self.num("transfers"), "0x0"
        )
        self.add(
            "eth_getUncleByBlockHashAndIndex", "transfers index 0", self.hash("transfers"), "0x0"
        )
        self.add("eth_getUncleByBlockNumberAndIndex", "latest index 0", "latest", "0x0")
        for name in ("genesis", "transfers", "mixed"):
            for method in ("debug_getRawHeader", "debug_getRawBlock", "debug_getRawReceipts"):
                self.add(method, name, self.num(name))
        self.add("debug_getRawBlock", "latest", "latest")
        self.add("debug_getRawHeader", "not found: future height", future)

    def transactions(self) -> None:
        future = hex(self.chain.head + FUTURE)
        for name, index in (
            ("transfers", 0),
            ("transfers", 2),
            ("transfers", 3),
            ("logs", 1),
            ("mixed", 3),
            ("empty_old", 0),
        ):
            self.add(
                "eth_getTransactionByBlockNumberAndIndex",
                f"{name} index {index}",
                self.num(name),
                hex(index),
            )
            self.add(
                "eth_getTransactionByBlockHashAndIndex",
                f"{name} index {index}",
                self.hash(name),
                hex(index),
            )
        self.add("eth_getTransactionByBlockNumberAndIndex", "latest index 0", "latest", "0x0")
        self.add("eth_getTransactionByBlockNumberAndIndex", "pending index 0", "pending", "0x0")
        self.add(
            "eth_getTransactionByBlockNumberAndIndex", "not found: future height", future, "0x0"
        )
        self.add(
            "eth_getTransactionByBlockHashAndIndex", "not found: unknown hash", UNKNOWN_HASH, "0x0"
        )
        for name in self.chain.txs:
            self.add(
                "eth_getTransactionByHash", f"{name} in {self.chain.tx_block[name]}", self.tx(name)
            )
        self.add("eth_getTransactionByHash", "pending transaction", self.chain.pending_tx)
        self.add("eth_getTransactionByHash", "not found: unknown hash", UNKNOWN_HASH)
        self.add("eth_getTransactionByHash", "bad: short hash", "0x1234")
        for name in (
            "legacy_transfer",
            "access_list_transfer",
            "dynamic_fee_transfer",
            "legacy_create",
            "recent_panic",
        ):
            self.add("debug_getRawTransaction", name, self.tx(name))
        self.add("debug_getRawTransaction", "not found: unknown hash", UNKNOWN_HASH)

    def receipts(self) -> None:
        for name in self.chain.txs:
            self.add(
                "eth_getTransactionReceipt", f"{name} in {self.chain.tx_block[name]}", self.tx(name)
            )
        self.add("eth_getTransactionReceipt", "pending transaction", self.chain.pending_tx)
        self.add("eth_getTransactionReceipt", "not found: unknown hash", UNKNOWN_HASH)

    def logs(self) -> None:
        erc20 = self.chain.contracts["erc20"]
        first, last = self.num("transfers"), self.num("head")
        dev_topic = "0x" + "00" * 12 + DEV[2:]
        self.add("eth_getLogs", "whole chain", {"fromBlock": "earliest", "toBlock": "latest"})
        self.add(
            "eth_getLogs", "archive range", {"fromBlock": first, "toBlock": self.num("empty_old")}
        )
        self.add("eth_getLogs", "recent range", {"fromBlock": self.num("mixed"), "toBlock": last})
        self.add(
            "eth_getLogs",
            "range across the state window",
            {"fromBlock": self.num("logs"), "toBlock": self.num("mixed")},
        )
        self.add("eth_getLogs", "one archive block by blockHash", {"blockHash": self.hash("logs")})
        self.add("eth_getLogs", "one recent block by blockHash", {"blockHash": self.hash("mixed")})
        self.add(
            "eth_getLogs",
            "empty block",
            {"fromBlock": self.num("empty_old"), "toBlock": self.num("empty_old")},
        )
        self.add(
            "eth_getLogs",
            "address and Transfer topic",
            {"fromBlock": first, "toBlock": last, "address": erc20, "topics": [TRANSFER_TOPIC]},
        )
        self.add(
            "eth_getLogs",
            "from dev (topic 1)",
            {"fromBlock": first, "toBlock": last, "topics": [None, dev_topic]},
        )
        self.add(
            "eth_getLogs",
            "topic alternatives",
            {
                "fromBlock": first,
                "toBlock": last,
                "topics": [[TRANSFER_TOPIC, "0x" + "00" * 28 + "63616c6c"]],
            },
        )
        self.add(
            "eth_getLogs",
            "address list",
            {
                "fromBlock": first,
                "toBlock": last,
                "address": [erc20, self.chain.contracts["callenv"]],
            },
        )
        self.add("eth_getLogs", "default range (latest)", {})
        self.add("eth_getLogs", "safe to finalized", {"fromBlock": "safe", "toBlock": "finalized"})
        self.add("eth_getLogs", "not found: unknown blockHash", {"blockHash": UNKNOWN_HASH})
        self.add("eth_getLogs", "bad: reversed range", {"fromBlock": last, "toBlock": first})
        self.add(
            "eth_getLogs",
            "bad: range past the head",
            {"fromBlock": last, "toBlock": hex(self.chain.head + FUTURE)},
        )

    def filters(self) -> None:
        criteria = {
            "fromBlock": self.num("transfers"),
            "toBlock": self.num("mixed"),
            "address": self.chain.contracts["erc20"],
        }
        self.out.append(
            Case(
                "eth_newFilter",
                "logs filter: create, logs, changes, uninstall twice",
                [criteria],
                flow=log_filter_flow(criteria),
            )
        )
        self.out.append(
            Case(
                "eth_newBlockFilter",
                "block filter: create, changes, uninstall",
                flow=simple_filter_flow("eth_newBlockFilter"),
            )
        )
        self.out.append(
            Case(
                "eth_newPendingTransactionFilter",
                "pending filter: create, changes, uninstall",
                flow=simple_filter_flow("eth_newPendingTransactionFilter"),
            )
        )
        self.add("eth_getFilterChanges", "not found: unknown filter id", "0x123456")
        self.add("eth_getFilterLogs", "not found: unknown filter id", "0x123456")
        self.add("eth_uninstallFilter", "unknown filter id", "0x123456")

    def traces(self) -> None:
        tracers: list[tuple[str, dict[str, Any] | None]] = [
            ("callTracer", {"tracer": "callTracer"}),
            ("callTracer withLog", {"tracer": "callTracer", "tracerConfig": {"withLog": True}}),
            ("prestateTracer", {"tracer": "prestateTracer"}),
            (
                "prestateTracer diffMode",
                {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True}},
            ),
        ]
        for name in (
            "legacy_transfer",
            "dynamic_fee_transfer",
            "legacy_create",
            "erc20_transfer",
            "reverted_erc20",
            "reverted_call",
            "callenv_call",
            "recent_erc20",
            "recent_panic",
        ):
            for label, config in tracers:
                self.add("debug_traceTransaction", f"{name} {label}", self.tx(name), config)
            self.add("trace_transaction", name, self.tx(name))
        for name in ("legacy_transfer", "erc20_transfer", "reverted_call"):
            self.add("debug_traceTransaction", f"{name} struct logs", self.tx(name))
            self.add(
                "debug_traceTransaction",
                f"{name} struct logs with memory and storage",
                self.tx(name),
                {"enableMemory": True, "disableStorage": False},
            )
        self.add(
            "debug_traceTransaction",
            "not found: unknown hash",
            UNKNOWN_HASH,
            {"tracer": "callTracer"},
        )
        self.add("trace_transaction", "not found: unknown hash", UNKNOWN_HASH)
        for name in (
            "genesis",
            "transfers",
            "deploys",
            "logs",
            "reverts",
            "empty_old",
            "mixed",
            "head",
        ):
            for label, config in tracers[::3]:
                self.add("debug_traceBlockByNumber", f"{name} {label}", self.num(name), config)
                self.add("debug_traceBlockByHash", f"{name} {label}", self.hash(name), config)
            self.add("trace_block", name, self.num(name))
            self.add("trace_replayBlockTransactions", f"{name} trace", self.num(name), ["trace"])
        for name in ("transfers", "logs"):
            replay = "trace_replayBlockTransactions"
            self.add(replay, f"{name} stateDiff", self.num(name), ["trace", "stateDiff"])
        self.add(
            "debug_traceBlockByNumber", "latest callTracer", "latest", {"tracer": "callTracer"}
        )
        self.add(
            "debug_traceBlockByNumber",
            "not found: future height",
            hex(self.chain.head + FUTURE),
            {"tracer": "callTracer"},
        )
        self.add(
            "debug_traceBlockByHash",
            "not found: unknown hash",
            UNKNOWN_HASH,
            {"tracer": "callTracer"},
        )
        self.add("trace_block", "latest", "latest")
        self.add("trace_block", "not found: future height", hex(self.chain.head + FUTURE))
        first, last = self.num("transfers"), self.num("head")
        self.add("trace_filter", "whole scenario", {"fromBlock": first, "toBlock": last})
        self.add(
            "trace_filter",
            "archive range to the erc20",
            {
                "fromBlock": first,
                "toBlock": self.num("empty_old"),
                "toAddress": [self.chain.contracts["erc20"]],
            },
        )
        self.add(
            "trace_filter",
            "from dev, after 1, count 2",
            {"fromBlock": first, "toBlock": last, "fromAddress": [DEV], "after": 1, "count": 2},
        )
        contracts = self.chain.contracts
        call = {
            "from": DEV,
            "to": contracts["callenv"],
            "input": "0x01",
            "maxFeePerGas": "0x77359400",
            "maxPriorityFeePerGas": "0x5",
        }
        transfer = {
            "from": DEV,
            "to": contracts["erc20"],
            "input": erc20_transfer_data(ADDRESSES[8], 1),
        }
        for label, block in (
            ("latest", "latest"),
            ("archive", self.num("logs")),
            ("recent", self.num("mixed")),
        ):
            for tracer_label, config in tracers[::3]:
                self.add(
                    "debug_traceCall", f"callenv at {label} {tracer_label}", call, block, config
                )
            self.add(
                "debug_traceCall",
                f"erc20 transfer at {label} callTracer",
                transfer,
                block,
                {"tracer": "callTracer"},
            )
        self.add(
            "debug_traceCall",
            "revert callTracer",
            {"to": contracts["revert"], "input": "0x01"},
            "latest",
            {"tracer": "callTracer"},
        )
        self.add("debug_traceCall", "callenv struct logs", call, "latest")
        self.add(
            "debug_traceCall",
            "not found: future height",
            call,
            hex(self.chain.head + FUTURE),
            {"tracer": "callTracer"},
        )

    # -- the pool, signing, sending --------------------------------------------------------

    def pool_and_signing(self) -> None:
        for method in ("txpool_status", "txpool_content", "txpool_inspect"):
            self.add(method, "one pending transaction")
        self.add("txpool_contentFrom", "pending sender", ADDRESSES[9])
        self.add("eth_sign", "dev account", DEV, "0xdeadbeef")
        self.add("eth_sign", "bad: account without key", UNKNOWN_ACCOUNT, "0xdeadbeef")
        tx = {
            "from": DEV,
            "to": fresh_address(7),
            "value": "0x1",
            "gas": "0x5208",
            "nonce": "0x0",
            "maxFeePerGas": "0x77359400",
            "maxPriorityFeePerGas": "0x1",
        }
        self.add("eth_signTransaction", "dev account 1559", tx)
        self.add("eth_signTransaction", "bad: account without key", {**tx, "from": UNKNOWN_ACCOUNT})
        self.add(
            "eth_fillTransaction",
            "plain transfer",
            {"from": DEV, "to": fresh_address(7), "value": "0x1"},
        )

    def sends(self) -> None:
        """Only sends that change nothing: rejected ones and a resent pending transaction."""
        mined_raw = self.chain.raws[self.tx("legacy_transfer")]
        self.add("eth_sendRawTransaction", "bad: nonce too low (a mined transaction)", mined_raw)
        self.add(
            "eth_sendRawTransaction",
            "already known (the pending transaction)",
            self.chain.raws[self.chain.pending_tx],
        )
        self.add("eth_sendRawTransaction", "bad: not RLP", "0x1234")
        self.add(
            "eth_sendTransaction",
            "bad: account without key",
            {"from": UNKNOWN_ACCOUNT, "to": DEV, "value": "0x1"},
        )

    def unserved(self) -> None:
        """Methods of the spec that no node of the devnet has (newer forks, bad blocks)."""
        self.add("eth_getBlockAccessList", "transfers", self.num("transfers"))
        self.add("debug_getRawBlockAccessList", "transfers", self.num("transfers"))
        self.add("debug_getBadBlocks", "no params")


def filter_id(answer: dict[str, Any]) -> str | None:
    result = answer.get("result")
    return result if isinstance(result, str) and result.startswith("0x") else None


def without_id(answer: dict[str, Any], fid: str | None) -> dict[str, Any]:
    """The answer with the filter's own id hidden: ids differ between any two nodes."""
    if fid is not None and answer.get("result") == fid:
        return {**answer, "result": "<filter id>"}
    return answer


def log_filter_flow(criteria: dict[str, Any]) -> Callable[[Rpc], list[dict[str, Any]]]:
    def flow(rpc: Rpc) -> list[dict[str, Any]]:
        created = rpc.request("eth_newFilter", criteria)
        fid = filter_id(created)
        steps = [created]
        for method in (
            "eth_getFilterLogs",
            "eth_getFilterChanges",
            "eth_uninstallFilter",
            "eth_uninstallFilter",
            "eth_getFilterChanges",
        ):
            steps.append(rpc.request(method, fid))
        return [without_id(s, fid) for s in steps]

    return flow


def simple_filter_flow(method: str) -> Callable[[Rpc], list[dict[str, Any]]]:
    def flow(rpc: Rpc) -> list[dict[str, Any]]:
        created = rpc.request(method)
        fid = filter_id(created)
        steps = [
            created,
            rpc.request("eth_getFilterChanges", fid),
            rpc.request("eth_uninstallFilter", fid),
        ]
        return [without_id(s, fid) for s in steps]

    return flow

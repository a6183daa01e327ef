"""EVM test fixtures: one anvil with the devnet workload per module, a StateReader reading
anvil's state at any height (so the executor runs exactly as in the node, reading through the
reader), and the EVM methods served on a dispatcher."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import pytest_asyncio

from chainstate.jsonrpc import Dispatcher, JsonRpcError
from nodes.devnet.anvil import ensure_openzeppelin
from nodes.devnet.workload import run_workload
from nodes.state.evm.methods import EvmMethods
from nodes.state.evm.settings import EvmSettings
from nodes.state.reader import HeaderInfo
from tests.nodes.conftest import anvil, anvil_binary, anvil_url  # noqa: F401 (fixtures)

A0 = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
A1 = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
A2 = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc"

# Hand-assembled contracts (no compiler on the devnet).
# ENV: returns NUMBER, TIMESTAMP, BASEFEE, COINBASE, GASLIMIT, CHAINID, PREVRANDAO, BLOCKHASH(n-1)
ENV_RUNTIME = (
    "".join(
        f"{op}60{i * 32:02x}52" for i, op in enumerate(["43", "42", "48", "41", "45", "46", "44"])
    )
    + "60014303"
    + "40"
    + "60e052"
    + "610100"
    + "6000"
    + "f3"
)
LOOP_RUNTIME = "5b600056"  # JUMPDEST PUSH1 0 JUMP: loops until gas runs out
# PANIC: reverts with Panic(0x11): mstore selector+code, revert(0x1c, 0x24)
PANIC_RUNTIME = "634e487b71" + "6000" + "52" + "6011" + "6020" + "52" + "6024" + "601c" + "fd"
# BIGRET: returns 2 MiB of zeros (exceeds the return size limit)
BIGRET_RUNTIME = "62200000" + "6000" + "f3"
# COUNTER: SSTORE(0, SLOAD(0)+1), LOG1(topic=new value), return new value
CODESIZE_RUNTIME = "600035" + "3b" + "600052" + "60206000f3"  # EXTCODESIZE(calldata word)
BALANCE_RUNTIME = "600035" + "31" + "600052" + "60206000f3"  # returns BALANCE(calldata word)
COUNTER_RUNTIME = (
    "600054"
    + "6001"
    + "01"
    + "80"
    + "600055"
    + "80"
    + "600052"
    + "80"
    + "60206000a1"
    + "60206000f3"
)


def forwarder_runtime(target: str) -> str:
    """Forwards its calldata to `target` with CALL and returns what it returned."""
    return (
        "3660006000"
        + "37"  # CALLDATACOPY(0, 0, CALLDATASIZE)
        + "60006000366000600073"
        + target[2:]
        + "5af1"  # CALL(gas, target, 0, 0, size, 0, 0)
        + "50"  # POP success
        + "3d60006000"
        + "3e"  # RETURNDATACOPY(0, 0, RETURNDATASIZE)
        + "3d6000f3"  # RETURN(0, RETURNDATASIZE)
    )


def init_code(runtime_hex: str) -> str:
    n = len(runtime_hex) // 2
    return "0x61" + f"{n:04x}" + "80600c6000396000f3" + runtime_hex


def rpc(url: str, method: str, params: Any) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.loads(resp.read())
    if "error" in answer:
        err = answer["error"]
        raise JsonRpcError(err["code"], err["message"], err.get("data"))
    return answer["result"]


def rpc_raw(url: str, method: str, params: Any) -> dict[str, Any]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


class AnvilReader:
    """A StateReader over anvil's JSON-RPC: real state at any height, read on demand."""

    def __init__(self, url: str) -> None:
        self.url = url

    def range(self) -> tuple[int, int]:
        return 0, int(rpc(self.url, "eth_blockNumber", []), 16)

    def header(self, height: int) -> HeaderInfo:
        b = rpc(self.url, "eth_getBlockByNumber", [hex(height), False])
        if b is None:
            raise JsonRpcError(-39006, f"block {height} is outside the range")
        return HeaderInfo(
            number=int(b["number"], 16),
            hash=b["hash"],
            parent_hash=b["parentHash"],
            timestamp=int(b["timestamp"], 16),
            miner=b["miner"],
            gas_limit=int(b["gasLimit"], 16),
            gas_used=int(b["gasUsed"], 16),
            base_fee_per_gas=int(b["baseFeePerGas"], 16),
            mix_hash=b["mixHash"],
            difficulty=int(b["difficulty"], 16),
            validation_hash="",
            excess_blob_gas=int(b["excessBlobGas"], 16) if "excessBlobGas" in b else None,
        )

    def height_of(self, block_hash: str) -> int | None:
        b = rpc(self.url, "eth_getBlockByHash", [block_hash, False])
        return None if b is None else int(b["number"], 16)

    def balance(self, address: str, height: int) -> int:
        return int(rpc(self.url, "eth_getBalance", [address, hex(height)]), 16)

    def nonce(self, address: str, height: int) -> int:
        return int(rpc(self.url, "eth_getTransactionCount", [address, hex(height)]), 16)

    def code(self, address: str, height: int) -> bytes:
        return bytes.fromhex(rpc(self.url, "eth_getCode", [address, hex(height)])[2:])

    def storage(self, address: str, slot: int, height: int) -> int:
        return int(rpc(self.url, "eth_getStorageAt", [address, hex(slot), hex(height)]), 16)

    def block_body(self, height: int) -> dict[str, Any] | None:
        block = rpc(self.url, "eth_getBlockByNumber", [hex(height), True])
        if block is None:
            return None
        return {"block": block, "receipts": rpc(self.url, "eth_getBlockReceipts", [hex(height)])}

    def transaction_location(self, tx_hash: str) -> tuple[int, int] | None:
        tx = rpc(self.url, "eth_getTransactionByHash", [tx_hash])
        if tx is None or tx.get("blockNumber") is None:
            return None
        return int(tx["blockNumber"], 16), int(tx["transactionIndex"], 16)


@dataclass
class Chain:
    """The devnet after the workload and our extra contracts."""

    url: str
    erc20: str
    holders: list[str]
    env: str
    loop: str
    panic: str
    bigret: str
    counter: str
    forwarder: str
    balances: str
    codesize: str
    erc20_block: int  # first block where the ERC20 exists
    head: int


def send(url: str, tx: dict[str, Any]) -> dict[str, Any]:
    import time

    tx_hash = rpc(url, "eth_sendTransaction", [tx])
    for _ in range(200):
        receipt = rpc(url, "eth_getTransactionReceipt", [tx_hash])
        if receipt is not None:
            return receipt
        time.sleep(0.01)
    raise AssertionError(f"no receipt for {tx_hash}")


def deploy(url: str, runtime_hex: str) -> str:
    return send(url, {"from": A0, "data": init_code(runtime_hex)})["contractAddress"]


@pytest.fixture(scope="module")
def chain(anvil_url: str) -> Chain:  # noqa: F811
    import asyncio

    ensure_openzeppelin()
    record = asyncio.run(run_workload(anvil_url, reorg=False))
    erc20_block = int(rpc(anvil_url, "eth_blockNumber", []), 16)
    for b in range(record.first_block, erc20_block + 1):
        if rpc(anvil_url, "eth_getCode", [record.erc20, hex(b)]) != "0x":
            erc20_block = b
            break
    contracts = {
        name: deploy(anvil_url, code)
        for name, code in [
            ("env", ENV_RUNTIME),
            ("loop", LOOP_RUNTIME),
            ("panic", PANIC_RUNTIME),
            ("bigret", BIGRET_RUNTIME),
            ("counter", COUNTER_RUNTIME),
            ("balances", BALANCE_RUNTIME),
            ("codesize", CODESIZE_RUNTIME),
        ]
    }
    contracts["forwarder"] = deploy(anvil_url, forwarder_runtime(record.erc20))
    # more ERC20 history after the workload: transfers in separate blocks
    for i in range(3):
        data = "0xa9059cbb" + A2[2:].rjust(64, "0") + f"{(i + 1) * 10**18:064x}"
        send(anvil_url, {"from": A0, "to": record.erc20, "data": data})
    head = int(rpc(anvil_url, "eth_blockNumber", []), 16)
    return Chain(
        url=anvil_url,
        erc20=record.erc20,
        holders=[h.lower() for h in record.erc20_holders],
        head=head,
        erc20_block=erc20_block,
        **contracts,
    )


class Client:
    """Calls the EVM methods through a Dispatcher, as the node's JSON-RPC server does."""

    def __init__(self, methods: EvmMethods) -> None:
        self.methods = methods
        self.dispatcher = Dispatcher("evm-test")
        self.dispatcher.update(methods.handlers())

    async def raw(self, method: str, params: Any) -> dict[str, Any]:
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        return orjson.loads(await self.dispatcher.handle_body(body))

    async def call(self, method: str, params: Any) -> Any:
        answer = await self.raw(method, params)
        if "error" in answer:
            err = answer["error"]
            raise JsonRpcError(err["code"], err["message"], err.get("data"))
        return answer["result"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def evm(chain: Chain) -> AsyncIterator[Client]:
    # the first call a worker runs on py-evm imports it (~1.5 s, more on a busy machine)
    settings = EvmSettings(workers=2, call_timeout=10.0, chain_id=1337, max_trace_steps=1000)
    methods = EvmMethods(AnvilReader(chain.url), settings)
    await methods.start()
    try:
        yield Client(methods)
    finally:
        await methods.close()

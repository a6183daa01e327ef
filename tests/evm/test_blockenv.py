"""Every opcode that reads the block environment, differential against anvil: NUMBER,
TIMESTAMP, COINBASE, GASLIMIT, BASEFEE, PREVRANDAO, CHAINID and BLOBBASEFEE, at latest and
at older heights, with and without blockOverrides; and the issue's BASEFEE reproduction
(code given by a state override). BASEFEE is the one pyrevm 0.3.7 cannot give (it runs
calls with a base fee of 0): such calls are answered by py-evm (nodes/state/evm/basefee.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.evm.conftest import A1, Chain, Client, deploy, rpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

OPS = {
    "NUMBER": "43",
    "TIMESTAMP": "42",
    "COINBASE": "41",
    "GASLIMIT": "45",
    "BASEFEE": "48",
    "PREVRANDAO": "44",
    "CHAINID": "46",
    "BLOBBASEFEE": "4a",
}
# returns the eight values above as eight words
BLOCKENV_RUNTIME = (
    "".join(f"{op}60{i * 32:02x}52" for i, op in enumerate(OPS.values())) + "6101006000f3"
)
BASEFEE_CODE = "0x4860005260206000f3"  # the reproduction: returns BASEFEE
OVERRIDES = {
    "number": "0x1234",
    "time": "0x65000000",
    "gasLimit": "0x1c9c380",
    "coinbase": A1,
    "random": "0x" + "ab" * 32,
    "baseFee": "0x3b9aca07",
}


@pytest.fixture(scope="module")
def blockenv(chain: Chain) -> str:
    return deploy(chain.url, BLOCKENV_RUNTIME)


def words(hex_data: str) -> dict[str, int]:
    raw = bytes.fromhex(hex_data[2:])
    return {name: int.from_bytes(raw[32 * i : 32 * i + 32], "big") for i, name in enumerate(OPS)}


def heights(chain: Chain) -> list[str]:
    head = int(rpc(chain.url, "eth_blockNumber", []), 16)
    return ["latest", hex(head - 2), hex(chain.erc20_block)]


@pytest.mark.parametrize("overrides", [None, OVERRIDES], ids=["header", "blockOverrides"])
async def test_block_env_opcodes_equal_anvil(
    evm: Client, chain: Chain, overrides: dict[str, Any] | None
) -> None:
    """The code sits at a fresh address through a state override, so it exists at every
    height asked (old ones included)."""
    target = "0x" + "5c" * 20
    for height in heights(chain):
        params: list[Any] = [
            {"to": target, "data": "0x"},
            height,
            {target: {"code": "0x" + BLOCKENV_RUNTIME}},
        ]
        if overrides is not None:
            params.append(overrides)
        theirs = words(rpc(chain.url, "eth_call", params))
        ours = words(await evm.call("eth_call", params))
        assert ours == theirs, height
        assert theirs["BASEFEE"] != 0, (height, theirs)  # what pyrevm alone answers wrong


async def test_basefee_reproduction_answers_the_blocks_base_fee(evm: Client, chain: Chain) -> None:
    """The issue's reproduction: code returning BASEFEE given by a state override."""
    target = "0x" + "5a" * 20
    for height in heights(chain):
        params = [{"to": target, "data": "0x"}, height, {target: {"code": BASEFEE_CODE}}]
        theirs = rpc(chain.url, "eth_call", params)
        assert await evm.call("eth_call", params) == theirs, height
        block = rpc(chain.url, "eth_getBlockByNumber", [height, False])
        assert int(theirs, 16) == int(block["baseFeePerGas"], 16)


async def test_a_call_reading_basefee_through_another_contract(
    evm: Client, chain: Chain, blockenv: str
) -> None:
    """BASEFEE read by a contract the called one calls (not the called code itself), and a
    contract creation whose init code reads it: both still equal anvil."""
    forwarder = "0x" + "5b" * 20
    # CALL(gas, blockenv, 0, 0, 0, 0, 256); RETURN(0, 256)
    code = "0x" + "6101006000600060006000" + "73" + blockenv[2:] + "5af1" + "506101006000f3"
    params = [{"to": forwarder, "data": "0x"}, "latest", {forwarder: {"code": code}}]
    assert await evm.call("eth_call", params) == rpc(chain.url, "eth_call", params)
    # init code: MSTORE(0, BASEFEE); RETURN(0, 32) → the "deployed code" is the base fee
    create = [{"data": "0x" + "4860005260206000f3"}, "latest"]
    assert await evm.call("eth_call", create) == rpc(chain.url, "eth_call", create)

"""`chainstate up` as a newcomer runs it: send a transaction through the proxy, read the new
balance at the new block and the old balance at an old block, trace a block, see it
confirmed by the checker, stop with Ctrl-C, and resume from the stored data."""

from __future__ import annotations

import pytest

from tests.e2e.stack import BEEF, DEV, Stack, post, wait_for, write_config


@pytest.mark.timeout(300)
def test_up_send_read_trace_confirm_and_resume(tmp_path):
    config, ports = write_config(tmp_path)
    stack = Stack(config, ports)
    stack.start()
    try:
        banner = "".join(stack.output)
        assert f"POST http://127.0.0.1:{ports['8663']}/1337" in banner
        assert stack.rpc("eth_chainId") == "0x539"
        tx = stack.rpc("eth_sendTransaction", {"from": DEV, "to": BEEF, "value": hex(10**18)})
        receipt = wait_for(
            lambda: stack.rpc("eth_getTransactionReceipt", tx, url=stack.url("8545")),
            what="the transaction to be mined",
        )
        mined = int(receipt["blockNumber"], 16)
        wait_for(
            lambda: stack.rpc("eth_getBalance", BEEF, "latest") == hex(10**18),
            what="the state node to ingest the block",
        )
        assert stack.rpc("eth_getBalance", BEEF, hex(mined)) == hex(10**18)
        assert stack.rpc("eth_getBalance", BEEF, hex(mined - 1)) == "0x0"
        assert stack.rpc("eth_getBalance", BEEF, "earliest") == "0x0"  # archive node
        # The block's header through the proxy is anvil's, field for field (the spec
        # answers block queries with the header alone: the body's lists and the
        # deprecated totalDifficulty aside).
        ours = stack.rpc("eth_getBlockByNumber", hex(mined), False)
        anvils = stack.rpc("eth_getBlockByNumber", hex(mined), False, url=stack.url("8545"))
        body = {"transactions", "uncles", "withdrawals", "totalDifficulty"}
        assert {k: v for k, v in ours.items() if k not in body} == {
            k: v for k, v in anvils.items() if k not in body
        }

        batch = post(
            stack.url("8663") + "/1337",
            [
                {
                    "jsonrpc": "2.0",
                    "id": "new",
                    "method": "eth_getBalance",
                    "params": [BEEF, "latest"],
                },
                {
                    "jsonrpc": "2.0",
                    "id": "old",
                    "method": "getAddressBalance",
                    "params": [BEEF, {"block_id": hex(mined - 1), "type": "Equals"}],
                },
            ],
        )
        assert [item["id"] for item in batch] == ["new", "old"]

        block0 = stack.rpc("trace_vendorBlock", "0x0")
        assert set(block0) == {"BlockFile", "Header", "StateDiff", "ValidationHash"}
        traced = stack.rpc("trace_vendorBlock", hex(mined))
        assert BEEF in traced["StateDiff"]["post"]

        checker = stack.url("8667")
        confirmed = wait_for(
            lambda: (r := stack.rpc("getLatestBlock", url=checker))["num"] >= mined and r,
            what="the checker to confirm the block",
        )
        assert confirmed["is_fork"] is False
        assert stack.rpc("blockIsValid", traced["Header"]["hash"], url=checker) is True
    finally:
        assert stack.stop() == 0, "".join(stack.output)

    stack = Stack(config, ports)
    stack.start()
    try:
        assert stack.rpc("eth_getBalance", BEEF, hex(mined)) == hex(10**18)
        assert int(stack.rpc("eth_blockNumber"), 16) >= mined
    finally:
        assert stack.stop() == 0, "".join(stack.output)

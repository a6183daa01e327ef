"""A fleet's client: reads and transactions through two proxies, as behind a load balancer.

Run on its own host (`python -m tests.fleet.client OUT URL URL`) until SIGTERM. Requests go
round-robin to the proxies in service; an attempt that fails (no connection, timeout, HTTP
5xx, a JSON-RPC error saying the proxy could not serve it) is retried once on the other
proxy and takes the failed one out of service until its `GET /health` answers again
(checked every CHECK_INTERVAL), as a load balancer with passive and active health checks
does. Every request is one JSON line in OUT: when it started and ended, which proxy it went
to first, how many attempts it took, whether it was answered; transactions also give their
hash when one was returned (acknowledged).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import time
from typing import Any

import aiohttp
from eth_account import Account

ATTEMPT_TIMEOUT = 3.0  # seconds one attempt may take before the other proxy is tried
CHECK_INTERVAL = 1.0  # seconds between health checks of a proxy out of service
CHECK_TIMEOUT = 1.0  # seconds a health check may take
READERS = 4  # concurrent read loops
TX_INTERVAL = 0.2  # seconds between transactions
# dev account 1 of the test mnemonic (account 0 is left to other tools)
SENDER_KEY = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"
SENDER = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
BEEF = "0x000000000000000000000000000000000000bEEF"
CHAIN_ID = 1337
# The proxy could not serve the request (no node, the Leader down; busy): another proxy may.
# Every other error is the answer to the request itself (a transaction whose nonce is
# already used, after an attempt whose answer was lost, is refused as such).
PROXY_FAILURES = (-32603, -32005)


def some_read() -> tuple[str, list[Any]]:
    """A read the proxy's cache cannot answer from an earlier one most of the time (a fresh
    address), so the nodes behind the proxies are asked."""
    address = "0x" + random.randbytes(20).hex()
    return random.choice(
        [
            ("eth_blockNumber", []),
            ("eth_getBlockByNumber", ["latest", False]),
            ("eth_getBalance", [address, "latest"]),
            ("eth_getTransactionCount", [address, "latest"]),
            ("eth_getBalance", [address, "0x1"]),
        ]
    )


class Failed(Exception):
    pass


class Balancer:
    def __init__(self, urls: list[str], session: aiohttp.ClientSession) -> None:
        self.urls = urls
        self.session = session
        self.down = [False] * len(urls)
        self.turn = 0

    def order(self) -> list[int]:
        self.turn += 1
        ring = [(self.turn + i) % len(self.urls) for i in range(len(self.urls))]
        return sorted(ring, key=lambda i: self.down[i])  # those in service first

    async def check_health(self, stopping: asyncio.Event) -> None:
        """Bring a proxy out of service back once its /health answers."""
        timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT)
        while not stopping.is_set():
            await asyncio.sleep(CHECK_INTERVAL)
            for index, url in enumerate(self.urls):
                if not self.down[index]:
                    continue
                health = url.rsplit("/", 1)[0] + "/health"
                try:
                    async with self.session.get(health, timeout=timeout) as resp:
                        self.down[index] = resp.status != 200
                except (aiohttp.ClientError, TimeoutError):
                    pass

    async def attempt(self, index: int, body: dict[str, Any]) -> Any:
        timeout = aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT)
        try:
            async with self.session.post(self.urls[index], json=body, timeout=timeout) as resp:
                if resp.status >= 500:
                    raise Failed(f"HTTP {resp.status}")
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise Failed(f"{type(exc).__name__}: {exc}") from None
        error = answer.get("error") if isinstance(answer, dict) else None
        if error is not None:
            code = error.get("code", 0)
            if code in PROXY_FAILURES:
                raise Failed(f"JSON-RPC {code}: {error.get('message')}")
            return answer  # the request's own error (e.g. nonce too low): an answer
        return answer

    async def call(self, method: str, params: list[Any]) -> dict[str, Any]:
        """One request with at most one retry on the other proxy; a record of it."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        record: dict[str, Any] = {"method": method, "t0": time.time(), "tries": 0}
        order = self.order()
        record["first"] = order[0]
        for index in order:
            record["tries"] += 1
            try:
                record["answer"] = await self.attempt(index, body)
                record["ok"] = "result" in record["answer"]
                break
            except Failed as exc:
                self.down[index] = True
                record.setdefault("errors", []).append(f"proxy {index}: {exc}")
        else:
            record["ok"] = False
        record["t1"] = time.time()
        return record


class Client:
    def __init__(self, out: Any, balancer: Balancer) -> None:
        self.out = out
        self.balancer = balancer
        self.stopping = asyncio.Event()

    def write(self, record: dict[str, Any]) -> None:
        record.pop("answer", None)
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    async def reader(self) -> None:
        while not self.stopping.is_set():
            method, params = some_read()
            record = await self.balancer.call(method, params)
            record["op"] = "read"
            self.write(record)

    async def sender(self) -> None:
        """Transactions one after another; one not acknowledged is sent again (the same
        signed bytes, so never twice under two hashes) until it is."""
        account = Account.from_key(SENDER_KEY)
        while not self.stopping.is_set():
            answer = await self.balancer.call("eth_getTransactionCount", [SENDER, "pending"])
            if answer["ok"]:
                nonce = int(answer["answer"]["result"], 16)
                break
            await asyncio.sleep(0.5)
        else:
            return
        while not self.stopping.is_set():
            tx = {
                "to": BEEF,
                "value": 1,
                "gas": 21000,
                "maxFeePerGas": 100 * 10**9,
                "maxPriorityFeePerGas": 10**9,
                "nonce": nonce,
                "chainId": CHAIN_ID,
            }
            raw = "0x" + account.sign_transaction(tx).raw_transaction.hex().removeprefix("0x")
            record = await self.balancer.call("eth_sendRawTransaction", [raw])
            record.update(op="tx", nonce=nonce)
            result = record.get("answer", {}).get("result") if record["ok"] else None
            if result:
                record["hash"] = result
                nonce += 1
            elif "answer" in record:  # refused as such (already known, nonce too low)
                record["refused"] = record["answer"].get("error")
                nonce += 1
            self.write(record)
            await asyncio.sleep(TX_INTERVAL)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        tasks = [asyncio.create_task(self.reader()) for _ in range(READERS)]
        tasks.append(asyncio.create_task(self.sender()))
        tasks.append(asyncio.create_task(self.balancer.check_health(self.stopping)))
        await self.stopping.wait()
        await asyncio.wait(tasks, timeout=ATTEMPT_TIMEOUT * 2 + 1)


async def main(out_path: str, urls: list[str]) -> None:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        with open(out_path, "a") as out:  # noqa: ASYNC230 (opened once, before any request)
            await Client(out, Balancer(urls, session)).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))

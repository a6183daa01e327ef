"""One bad client must not hurt the others: each attack on a real `chainstate up`, with the
bound it must keep. One stack for the module (starting one costs ~15 s); the attacks run one
after another, each watched by a probe (an `eth_getBalance` every 50 ms from another
thread, its slowest answer kept) and, where memory is the point, the RSS of the process.

Bounds have margins for a loaded 2-core machine: unbounded, these attacks took 1.5-4 GB of
RSS and stalled others 2-26 s; the bounds are 400 MB and 0.2-2 s, and the quiet-machine
figures of this code a fraction of those (see each test)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.stack import BEEF, DEV, Stack, wait_for, write_config

pytestmark = pytest.mark.timeout(600)

# A contract that, called with (n, s) as two words, emits n LOG1 (topic 1) of s zero bytes.
RUNTIME = "600035602035905b8015601a576001826000a1600190036007565b00"
EVENTS = {
    "max_filters": 20_000,
    "max_listeners_per_client": 20_000,
    "max_listener_bytes_per_client": 268_435_456,
}


# Each loop reads the balance of a new account (GAS's value): 2.6k gas of cold state reads,
# so 30M gas run past CALL_TIMEOUT (set low here for a short test; the proxy waits longer).
SLOW = "5b5a3150600056"  # JUMPDEST GAS BALANCE POP PUSH1 0 JUMP
CALL_TIMEOUT = 1.0
UPSTREAM = 30.0


def _init_code(runtime: str) -> str:
    size = len(runtime) // 2
    return "0x60" + f"{size:02x}" + "80600b6000396000f3" + runtime


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("hostile")
    config, ports = write_config(tmp)
    table = "\n".join(f"{k} = {v}" for k, v in EVENTS.items())
    text = config.read_text().replace("[proxy]\n", f"[proxy]\nupstream_timeout = {UPSTREAM}\n")
    text = text.replace(  # (every state node: `source` is the last key of its table)
        'source = "inproc://writer-1"\n',
        f'source = "inproc://writer-1"\nevm = {{ call_timeout = {CALL_TIMEOUT} }}\n',
    )
    config.write_text(text + f"\n[proxy.events]\n{table}\n")
    stack = Stack(config, ports)
    stack.start()
    drain = threading.Thread(target=lambda: [stack.output.append(x) for x in stack.proc.stdout])
    drain.daemon = True  # (the stack's log must not fill the pipe and stop it)
    drain.start()
    try:
        yield stack
    finally:
        stack.stop()


def call(url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 60) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"null")
        except json.JSONDecodeError:
            return exc.code, raw.decode("latin-1")


def req(method: str, *params: Any, rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": list(params)}


class Probe:
    """Another client: an eth_getBalance every 50 ms; the slowest answer, and the highest
    RSS of the stack's process, while it runs."""

    def __init__(self, stack: Stack) -> None:
        self.url = stack.url("8663") + "/1337"
        self.pid = stack.proc.pid
        self.slowest = 0.0
        self.rss_before = rss(self.pid)
        self.rss_peak = self.rss_before
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._probe, daemon=True),
            threading.Thread(target=self._memory, daemon=True),
        ]

    def __enter__(self) -> Probe:
        for thread in self._threads:
            thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _probe(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            status, answer = call(self.url, req("eth_getBalance", BEEF, "latest"), timeout=30)
            assert status == 200 and "result" in answer, answer
            self.slowest = max(self.slowest, time.monotonic() - started)
            self._stop.wait(0.05)

    def _memory(self) -> None:
        while not self._stop.is_set():
            self.rss_peak = max(self.rss_peak, rss(self.pid))
            self._stop.wait(0.02)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def deploy(stack: Stack, runtime: str = RUNTIME) -> str:
    tx = stack.rpc("eth_sendTransaction", {"from": DEV, "data": _init_code(runtime)})
    receipt = wait_for(lambda: stack.rpc("eth_getTransactionReceipt", tx), what="the deploy")
    return receipt["contractAddress"]


def emit(stack: Stack, contract: str, count: int, size: int, txs: int = 1) -> list[int]:
    """`txs` transactions of `count` logs of `size` bytes each; the blocks that hold them,
    once the state nodes have them."""
    data = "0x" + f"{count:064x}" + f"{size:064x}"
    sent = [
        stack.rpc(
            "eth_sendTransaction", {"from": DEV, "to": contract, "data": data, "gas": "0x1c9c380"}
        )
        for _ in range(txs)
    ]
    blocks = []
    for tx in sent:
        receipt = wait_for(lambda tx=tx: stack.rpc("eth_getTransactionReceipt", tx), timeout=60)
        assert receipt["status"] == "0x1", receipt
        blocks.append(int(receipt["blockNumber"], 16))
    return blocks


@pytest.fixture(scope="module")
def contract(stack: Stack) -> str:
    return deploy(stack)


def test_a_batch_of_big_answers_is_bounded(stack: Stack, contract: str) -> None:
    """Six blocks with one 2 MB log each, then a batch of 32 eth_getLogs over all six (each
    answer 24 MB, 768 MB together): the batch stops once its answers pass the node's
    32 MiB batch budget and answers the rest -32005; RSS grows by at most 400 MB (the
    unbounded: 1.5 GB), the probe is answered within 2 s throughout, and the refusals,
    though -32005, back no node off as a rate limit would (each retried elsewhere made
    more 24 MB answers)."""
    blocks = emit(stack, contract, 1, 2 * 1024 * 1024, txs=6)
    flt = {"fromBlock": hex(min(blocks)), "toBlock": hex(max(blocks)), "address": contract}
    batch = [req("eth_getLogs", flt, rid=i) for i in range(32)]
    with Probe(stack) as probe:
        status, answers = call(stack.url("8663") + "/1337", batch, timeout=120)
    assert status == 200 and [a["id"] for a in answers] == list(range(32))
    done = [a for a in answers if "result" in a]
    refused = [a for a in answers if "error" in a]
    assert done and refused, [a.get("error") for a in answers]
    assert all(len(a["result"]) == 6 for a in done)
    assert all(a["error"]["code"] == -32005 for a in refused)
    assert "batch_answer_bytes" in refused[0]["error"]["message"]
    assert probe.rss_peak - probe.rss_before <= 400 * 1024 * 1024, probe.rss_peak
    grew = (probe.rss_peak - probe.rss_before) >> 20
    print(f"probe slowest {probe.slowest:.2f} s, RSS +{grew} MB")
    assert probe.slowest < 2.0, probe.slowest
    # the node's refusals of the batch's size are no rate limit: no node was backed off
    with urllib.request.urlopen(stack.url("8663") + "/1337/getAllNodes", timeout=10) as resp:
        nodes = json.loads(resp.read())["nodes"]
    assert [n["key"] for n in nodes if n["upstream_budget"]["rate_limited"]] == [], nodes


def test_a_600_kb_log_reaches_a_reading_subscriber(stack: Stack, contract: str) -> None:
    """A notification larger than ws_queue_bytes (1 MiB as hex) is delivered whole to a
    client that reads (it used to be dropped with 1008 'slow consumer')."""
    ws_url = stack.url("8663").replace("http", "ws") + "/1337"

    async def run() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
            await ws.send_json(req("eth_subscribe", "logs", {"address": contract}))
            sub = (await ws.receive_json(timeout=30))["result"]
            sender = asyncio.get_running_loop().run_in_executor(
                None, emit, stack, contract, 1, 600_000
            )
            message = await ws.receive_json(timeout=60)
            await sender
            assert message["params"]["subscription"] == sub
            return message["params"]["result"]

    log = asyncio.run(run())
    assert log["address"] == contract and len(log["data"]) == 2 + 2 * 600_000


def test_ten_thousand_filters_and_an_8000_log_block(stack: Stack, contract: str) -> None:
    """10,000 filters on other contracts (one client: its cap raised for the test), then a
    transaction with 8,000 logs: matching is indexed by address, so the block costs its
    logs' lookups, not 10,000 × 8,000 checks (unindexed: a 7.4 s stall); the probe stays
    under 0.5 s and a filter on the contract gets all 8,000 logs."""
    url = stack.url("8663") + "/1337"
    for start in range(0, 10_000, 1000):
        batch = [
            req("eth_newFilter", {"address": f"0x{start + i + 1:040x}"}, rid=i) for i in range(1000)
        ]
        status, answers = call(url, batch)
        assert status == 200 and all("result" in a for a in answers), answers[:2]
    status, mine = call(url, req("eth_newFilter", {"address": contract}))
    with Probe(stack) as probe:
        emit(stack, contract, 8000, 0)
        changes: list[Any] = []
        deadline = time.monotonic() + 30
        while len(changes) < 8000 and time.monotonic() < deadline:
            changes += call(url, req("eth_getFilterChanges", mine["result"]))[1]["result"]
            time.sleep(0.2)
    assert len(changes) == 8000
    assert probe.slowest < 0.5, probe.slowest


def test_big_calldata_does_not_stall_other_clients(stack: Stack) -> None:
    """Eight eth_calls with 5 MB of calldata each, sent at once, three times: the slowest
    probe of the best round stays under 0.2 s (with a per-byte regex: 5.7 s). What each call
    leaves on the event loop is one parse of its body, one body per turn of the loop (engine.py
    `_large`): no regex over the hex, no key written or hashed for the cache, no pinned
    body written again for the node in process, the calldata decoded by the EVM worker.
    Measured on this shared 2-core VM: best round 0.15 s at load averages of 7-8 (rounds
    0.15-0.46 s), ~0.5 s at 11-12 (the stack's process then waits for a core whatever it
    runs). The best of three rounds takes out the scheduling noise of a loaded machine: a
    stall the code causes shows in every round."""
    data = "0x" + "ab" * (5 * 1024 * 1024 // 2)
    body = json.dumps(req("eth_call", {"to": BEEF, "data": data}, "latest")).encode()
    url = stack.url("8663") + "/1337"
    for i in range(10):  # both nodes' EVM workers started (they start on a first call)
        call(url, req("eth_call", {"to": BEEF, "data": hex(i)}, "latest"))
    rounds = []
    for _ in range(3):
        with Probe(stack) as probe:
            threads = [threading.Thread(target=call, args=(url, body)) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        rounds.append(probe.slowest)
    status, answer = call(url, body)
    assert status == 200 and "intrinsic gas" in answer["error"]["message"], answer
    assert min(rounds) < 0.2, rounds


def test_a_call_stopped_by_its_own_cost_is_not_run_again(stack: Stack) -> None:
    """Eight distinct eth_calls at once, each running past the EVM's time limit: each is
    answered as stopped by its own cost (geth's -32000 at the face, `data.reason`
    time_limit) and stops an EVM worker once: none runs again, neither as the culprit of a
    combined job nor after its client has its answer. (Before: 16 such calls at the 5 s
    default stopped 32 workers, most of them after the clients had their errors, and the
    proxy ran the calls again on the other node.)"""
    contract = deploy(stack, SLOW)
    url = stack.url("8663") + "/1337"

    def stopped() -> int:  # EVM workers stopped at the time limit (and replaced)
        return sum("evm worker replaced" in line for line in list(stack.output))

    before = stopped()
    answers: list[Any] = [None] * 8

    def one(i: int) -> None:
        item = {"to": contract, "gas": "0x1c9c380", "data": "0x" + f"{i:064x}"}
        answers[i] = call(url, req("eth_call", item, "latest"), timeout=120)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for status, answer in answers:
        assert status == 200, answer
        assert answer["error"]["data"] == {"reason": "time_limit", "seconds": CALL_TIMEOUT}
    time.sleep(3 * CALL_TIMEOUT)  # (a call run again would stop one more worker by now)
    assert stopped() - before == 8, "".join(stack.output[-20:])


def test_nested_params_are_invalid_params(stack: Stack) -> None:
    nested: Any = {"to": BEEF}
    for _ in range(260):
        nested = {"a": nested}
    url = stack.url("8663") + "/1337"
    status, answer = call(url, req("eth_call", nested, "latest"))
    assert status == 200 and answer["error"]["code"] == -32602, "".join(stack.output[-5:])[-3000:]
    status, answers = call(url, [req("eth_call", nested, "latest"), req("eth_chainId", rid=2)])
    assert status == 200 and answers[0]["error"]["code"] == -32602
    assert answers[1] == {"jsonrpc": "2.0", "id": 2, "result": "0x539"}


def test_the_admin_api_refuses_cross_site_requests(stack: Stack) -> None:
    """A page the operator opens can send text/plain POSTs anywhere: addMirror would copy
    every client request out (it used to: 201). Refused; a cut-off admin request leaves the
    admin API answering; /metrics never shows a client id."""
    base = stack.url("8663")
    mirror = json.dumps({"url": "http://127.0.0.1:9"}).encode()
    for headers in (
        {"content-type": "text/plain"},
        {"Origin": "http://evil.example"},
        {"Host": "evil.example:8663"},
    ):
        status, answer = call(base + "/1337/addMirror", mirror, headers)
        assert status in (403, 415), (headers, status, answer)
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", stack.ports["8663"])) as sock:
            sock.sendall(
                b"POST /1337/deleteWeight HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"key"'
            )
    status, answer = call(base + "/1337/cache/flush", {}, timeout=10)
    assert status == 200, answer
    assert call(base + "/1337/getMirrors", b"")[0] in (404, 405)  # (a GET path)
    with urllib.request.urlopen(base + "/1337/getMirrors", timeout=10) as resp:
        assert json.loads(resp.read())["mirrors"] == []
    secret = "sk_live_0123456789abcdef"
    call(base + "/1337", req("eth_chainId"), {"client-id": secret})
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    assert "chainstate_proxy_client_requests_total" in text and secret not in text

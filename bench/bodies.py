"""The request bodies a load run sends: one fixed body, or a pool drawn from a method mix.

Bodies are built before the run starts so the hot loop only picks bytes from a list. A mix
draws methods by weight, heights uniformly from a range and accounts from a fixed set, into
a pool of `pool_size` distinct bodies that the connections cycle through.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

DEFAULT_POOL_SIZE = 4096  # distinct bodies pre-built for a mix of single requests
DEFAULT_POOL_ITEMS = 65_536  # batches: the default pool holds about this many items
MIN_POOL_SIZE = 16  # bodies in a default pool however large the batch
DEFAULT_ADDRESSES = 1000  # distinct accounts a mix draws from
DEFAULT_SLOTS = 16  # storage slots 0..N-1 a mix draws from
MAX_BATCH = 100_000  # refuse absurd --batch values early


class BodyError(ValueError):
    """A body option is malformed (the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class BlockRange:
    """Heights to draw from (inclusive); `None` bounds mean the tag `latest`."""

    low: int | None = None
    high: int | None = None

    def pick(self, rng: random.Random) -> str:
        if self.low is None or self.high is None:
            return "latest"
        return hex(rng.randint(self.low, self.high))


def parse_blocks(text: str) -> BlockRange:
    """`latest`, `H` or `LO-HI` (decimal heights)."""
    text = text.strip()
    if text == "latest":
        return BlockRange()
    try:
        if "-" in text:
            lo_s, hi_s = text.split("-", 1)
            low, high = int(lo_s), int(hi_s)
        else:
            low = high = int(text)
    except ValueError:
        raise BodyError(f"--blocks {text!r}: expected 'latest', 'H' or 'LO-HI'") from None
    if low < 0 or high < low:
        raise BodyError(f"--blocks {text!r}: need 0 <= LO <= HI")
    return BlockRange(low, high)


@dataclass(frozen=True)
class Draw:
    """What one templated request may use: an account, a block, a storage slot."""

    address: str
    block: str
    slot: int


def _ctx(block: str) -> dict[str, str]:
    return {"block_id": block, "type": "Equals"}


def balance_of(address: str) -> str:
    return "0x70a08231" + address[2:].rjust(64, "0")  # ERC20 balanceOf(address)


TEMPLATES: dict[str, Callable[[Draw], list[Any]]] = {
    "eth_blockNumber": lambda d: [],
    "eth_chainId": lambda d: [],
    "eth_getBalance": lambda d: [d.address, d.block],
    "eth_getTransactionCount": lambda d: [d.address, d.block],
    "eth_getCode": lambda d: [d.address, d.block],
    "eth_getStorageAt": lambda d: [d.address, hex(d.slot), d.block],
    "eth_call": lambda d: [{"to": d.address, "data": balance_of(d.address)}, d.block],
    "eth_getBlockByNumber": lambda d: [d.block, False],
    "eth_getLogs": lambda d: [{"fromBlock": d.block, "toBlock": d.block, "address": d.address}],
    "getAddressBalance": lambda d: [d.address, _ctx(d.block)],
    "getAddressNonce": lambda d: [d.address, _ctx(d.block)],
    "getAddressCode": lambda d: [d.address, _ctx(d.block)],
    "getStorageAt": lambda d: [d.address, hex(d.slot), _ctx(d.block)],
}


def parse_mix(text: str) -> list[tuple[str, float]]:
    """`eth_getBalance=3,eth_getStorageAt=1` → [(method, weight)]; weight defaults to 1."""
    mix: list[tuple[str, float]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, weight_s = part.partition("=")
        name = name.strip()
        if name not in TEMPLATES:
            known = ", ".join(sorted(TEMPLATES))
            raise BodyError(f"--mix: unknown method {name!r}; known: {known}")
        try:
            weight = float(weight_s) if weight_s else 1.0
        except ValueError:
            raise BodyError(f"--mix: weight of {name} must be a number") from None
        if weight <= 0:
            raise BodyError(f"--mix: weight of {name} must be > 0")
        mix.append((name, weight))
    if not mix:
        raise BodyError("--mix: give at least one method")
    return mix


def fake_addresses(count: int, seed: int = 0) -> list[str]:
    """`count` distinct deterministic account addresses."""
    return [
        "0x" + hashlib.blake2b(b"acct%d:%d" % (seed, i), digest_size=20).hexdigest()
        for i in range(count)
    ]


@dataclass
class BodyPlan:
    """How to make bodies: exactly one of `fixed` (a JSON value) or `mix` is set."""

    fixed: Any = None
    mix: list[tuple[str, float]] = field(default_factory=list)
    batch: int = 1  # items per HTTP request (1 = single request objects)
    blocks: BlockRange = field(default_factory=BlockRange)
    addresses: list[str] = field(default_factory=list)
    slots: int = DEFAULT_SLOTS
    pool_size: int | None = None  # None: DEFAULT_POOL_SIZE bodies, fewer for large batches
    # eth_call items of a mix call this contract (else the drawn account itself) with
    # `call_data` (else ERC20 balanceOf(drawn account)).
    call_to: str | None = None
    call_data: str | None = None
    # The mix's weights are exact item counts per batch (they sum to `batch`), each method's
    # items drawn without repeating an account, in shuffled order.
    exact_mix: bool = False
    # eth_getLogs items of a mix cover this many blocks from the drawn one (the drawn
    # account's logs, with `log_topics` when given).
    log_span: int = 1
    log_topics: list[Any] | None = None
    _built: dict[int, list[bytes]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.fixed is None) == (not self.mix):
            raise BodyError("give either a fixed body (--method/--body-file) or --mix")
        if not 1 <= self.batch <= MAX_BATCH:
            raise BodyError(f"--batch must be between 1 and {MAX_BATCH}")
        if isinstance(self.fixed, list) and self.batch != 1:
            raise BodyError("the body is already a batch array; drop --batch")
        if self.mix and not self.addresses:
            self.addresses = fake_addresses(DEFAULT_ADDRESSES)
        if self.pool_size is None:
            by_items = max(MIN_POOL_SIZE, DEFAULT_POOL_ITEMS // self.batch)
            self.pool_size = min(DEFAULT_POOL_SIZE, by_items)
        if self.pool_size < 1:
            raise BodyError("--pool must be >= 1")
        self._check_call()
        if self.exact_mix:
            counts = [w for _, w in self.mix]
            if any(c != int(c) for c in counts) or sum(counts) != self.batch:
                raise BodyError("an exact mix needs whole counts that sum to --batch")

    def _check_call(self) -> None:
        if self.call_to is None and self.call_data is None:
            return
        if not any(m == "eth_call" for m, _ in self.mix):
            raise BodyError("--call-to/--call-data need eth_call in --mix")
        if self.call_to is not None and not _is_hex(self.call_to, 20):
            raise BodyError(f"--call-to {self.call_to!r}: expected a 20-byte 0x address")
        if self.call_data is not None and not _is_hex(self.call_data, None):
            raise BodyError(f"--call-data {self.call_data!r}: expected 0x-prefixed hex bytes")

    @property
    def items_per_body(self) -> int:
        if isinstance(self.fixed, list):
            return len(self.fixed)
        return self.batch

    def build(self, seed: int = 0) -> list[bytes]:
        """The pool of body bytes (a single body when fixed); built once per seed."""
        if seed not in self._built:
            self._built[seed] = self._build(seed)
        return self._built[seed]

    def _build(self, seed: int) -> list[bytes]:
        if self.fixed is not None:
            return [orjson.dumps(self._batched(lambda i: dict(self.fixed, id=i)))]
        rng = random.Random(seed)
        names = [m for m, _ in self.mix]
        weights = [w for _, w in self.mix]
        pool: list[bytes] = []
        if self.exact_mix:
            return [self._exact_body(rng) for _ in range(self.pool_size or DEFAULT_POOL_SIZE)]
        for _ in range(self.pool_size or DEFAULT_POOL_SIZE):

            def item(i: int) -> dict[str, Any]:
                method = rng.choices(names, weights)[0]
                draw = Draw(
                    rng.choice(self.addresses), self.blocks.pick(rng), rng.randrange(self.slots)
                )
                params = self._params(method, draw)
                return {"jsonrpc": "2.0", "id": i, "method": method, "params": params}

            pool.append(orjson.dumps(self._batched(item)))
        return pool

    def _exact_body(self, rng: random.Random) -> bytes:
        """One batch holding each method of the mix exactly `weight` times."""
        drawn: list[tuple[str, Draw]] = []
        for method, count in self.mix:
            n = int(count)
            accounts = (
                rng.sample(self.addresses, n)
                if n <= len(self.addresses)
                else [rng.choice(self.addresses) for _ in range(n)]
            )
            for address in accounts:
                drawn.append(
                    (method, Draw(address, self.blocks.pick(rng), rng.randrange(self.slots)))
                )
        rng.shuffle(drawn)
        items = [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": self._params(m, d)}
            for i, (m, d) in enumerate(drawn)
        ]
        return orjson.dumps(items)

    def _params(self, method: str, draw: Draw) -> list[Any]:
        if method == "eth_call" and (self.call_to or self.call_data):
            to = self.call_to or draw.address
            data = self.call_data if self.call_data is not None else balance_of(draw.address)
            return [{"to": to, "data": data}, draw.block]
        if method == "eth_getLogs":
            return [self._log_filter(draw)]
        return TEMPLATES[method](draw)

    def _log_filter(self, draw: Draw) -> dict[str, Any]:
        flt = TEMPLATES["eth_getLogs"](draw)[0]
        if self.log_span > 1 and draw.block.startswith("0x"):
            flt["toBlock"] = hex(int(draw.block, 16) + self.log_span - 1)
        if self.log_topics is not None:
            flt["topics"] = self.log_topics
        return flt

    def _batched(self, make: Callable[[int], Any]) -> Any:
        if isinstance(self.fixed, list):
            return self.fixed
        if self.batch == 1:
            return make(1)
        return [make(i) for i in range(self.batch)]


def _is_hex(text: str, size: int | None) -> bool:
    """0x-prefixed hex of whole bytes (exactly `size` bytes when given)."""
    if not isinstance(text, str) or not text.startswith("0x") or len(text) % 2:
        return False
    try:
        bytes.fromhex(text[2:])
    except ValueError:
        return False
    return size is None or len(text) == 2 + 2 * size


def fixed_request(method: str, params_json: str | None) -> dict[str, Any]:
    """A request object from --method and --params (a JSON array or object)."""
    params: Any = []
    if params_json:
        try:
            params = orjson.loads(params_json)
        except orjson.JSONDecodeError as exc:
            raise BodyError(f"--params is not valid JSON: {exc}") from None
        if not isinstance(params, list | dict):
            raise BodyError("--params must be a JSON array or object")
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def load_body_file(path: str) -> Any:
    """A request object or batch array read from a file."""
    try:
        with open(path, "rb") as fh:
            value = orjson.loads(fh.read())
    except OSError as exc:
        raise BodyError(f"--body-file: {exc}") from None
    except orjson.JSONDecodeError as exc:
        raise BodyError(f"--body-file {path}: not valid JSON: {exc}") from None
    if isinstance(value, list):
        if not value or not all(isinstance(v, dict) for v in value):
            raise BodyError(f"--body-file {path}: a batch must be a non-empty array of objects")
    elif not isinstance(value, dict):
        raise BodyError(f"--body-file {path}: expected a JSON object or array")
    return value

"""How a job travels from the node to an EVM worker: compact, and each block env once.

A coalesced job holds a group per block, each group a job dict with its block env and its
calls. Pickled as they are, a group's dicts cost more to write in the node and to read in
the worker than the call costs to run. So the node sends (`pack`):

- each block env once per worker: a worker keeps the envs the node sent it (`WorkerEnvs`),
  and a later job names one by a number (`HeldEnvs`, the node's side, says which the worker
  holds and which it should drop, in the same message);
- a job dict of the usual keys as a tuple of its values, and a call of the usual fields as
  a tuple of its values (anything else goes as it is);
- in a job of groups, a plain group (`_plain`: one eth_call with no value, fee or access
  list, the usual keys, the same kind, state URL, chain, spec and store as the job's first
  group) as (height, env, from, to, data, gas) only, the rest said once for the job: at
  random old heights most groups are such a single call, and pickling their nested tuples
  and lists cost more than the call's own fields.

`unpack` makes the same job dicts again in the worker, every group of one block sharing one
env dict. An env is named by the id of the node's env dict, which the node keeps alive
(`HeldEnvs.held`) until the worker was told to drop it, so a number never names two envs
while the worker holds it; the node never changes an env dict once built (overrides make a
copy), so the worker's copy stays equal to it.

Answers come back compact too (`pack_answer`): a call's plain success (output, gas used, no
logs) as a pair, a group's results as a tuple, a job of groups as a list of those.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any

JOB_KEYS = ("kind", "fork_url", "height", "block", "chain_id", "spec_id", "calls", "store")
CALL_KEYS = (
    "from",
    "to",
    "data",
    "value",
    "gas",
    "max_fee",
    "tip",
    "nonce",
    "chain_id",
    "access_list",
)
_job_values = operator.itemgetter(*JOB_KEYS)
_call_values = operator.itemgetter(*CALL_KEYS)
_HEAD = ("kind", "fork_url", "chain_id", "spec_id", "store")  # what plain groups share
_JOB_KEY_COUNT = len(JOB_KEYS)
_CALL_KEY_COUNT = len(CALL_KEYS)
_BLOCK = JOB_KEYS.index("block")
_CALLS = JOB_KEYS.index("calls")
HELD_ENVS = 16_384  # block envs a worker holds at most (and the node keeps alive for it)


class HeldEnvs:
    """The node's record of the block envs one worker holds (least recently used first)."""

    def __init__(self, size: int = HELD_ENVS) -> None:
        self.size = size
        self.held: OrderedDict[int, dict[str, Any]] = OrderedDict()

    def ref(self, env: dict[str, Any], new: dict[int, dict[str, Any]]) -> int:
        """The number `env` goes by; added to `new` when the worker does not hold it yet."""
        key = id(env)
        held = self.held
        if key in held:
            held.move_to_end(key)
        else:
            held[key] = env
            new[key] = env
        return key

    def overflow(self, keep: int) -> list[int] | None:
        """The envs the worker should drop, the least recently used beyond `size`; never
        one of the `keep` most recent (those the job being packed names)."""
        held = self.held
        if len(held) <= max(self.size, keep):
            return None
        drop = []
        while len(held) > max(self.size, keep):
            drop.append(held.popitem(last=False)[0])
        return drop


def _pack_one(one: dict[str, Any], envs: HeldEnvs, new: dict[int, dict[str, Any]]) -> Any:
    """One job dict compact (a tuple when it has exactly the usual keys), its env named."""
    calls = one.get("calls")
    packed = None
    if calls is not None:
        packed = []
        for call in calls:
            if len(call) == len(CALL_KEYS):
                try:
                    packed.append(_call_values(call))
                    continue
                except KeyError:
                    pass
            packed.append(call)
    block = one.get("block")
    if len(one) == len(JOB_KEYS) and block is not None:
        try:
            values = list(_job_values(one))
        except KeyError:
            pass
        else:
            values[_BLOCK] = envs.ref(block, new)
            values[_CALLS] = packed
            return tuple(values)
    out = dict(one)
    if block is not None:
        out["block"] = envs.ref(block, new)
    if calls is not None:
        out["calls"] = packed
    return out


def _plain(one: dict[str, Any], head: tuple[Any, ...]) -> dict[str, Any] | None:
    """The call of a group that `head` (kind, state URL, chain, spec, store) describes and
    that holds one call of the usual fields with no value, fee, nonce, chain id or access
    list; else None. (Its keys are checked by count and by reading each: a dict of the
    usual number of keys that has each of them has no other; comparing key views cost
    more than the rest of the check.)"""
    if len(one) != _JOB_KEY_COUNT:
        return None
    try:
        calls = one["calls"]
        if len(calls) != 1:
            return None
        call = calls[0]
        if (
            len(call) != _CALL_KEY_COUNT
            or call["value"] != 0
            or call["max_fee"] != 0
            or call["access_list"] != []
            or call["tip"] is not None
            or call["nonce"] is not None
            or call["chain_id"] is not None
            or one["kind"] != head[0]
            or one["fork_url"] != head[1]
            or one["chain_id"] != head[2]
            or one["spec_id"] != head[3]
            or one["store"] != head[4]
        ):
            return None
        # (the rest of the keys, read by `pack`: all there, so with the counts, no other)
        _read = (call["from"], call["to"], call["data"], call["gas"], one["height"])
    except KeyError:
        return None
    return call  # type: ignore[no-any-return]


def pack(job: dict[str, Any], envs: HeldEnvs) -> tuple[Any, ...]:
    """`job` as it goes to the worker whose envs `envs` records (`unpack` reverses it)."""
    new: dict[int, dict[str, Any]] = {}
    if job["kind"] == "groups":
        ones = job["jobs"]
        first = ones[0]
        head = tuple(first.get(k) for k in _HEAD)
        groups = []
        for one in ones:
            call = _plain(one, head) if one.get("block") is not None else None
            if call is None:
                groups.append(_pack_one(one, envs, new))
            else:  # (a 6-tuple: `_pack_one` makes 8-tuples and dicts)
                env = envs.ref(one["block"], new)
                groups.append(
                    (one["height"], env, call["from"], call["to"], call["data"], call["gas"])
                )
        drop = envs.overflow(len(groups))
        return (True, new or None, drop, groups, head)
    one = _pack_one(job, envs, new)
    return (False, new or None, envs.overflow(1), one, None)


class WorkerEnvs:
    """The worker's side: the block envs the node sent, by number."""

    def __init__(self) -> None:
        self.envs: dict[int, dict[str, Any]] = {}


def call_fields(
    sender: Any,
    to: Any,
    data: Any,
    value: Any,
    gas: Any,
    max_fee: Any,
    tip: Any,
    nonce: Any,
    chain_id: Any,
    access_list: Any,
) -> dict[str, Any]:
    """A call as the EVM methods and the worker read it (CALL_KEYS), from its values: made
    where a call is parsed (`codec`) and where the worker reads one off the wire. (A dict
    display, not dict(zip()): a zip, its tuples and keyword parsing cost more.)"""
    return {
        "from": sender,
        "to": to,
        "data": data,
        "value": value,
        "gas": gas,
        "max_fee": max_fee,
        "tip": tip,
        "nonce": nonce,
        "chain_id": chain_id,
        "access_list": access_list,
    }


def _unpack_call(call: Any) -> dict[str, Any]:
    if call.__class__ is not tuple:
        return call  # type: ignore[no-any-return]
    return call_fields(*call)


def _unpack_one(one: Any, envs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    if one.__class__ is tuple:
        kind, fork_url, height, block, chain_id, spec_id, calls, store = one
        job = {
            "kind": kind,
            "fork_url": fork_url,
            "height": height,
            "block": block,
            "chain_id": chain_id,
            "spec_id": spec_id,
            "calls": calls,
            "store": store,
        }
    else:
        job = one
        block, calls = job.get("block"), job.get("calls")
    if block.__class__ is int:
        job["block"] = envs[block]
    if calls is not None:
        if len(calls) == 1:  # (most groups: one call, no list made by a comprehension)
            calls[0] = _unpack_call(calls[0])
        else:
            job["calls"] = [_unpack_call(call) for call in calls]
    return job


def _unpack_plain(one: tuple[Any, ...], head: tuple[Any, ...], envs: dict[int, Any]) -> Any:
    """A plain group (`_plain`) as the job dict it was."""
    height, block, sender, to, data, gas = one
    kind, fork_url, chain_id, spec_id, store = head
    call = call_fields(sender, to, data, 0, gas, 0, None, None, None, [])
    return {
        "kind": kind,
        "fork_url": fork_url,
        "height": height,
        "block": envs[block],
        "chain_id": chain_id,
        "spec_id": spec_id,
        "calls": [call],
        "store": store,
    }


def unpack(wire: tuple[Any, ...], held: WorkerEnvs) -> dict[str, Any]:
    """The job `pack` made `wire` of; the envs it sends kept, those it drops dropped."""
    groups, new, drop, body, head = wire
    envs = held.envs
    if drop:
        for key in drop:
            envs.pop(key, None)
    if new:
        envs.update(new)
    if groups:
        jobs = [
            _unpack_plain(one, head, envs)
            if one.__class__ is tuple and len(one) == 6
            else _unpack_one(one, envs)
            for one in body
        ]
        return {"kind": "groups", "jobs": jobs}
    return _unpack_one(body, envs)


def _pack_results(answer: dict[str, Any]) -> Any:
    """A `calls` answer as a tuple of its results, each plain success as (output, gas
    used); any other answer as it is (a dict)."""
    results = answer.get("results")
    if results is None or len(answer) != 1:
        return answer
    out = []
    for r in results:
        # (an error, logs, writes, a trace's steps: the dict as it is)
        if r.__class__ is dict and len(r) == 4 and r.get("ok") is True and r.get("logs") == []:
            out.append((r["output"], r["gas_used"]))
        else:
            out.append(r)
    return tuple(out)


def pack_answer(answer: dict[str, Any]) -> Any:
    """A worker's answer as it goes back to the node (`unpack_answer` reverses it): one
    group's results a tuple (`_pack_results`), a job of groups a list of those."""
    answers = answer.get("answers")
    if answers is not None and len(answer) == 1:
        return [_pack_results(one) for one in answers]
    return _pack_results(answer)


def result_of(r: Any) -> dict[str, Any]:
    """One call's result dict, from a result of a packed answer."""
    if r.__class__ is tuple:
        return {"ok": True, "output": r[0], "gas_used": r[1], "logs": []}
    return r  # type: ignore[no-any-return]


def unpack_answer(wire: Any) -> dict[str, Any]:
    """The answer `pack_answer` made `wire` of."""
    if wire.__class__ is dict:
        return wire  # type: ignore[no-any-return]
    if wire.__class__ is list:
        return {"answers": [unpack_answer(one) for one in wire]}
    return {"results": [result_of(r) for r in wire]}

"""How a job travels from the node to an EVM worker: compact, and each block env once.

A coalesced job holds a group per block, each group a job dict with its block env and its
calls. Pickled as they are, a group's dicts cost more to write in the node and to read in
the worker than the call costs to run. So the node sends (`pack`):

- each block env once per worker: a worker keeps the envs the node sent it (`WorkerEnvs`),
  and a later job names one by a number (`HeldEnvs`, the node's side, says which the worker
  holds and which it should drop, in the same message);
- a job dict of the usual keys as a tuple of its values, and a call of the usual fields as
  a tuple of its values (anything else goes as it is).

`unpack` makes the same job dicts again in the worker, every group of one block sharing one
env dict. An env is named by the id of the node's env dict, which the node keeps alive
(`HeldEnvs.held`) until the worker was told to drop it, so a number never names two envs
while the worker holds it; the node never changes an env dict once built (overrides make a
copy), so the worker's copy stays equal to it.
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
_BLOCK = JOB_KEYS.index("block")
_CALLS = JOB_KEYS.index("calls")
HELD_ENVS = 1024  # block envs a worker holds at most (and the node keeps alive for it)


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


def pack(job: dict[str, Any], envs: HeldEnvs) -> tuple[Any, ...]:
    """`job` as it goes to the worker whose envs `envs` records (`unpack` reverses it)."""
    new: dict[int, dict[str, Any]] = {}
    if job["kind"] == "groups":
        groups = [_pack_one(one, envs, new) for one in job["jobs"]]
        drop = envs.overflow(len(groups))
        return (True, new or None, drop, groups)
    one = _pack_one(job, envs, new)
    return (False, new or None, envs.overflow(1), one)


class WorkerEnvs:
    """The worker's side: the block envs the node sent, by number."""

    def __init__(self) -> None:
        self.envs: dict[int, dict[str, Any]] = {}


def _unpack_one(one: Any, envs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    job = dict(zip(JOB_KEYS, one, strict=True)) if one.__class__ is tuple else one
    block = job.get("block")
    if block.__class__ is int:
        job["block"] = envs[block]
    calls = job.get("calls")
    if calls is not None:
        job["calls"] = [
            dict(zip(CALL_KEYS, call, strict=True)) if call.__class__ is tuple else call
            for call in calls
        ]
    return job


def unpack(wire: tuple[Any, ...], held: WorkerEnvs) -> dict[str, Any]:
    """The job `pack` made `wire` of; the envs it sends kept, those it drops dropped."""
    groups, new, drop, body = wire
    envs = held.envs
    if drop:
        for key in drop:
            envs.pop(key, None)
    if new:
        envs.update(new)
    if groups:
        return {"kind": "groups", "jobs": [_unpack_one(one, envs) for one in body]}
    return _unpack_one(body, envs)

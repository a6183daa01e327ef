"""Drive Debian's `wrk` with a generated Lua script, as a cross-check of our own generator.

wrk is C and very cheap per request, so when both tools agree the number is the server's.
It only checks HTTP statuses (JSON-RPC error objects inside a 200 are not seen), so its
`items_ok` assumes every item of a 2xx response succeeded; the report says `tool: wrk`.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile

import orjson

from bench.bodies import BodyPlan
from bench.loadgen import BenchResult, LoadSettings, Target

WRK_POOL_LIMIT = 1024  # bodies put into the Lua script for a mix
_MARK = "CHAINSTATE_WRK_JSON "

_DONE = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"duration_us":%d,"requests":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d,"min":%d,"mean":%f}\n',
    "MARK", summary.duration, summary.requests, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.min, latency.mean))
end
""".replace("MARK", _MARK)


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def _lua_string(text: str) -> str:
    """A Lua long-bracket literal that cannot be closed by the text itself."""
    level = 0
    while "]" + "=" * level + "]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[{text}]{eq}]"


def lua_script(plan: BodyPlan, headers: list[tuple[str, str]], seed: int = 0) -> str:
    """The wrk script: POST the body (or cycle through a mix's bodies) and print JSON."""
    lines = ['wrk.method = "POST"', 'wrk.headers["Content-Type"] = "application/json"']
    lines += [f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers]
    bodies = plan.build(seed)[:WRK_POOL_LIMIT]
    if len(bodies) == 1:
        lines.append(f"wrk.body = {_lua_string(bodies[0].decode())}")
    else:
        lines.append("local bodies = {")
        lines += [f"  {_lua_string(b.decode())}," for b in bodies]
        lines.append("}")
        lines.append("local i = 0")
        lines.append("request = function()")
        lines.append("  i = i % #bodies + 1")
        lines.append("  return wrk.format(nil, nil, nil, bodies[i])")
        lines.append("end")
    return "\n".join(lines) + "\n" + _DONE


def _wrk(settings: LoadSettings, script: str, seconds: int) -> dict[str, float]:
    binary = wrk_binary()
    if binary is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    threads = min(settings.processes, settings.concurrency)
    cmd = [
        binary,
        f"-t{threads}",
        f"-c{settings.concurrency}",
        f"-d{seconds}s",
        f"--timeout={max(1, math.ceil(settings.timeout))}s",
        "-s",
        script,
        settings.url,
    ]
    if settings.cpus:
        cmd = ["taskset", "-c", ",".join(map(str, settings.cpus)), *cmd]
    timeout = seconds + settings.timeout + 30
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            return orjson.loads(line[len(_MARK) :])
    raise RuntimeError(f"wrk failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}")


def run_wrk(settings: LoadSettings, plan: BodyPlan) -> BenchResult:
    """Run wrk for the warm-up (discarded) and then the measured duration."""
    if settings.requests is not None:
        raise ValueError("wrk runs for a duration only: use --duration with --wrk")
    Target.parse(settings.url)
    fd, script = tempfile.mkstemp(prefix="chainstate-wrk-", suffix=".lua")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(lua_script(plan, settings.headers, settings.seed))
        if settings.warmup > 0:
            _wrk(settings, script, max(1, math.ceil(settings.warmup)))
        out = _wrk(settings, script, max(1, math.ceil(settings.duration)))
    finally:
        os.unlink(script)
    errors = {
        "conn:connect": int(out["connect"]),
        "conn:read": int(out["read"]),
        "conn:write": int(out["write"]),
        "http:4xx-5xx": int(out["status"]),
        "timeout": int(out["timeout"]),
    }
    errors = {k: v for k, v in errors.items() if v}
    requests = int(out["requests"])
    ok = requests - int(out["status"])
    items = plan.items_per_body
    return BenchResult(
        url=settings.url,
        tool="wrk",
        concurrency=settings.concurrency,
        processes=min(settings.processes, settings.concurrency),
        items_per_request=items,
        elapsed_s=out["duration_us"] / 1e6,
        requests=requests,
        requests_ok=ok,
        items_ok=ok * items,
        items_err=int(out["status"]) * items,
        errors=errors,
        latency_ns={k: float(out[k]) * 1000 for k in ("p50", "p90", "p99", "max", "min", "mean")},
    )

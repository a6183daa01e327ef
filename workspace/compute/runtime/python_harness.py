"""Runs one Python Function or Notebook inside the sandbox (executed by path, not imported).

Reads `job.json` ({"entry", "args", "mode"}) and the user's code from `main.py` in the working
directory, calls the entry function with the positional arguments, and writes one JSON document
to the result fd: {"ok": true, "value": ...} or {"ok": false, "code", "type", "message",
"stack", "locals"}. Locals come from the failing frame of the user's code, with values
truncated and secret-looking names or values redacted.
"""

import asyncio
import inspect
import json
import os
import re
import sys
import traceback
import types

SECRET_NAME = re.compile(
    r"(?i)(pass|secret|token|api_?key|private|credential|auth|mnemonic|seed|cookie|session|sig)"
)
SECRET_VALUE = re.compile(r"^(0x)?[0-9a-fA-F]{64}$|^(sk|pk|ghp|xox[bp])[-_][A-Za-z0-9_-]{16,}$")
MAX_VALUE_CHARS = int(os.environ.get("CHAINSTATE_LOCALS_VALUE_CHARS", "256"))
MAX_LOCALS = 64
USER_FILE = os.path.abspath("main.py")
RUN_PID = os.getpid()  # children the user's code forks share the result fd


def _emit(fd, doc):
    if os.getpid() != RUN_PID:  # a forked child returning: only the run's process answers
        os.close(fd)
        return
    data = json.dumps(doc, allow_nan=False, default=str).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


def _safe_value(name, value):
    if SECRET_NAME.search(name):
        return "***"
    if isinstance(value, bool | int | float) or value is None:
        if isinstance(value, float) and value != value:
            return repr(value)
        return value
    if isinstance(value, str):
        if SECRET_VALUE.match(value):
            return "***"
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…"
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the real failure
        text = f"<unrepresentable {type(value).__name__}: {exc}>"
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"


def _failing_locals(exc):
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    user = [f for f in frames if f.f_code.co_filename == USER_FILE]
    user = [f for f in user if f.f_code.co_name != "<module>"] or user
    frame = user[-1] if user else (frames[-1] if frames else None)
    if frame is None:
        return {}
    out = {}
    for name, value in list(frame.f_locals.items())[:MAX_LOCALS]:
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        out[name] = _safe_value(name, value)
    return out


def _user_traceback(exc):
    """Skip the harness's own frames: the stack starts where the user's code was entered
    (none for a syntax error, whose message already points into main.py)."""
    start = exc.__traceback__
    while start is not None and start.tb_frame.f_code.co_filename != USER_FILE:
        start = start.tb_next
    if start is None and not isinstance(exc, SyntaxError):
        return exc.__traceback__
    return start


def _failure(code, exc, with_locals=True):
    tb = _user_traceback(exc)
    stack = "".join(traceback.format_exception(type(exc), exc, tb))
    stack = stack.replace(f'File "{USER_FILE}"', 'File "main.py"')
    return {
        "ok": False,
        "code": code,
        "type": type(exc).__name__,
        "message": f"{type(exc).__name__}: {exc}",
        "stack": stack,
        "locals": _failing_locals(exc) if with_locals else {},
    }


def main():
    fd = int(os.environ.pop("CHAINSTATE_RESULT_FD"))
    with open("job.json", encoding="utf-8") as fh:
        job = json.load(fh)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    extra = os.environ.pop("CHAINSTATE_SITE_PACKAGES", "")
    sys.path.extend(p for p in extra.split(os.pathsep) if p)
    sys.argv = ["main.py"]
    module = types.ModuleType("main")
    module.__file__ = USER_FILE
    sys.modules["main"] = module
    try:
        with open(USER_FILE, encoding="utf-8") as fh:
            code = compile(fh.read(), USER_FILE, "exec")
    except (SyntaxError, ValueError) as exc:
        _emit(fd, _failure("compile_error", exc, with_locals=False))
        return
    try:
        module.__dict__.update(job.get("globals") or {})
        exec(code, module.__dict__)
        entry = job.get("entry")
        if job.get("mode") == "script":
            value = None
        else:
            func = module.__dict__.get(entry)
            if not callable(func):
                _emit(
                    fd,
                    {
                        "ok": False,
                        "code": "entry_not_found",
                        "type": "NameError",
                        "message": f"entry function {entry!r} is not defined",
                        "stack": "",
                        "locals": {},
                    },
                )
                return
            value = func(*job.get("args", []))
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
    except MemoryError as exc:
        _emit(fd, _failure("memory_limit", exc))
        return
    except BaseException as exc:  # user code may raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        _emit(fd, _failure("exception", exc))
        return
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        _emit(
            fd,
            {
                "ok": False,
                "code": "bad_return",
                "type": type(exc).__name__,
                "message": f"return value is not JSON: {exc}",
                "stack": "",
                "locals": {},
            },
        )
        return
    _emit(fd, {"ok": True, "value": json.loads(encoded)})


async def _await(value):
    return await value


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

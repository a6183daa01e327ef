"""Each language's success, exception, timeout and bad-return cases, and the run record."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.compute.conftest import BUILD_UID, FAST, GO_CACHE
from workspace.compute.records import build_run_record
from workspace.compute.runners import CodeRunner, Outcome, RunnerSettings, SqlError
from workspace.compute.sandbox import Limits, Sandbox, WorkerPool

SUCCESS = {
    "python": "def main(a, b):\n    print('adding')\n    return {'sum': a + b, 'args': [a, b]}\n",
    "javascript": (
        "function main(a, b) { console.log('adding'); return {sum: a + b, args: [a, b]}; }"
    ),
    "go": (
        'import "fmt"\n\n'
        "func Main(a int, b int) (map[string]interface{}, error) {\n"
        '\tfmt.Println("adding")\n'
        '\treturn map[string]interface{}{"sum": a + b, "args": []int{a, b}}, nil\n}\n'
    ),
}
EXCEPTION = {
    "python": (
        "def main(x):\n    api_key = 'abc'\n    depth = x * 2\n"
        "    raise ValueError('bad ' + str(x))\n"
    ),
    "javascript": "async function main(x) { throw new Error('bad ' + x); }",
    "go": 'import "errors"\n\nfunc Main(x int) (int, error) { return 0, errors.New("bad") }\n',
}
LOOP = {
    "python": "def main():\n    while True:\n        pass\n",
    "javascript": "function main() { for (;;) {} }",
    "go": "func Main() int {\n\tfor {\n\t}\n}\n",
}
BAD_RETURN = {
    "python": "def main():\n    return {1, 2}\n",
    "javascript": "function main() { return 1n; }",
    "go": "func Main() chan int { return make(chan int) }\n",
}
LANGS = ["python", "javascript", "go"]


@pytest.mark.parametrize("lang", LANGS)
async def test_success(runner: CodeRunner, lang: str) -> None:
    out = await runner.run(lang, SUCCESS[lang], None, [2, 3])
    assert out.status == "succeeded", out
    assert out.return_value == {"sum": 5, "args": [2, 3]}
    assert "adding" in out.text and out.failure is None
    assert out.execution_duration_ms > 0 and out.queue_wait_ms >= 0


async def test_python_runs_when_the_start_probe_found_no_interpreter(
    sandbox: Sandbox, pool: WorkerPool
) -> None:
    """The interpreter is probed again at a Python run while none has passed: one failed
    probe (here: a configured interpreter that does not exist, and no probe at start) does
    not fail every later run of the process."""
    missing = RunnerSettings(
        python="/nonexistent/python3", limits=FAST, cache_dir=GO_CACHE, build_uid=BUILD_UID
    )
    runner = CodeRunner(sandbox, pool, missing)
    out = await runner.run("python", SUCCESS["python"], None, [2, 3])
    assert out.status == "succeeded", out
    assert out.return_value == {"sum": 5, "args": [2, 3]}


@pytest.mark.parametrize("lang", LANGS)
async def test_exception_is_a_failed_record(runner: CodeRunner, lang: str) -> None:
    out = await runner.run(lang, EXCEPTION[lang], None, [7])
    assert out.status == "failed"
    assert out.failure is not None and out.failure["code"] == "exception"
    assert "bad" in out.failure["message"] and out.failure["retryable"] is False
    assert out.return_value is None


async def test_python_locals_are_captured_and_redacted(runner: CodeRunner) -> None:
    out = await runner.run("python", EXCEPTION["python"], None, [7])
    assert out.local_vars == {"x": 7, "api_key": "***", "depth": 14}
    assert "ValueError: bad 7" in out.error_stack and "main.py" in out.error_stack
    # the stack starts at the user's code: no frames (or server paths) of the harness
    assert "python_harness" not in out.error_stack, out.error_stack
    assert out.error_stack.startswith('Traceback (most recent call last):\n  File "main.py"')


async def test_python_forked_child_does_not_answer_for_the_run(runner: CodeRunner) -> None:
    """A child made by os.fork() shares the result pipe: only the run's own process answers."""
    code = (
        "import os\n"
        "def main():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        return 'child'\n"
        "    os.waitpid(pid, 0)\n"
        "    return 'parent'\n"
    )
    out = await runner.run("python", code, None, [])
    assert (out.status, out.return_value) == ("succeeded", "parent"), out


async def test_python_long_local_values_are_truncated(runner: CodeRunner) -> None:
    code = "def main():\n    text = 'y' * 5000\n    key_hex = '0x' + 'ab' * 32\n    return 1 / 0\n"
    out = await runner.run("python", code, None, [])
    assert len(out.local_vars["text"]) < 300
    assert out.local_vars["key_hex"] == "***"


@pytest.mark.parametrize("lang", LANGS)
async def test_timeout(runner: CodeRunner, lang: str) -> None:
    out = await runner.run(lang, LOOP[lang], None, [], limits=Limits(wall_seconds=1.5))
    assert out.status == "timeout"
    assert out.failure == {
        "code": "timeout",
        "message": "wall-clock limit of 1.5 s exceeded",
        "retryable": True,
    }


@pytest.mark.parametrize("lang", LANGS)
async def test_bad_return(runner: CodeRunner, lang: str) -> None:
    out = await runner.run(lang, BAD_RETURN[lang], None, [])
    assert out.status == "failed" and out.failure is not None
    assert out.failure["code"] == "bad_return"
    assert "not JSON" in out.failure["message"]


@pytest.mark.parametrize("lang", LANGS)
async def test_missing_entry(runner: CodeRunner, lang: str) -> None:
    out = await runner.run(lang, SUCCESS[lang], "nothere", [1, 2])
    assert out.status == "failed" and out.failure is not None
    expected = "compile_error" if lang == "go" else "entry_not_found"
    assert out.failure["code"] == expected
    assert "nothere" in out.failure["message"] or "nothere" in out.error_stack


async def test_custom_func_name_and_async_python(runner: CodeRunner) -> None:
    code = "import asyncio\n\nasync def handler(n):\n    await asyncio.sleep(0)\n    return n * 2\n"
    out = await runner.run("python", code, "handler", [21])
    assert (out.status, out.return_value) == ("succeeded", 42)


async def test_compile_errors(runner: CodeRunner) -> None:
    py = await runner.run("python", "def main(:\n", None, [])
    js = await runner.run("javascript", "function main( {", None, [])
    go = await runner.run("go", "func Main() int { return undefinedName }", None, [])
    for out in (py, js, go):
        assert out.status == "failed" and out.failure["code"] == "compile_error", out
    assert "undefinedName" in go.failure["message"]
    assert py.error_stack.startswith('  File "main.py", line 1'), py.error_stack


async def test_go_argument_type_mismatch(runner: CodeRunner) -> None:
    out = await runner.run("go", SUCCESS["go"], None, ["two", 3])
    assert out.failure is not None and out.failure["code"] == "bad_arguments"


@pytest.mark.parametrize(
    ("lang", "code"),
    [
        ("python", "def main():\n    b = bytearray(10 * 1024 ** 3)\n    return len(b)\n"),
        ("javascript", "function main() { return Buffer.alloc(10 * 1024 ** 3).length; }"),
        ("go", "func Main() int { b := make([]byte, 10<<30); b[1] = 1; return len(b) }\n"),
    ],
)
async def test_10gb_allocation_fails_cleanly(runner: CodeRunner, lang: str, code: str) -> None:
    out = await runner.run(lang, code, None, [])
    assert out.status == "failed" and out.failure is not None
    assert out.failure["code"] in ("memory_limit", "exception"), out.failure


async def test_fork_bomb_and_big_print_records(runner: CodeRunner) -> None:
    bomb = (
        "import os\ndef main():\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    )
    out = await runner.run("python", bomb, None, [], limits=Limits(wall_seconds=1.5))
    assert out.status == "timeout"
    spam = "def main():\n    for _ in range(100):\n        print('x' * 1048576)\n"
    out = await runner.run("python", spam, None, [])
    assert out.status == "failed" and out.failure["code"] == "output_limit"
    assert out.truncated and out.original_size_bytes > len(out.text)


async def test_oversized_result_is_result_too_large(runner: CodeRunner) -> None:
    """A return value over result_bytes ends the run at once (not at the wall clock)."""
    code = "def main():\n    return 'x' * (2 * 1024 * 1024)\n"
    out = await runner.run("python", code, None, [], limits=Limits(result_bytes=1024 * 1024))
    assert out.status == "failed" and out.failure is not None, out
    assert out.failure["code"] == "result_too_large", out.failure
    assert out.execution_duration_ms < 4000


async def test_unsupported_language_and_sql_without_store(runner: CodeRunner) -> None:
    out = await runner.run("cobol", "x", None, [])
    assert out.failure is not None and out.failure["code"] == "unsupported"
    out = await runner.run("sql", "SELECT 1", None, [])
    assert out.failure is not None and out.failure["code"] == "unsupported"


async def test_sql_goes_through_the_executor(runner: CodeRunner) -> None:
    seen: list[Any] = []

    async def executor(sql: str, args: list[Any]) -> Any:
        seen.append((sql, args))
        if "DROP" in sql:
            raise SqlError("only SELECT statements are allowed")
        return [{"n": 1}]

    ok = await runner.run("sql", "SELECT 1 AS n", None, [5], sql=executor)
    assert (ok.status, ok.return_value) == ("succeeded", [{"n": 1}])
    bad = await runner.run("sql", "DROP TABLE t", None, [], sql=executor)
    assert bad.status == "failed" and "only SELECT" in bad.failure["message"]
    assert seen[0] == ("SELECT 1 AS n", [5])


def test_run_record_shape() -> None:
    outcome = Outcome.failed("exception", "boom", local_vars={"a": 1}, text="out")
    rec = build_run_record(
        run_id="r1",
        language="python",
        code="c",
        parameters=[],
        args=[1],
        arguments=[{"value": 1, "name": None, "order": 0}],
        creator_id="u",
        created_at=1.0,
        outcome=outcome,
    )
    assert rec["status"] == "failed" and rec["return_value"] is None
    assert json.loads(rec["output"]["local_vars_json"]) == {"a": 1}
    assert set(rec["output"]) == {
        "text",
        "truncated",
        "original_size_bytes",
        "failure",
        "error_stack",
        "local_vars_json",
        "execution_duration_ms",
        "queue_wait_ms",
        "call_id",
    }


async def test_python_sees_the_venv_toolchain(runner: CodeRunner) -> None:
    code = (
        "import orjson, pyrevm\n\n"
        "def main():\n    return orjson.loads(orjson.dumps([pyrevm.__name__]))\n"
    )
    out = await runner.run("python", code, None, [])
    assert (out.status, out.return_value) == ("succeeded", ["pyrevm"]), out.error_stack

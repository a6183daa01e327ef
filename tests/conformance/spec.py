"""The execution-apis specification as test data: its methods, their result schemas and its
example requests (the copy in `execution-apis/`, see its SOURCE.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import yaml

SPEC_DIR = Path(__file__).parent / "execution-apis"
SRC = SPEC_DIR / "src"
METHOD_FOLDERS = ("eth", "debug", "txpool", "testing")


@cache
def methods() -> dict[str, dict[str, Any]]:
    """Every method of the spec by name, as its OpenRPC method object."""
    found: dict[str, dict[str, Any]] = {}
    for folder in METHOD_FOLDERS:
        for path in sorted((SRC / folder).glob("*.yaml")):
            for method in yaml.safe_load(path.read_text()):
                found[method["name"]] = method
    return found


@cache
def components() -> dict[str, Any]:
    """The shared schemas every method's `$ref: '#/components/schemas/…'` points into."""
    schemas: dict[str, Any] = {}
    for path in sorted((SRC / "schemas").glob("*.yaml")):
        schemas.update(yaml.safe_load(path.read_text()))
    return {"schemas": schemas}


@cache
def _result_validator(method: str) -> Any:
    schema = {**methods()[method]["result"]["schema"], "components": components()}
    return jsonschema_rs.Draft202012Validator(schema)


def result_violations(method: str, result: Any) -> list[str]:
    """Where `result` breaks the spec's result schema of `method` (empty: it conforms)."""
    if method not in methods():
        return []
    return [
        f"{e.instance_path}: {e.message}"[:300]
        for e in _result_validator(method).iter_errors(result)
    ]


@dataclass(frozen=True)
class SpecRequest:
    """One `>>` request line of a spec `.io` file, and the error the spec expects for it
    (the `<<` line after it, kept in the copy only when it is an error)."""

    file: str  # "eth_getBalance/get-balance.io"
    comment: str
    request: dict[str, Any]
    expected_error: dict[str, Any] | None = None


@cache
def spec_requests() -> tuple[SpecRequest, ...]:
    """Every request line of the copied `.io` files, in file order."""
    found: list[SpecRequest] = []
    for path in sorted((SPEC_DIR / "tests").glob("*/*.io")):
        name = f"{path.parent.name}/{path.name}"
        lines = path.read_text().splitlines()
        comment = " ".join(line[2:].strip() for line in lines if line.startswith("//"))
        for line, following in zip(lines, [*lines[1:], ""], strict=True):
            if line.startswith(">>"):
                answer = json.loads(following[2:]) if following.startswith("<<") else {}
                found.append(SpecRequest(name, comment, json.loads(line[2:]), answer.get("error")))
    return tuple(found)

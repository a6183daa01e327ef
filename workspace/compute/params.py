"""Parameters (Functions, Notebooks) and Arguments (runs, instances, schedules).

Validation follows the spec's order rules: Function parameters either all omit `order` or use
consecutive values from 0; Notebook parameters only need `order` >= 0; arguments either all
omit `order` or use consecutive values from 0. Resolution turns arguments into positional args
(Functions) or named globals (Notebooks), filling declared defaults.

A parameter whose `type` names a workspace column type (INT, STRING, ADDRESS, UINT256, …; any
letter case) takes only values that type accepts in a row, so a bad argument is a 400 when the
run or instance is requested rather than a failure inside the user's code. Values reach the
code as given; null and parameters of other types (JSON, ANY, …) take any JSON value.
"""

from __future__ import annotations

import json
import keyword
from typing import Any

from workspace.coltypes import TYPES
from workspace.errors import invalid

MAX_PARAMETERS = 64
MAX_NAME_CHARS = 64


def _order_ok(orders: list[int | None], consecutive: bool, what: str) -> None:
    given = [o for o in orders if o is not None]
    if consecutive and given and len(given) != len(orders):
        raise invalid(f"{what}: either every item sets `order` or none does")
    for o in given:
        if isinstance(o, bool) or not isinstance(o, int) or o < 0:
            raise invalid(f"{what}: `order` must be an integer >= 0")
    if consecutive and given and sorted(given) != list(range(len(given))):
        raise invalid(f"{what}: `order` values must be consecutive from 0")


def check_parameters(raw: Any, *, consecutive: bool, identifiers: bool) -> list[dict[str, Any]]:
    """Validate a Parameter array; returns it normalised, sorted by order, with display ids."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("parameters must be an array of objects")
    if len(raw) > MAX_PARAMETERS:
        raise invalid(f"parameters: at most {MAX_PARAMETERS} items")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"parameters[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object")
        name = item.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
            raise invalid(f"{where}.name is required: a string of 1-{MAX_NAME_CHARS} characters")
        if identifiers and (not name.isidentifier() or keyword.iskeyword(name)):
            raise invalid(f"{where}.name must be a Python identifier; got {name!r}")
        if name in seen:
            raise invalid(f"{where}.name {name!r} is used twice")
        seen.add(name)
        ptype = item.get("type")
        if not isinstance(ptype, str) or not ptype:
            raise invalid(f"{where}.type is required: a non-empty string such as INT or STRING")
        options = item.get("options")
        if options is not None and not isinstance(options, list):
            raise invalid(f"{where}.options must be an array or null")
        default = item.get("default")
        if default is not None and (not isinstance(default, dict) or "value" not in default):
            raise invalid(f"{where}.default must be null or an object holding `value`")
        if default is not None and options is not None and default["value"] not in options:
            raise invalid(f"{where}.default.value is not one of its options")
        for j, option in enumerate(options or []):
            _check_type(f"{where}.options[{j}]", ptype, option)
        if default is not None:
            _check_type(f"{where}.default.value", ptype, default["value"])
        out.append(
            {
                "name": name,
                "type": ptype,
                "options": options,
                "default": {"value": default["value"]} if default is not None else None,
                "order": item.get("order"),
            }
        )
    _order_ok([p["order"] for p in out], consecutive, "parameters")
    if consecutive and all(p["order"] is None for p in out):
        for i, p in enumerate(out):
            p["order"] = i
    out.sort(key=lambda p: p["order"] if p["order"] is not None else 1 << 30)
    for i, p in enumerate(out):
        p["id"] = f"p{i}"
    return out


def check_arguments(raw: Any) -> list[dict[str, Any]]:
    """Validate an Argument array; returns it normalised and sorted by order."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("arguments must be an array of objects")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "value" not in item:
            raise invalid(f"arguments[{i}] must be an object with `value`")
        name = item.get("name")
        if name is not None and not isinstance(name, str):
            raise invalid(f"arguments[{i}].name must be a string or null")
        out.append({"value": item["value"], "name": name, "order": item.get("order")})
    _order_ok([a["order"] for a in out], True, "arguments")
    if any(a["order"] is not None for a in out):
        out.sort(key=lambda a: a["order"])
    return out


def _check_type(what: str, ptype: str, value: Any) -> None:
    """`value` must pass the input check of the column type `ptype` names (if it names one)."""
    col = TYPES.get(ptype.upper())
    if col is None or value is None:
        return
    try:
        col.encode(value)
    except ValueError as exc:  # BadValue, or int() refusing a string of over 4300 digits
        raise invalid(f"{what} ({col.name}) {_reason(exc)}; got {_shown(value)}") from None


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except ValueError:  # an integer beyond Python's 4300-digit str() limit
        return "a number with too many digits"
    return text if len(text) <= 80 else text[:77] + "..."


def _reason(exc: ValueError) -> str:
    text = str(exc)
    return text if text.startswith("must") else "is not a valid number: too many digits"


def _check_option(param: dict[str, Any], value: Any) -> None:
    if param.get("options") is not None and value not in param["options"]:
        raise invalid(f"argument {param['name']!r} must be one of its options")


def bind(parameters: list[dict[str, Any]], arguments: list[dict[str, Any]]) -> list[Any]:
    """Arguments -> positional values in parameter order, defaults filling the gaps.

    Named arguments go to the parameter of that name; unnamed ones fill positions in order.
    """
    if not parameters:
        if any(a["name"] is not None for a in arguments):
            raise invalid("named arguments need declared parameters")
        return [a["value"] for a in arguments]
    if len(arguments) > len(parameters):
        raise invalid(f"{len(arguments)} arguments given for {len(parameters)} parameters")
    slots: list[Any] = [_UNSET] * len(parameters)
    index = {p["name"]: i for i, p in enumerate(parameters)}
    for pos, arg in enumerate(arguments):
        if arg["name"] is not None:
            if arg["name"] not in index:
                raise invalid(f"argument {arg['name']!r} matches no parameter")
            pos = index[arg["name"]]
        if slots[pos] is not _UNSET:
            raise invalid(f"parameter {parameters[pos]['name']!r} is given twice")
        _check_type(f"argument {parameters[pos]['name']!r}", parameters[pos]["type"], arg["value"])
        slots[pos] = arg["value"]
    out: list[Any] = []
    for param, value in zip(parameters, slots, strict=True):
        if value is _UNSET:
            if param.get("default") is None:
                raise invalid(f"missing argument for parameter {param['name']!r}")
            value = param["default"]["value"]
        _check_option(param, value)
        out.append(value)
    return out


def bind_names(parameters: list[dict[str, Any]], arguments: list[dict[str, Any]]) -> dict[str, Any]:
    """Notebook globals: parameter name -> bound value."""
    values = bind(parameters, arguments)
    return {p["name"]: v for p, v in zip(parameters, values, strict=True)}


class _Unset:
    pass


_UNSET: Any = _Unset()

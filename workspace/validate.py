"""Request parameter declarations: one description drives validation and the OpenAPI document.

An endpoint lists its parameters as `Field`s. `parse_params` checks a query string or JSON
body against them (clear 400 errors naming the field) and fills defaults; `Field.schema()`
gives the JSON Schema used in /v1/openapi.json, so the document cannot drift from the code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workspace.errors import invalid

MISSING: Any = object()
_INT_RE = re.compile(r"-?[0-9]+")
MAX_INT_DIGITS = 30  # no integer parameter needs more (int64 has 19 digits)


def _shown_int(value: int) -> str:
    text = str(value) if value.bit_length() < 128 else f"a {value.bit_length()}-bit integer"
    return text


class Kind:
    """A value type. `parse` returns the checked value or raises a 400 ApiError."""

    def parse(self, name: str, value: Any, query: bool) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Str(Kind):
    min_len: int | None = None
    max_len: int | None = None
    pattern: str | None = None
    enum: tuple[str, ...] | None = None
    pattern_doc: str = ""

    def parse(self, name: str, value: Any, query: bool) -> Any:
        if not isinstance(value, str):
            raise invalid(f"{name} must be a string")
        if "\x00" in value:  # PostgreSQL text cannot hold NUL; refuse it on both backends
            raise invalid(f"{name} must not contain NUL characters")
        if self.enum is not None and value not in self.enum:
            raise invalid(f"{name} must be one of {', '.join(self.enum)}; got {value!r}")
        if self.min_len is not None and len(value) < self.min_len:
            raise invalid(f"{name} must have at least {self.min_len} character(s)")
        if self.max_len is not None and len(value) > self.max_len:
            raise invalid(f"{name} must have at most {self.max_len} characters")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            what = self.pattern_doc or f"match {self.pattern}"
            raise invalid(f"{name} must {what}; got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string"}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.min_len is not None:
            out["minLength"] = self.min_len
        if self.max_len is not None:
            out["maxLength"] = self.max_len
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"
        return out


@dataclass(frozen=True)
class Int(Kind):
    minimum: int | None = None
    maximum: int | None = None

    def parse(self, name: str, value: Any, query: bool) -> Any:
        if query and isinstance(value, str):
            if not _INT_RE.fullmatch(value):
                raise invalid(f"{name} must be an integer; got {value!r}")
            if len(value.lstrip("-").lstrip("0")) > MAX_INT_DIGITS:
                raise invalid(self._out_of_range(name, value.startswith("-")))
            value = int(value)
        if isinstance(value, float) and value.is_integer() and not query:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"{name} must be an integer")
        if self.minimum is not None and value < self.minimum:
            raise invalid(f"{name} must be at least {self.minimum}; got {_shown_int(value)}")
        if self.maximum is not None and value > self.maximum:
            raise invalid(f"{name} must be at most {self.maximum}; got {_shown_int(value)}")
        return value

    def _out_of_range(self, name: str, negative: bool) -> str:
        if negative and self.minimum is not None:
            return f"{name} must be at least {self.minimum}"
        if not negative and self.maximum is not None:
            return f"{name} must be at most {self.maximum}"
        return f"{name} is out of range (more than {MAX_INT_DIGITS} digits)"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


@dataclass(frozen=True)
class Bool(Kind):
    def parse(self, name: str, value: Any, query: bool) -> Any:
        if query and isinstance(value, str):
            if value.lower() in ("true", "1"):
                return True
            if value.lower() in ("false", "0"):
                return False
            raise invalid(f"{name} must be true or false; got {value!r}")
        if not isinstance(value, bool):
            raise invalid(f"{name} must be a boolean")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class AnyJSON(Kind):
    def parse(self, name: str, value: Any, query: bool) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class Arr(Kind):
    item: Kind
    min_items: int | None = None
    max_items: int | None = None

    def parse(self, name: str, value: Any, query: bool) -> Any:
        if not isinstance(value, list):
            raise invalid(f"{name} must be an array")
        if self.min_items is not None and len(value) < self.min_items:
            raise invalid(f"{name} must have at least {self.min_items} item(s)")
        if self.max_items is not None and len(value) > self.max_items:
            raise invalid(f"{name} must have at most {self.max_items} items; got {len(value)}")
        return [self.item.parse(f"{name}[{i}]", v, False) for i, v in enumerate(value)]

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema()}
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


@dataclass(frozen=True)
class Obj(Kind):
    """An object with declared fields (unknown keys rejected), or a map when `values` is set."""

    fields: tuple[Field, ...] = ()
    values: Kind | None = None
    free: bool = False  # any keys, any values (row data)

    def parse(self, name: str, value: Any, query: bool) -> Any:
        if not isinstance(value, dict):
            raise invalid(f"{name} must be an object")
        if self.free:
            return value
        if self.values is not None:
            return {k: self.values.parse(f"{name}.{k}", v, False) for k, v in value.items()}
        return parse_fields(self.fields, value, prefix=f"{name}.", query=False)

    def schema(self) -> dict[str, Any]:
        if self.free:
            return {"type": "object"}
        if self.values is not None:
            return {"type": "object", "additionalProperties": self.values.schema()}
        return object_schema(self.fields)


@dataclass(frozen=True)
class Field:
    """One request parameter."""

    name: str
    kind: Kind
    required: bool = False
    nullable: bool = False
    default: Any = MISSING
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        out = dict(self.kind.schema())
        if self.nullable:
            if "type" in out:
                out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        if self.default is not MISSING and self.default is not None:
            out["default"] = self.default
        if self.doc:
            out["description"] = self.doc
        return out


def parse_fields(
    specs: Sequence[Field], given: Mapping[str, Any], *, prefix: str = "", query: bool
) -> dict[str, Any]:
    """Check `given` against `specs`; unknown names, missing required fields and bad values
    are 400 errors. Absent optional fields get their default (or None)."""
    known = {f.name for f in specs}
    for key in given:
        if key not in known:
            raise invalid(f"unknown parameter {prefix}{key}")
    out: dict[str, Any] = {}
    for spec in specs:
        name = prefix + spec.name
        if spec.name not in given:
            if spec.required:
                raise invalid(f"{name} is required")
            out[spec.name] = None if spec.default is MISSING else spec.default
            continue
        value = given[spec.name]
        if value is None:
            if not spec.nullable:
                raise invalid(f"{name} must not be null")
            out[spec.name] = None
            continue
        out[spec.name] = spec.kind.parse(name, value, query)
    return out


def object_schema(specs: Sequence[Field]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: f.schema() for f in specs},
        "additionalProperties": False,
    }
    required = [f.name for f in specs if f.required]
    if required:
        out["required"] = required
    return out


# Shared parameter shapes of the spec.
SPACE_ID = Str(
    1, 64, r"[a-z0-9][a-z0-9_-]*", pattern_doc="use a-z, 0-9, '_' or '-' (first a-z or 0-9)"
)
ID_255 = Str(1, 255)
START = Int(0, 9223372036854775807)
DIRECTION = Str(enum=("asc", "desc"))
ACCOUNT_ID = Str(pattern=r"[0-9a-f]{32}", pattern_doc="be 32 lowercase hex characters")

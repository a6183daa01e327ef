"""row/query: accept only `SELECT * FROM <that table> [WHERE] [ORDER BY] [LIMIT] [OFFSET]`.

The statement is parsed with sqlglot and checked against a whitelist: one SELECT of `*`
from the named table (no joins, subqueries, CTEs, grouping, functions or set operations);
WHERE may use columns of the table, literals, AND/OR/NOT, comparisons, IS [NOT] NULL, IN
(literal list), BETWEEN and LIKE. Literals compared with a column are converted to the
column's stored form (so `amount > 5` works on a UINT256 column on both backends). The SQL
actually run is regenerated from the checked tree against the physical table; the database
adds its own guard (see workspace.db.QueryGuard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from workspace.coltypes import INT64_MAX, TYPES, BadValue
from workspace.errors import INVALID_SQL, ApiError
from workspace.tabledefs import Table, q

_ALLOWED_ARGS = {"expressions", "from", "from_", "where", "order", "limit", "offset"}
_COMPARE = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_ALLOWED_NODES = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.And,
    exp.Or,
    exp.Not,
    exp.Paren,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Like,
    exp.Neg,
    *_COMPARE,
)
_COLUMN_PARENTS = (*_COMPARE, exp.In, exp.Between, exp.Like, exp.Is)
_WHERE_HELP = "WHERE takes columns, literals, comparisons, AND/OR/NOT, IS NULL, IN, BETWEEN, LIKE"
_NO_LIKE = {"TOKENID", "UINT256", "DECIMAL", "INT", "BLOCKHEIGHT", "TIMESTAMP", "FLOAT", "BOOLEAN"}


def bad(message: str) -> ApiError:
    return ApiError(INVALID_SQL, message)


@dataclass(frozen=True)
class CompiledQuery:
    sql: str
    fetch: int  # rows to fetch (max_rows + 1 when the cap may cut the result)
    max_rows: int


def compile_query(text: str, table: Table, dialect: str, max_rows: int) -> CompiledQuery:
    """Check `text` and build the SQL to run; raises ApiError(INVALID_SQL) with the reason."""
    try:
        return _compile(text, table, dialect, max_rows)
    except RecursionError:  # sqlglot parses and prints recursively
        raise bad("the statement is nested too deeply") from None


def _compile(text: str, table: Table, dialect: str, max_rows: int) -> CompiledQuery:
    try:
        statements = [s for s in sqlglot.parse(text, read="postgres") if s is not None]
    except (ParseError, TokenError) as exc:
        raise bad(f"could not parse the SQL: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise bad("send exactly one statement")
    select = statements[0]
    if type(select) is not exp.Select:
        raise bad("only SELECT * FROM <table> [WHERE …] [ORDER BY …] [LIMIT …] is allowed")
    for key, value in select.args.items():
        if value and key not in _ALLOWED_ARGS:
            raise bad(f"{key.upper().rstrip('_')} is not allowed here; only WHERE, ORDER BY, LIMIT")
    projections = select.expressions
    if (
        len(projections) != 1
        or type(projections[0]) is not exp.Star
        or any(projections[0].args.values())
    ):
        raise bad("the select list must be exactly *")
    alias = _check_from(select.args.get("from_") or select.args.get("from"), table)
    parts = [f"SELECT {', '.join(q(c['name']) for c in table.columns)} FROM {q(table.physical)}"]
    where = select.args.get("where")
    out = "postgres" if dialect == "postgresql" else "sqlite"
    if where is not None:
        cond = _check_where(where.this, table, alias)
        parts.append("WHERE " + cond.sql(dialect=out, comments=False))
    order = select.args.get("order")
    if order is not None:
        parts.append(
            "ORDER BY " + ", ".join(_order_item(o, table, alias) for o in order.expressions)
        )
    limit = _int_clause(select.args.get("limit"), "LIMIT")
    offset = _int_clause(select.args.get("offset"), "OFFSET")
    fetch = max_rows + 1 if limit is None or limit > max_rows else limit
    parts.append(f"LIMIT {fetch}")
    if offset:
        parts.append(f"OFFSET {offset}")
    return CompiledQuery(" ".join(parts), fetch, max_rows)


def _check_from(from_: Any, table: Table) -> set[str]:
    """The names a column may be qualified with; raises unless FROM is exactly the table."""
    if from_ is None:
        raise bad("FROM <table> is required")
    t = from_.this
    if type(t) is not exp.Table:
        raise bad("FROM must name the table itself (no subqueries or functions)")
    for key, value in t.args.items():
        if value and key not in ("this", "db", "catalog", "alias"):
            raise bad(f"{key} is not allowed in FROM")
    names = [t.args[k].name for k in ("catalog", "db", "this") if t.args.get(k) is not None]
    ref = ".".join(names)
    if ref not in (table.id, table.name):
        raise bad(f"the query may read only table {table.id!r}; it names {ref!r}")
    allowed = {table.name, table.id, names[-1]}
    if t.alias:
        allowed.add(t.alias)
    return allowed


def _column(node: exp.Column, table: Table, alias: set[str]) -> dict[str, Any]:
    qualifier = ".".join(p.name for p in node.parts[:-1])
    if qualifier and qualifier not in alias:
        raise bad(f"unknown table reference {qualifier!r}")
    ident = node.this
    name = ident.name if ident.quoted else ident.name.lower()
    col = table.column(name)
    if col is None:
        raise bad(f"unknown column {ident.name!r}")
    return col


def _check_where(cond: exp.Expression, table: Table, alias: set[str]) -> exp.Expression:
    for node in cond.walk():
        if not isinstance(node, _ALLOWED_NODES):
            raise bad(f"{describe(node)} is not allowed in WHERE; {_WHERE_HELP}")
        if type(node) is exp.Like and not isinstance(node.expression, exp.Literal):
            raise bad("LIKE needs a string pattern")
        if type(node) is exp.Is and not isinstance(node.expression, exp.Null):
            raise bad("IS takes NULL (IS NULL / IS NOT NULL)")
        if isinstance(node, exp.In | exp.Between | exp.Like) and type(node.this) is not exp.Column:
            raise bad(f"{type(node).__name__.upper()} needs a column on its left")
        if isinstance(node, exp.Column) and not isinstance(node.parent, _COLUMN_PARENTS):
            raise bad(f"use column {node.name!r} in a comparison (e.g. {node.name} = …)")
    cond = cond.copy()
    columns: dict[int, dict[str, Any]] = {}
    for node in list(cond.walk()):
        if isinstance(node, exp.Column):
            columns[id(node)] = _column(node, table, alias)
    for node in list(cond.walk()):
        if isinstance(node, _COMPARE):
            _typed_pair(node, "this", "expression", columns)
        elif isinstance(node, exp.In):
            col = _col_of(node.this, columns)
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                raise bad("IN takes a list of literals")
            if col is not None:  # one set(), not a replace() per item (quadratic)
                node.set("expressions", [encode_literal(i, col) for i in node.expressions])
        elif isinstance(node, exp.Between):
            col = _col_of(node.this, columns)
            if col is not None:
                for key in ("low", "high"):
                    node.args[key].replace(encode_literal(node.args[key], col))
        elif isinstance(node, exp.Like):
            col = _col_of(node.this, columns)
            if col is not None and col["type"] in _NO_LIKE:
                raise bad(f"LIKE does not apply to {col['type']} column {col['name']!r}")
    for node in list(cond.walk()):
        if isinstance(node, exp.Column):
            node.replace(exp.column(exp.to_identifier(columns[id(node)]["name"], quoted=True)))
    return cond


def describe(node: exp.Expression) -> str:
    """What the user wrote, in words (not sqlglot's class names)."""
    if isinstance(node, exp.Subquery | exp.Select | exp.Exists):
        return "a subquery"
    if isinstance(node, exp.Placeholder):
        return "a placeholder"
    if isinstance(node, exp.Func):
        name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        return f"function {name.lower()}()"
    text = node.sql(dialect="postgres")
    return repr(text if len(text) <= 40 else text[:40] + "…")


def _col_of(node: exp.Expression, columns: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    return columns.get(id(node)) if isinstance(node, exp.Column) else None


def _typed_pair(node: exp.Expression, a: str, b: str, columns: dict[int, dict]) -> None:
    left, right = node.args[a], node.args[b]
    lc, rc = _col_of(left, columns), _col_of(right, columns)
    if lc and rc:
        if lc["type"] != rc["type"]:
            raise bad(
                f"cannot compare {lc['name']} ({lc['type']}) with {rc['name']} ({rc['type']})"
            )
    elif lc:
        right.replace(encode_literal(right, lc))
    elif rc:
        left.replace(encode_literal(left, rc))


def _literal_value(node: exp.Expression) -> Any:
    if isinstance(node, exp.Paren):
        return _literal_value(node.this)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -_literal_value(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            return float(text) if "e" in text.lower() else _decimal_text(text)
    raise bad(f"compare columns with literal values, not {describe(node)}")


def _decimal_text(text: str) -> Any:
    return float(text) if text.count(".") == 1 else text


def encode_literal(node: exp.Expression, col: dict[str, Any]) -> exp.Expression:
    """The literal `node` in `col`'s stored form; ApiError(INVALID_SQL) when it does not fit."""
    value = _literal_value(node)
    if col["type"] == "DECIMAL":
        value = _decimal_digits(node, value)
    try:
        stored = TYPES[col["type"]].encode(value)
    except BadValue as exc:
        raise bad(f"value {value!r} for column {col['name']!r} ({col['type']}) {exc}") from None
    if isinstance(stored, str):
        return exp.Literal.string(stored)
    return exp.Literal.number(stored)


def _decimal_digits(node: exp.Expression, value: Any) -> Any:
    """A number literal compared with a DECIMAL column, as the digits written (not a float:
    -1.00000000000000000001 stays exact, -1e1000000 is refused for its digits)."""
    sign = ""
    if isinstance(node, exp.Neg):
        sign, node = "-", node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        return sign + node.this
    return value


def _order_item(node: exp.Expression, table: Table, alias: set[str]) -> str:
    if type(node) is not exp.Ordered or type(node.this) is not exp.Column:
        raise bad("ORDER BY takes column names, each optionally ASC or DESC")
    col = _column(node.this, table, alias)
    return order_sql(col["name"], "desc" if node.args.get("desc") else "asc")


def order_sql(name: str, direction: str) -> str:
    """One ORDER BY term with the same NULL placement on both backends (SQLite's)."""
    return f"{q(name)} DESC NULLS LAST" if direction == "desc" else f"{q(name)} ASC NULLS FIRST"


def _int_clause(node: Any, what: str) -> int | None:
    if node is None:
        return None
    value = node.args.get("expression") or node.this
    if type(value) is not exp.Literal or value.is_string or not value.this.isdigit():
        raise bad(f"{what} takes a non-negative integer")
    if len(value.this.lstrip("0")) > len(str(INT64_MAX)):  # int() refuses 4300+ digits
        raise bad(f"{what} must be at most {INT64_MAX}")
    n = int(value.this)
    if n > INT64_MAX:
        raise bad(f"{what} must be at most {INT64_MAX}")
    return n

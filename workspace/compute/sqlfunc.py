"""SQL Functions: one read-only query over the caller's own tables (joins, aggregates, CTEs).

The statement is parsed with sqlglot; only a single query (SELECT / set operation, CTEs
included) passes, and every table it names must be an initialized table of the caller's
account (other accounts' tables are never readable, even public ones). Table references are
rewritten to the physical tables, positional arguments bind to `?` placeholders, and the query
runs under the same kind of guard as row/query: SQLite through a `mode=ro` connection with an
authorizer that allows reads of exactly those tables and a progress-handler time limit;
PostgreSQL in a READ ONLY transaction with `statement_timeout` (Database.read_only).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from workspace.coltypes import TYPES, BadValue
from workspace.compute.runners import SqlError, SqlResultTooLarge, SqlTimeout
from workspace.db import Conn, Database, QueryDenied, QueryGuard, QueryTimeout
from workspace.errors import ApiError
from workspace.sqlquery import encode_literal
from workspace.tabledefs import Table

_QUERY_ROOTS = (exp.Select, exp.Union, exp.Intersect, exp.Except)
_FORBIDDEN = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.Command,
    exp.Pragma,
    exp.Into,
    exp.Merge,
    exp.Set,
    exp.Use,
    exp.Transaction,
)
_COMPARE = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
# logical types whose stored form is not the value itself (zero-padded text, 0/1, lowercase)
_ENCODED_TYPES = {"UINT256", "TOKENID", "DECIMAL", "BOOLEAN", "ADDRESS", "HASH", "BLOCKID", "TXID"}
_RESERVED_PREFIXES = ("ws_", "t_", "ix_", "sqlite_", "pg_")
_SQLITE_OK_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}

# Functions sqlglot does not model itself (it parses them as "anonymous") that a SQL Function
# may call: plain scalar, aggregate and window functions of SQLite and PostgreSQL. Left out on
# purpose: anything that runs SQL from a string, reads files or settings, or allocates at will
# (zeroblob, randomblob, repeat).
# fmt: off
ALLOWED_FUNCTIONS = frozenset({
    "acos", "asin", "atan", "atan2", "cbrt", "ceiling", "cos", "cot", "degrees", "div",
    "exp", "gcd", "lcm", "ln", "log", "log10", "log2", "mod", "pi", "power", "radians",
    "sign", "sin", "sqrt", "tan", "trunc", "width_bucket", "ascii", "btrim", "char", "chr",
    "character_length", "bit_length", "concat_ws", "format", "initcap", "lpad", "ltrim",
    "octet_length", "printf", "quote", "quote_ident", "quote_literal", "quote_nullable",
    "regexp_like", "regexp_match", "regexp_matches", "regexp_split_to_array", "reverse",
    "right", "rpad", "rtrim", "soundex", "starts_with", "strpos", "translate", "unhex",
    "unicode", "glob", "like", "age", "clock_timestamp", "date_part", "julianday",
    "make_date", "make_interval", "make_time", "make_timestamp", "statement_timestamp",
    "strftime", "time", "to_date", "to_number", "unixepoch", "array_length",
    "array_to_string", "cardinality", "string_to_array", "row", "json_agg", "jsonb_agg",
    "json_build_array", "jsonb_build_array", "json_build_object", "jsonb_build_object",
    "json_object_agg", "jsonb_object_agg", "json_array_length", "jsonb_array_length",
    "json_extract_path", "json_extract_path_text", "jsonb_extract_path",
    "jsonb_extract_path_text", "json_typeof", "jsonb_typeof", "to_json", "to_jsonb",
    "json_object", "json_array", "json_group_array", "json_group_object", "json_type",
    "json_valid", "json_quote", "json_remove", "json_set", "json_insert", "json_replace",
    "json_patch", "bool_and", "bool_or", "every", "bit_and", "bit_or", "bit_xor", "total",
    "median", "mode", "percentile_cont", "percentile_disc", "stddev", "stddev_pop",
    "stddev_samp", "variance", "var_pop", "var_samp", "corr", "covar_pop", "covar_samp",
    "regr_slope", "regr_intercept", "regr_count", "regr_r2", "cume_dist", "dense_rank",
    "percent_rank", "rank", "ntile", "nth_value", "first_value", "last_value", "likelihood",
    "likely", "unlikely",
})
# fmt: on

TableLookup = Callable[[str], Table | None]  # full table id -> the caller's own inited table


@dataclass
class CompiledSql:
    sql: str
    placeholders: int
    tables: list[Table]
    decoders: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    ctes: set[str] = field(default_factory=set)
    # ? position -> the column its argument is compared with (encoded before binding)
    encoders: dict[int, dict[str, Any]] = field(default_factory=dict)


def _names(t: exp.Table) -> list[str]:
    return [t.args[k].name for k in ("catalog", "db", "this") if t.args.get(k) is not None]


def _ident_key(ident: exp.Expression) -> str:
    """An identifier as PostgreSQL resolves it: unquoted folds to lower case."""
    name = ident.name
    return name if isinstance(ident, exp.Identifier) and ident.quoted else name.lower()


def _with_of(node: exp.Expression) -> exp.With | None:
    found = node.args.get("with_") or node.args.get("with")
    return found if isinstance(found, exp.With) else None


def is_cte_reference(table: exp.Table) -> bool:
    """Whether this table reference names a CTE in scope where it stands (PostgreSQL's rules),
    rather than a table. A CTE is visible in the body of the query its WITH belongs to and in
    the subqueries below it; inside a WITH list, an item sees the items before it, and with
    RECURSIVE every item of the list. A name equal to a CTE elsewhere in the statement is a
    table reference (and must then be one of the caller's tables)."""
    if table.args.get("db") is not None or table.args.get("catalog") is not None:
        return False
    key = _ident_key(table.this)
    path: list[exp.Expression] = [table]
    node = table.parent
    while node is not None:
        with_ = _with_of(node)
        if with_ is not None:
            ctes = [c for c in with_.expressions if isinstance(c, exp.CTE)]
            visible = ctes
            if len(path) >= 2 and path[-1] is with_ and not with_.args.get("recursive"):
                inside = path[-2]  # the WITH item this reference stands in
                visible = ctes[: next(i for i, c in enumerate(ctes) if c is inside)]
            if any(_ident_key(c.args["alias"].this) == key for c in visible):
                return True
        path.append(node)
        node = node.parent
    return False


def _check_function(node: exp.Expression) -> None:
    """Functions sqlglot knows (standard SQL) pass; any other name must be on the allow-list.

    PostgreSQL has no authorizer: functions such as query_to_xml (runs SQL given as a string),
    pg_read_file or set_config would step around the table check, so only plain scalar and
    aggregate functions are callable, the same list on both backends.
    """
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
        raise SqlError(f"function {node.sql()!r} is not allowed in a SQL Function (no schemas)")
    if isinstance(node, exp.Anonymous | exp.AnonymousAggFunc):
        name = node.name.lower()
        if name not in ALLOWED_FUNCTIONS:
            raise SqlError(f"function {name}() is not allowed in a SQL Function")


def compile_sql(text: str, lookup: TableLookup, dialect: str) -> CompiledSql:
    """Check and rewrite one statement; raises SqlError with a clear reason."""
    try:
        return _compile_sql(text, lookup, dialect)
    except RecursionError:
        raise SqlError("the statement is nested too deeply") from None


def _compile_sql(text: str, lookup: TableLookup, dialect: str) -> CompiledSql:
    try:
        statements = [s for s in sqlglot.parse(text, read="postgres") if s is not None]
    except (ParseError, TokenError) as exc:
        raise SqlError(f"could not parse the SQL: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise SqlError("a SQL Function holds exactly one statement")
    stmt = statements[0]
    if not isinstance(stmt, _QUERY_ROOTS):
        raise SqlError("a SQL Function must be a read-only query (SELECT …)")
    for node in stmt.walk():
        if isinstance(node, _FORBIDDEN):
            raise SqlError(f"{type(node).__name__.upper()} is not allowed in a SQL Function")
        _check_function(node)
    ctes = {c.alias_or_name for c in stmt.find_all(exp.CTE)}
    for name in ctes:  # a CTE must not shadow the database's own tables (see the authorizer)
        if name.lower().startswith(_RESERVED_PREFIXES):
            raise SqlError(f"CTE name {name!r} is reserved; choose another name")
    by_alias: dict[str, Table] = {}
    used: dict[str, Table] = {}
    for t in list(stmt.find_all(exp.Table)):
        if not isinstance(t.this, exp.Identifier):
            raise SqlError("table functions are not allowed")
        names = _names(t)
        if is_cte_reference(t):
            continue
        ref = ".".join(names)
        table = lookup(ref)
        if table is None:
            raise SqlError(
                f"table {ref!r} is not an initialized table of your account "
                "(name tables by their full id, e.g. myspace.transfers)"
            )
        alias = t.alias or names[-1]
        t.set("this", exp.to_identifier(table.physical, quoted=True))
        t.set("db", None)
        t.set("catalog", None)
        t.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
        by_alias[alias] = table
        used[table.id] = table
    for col in stmt.find_all(exp.Column):
        parts = [p.name for p in col.parts[:-1]]
        if len(parts) > 1:  # space.table.column -> table.column
            col.set("db", None)
            col.set("catalog", None)
            col.set("table", exp.to_identifier(parts[-1], quoted=True))
    placeholders = len(list(stmt.find_all(exp.Placeholder)))
    single = _single_table(stmt, by_alias, ctes)
    encoders = _encode_comparisons(stmt, by_alias, single)
    out = "postgres" if dialect == "postgresql" else "sqlite"
    sql = stmt.sql(dialect=out, comments=False)
    compiled = CompiledSql(sql, placeholders, list(used.values()), _decoders(stmt, by_alias))
    compiled.ctes = ctes
    compiled.encoders = encoders
    return compiled


def _single_table(stmt: exp.Expression, by_alias: dict[str, Table], ctes: set[str]) -> Table | None:
    """The table unqualified columns belong to, when the statement reads exactly one."""
    if ctes or len(by_alias) != 1 or len(list(stmt.find_all(exp.Table))) != 1:
        return None
    return next(iter(by_alias.values()))


def _typed_column(
    node: exp.Expression, by_alias: dict[str, Table], single: Table | None
) -> dict[str, Any] | None:
    """The table column `node` names when its stored form differs from its value."""
    if not isinstance(node, exp.Column):
        return None
    table = by_alias.get(node.table) if node.table else single
    col = table.column(node.name) if table is not None else None
    return col if col is not None and col["type"] in _ENCODED_TYPES else None


def _encode_comparisons(
    stmt: exp.Expression, by_alias: dict[str, Table], single: Table | None
) -> dict[int, dict[str, Any]]:
    """Rewrite literals compared with encoded columns (amount > 5 on a UINT256 column, as in
    row/query) and return, per ? position, the column its argument is compared with."""
    position = {id(p): i for i, p in enumerate(stmt.find_all(exp.Placeholder, bfs=False))}
    encoders: dict[int, dict[str, Any]] = {}

    def encode(node: exp.Expression, col: dict[str, Any]) -> exp.Expression:
        if isinstance(node, exp.Placeholder):
            encoders[position[id(node)]] = col
            return node
        if isinstance(node, exp.Literal | exp.Boolean | exp.Neg | exp.Paren):
            try:
                return encode_literal(node, col)
            except ApiError as exc:
                raise SqlError(exc.message) from None
        return node

    for node in list(stmt.find_all(*_COMPARE, exp.In, exp.Between)):
        if isinstance(node, _COMPARE):
            left, right = node.this, node.expression
            if col := _typed_column(left, by_alias, single):
                node.set("expression", encode(right, col))
            elif col := _typed_column(right, by_alias, single):
                node.set("this", encode(left, col))
        elif (col := _typed_column(node.this, by_alias, single)) is None:
            continue
        elif isinstance(node, exp.In) and not node.args.get("query"):
            node.set("expressions", [encode(i, col) for i in node.expressions])
        elif isinstance(node, exp.Between):
            node.set("low", encode(node.args["low"], col))
            node.set("high", encode(node.args["high"], col))
    return encoders


def _decoders(stmt: exp.Expression, by_alias: dict[str, Table]) -> dict[str, Callable]:
    """Output columns that are plain table columns read back in their logical form."""
    if not isinstance(stmt, exp.Select):
        return {}
    out: dict[str, Callable[[Any], Any]] = {}
    for proj in stmt.expressions:
        if isinstance(proj, exp.Star):
            for table in by_alias.values():
                for c in table.columns:
                    out.setdefault(c["name"], TYPES[c["type"]].decode)
            continue
        inner = proj.this if isinstance(proj, exp.Alias) else proj
        if isinstance(inner, exp.Min | exp.Max):  # order-preserving storage: same form
            inner = inner.this
        if not isinstance(inner, exp.Column) or isinstance(inner.this, exp.Star):
            continue
        candidates = [by_alias[inner.table]] if inner.table in by_alias else by_alias.values()
        for table in candidates:
            col = table.column(inner.name)
            if col is not None:
                out[proj.alias_or_name] = TYPES[col["type"]].decode
                break
    return out


class SqlFunctionRunner:
    """Executes compiled SQL Functions against the workspace database under a guard.

    The result is bounded while it is fetched: at most `max_rows` rows and `result_bytes`
    (the same budget as other languages' return values, counted as JSON), so a large result
    fails after that much was read, not after all of it. One value is bounded too, before it
    leaves the database: SQLite refuses to build a string or blob over `max_value_bytes`
    (SQLITE_LIMIT_LENGTH, intermediate values included); on PostgreSQL a row holding a value
    over `max_value_bytes` (as text) fails the query in the database."""

    def __init__(
        self,
        db: Database,
        timeout_ms: int,
        max_rows: int,
        result_bytes: int = 8 * 1024 * 1024,
        max_value_bytes: int = 1024 * 1024,
        max_columns: int = 256,
    ) -> None:
        self.db = db
        self.timeout_ms = timeout_ms
        self.max_rows = max_rows
        self.result_bytes = result_bytes
        self.max_value_bytes = max_value_bytes
        # SQLite builds a whole row before it is fetched: this many columns of at most
        # max_value_bytes each (room for SELECT * over a join of two of the widest tables)
        self.max_columns = 2 * max_columns + 64
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ws-sqlfn")
        self._ro: sqlite3.Connection | None = None

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, True)
        if self._ro is not None:
            self._ro.close()

    async def run(self, compiled: CompiledSql, args: list[Any]) -> list[dict[str, Any]]:
        if compiled.placeholders != len(args):
            raise SqlError(
                f"the SQL has {compiled.placeholders} ? placeholder(s) "
                f"but {len(args)} argument(s) were given"
            )
        for i, a in enumerate(args):
            if isinstance(a, dict | list):
                raise SqlError(f"argument {i} must be a string, number, boolean or null")
        args = [_encode_arg(i, a, compiled.encoders.get(i)) for i, a in enumerate(args)]
        budget = _Budget(self.max_rows, self.result_bytes)
        try:
            if self.db.dialect == "sqlite":
                loop = asyncio.get_running_loop()
                wrapped = f"SELECT * FROM ({compiled.sql}) AS fn_result"
                names, rows = await loop.run_in_executor(
                    self._pool, self._sqlite, wrapped, args, compiled, budget
                )
            else:
                guard = QueryGuard(
                    compiled.tables[0].physical if compiled.tables else "", self.timeout_ms
                )
                names, rows = await self.db.read_only(
                    _pg_fetch, guard, compiled.sql, args, budget, self.max_value_bytes
                )
        except QueryTimeout:
            raise SqlTimeout(f"the query ran longer than {self.timeout_ms} ms") from None
        except QueryDenied as exc:
            if VALUE_TOO_LARGE in str(exc) or "too big" in str(exc):
                raise SqlError(
                    f"a value is larger than {self.max_value_bytes} bytes (sql_max_value_bytes)"
                ) from None
            raise SqlError(f"the database rejected the query: {exc}") from None
        return [_decode(names, r, compiled.decoders) for r in rows]

    def _sqlite(
        self, sql: str, args: list[Any], compiled: CompiledSql, budget: _Budget
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        if self._ro is None:
            path = getattr(self.db, "path")  # noqa: B009 - SqliteDatabase only
            self._ro = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
            # the query runs inside the server: printf('%.*c', 1e9, 'x') must not take 1 GB
            self._ro.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.max_value_bytes)
            self._ro.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, self.max_columns)
        raw = self._ro
        # CTE names appear as read "tables" (count(*) over a CTE); they cannot shadow real
        # tables: names with the database's prefixes are refused by compile_sql
        allowed = {t.physical for t in compiled.tables} | compiled.ctes
        deadline = time.monotonic() + self.timeout_ms / 1000
        timed_out = False

        def authorize(action: int, arg1: Any, arg2: Any, dbname: Any, trigger: Any) -> int:
            if action in _SQLITE_OK_ACTIONS:
                return sqlite3.SQLITE_OK
            if action == sqlite3.SQLITE_READ and arg1 in allowed:
                return sqlite3.SQLITE_OK  # CTEs and subqueries report their base tables
            return sqlite3.SQLITE_DENY

        def progress() -> int:
            nonlocal timed_out
            timed_out = time.monotonic() > deadline
            return 1 if timed_out else 0

        raw.execute("BEGIN")
        raw.set_authorizer(authorize)
        raw.set_progress_handler(progress, 1000)
        try:
            cur = raw.execute(sql, [int(a) if isinstance(a, bool) else a for a in args])
            names = [d[0] for d in cur.description]
            return names, budget.collect(names, cur)
        except sqlite3.DatabaseError as exc:
            if timed_out:
                raise QueryTimeout("timeout") from None
            raise QueryDenied(str(exc)) from None
        finally:
            raw.set_authorizer(None)
            raw.set_progress_handler(None, 0)
            raw.execute("ROLLBACK")


class _Budget:
    """Rows and JSON bytes a result may take, counted as rows arrive."""

    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes

    def collect(self, names: list[str], rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        size = 2  # []
        keys = sum(len(n.encode()) + 4 for n in names) + 2  # {"name": , …}
        for row in rows:
            if len(out) >= self.max_rows:
                raise SqlError(
                    f"the query returned more than {self.max_rows} rows; add a LIMIT or aggregate"
                )
            size += keys + sum(_json_size(v) for v in row)
            if size > self.max_bytes:
                raise SqlResultTooLarge(f"return value larger than {self.max_bytes} bytes")
            out.append(tuple(row))
        return out


def _json_size(v: Any) -> int:
    """About how many bytes `v` takes in the JSON answer (strings counted exactly)."""
    if isinstance(v, str):
        return len(v.encode()) + 2
    if isinstance(v, bytes | bytearray | memoryview):
        return 2 * len(v) + 4
    if v is None:
        return 4
    return len(str(v))


VALUE_TOO_LARGE = "chainstate: value larger than sql_max_value_bytes"


def _pg_fetch(
    conn: Conn, sql: str, args: list[Any], budget: _Budget, max_value: int
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run on PostgreSQL through a server-side cursor (rows arrive in chunks and are counted
    as they come). The columns are learnt first (LIMIT 0), then the query runs renamed
    positionally (duplicate names allowed) with every row's values checked in the database:
    one over `max_value` bytes (as text) fails the query there, before it is sent."""
    cur = conn.execute(f"SELECT * FROM ({sql}) AS fn_result LIMIT 0", args)
    names = [d[0] for d in cur.description]
    if not names:
        return names, budget.collect(names, conn.stream(sql, args))
    cols = [f"c{i}" for i in range(len(names))]
    sizes = [f"octet_length(CAST({c} AS text))" for c in cols]
    widest = f"GREATEST({', '.join(sizes)})"
    # the error must depend on the row: PostgreSQL folds a constant CAST while planning
    fail = f"CAST('{VALUE_TOO_LARGE}: ' || {widest} AS integer)"
    select = ", ".join(f"{c} AS {_quote(n)}" for c, n in zip(cols, names, strict=True))
    checked = (
        f"SELECT {select} FROM ({sql}) AS fn_result({', '.join(cols)})"
        f" WHERE CASE WHEN {widest} > {int(max_value)} THEN {fail} ELSE 1 END = 1"
    )
    return names, budget.collect(names, conn.stream(checked, args))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _encode_arg(i: int, value: Any, col: dict[str, Any] | None) -> Any:
    if col is None or value is None:
        return value
    try:
        return TYPES[col["type"]].encode(value)
    except BadValue as exc:
        raise SqlError(f"argument {i} for column {col['name']!r} ({col['type']}) {exc}") from None


def _decode(
    names: list[str], row: tuple[Any, ...], dec: dict[str, Callable[[Any], Any]]
) -> dict[str, Any]:
    return {
        n: (dec[n](v) if n in dec and v is not None else _json_safe(v))
        for n, v in zip(names, row, strict=True)
    }


def _json_safe(v: Any) -> Any:
    """Database values that JSON has no type for (PostgreSQL numeric, dates, bytes)."""
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else str(v)
    if isinstance(v, datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, bytes | bytearray | memoryview):
        return "0x" + bytes(v).hex()
    return v


def own_table_lookup(conn: Conn, account_id: str) -> TableLookup:
    """Tables of `account_id` (its own Spaces only), initialized; by full id."""

    def lookup(table_id: str) -> Table | None:
        row = conn.one(
            "SELECT t.* FROM ws_tables t JOIN ws_spaces s ON s.id = t.space "
            "WHERE t.id = ? AND s.account_id = ? AND t.inited = 1",
            [table_id, account_id],
        )
        return Table.from_row(row) if row else None

    return lookup

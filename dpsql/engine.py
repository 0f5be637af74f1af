"""Engines run bounded SQL and return Arrow tables.

The pipeline talks to an :class:`Engine`: it asks for the schema, for how to name a policy
table, and runs a sqlglot tree (transpiled to the engine's dialect). DuckDB is the engine
today; another (Spark) needs only this interface.

Hardening. :class:`DuckDBEngine` opened from a path starts a private in-memory DuckDB
instance, attaches the data file ``READ_ONLY``, then switches off everything that lets SQL
reach outside (file access, replacement scans of Python variables, extension loading) and
locks the configuration. Opened from an existing ``duckdb.DuckDBPyConnection`` it trusts
that connection as the data owner configured it: dpsql only ever sends its own generated
SQL over it, but anyone holding the same connection object can read raw rows.

Data versions. :meth:`DuckDBEngine.data_version` names the data for the repeat store
(:mod:`dpsql.repeats`) without reading it: a file opened by path is attached read-only and
locked against writers while open, so its identity (device, inode, size, modification
time, taken at open) names its contents; a wrapped connection's version is whatever the
data owner passed as ``data_version`` (the owner says when the data changed). An earlier
version digested every row of the tables read on each query: whether a repeat was then
served told the analyst, for free, whether anyone's rows had changed (DESIGN §7).

Interrupts. :meth:`DuckDBEngine.interrupt` stops the statement running now (from another
thread), for the deadline of :mod:`dpsql.timing`.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp
from sqlglot.dialects.dialect import Dialect

from dpsql.errors import Error, InternalError
from dpsql.hardened import lock, open_for_data
from dpsql.plan import QueryPlan
from dpsql.statements import execute_argument, read_once, spread, writable

__all__ = ["DuckDBEngine", "Engine", "Prepared", "bind"]

_ATTACHED = "dpsql_data"

#: Bounded SQL texts remembered per DuckDB engine, each a prepared statement from its second
#: run (new aliases and new salts share one).
_STATEMENTS = 64

# DuckDB's DB-API ``to_arrow_table`` warns that it copies the rows once more: for the
# bounded query's few rows per group that copy costs less than ``sql()``'s second binding.
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning,
                        module=r"dpsql\.engine")


_ARROW_BATCH: int | None
try:  # DuckDB 2.0's batch size for Arrow results (see _arrow)
    from duckdb._seam import DEFAULT_BATCH_SIZE as _ARROW_BATCH
except ImportError:  # pragma: no cover - another DuckDB: the DB-API path
    _ARROW_BATCH = None


class Prepared(str):
    """The SQL text of a bounded query that :meth:`DuckDBEngine.run` keeps as a prepared
    statement: a run binds only its salts. A plain ``str`` to any other reader."""

    __slots__ = ()


class _Unoptimized(Prepared):
    """A :class:`Prepared` text that a small database runs with DuckDB's optimizer off
    (:func:`runs_unoptimized`, :data:`SMALL_TABLE_OPTIMIZER`); ``renamed``: its parameters'
    uses after the first, each under its own name (:func:`dpsql.statements.read_once`)."""

    renamed: tuple[tuple[str, str], ...] = ()


def runs_unoptimized(query: exp.Expression) -> bool:
    """Whether a bounded query's plan as written is cheap, so that a small database may run
    it unoptimized: every SELECT in it is the query, a CTE or a FROM/JOIN source, or
    ``IN (SELECT UNNEST(<list parameter>))`` (listed keys), it has no window and joins no
    table (only its own derived tables: the L0 cut). Anything else stays optimized:
    unoptimized, a correlated ``EXISTS`` (an ``IN`` over the unit:
    :mod:`dpsql.analyze.semijoins`) ran 40x slower at 60,000 rows, value queries' windows
    2x, and a join's WHERE runs after the join instead of before it (26x on two private
    tables with a filter on each: the run time would follow the units' joined row counts).

    >>> import sqlglot
    >>> runs_unoptimized(sqlglot.parse_one("SELECT g, sum(n) FROM (SELECT u, g, count(*) AS n FROM t GROUP BY u, g) GROUP BY g"))
    True
    >>> runs_unoptimized(sqlglot.parse_one("SELECT count(*) FROM t WHERE EXISTS (SELECT 1 FROM s WHERE s.u = t.u)"))
    False
    >>> runs_unoptimized(sqlglot.parse_one("SELECT count(*) FROM t WHERE g IN (SELECT UNNEST($k))", read="duckdb"))
    True
    >>> runs_unoptimized(sqlglot.parse_one("SELECT count(*) FROM main.t JOIN main.s ON t.u = s.u WHERE s.x > 1"))
    False
    """
    if query.find(exp.Window) is not None:
        return False
    if any(isinstance(j.this, exp.Table) and j.this.args.get("db") is not None for j in query.find_all(exp.Join)):
        return False  # a table joined: its rows' WHERE would run after the join, not before it
    for select in query.find_all(exp.Select):
        parent = select.parent
        if select is query or isinstance(parent, exp.CTE):
            continue
        if isinstance(parent, exp.Subquery) and isinstance(parent.parent, (exp.From, exp.Join)):
            continue
        if (isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.In) and parent.arg_key == "query"
                and select.args.get("from_") is None and select.args.get("from") is None
                and len(select.expressions) == 1 and _unnests_a_parameter(select.expressions[0])):
            continue
        return False
    return True


def _unnests_a_parameter(node: exp.Expr) -> bool:
    """``UNNEST($k)`` or ``UNNEST(CAST($k AS T[]))``, as sqlglot reads it or dpsql writes it."""
    if isinstance(node, exp.Explode):
        args = [node.this]
    elif isinstance(node, exp.Unnest) or (isinstance(node, exp.Anonymous) and str(node.this).lower() == "unnest"):
        args = list(node.expressions)
    else:
        return False
    args = [a.this if isinstance(a, exp.Cast) else a for a in args]
    return len(args) == 1 and isinstance(args[0], (exp.Placeholder, exp.Parameter))


class Engine(Protocol):
    """What the pipeline needs from a database."""

    dialect: str

    def schema(self) -> Mapping[str, Mapping[str, str]]:
        """Casefolded table name -> casefolded column name -> type name."""
        ...

    def table(self, name: str) -> exp.Table:
        """The fully qualified reference to a table of the schema."""
        ...

    def row_id(self, alias: str, table: str | None = None) -> exp.Expression:
        """An expression that tells the rows of ``table`` (read as ``alias``) apart, for keyed
        row sampling and for row-level units."""
        ...

    def distinct_values(self, table: str, column: str, limit: int) -> tuple[object, ...] | None:
        """A (public) table's distinct values of a column, ``None`` past ``limit``."""
        ...

    def prepare(self, query: exp.Expression) -> exp.Expression | str:
        """What :meth:`run` takes for a bounded query's tree, prepared once per plan and
        run many times (DuckDB: its SQL text; Spark: the tree itself)."""
        ...

    def run(self, query: exp.Expression | str, params: Mapping[str, object] | None = None) -> pa.Table:
        """Run a query (a tree, or what :meth:`prepare` returned) and return its rows."""
        ...

    def shown_sql(self, query: exp.Expression) -> str:
        """The SQL text :meth:`run` sends for ``query``, pretty-printed (what ``explain``
        shows: the engine's own SQL, not the pipeline's dialect)."""
        ...

    def data_version(self) -> str:
        """A name for the data's current version that is not read from the data (the
        repeat store's key; see :class:`DuckDBEngine`)."""
        ...

    def close(self) -> None: ...


def bind(plan: QueryPlan, engine: Engine) -> QueryPlan:
    """``plan`` with what the bounded query needs from ``engine`` written into it: the
    reference to each table read, each stored source's column types and each source's row
    id. After this :mod:`dpsql.rewrite` reads nothing but the plan."""
    names = {s.table.casefold() for s in plan.sources if s.query is None}
    for source in plan.sources:
        if source.query is not None:
            names.update(t.name.casefold() for t in source.query.find_all(exp.Table))
    if plan.where is not None:  # IN / EXISTS over policy tables (dpsql.analyze.semijoins)
        names.update(t.name.casefold() for t in plan.where.find_all(exp.Table))
    schema = engine.schema()
    sources = []
    for source in plan.sources:
        if source.query is not None:  # a derived table's rows are unique: the hash of the row
            row_id: exp.Expression = exp.Anonymous(this="hash", expressions=[exp.column(source.alias, quoted=True)])
            sources.append(replace(source, row_id=row_id))
        else:
            types = tuple(schema[source.table.casefold()].items())
            sources.append(replace(source, types=types, row_id=engine.row_id(source.alias, source.table)))
    tables = tuple((name, engine.table(name)) for name in sorted(names))
    lists = bool(getattr(engine, "list_parameters", False))
    return replace(plan, sources=tuple(sources), tables=tables, list_parameters=lists)


class DuckDBEngine:
    """DuckDB, opened from a file path or wrapping an existing connection."""

    dialect = "duckdb"
    #: binds a Python list as one parameter (long lists of public keys, :mod:`dpsql.rewrite`)
    list_parameters = True

    def __init__(
        self, database: str | os.PathLike[str] | duckdb.DuckDBPyConnection, *, data_version: str | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._statements: dict[str, str | None] = {}  # SQL text -> prepared statement name (None: run once), oldest first
        self._prepared_count = 0
        self._plain: duckdb.DuckDBPyConnection | None = None  # optimizer off: a small file's (_open_hardened)
        self._running: duckdb.DuckDBPyConnection | None = None
        if isinstance(database, duckdb.DuckDBPyConnection):
            self._con = database
            self._catalog: str | None = None
            self._owned = False
            self._version = f"owner:{data_version}" if data_version is not None else "wrapped"
        else:
            path = os.fspath(database)
            self._con, self._plain = _open_hardened(path)
            self._catalog = _ATTACHED
            self._owned = True
            info = os.stat(path)
            self._version = f"file:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
            if data_version is not None:
                self._version += f":owner:{data_version}"
        self._schema = self._read_schema()
        self._small = self._plain is not None or (self._catalog is None and self._small_tables())

    def _small_tables(self) -> bool:
        """Whether a wrapped connection's tables are all small (catalog metadata, as
        :func:`_set_threads` decides for a file) and it has no view, whose size is unknown."""
        counts = self.row_counts()
        return not self._views and bool(counts) and max(counts.values()) <= ONE_THREAD_ROWS

    def _read_schema(self) -> dict[str, dict[str, str]]:
        catalog = self._catalog or self._con.sql("SELECT current_database()").fetchall()[0][0]
        rows = self._con.sql(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = $db AND schema_name = 'main' ORDER BY table_name, column_index",
            params={"db": catalog},
        ).fetchall()
        schema: dict[str, dict[str, str]] = {}
        for table, column, dtype in rows:
            schema.setdefault(table.casefold(), {})[column.casefold()] = dtype
        self._names = {t.casefold(): t for t, _, _ in rows}
        views = self._con.sql("SELECT view_name FROM duckdb_views() WHERE database_name = $db AND schema_name = 'main'",
                              params={"db": catalog}).fetchall()
        self._views = {str(v).casefold() for (v,) in views}
        return schema

    def schema(self) -> Mapping[str, Mapping[str, str]]:
        return self._schema

    def table(self, name: str) -> exp.Table:
        real = self._names.get(name.casefold())
        if real is None:
            raise InternalError(f"table {name!r} is not in the database; the policy check should have caught this")
        return exp.table_(
            exp.to_identifier(real, quoted=True),
            db=exp.to_identifier("main", quoted=True),
            catalog=exp.to_identifier(self._catalog, quoted=True) if self._catalog else None,
        )

    def row_id(self, alias: str, table: str | None = None) -> exp.Expression:
        """``alias.rowid``; a view has none, so there the hash of the whole row stands in.

        Identical rows of a view then share an id: sampling treats them alike and, in a
        row-level table, they count as one unit. That only merges rows, so every bound still
        holds (a unit is never split).
        """
        if table is not None and table.casefold() in self._views:
            return exp.Anonymous(this="hash", expressions=[exp.column(alias, quoted=True)])
        return exp.column("rowid", table=alias)

    def distinct_values(self, table: str, column: str, limit: int) -> tuple[object, ...] | None:
        """The sorted distinct non-NULL values of a column, or ``None`` if there are more
        than ``limit``. Only for public tables: the caller checks."""
        ref = exp.column(column, quoted=True)
        query = (
            exp.select(ref).distinct().from_(self.table(table)).where(exp.Not(this=exp.Is(this=ref.copy(), expression=exp.Null())))
            .order_by(ref.copy()).limit(limit + 1)
        )
        values = self.run(query).column(0).to_pylist()
        return None if len(values) > limit else tuple(values)

    def prepare(self, query: exp.Expression) -> Prepared:
        """The tree's text, written without the copy sqlglot's ``.sql()`` makes first (60%
        of writing it): the tree may be changed by the writing, so hand it a fresh one.
        :meth:`run` keeps it as a DuckDB prepared statement (see :class:`Prepared`); on a
        small file, unoptimized where :func:`runs_unoptimized` says so."""
        if self._plain is None or not runs_unoptimized(query):
            return Prepared(Dialect.get_or_raise(self.dialect).generator().generate(query, copy=False))
        renamed = read_once(query)  # bound once, not on every run
        text = _Unoptimized(Dialect.get_or_raise(self.dialect).generator().generate(query, copy=False))
        text.renamed = renamed
        return text

    def run(self, query: exp.Expression | str, params: Mapping[str, object] | None = None) -> pa.Table:
        """Run ``query`` and return its rows as Arrow.

        DuckDB's native ``execute``, not ``sql()``: the latter's relation layer binds the
        query once for its signature and then again to run it (twice the CPU on a small
        query). A :class:`Prepared` text runs as a prepared statement (parsed, bound and
        optimized once per text), its integer and string parameters written into the
        ``EXECUTE``, and on small tables its short lists too (:func:`dpsql.statements.writable`);
        a run binding a list parameter otherwise runs the text directly."""
        sql = query if isinstance(query, str) else query.sql(dialect=self.dialect)
        con = self._plain if isinstance(query, _Unoptimized) and self._plain is not None else self._con
        if isinstance(query, _Unoptimized):
            params = spread(query.renamed, params)
        with self._lock:
            self._running = con
            statement = None
            if isinstance(query, Prepared) and all(writable(v, self._small) for v in (params or {}).values()):
                statement = self._statement(con, sql, params or {})
            if statement is not None:
                return _arrow(con, statement, None)
            return _arrow(con, sql, dict(params) if params else None)

    def _statement(self, con: duckdb.DuckDBPyConnection, sql: str, params: Mapping[str, object]) -> str | None:
        """``EXECUTE`` of the prepared statement for ``sql``, ``params`` written in; ``None``
        the first time ``sql`` is seen (run it directly). DuckDB binds and plans an
        optimized ``EXECUTE`` again on every run, so there a statement saves only the
        parsing (an unoptimized one keeps its plan: :data:`SMALL_TABLE_OPTIMIZER`), while
        ``PREPARE`` costs a full planning: a text is prepared on its second run (a new
        question's text, run once, was 9.7 against 4.7 ms prepared, under load). The oldest
        of more than ``_STATEMENTS`` texts is forgotten (deallocated if prepared). A text is
        always run on the same connection ``con`` (its class says which), so a statement
        lives on the connection that runs it."""
        seen = sql in self._statements
        name = self._statements.pop(sql, None)
        if name is None and seen:
            self._prepared_count += 1
            name = f"__dpsql_s{self._prepared_count}"
            con.execute(f"PREPARE {name} AS {sql}")
        if not seen and len(self._statements) >= _STATEMENTS:
            oldest = self._statements.pop(next(iter(self._statements)))
            if oldest is not None:
                for each in (self._con, self._plain):  # not prepared on one of them: nothing to drop there
                    if each is not None:
                        each.execute(f"DEALLOCATE {oldest}")
        self._statements[sql] = name  # most recently used last
        if name is None:
            return None
        if not params:
            return f"EXECUTE {name}"
        return f"EXECUTE {name}(" + ", ".join(f"{k} := {execute_argument(k, v, sql)}" for k, v in params.items()) + ")"

    def shown_sql(self, query: exp.Expression) -> str:
        return query.sql(dialect=self.dialect, pretty=True)

    @property
    def one_thread(self) -> bool:
        """Whether this engine runs a small file's way: one thread, and plain bounded queries
        unoptimized on a second connection (:func:`small_settings`)."""
        return self._plain is not None

    def data_version(self) -> str:
        """A name for the data's current version that is not read from the data (see the
        module docstring): the file's identity, or the owner's ``data_version``."""
        return self._version

    def row_counts(self) -> dict[str, int]:
        """Casefolded table name -> its row count as DuckDB's catalog keeps it (metadata:
        no scan). Views have none and are left out. For the timing model's sizes, which
        the caller coarsens (:mod:`dpsql.timing`)."""
        catalog = self._catalog or self._con.sql("SELECT current_database()").fetchall()[0][0]
        with self._lock:
            rows = self._con.sql(
                "SELECT table_name, estimated_size FROM duckdb_tables() WHERE database_name = $db "
                "AND schema_name = 'main'", params={"db": catalog},
            ).fetchall()
        return {str(name).casefold(): int(size or 0) for name, size in rows}

    def interrupt(self) -> None:
        """Stop the statement running now, if any (callable from any thread)."""
        (self._running or self._con).interrupt()

    def close(self) -> None:
        if self._owned:
            if self._plain is not None:
                self._plain.close()
            self._con.close()


def _arrow(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object] | None) -> pa.Table:
    """Run one statement straight to an Arrow table: DuckDB 2.0's own terminal for Arrow
    (``_submit``, what its relations' ``to_arrow_table`` runs on), where a DB-API result's
    ``to_arrow_table`` runs a second statement over the rows (0.25 ms of a 2.1 ms small
    query's CPU). Without that private method (another DuckDB), the DB-API path."""
    submit = getattr(con, "_submit", None)
    if submit is not None and _ARROW_BATCH is not None:
        table: pa.Table = submit(sql, params, "arrow", _ARROW_BATCH).arrow_table()
        return table
    return con.execute(sql, params).to_arrow_table()


def _open_hardened(path: str) -> tuple[duckdb.DuckDBPyConnection, duckdb.DuckDBPyConnection | None]:
    """The locked connection to a private instance with ``path`` attached, and for a small
    file a second, unoptimized connection to the same instance (:func:`_set_threads`)."""
    if not os.path.exists(path):
        raise Error(f"database file {path!r} does not exist. Pass the path of an existing DuckDB file.")
    con = open_for_data()
    literal = exp.Literal.string(path).sql(dialect="duckdb")
    try:
        con.execute(f"ATTACH {literal} AS {_ATTACHED} (READ_ONLY)")
    except duckdb.Error as e:
        con.close()
        raise Error(
            f"cannot open {path!r} read-only: {e}. If this process already has the file open "
            "read-write, pass that connection to dpsql.connect instead of the path."
        ) from None
    plain = _set_threads(con)
    return lock(con), plain


#: Tables of at most this many rows (coarsened) are read by one DuckDB thread: DuckDB splits
#: a scan by row groups of 122,880 rows, so a second thread only adds scheduling to a
#: query over fewer.
ONE_THREAD_ROWS = 65_536


#: Optimizer passes switched off when every table is small: on a small table planning is
#: most of a query's time, and these three were a fifth of the bounded query's (issue 16:
#: 2.16 -> 1.75 ms CPU on 1,000 rows, 6.44 -> 6.29 ms on 60,000; same rows out). They only
#: rewrite the plan, never its result.
SMALL_TABLE_OPTIMIZERS_OFF = ("expression_rewriter", "statistics_propagation", "common_subexpressions")

#: Whether a small file's plain bounded queries (:func:`runs_unoptimized`) run optimized.
#: They run on a second connection with the optimizer off: in DuckDB 2.0 an optimized
#: prepared statement is bound and optimized again on every ``EXECUTE`` (profiler: binding
#: 1.43 ms and optimizer 0.57 ms for 0.2 ms of execution, a bounded GROUP BY on 1,000 rows),
#: an unoptimized one only once (``EXECUTE`` 1.96 -> 0.49 ms, binding 0.004 ms; issue 16,
#: ``benchmarks/HISTORY.md``). The optimizer only rewrites a plan, never its result; the
#: shapes that need it (correlated subqueries, windows, joined tables) stay optimized.
SMALL_TABLE_OPTIMIZER = False


def _set_threads(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection | None:
    """One thread, fewer optimizer passes (:data:`SMALL_TABLE_OPTIMIZERS_OFF`) and a second
    connection without the optimizer (:data:`SMALL_TABLE_OPTIMIZER`, returned) when every
    attached table is small; DuckDB's defaults and ``None`` otherwise. Decided from the
    catalog's metadata (no data read), one bit of a table size as coarse as the timing
    model's (:func:`dpsql.timing.coarse_rows`). Call it before :func:`~dpsql.hardened.lock`."""
    rows = con.execute(
        "SELECT max(estimated_size) FROM duckdb_tables() WHERE database_name = $db", {"db": _ATTACHED}
    ).fetchall()[0][0]
    if int(rows or 0) > ONE_THREAD_ROWS:
        return None
    return small_settings(con)


def small_settings(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A small file's settings on ``con`` (:func:`_set_threads`), and its second, unoptimized
    connection (also the timing calibration's, :mod:`dpsql.calibration`, for such a file)."""
    con.execute("SET threads = 1")
    con.execute(f"SET disabled_optimizers = '{','.join(SMALL_TABLE_OPTIMIZERS_OFF)}'")
    plain = con.cursor()  # the same instance and attached file; its own session settings
    plain.execute(f"SET SESSION enable_optimizer = {str(SMALL_TABLE_OPTIMIZER).lower()}")
    return plain

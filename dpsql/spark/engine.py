"""An :class:`~dpsql.engine.Engine` over an Apache Spark session (pyspark).

The pipeline is unchanged: analysis, noise and accounting run in dpsql; Spark runs only the
bounded query, which :mod:`dpsql.spark.translate` turns into Spark SQL with the same exact
results as on DuckDB (keyed hash, clipping, DECIMAL(38,0) sums, exact floors).

Tables. The policy's tables are tables or temporary views of the session (``tables=None``:
every temporary view and every table of the current database), or what ``tables=`` maps
policy names to: a Spark DataFrame of this session, or the path of Parquet, CSV or JSON
files (read by Spark; a folder is read whole, Hive-style partition folders included).

Security. Analyst SQL never reaches Spark: the analyzer lets only policy tables and a
fixed grammar in, and this engine refuses, before Spark parses anything, a query reading
any other table or calling a function outside an allow-list
(:func:`~dpsql.spark.translate.check_reachable`). So ``read_files``, ``parquet.`path```,
``spark_catalog.`` names of other tables, ``reflect``/``java_method`` and registered UDFs
are unreachable. Anyone holding the same SparkSession can of course read raw rows: it is the
data owner's.

Rows have no stable id in Spark (``monotonically_increasing_id`` changes with the
partitioning), so :meth:`SparkEngine.row_id` is the keyed-hash input ``xxhash64`` of the
whole row, as DuckDB's engine does for views: identical rows share an id, which only
merges units, so every bound still holds.

Dialect. ``rewrite`` builds the bounded query as a tree with DuckDB's functions
(:attr:`SparkEngine.dialect`); the pipeline hands :meth:`SparkEngine.run` that tree
(:meth:`SparkEngine.prepare`), which translates it without parsing any text, and
``explain`` shows the Spark SQL it sends (:meth:`SparkEngine.sql`). SQL text in DuckDB's
dialect is still accepted (parsed first).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.errors import Error, InternalError, first_line
from dpsql.spark.translate import check_reachable, parse_bounded, table_key, to_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkEngine", "duckdb_type"]

#: pyspark logs every failed query's message (which can quote a value of a row) with its
#: stack to stderr through these loggers; dpsql logs engine failures itself, without the
#: message (DESIGN §7), so they are silenced once a Spark engine is created.
_PYSPARK_QUERY_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")

#: Translations kept (bounded query text -> Spark SQL), oldest dropped first.
_CACHED_TEXTS = 256

_FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json"}

#: Spark's simple type names -> the names the analyzer reads (DuckDB's). Others pass upper-cased
#: (arrays, maps, structs, binary: the analyzer allows them IS NULL only).
_TYPE_NAMES = {
    "tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
    "float": "FLOAT", "double": "DOUBLE", "boolean": "BOOLEAN", "string": "VARCHAR",
    "date": "DATE", "timestamp": "TIMESTAMP WITH TIME ZONE", "timestamp_ntz": "TIMESTAMP",
}


def duckdb_type(spark_type: str) -> str:
    """A Spark column type (``DataType.simpleString()``) as the analyzer names it.

    >>> duckdb_type("int"), duckdb_type("decimal(10,2)"), duckdb_type("varchar(20)")
    ('INTEGER', 'DECIMAL(10,2)', 'VARCHAR')
    """
    name = spark_type.strip().casefold()
    if name in _TYPE_NAMES:
        return _TYPE_NAMES[name]
    if name.startswith(("varchar(", "char(")):
        return "VARCHAR"
    return name.upper()


class SparkEngine:
    """Runs bounded queries on a SparkSession and returns Arrow tables."""

    dialect = "duckdb"

    def __init__(
        self,
        session: SparkSession,
        *,
        tables: Mapping[str, DataFrame | str | os.PathLike[str]] | None = None,
        data_version: str | None = None,
        owned: bool = False,
    ) -> None:
        """Args:
            session: the SparkSession that holds (or reads) the data.
            tables: policy table name -> a DataFrame of ``session`` or a path of
                Parquet/CSV/JSON files; ``None``: the session's views and tables.
            data_version: a name for the data's current version, for the repeat store (the
                owner says when the data changed; nothing reads the data to find out).
            owned: stop ``session`` on :meth:`close` (a session dpsql started).
        """
        self._session = session
        self._owned = owned
        for name in _PYSPARK_QUERY_LOGGERS:
            logging.getLogger(name).disabled = True
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._group = f"dpsql-{uuid.uuid4().hex}"
        self._files: list[str] = []
        self._refs: dict[str, exp.Table] = {}
        self._schema: dict[str, dict[str, str]] = {}
        self._columns: dict[str, list[str]] = {}
        if tables is None:
            self._add_catalog()
        else:
            for name, source in tables.items():
                self._add_source(name, source)
        self._allowed = frozenset(table_key(ref) for ref in self._refs.values())
        self._texts: dict[str, tuple[str, frozenset[str]]] = {}
        self._version = _version(self._files, data_version)

    # -- the tables ---------------------------------------------------------------------
    def _add_catalog(self) -> None:
        catalog = self._session.catalog
        database = catalog.currentDatabase()
        for table in catalog.listTables():
            if table.isTemporary:
                ref = exp.table_(exp.to_identifier(table.name, quoted=True))
                if table.namespace:  # a global temporary view
                    ref = exp.table_(exp.to_identifier(table.name, quoted=True),
                                     db=exp.to_identifier(table.namespace[0], quoted=True))
            elif (table.database or database) == database:
                ref = exp.table_(
                    exp.to_identifier(table.name, quoted=True),
                    db=exp.to_identifier(table.database or database, quoted=True),
                    catalog=exp.to_identifier(table.catalog or "spark_catalog", quoted=True),
                )
            else:
                continue
            self._register(table.name, ref)

    def _add_source(self, name: str, source: DataFrame | str | os.PathLike[str]) -> None:
        from pyspark.sql import DataFrame

        if isinstance(source, DataFrame):
            frame = source
            if frame.sparkSession is not self._session:
                raise Error(f"the DataFrame given for table {name!r} belongs to another SparkSession; "
                            "pass DataFrames of the session dpsql runs on.")
        else:
            path = os.fspath(source)
            frame = self._read(name, path)
            self._files.extend(_identities(path))
        hidden = f"__dpsql_{uuid.uuid4().hex[:12]}_{name}"
        frame.createOrReplaceTempView(hidden)
        self._register(name, exp.table_(exp.to_identifier(hidden, quoted=True)))

    def _read(self, name: str, path: str) -> DataFrame:
        stem = path.rstrip("/")
        fmt = next((f for ext, f in _FORMATS.items() if stem.endswith(ext) or stem.endswith(ext + "*")), None)
        if fmt is None and os.path.isdir(stem):
            found = {os.path.splitext(f)[1] for _, _, files in os.walk(stem) for f in files}
            fmt = next((f for ext, f in _FORMATS.items() if ext in found), None)
        if fmt is None:
            raise Error(f"cannot tell the format of {path!r} (table {name!r}): name Parquet (.parquet), "
                        "CSV (.csv) or JSON (.json) files, or a folder of them.")
        reader = self._session.read
        if fmt == "csv":
            reader = reader.option("header", "true").option("inferSchema", "true")
        try:
            return reader.format(fmt).load(path)
        except Exception as e:  # noqa: BLE001 - Spark raises AnalysisException and others
            first = first_line(e)
            raise Error(f"cannot read {path!r} for table {name!r}: {first}") from None

    def _register(self, name: str, ref: exp.Table) -> None:
        key = name.casefold()
        fields = self._session.table(ref.sql(dialect="spark")).schema.fields
        self._refs[key] = ref
        self._schema[key] = {f.name.casefold(): duckdb_type(f.dataType.simpleString()) for f in fields}
        self._columns[key] = [f.name for f in fields]

    # -- the Engine interface -----------------------------------------------------------
    def schema(self) -> Mapping[str, Mapping[str, str]]:
        return self._schema

    def table(self, name: str) -> exp.Table:
        ref = self._refs.get(name.casefold())
        if ref is None:
            raise InternalError(f"table {name!r} is not in the Spark session; the policy check should have caught this")
        return ref.copy()

    def row_id(self, alias: str, table: str | None = None) -> exp.Expression:
        """``xxhash64`` of every column of the row (Spark has no row id; see the module
        docstring)."""
        if table is None or table.casefold() not in self._columns:
            raise InternalError("the Spark engine needs the table to build a row id")
        columns = [exp.column(c, table=alias, quoted=True) for c in self._columns[table.casefold()]]
        return exp.Anonymous(this="hash", expressions=columns)

    def distinct_values(self, table: str, column: str, limit: int) -> tuple[object, ...] | None:
        ref = exp.column(column, quoted=True)
        query = (
            exp.select(ref).distinct().from_(self.table(table))
            .where(exp.Not(this=exp.Is(this=ref.copy(), expression=exp.Null())))
            .order_by(ref.copy()).limit(limit + 1)
        )
        values = self.run(query).column(0).to_pylist()
        return None if len(values) > limit else tuple(values)

    def spark_sql(self, query: exp.Expression | str, params: Mapping[str, object] | None = None,
                  *, pretty: bool = False) -> str:
        """The Spark SQL :meth:`run` would send (for ``explain`` and tests).

        A text seen before is not translated again (the pipeline reuses a bounded query's
        text, its salts left as parameters): parsing, the passes and writing cost tens of
        milliseconds per query. Its parameters are still checked."""
        cached = self._texts.get(query) if isinstance(query, str) and not pretty else None
        if cached is not None:
            sql, names = cached
            missing = names.difference(params or {})
            if missing:
                raise InternalError(f"the bounded query's parameter {sorted(missing)[0]!r} has no value")
            return sql
        tree = parse_bounded(query) if isinstance(query, str) else query
        translated = to_spark(tree)
        check_reachable(translated, self._allowed, params or {})
        sql = translated.sql(dialect="spark", pretty=pretty)
        if isinstance(query, str) and not pretty:
            if len(self._texts) >= _CACHED_TEXTS:
                self._texts.pop(next(iter(self._texts)))
            self._texts[query] = (sql, frozenset(p.name for p in translated.find_all(exp.Placeholder)))
        return sql

    def prepare(self, query: exp.Expression) -> exp.Expression:
        """The tree itself: :meth:`run` translates it, no SQL text is parsed again."""
        return query

    def shown_sql(self, query: exp.Expression) -> str:
        """The Spark SQL :meth:`run` sends for ``query`` (what ``explain`` shows), its salt
        parameters unbound."""
        names = {p.name for p in query.find_all(exp.Placeholder)}
        return self.spark_sql(query, dict.fromkeys(names, 0), pretty=True)

    def run(self, query: exp.Expression | str, params: Mapping[str, object] | None = None) -> pa.Table:
        """Run a bounded query (a tree, or its text in :attr:`dialect`) with its salts bound
        as named parameters, and return its rows as Arrow."""
        sql = self.spark_sql(query, params or {})
        args: dict[str, Any] = {k: int(v) if isinstance(v, int) else v for k, v in (params or {}).items()}
        with self._lock:
            context = self._session.sparkContext
            context.setJobGroup(self._group, "dpsql bounded query", interruptOnCancel=True)
            self._running.set()
            try:
                frame = self._session.sql(sql, args=args or None)
                return frame.toArrow()
            finally:
                self._running.clear()
                context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    def scratch(self, rows: int) -> SparkEngine:
        """An engine on the same session over the timing calibration's generated table
        ``t`` (:func:`dpsql.calibration.calibrate`: ``u`` four rows each, ``g`` seven groups, ``x``
        in [0, 1000)), so that deadlines are measured on Spark, never on the private data."""
        frame = self._session.range(int(rows)).selectExpr(
            "id DIV 4 AS u", "concat('g', CAST(id % 7 AS STRING)) AS g", "CAST(id * 7919 % 1000 AS DOUBLE) AS x")
        return SparkEngine(self._session, tables={"t": frame})

    def data_version(self) -> str:
        """A name for the data that is not read from it: the identity of the source files
        given as paths (taken at open), and the owner's ``data_version``; a session's own
        tables and DataFrames are named by the owner alone (a constant without one)."""
        return self._version

    def row_counts(self) -> dict[str, int]:
        """No catalog counts in Spark: the timing model counts each table once."""
        return {}

    def interrupt(self) -> None:
        """Cancel the running bounded query (from any thread).

        Spark cancels only jobs that have started, and a query spends its first moments
        being planned; so the cancel is repeated every 50 ms until the query has stopped."""
        if not self._running.is_set():
            return

        def cancel_until_stopped() -> None:
            context = self._session.sparkContext
            while self._running.is_set():
                context.cancelJobGroup(self._group)
                time.sleep(0.05)

        threading.Thread(target=cancel_until_stopped, name="dpsql-spark-interrupt", daemon=True).start()

    def close(self) -> None:
        if self._owned:
            self._session.stop()


def _identities(path: str) -> list[str]:
    """(path, device, inode, size, modification time) of every file under ``path``: local
    files only (a cluster path, hdfs:// or s3://, has none here and is named by the owner)."""
    import glob

    if os.path.isdir(path):
        files = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
    else:
        files = [f for f in glob.glob(path) if os.path.isfile(f)]
    out = []
    for f in sorted(files):
        info = os.stat(f)
        out.append(f"{os.path.abspath(f)}:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}")
    return out


def _version(files: list[str], owner: str | None) -> str:
    import hashlib

    parts = []
    if files:
        parts.append("files:" + hashlib.sha256("\n".join(files).encode()).hexdigest()[:32])
    if owner is not None:
        parts.append(f"owner:{owner}")
    return ":".join(parts) or "spark"

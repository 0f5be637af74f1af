"""Data where it lives: policy tables read from Parquet, CSV or JSON files, a table of another
DuckDB file, or in-memory DataFrames and Arrow tables, through one hardened DuckDB.

:func:`open_sources` starts a private in-memory DuckDB and makes each policy table a view
over its source, then closes everything else: the exact files the sources name (globs and
folders expanded once, at open) become DuckDB's ``allowed_paths``, a DuckDB file is attached
``READ_ONLY``, external access is switched off and the configuration locked. SQL on that
connection can read the declared files and nothing else: not another file (``read_csv``,
``'x.parquet'``), not a Python variable (replacement scans are off), not an extension.
A file added to a globbed folder later is not read until the connection is reopened.

Sources (``source =`` in a policy table, or the values of ``dpsql.connect(tables=...)``):

- a path to a ``.parquet``, ``.csv``, ``.json``/``.jsonl``/``.ndjson`` file, a glob of them
  (``data/visits/*.parquet``), or a folder (read recursively; ``key=value`` folders become
  Hive partition columns);
- ``"file.duckdb:table"``: a table (or view) of another DuckDB file;
- a pandas or polars DataFrame, or a pyarrow Table: copied into Arrow at open, so later
  changes to the frame are not seen.

The data version (:mod:`dpsql.repeats`) of files is their identity at open (path, device,
inode, size, modification time); in-memory frames get a fresh version at every open.
"""

from __future__ import annotations

import glob
import hashlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.engine import DuckDBEngine
from dpsql.errors import Error, PolicyError, first_line
from dpsql.hardened import lock, open_for_data

__all__ = [
    "OpenedSources", "SourcesEngine", "cli_database", "export_parquet", "open_engine", "open_sources",
    "policy_sources", "source_kind",
]

_READERS = {".parquet": "read_parquet", ".csv": "read_csv", ".json": "read_json",
            ".jsonl": "read_json", ".ndjson": "read_json"}
_DUCKDB_SUFFIXES = (".duckdb", ".db", ".ddb")



@dataclass(frozen=True)
class OpenedSources:
    """A hardened connection whose ``main`` schema holds one view per source, and a name
    for the data's version."""

    connection: duckdb.DuckDBPyConnection
    data_version: str


def source_kind(source: object) -> str:
    """What a source is: "frame", "duckdb", or a file format ("parquet", "csv", "json").

    >>> source_kind("data/visits/*.parquet"), source_kind("app.duckdb:visits"), source_kind("x.csv")
    ('parquet', 'duckdb', 'csv')
    """
    if not isinstance(source, str | os.PathLike):
        return "frame"
    text = os.fspath(source)
    base, _, table = text.rpartition(":")
    if table and base.endswith(_DUCKDB_SUFFIXES):
        return "duckdb"
    reader = _reader_for(text)
    return reader.removeprefix("read_") if reader else "unknown"


def _path(source: object) -> str:
    """The text of a source :func:`source_kind` found to be a path (a ``str`` or ``os.PathLike``)."""
    assert isinstance(source, str | os.PathLike), "source_kind calls any other source a frame"
    return os.fsdecode(source)


def _reader_for(path: str) -> str | None:
    stem = path.rstrip("/").removesuffix("*")
    for suffix, reader in _READERS.items():
        if stem.endswith(suffix) or stem.endswith(suffix + ".gz") or stem.endswith(suffix + ".zst"):
            return reader
    if os.path.isdir(path):
        found = {os.path.splitext(f)[1] for _, _, files in os.walk(path) for f in files}
        return next((r for s, r in _READERS.items() if s in found), None)
    return None


def _files(table: str, path: str) -> list[str]:
    """The files a path, glob or folder names, sorted; a clear error when there are none."""
    if os.path.isdir(path):
        files = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names
                 if not f.startswith((".", "_"))]
    elif glob.has_magic(path):
        files = [f for f in glob.glob(path, recursive=True) if os.path.isfile(f)]
    else:
        files = [path] if os.path.isfile(path) else []
    if not files:
        raise PolicyError(f"table {table!r}: its source {path!r} names no readable file. Check the path "
                          "(relative paths are relative to the policy file, or to the working directory for "
                          "dpsql.connect(tables=...)).")
    unreadable = [f for f in files if not os.access(f, os.R_OK)]
    if unreadable:
        raise PolicyError(f"table {table!r}: cannot read {unreadable[0]!r} (permission denied); give the dpsql "
                          "process read access to its source files.")
    return sorted(os.path.abspath(f) for f in files)


def _as_arrow(table: str, frame: Any) -> pa.Table:
    if isinstance(frame, pa.Table):
        return frame
    if isinstance(frame, pa.RecordBatchReader):
        return frame.read_all()
    module = type(frame).__module__.split(".")[0]
    if module == "polars":
        return frame.to_arrow()
    if module == "pandas":
        return pa.Table.from_pandas(frame, preserve_index=False)
    raise PolicyError(f"table {table!r}: a source must be a file path, 'file.duckdb:table', a pandas or polars "
                      f"DataFrame or a pyarrow Table, not {type(frame).__name__}.")


def _literal(value: str) -> str:
    return exp.Literal.string(value).sql(dialect="duckdb")


def _ident(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def open_sources(sources: Mapping[str, object]) -> OpenedSources:
    """A hardened in-memory DuckDB with one view per ``sources`` entry (policy table name ->
    source; see the module docstring).

    Raises:
        PolicyError: a source that names no readable file, a DuckDB file or table that
            cannot be opened, a file DuckDB cannot read, or an object that is no source.
    """
    con = open_for_data()
    allowed: list[str] = []
    identity: list[str] = []
    try:
        for position, (table, source) in enumerate(sources.items()):
            kind = source_kind(source)
            if kind == "frame":
                arrow = _as_arrow(table, source)
                hidden = f"__dpsql_frame_{position}"
                con.register(hidden, arrow)
                con.execute(f"CREATE VIEW {_ident(table)} AS SELECT * FROM {_ident(hidden)}")
                identity.append(f"frame:{uuid.uuid4().hex}")
            elif kind == "duckdb":
                path, _, inner = _path(source).rpartition(":")
                _attach(con, table, path, inner, position)
                info = os.stat(path)
                identity.append(f"{os.path.abspath(path)}:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}")
            elif kind == "unknown":
                raise PolicyError(f"table {table!r}: cannot tell the format of {_path(source)!r}; name Parquet "
                                  "(.parquet), CSV (.csv) or JSON (.json) files, a folder of them, or "
                                  "'file.duckdb:table'.")
            else:
                path = _path(source)
                files = _files(table, path)
                allowed += files
                reader = _reader_for(path) or "read_parquet"
                options = ", hive_partitioning = true" if reader == "read_parquet" else ""
                listed = "[" + ", ".join(_literal(f) for f in files) + "]"
                con.execute(f"CREATE VIEW {_ident(table)} AS SELECT * FROM {reader}({listed}{options})")
                for f in files:
                    info = os.stat(f)
                    identity.append(f"{f}:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}")
        if allowed:
            con.execute(f"SET allowed_paths = [{', '.join(_literal(f) for f in allowed)}]")
        lock(con)
        for table in sources:  # every view readable now, under the locked configuration
            try:
                con.sql(f"SELECT * FROM {_ident(table)} LIMIT 0").fetchall()
            except duckdb.Error as e:
                raise PolicyError(f"table {table!r}: DuckDB cannot read its source: {first_line(e)}") from None
    except BaseException:
        con.close()
        raise
    version = "sources:" + hashlib.sha256("\n".join(identity).encode()).hexdigest()[:32]
    return OpenedSources(con, version)


def _attach(con: duckdb.DuckDBPyConnection, table: str, path: str, inner: str, position: int) -> None:
    if not os.path.isfile(path):
        raise PolicyError(f"table {table!r}: the DuckDB file {path!r} does not exist.")
    alias = f"__dpsql_src_{position}"
    try:
        con.execute(f"ATTACH {_literal(os.path.abspath(path))} AS {_ident(alias)} (READ_ONLY)")
        con.execute(f"CREATE VIEW {_ident(table)} AS SELECT * FROM {_ident(alias)}.main.{_ident(inner)}")
    except duckdb.Error as e:
        raise PolicyError(f"table {table!r}: cannot open table {inner!r} of {path!r}: {first_line(e)}. "
                          "If this process has the file open read-write, pass that connection instead.") from None


class SourcesEngine(DuckDBEngine):
    """The DuckDB engine over :func:`open_sources`: owns its hardened connection, and names
    the data by its sources' identity (see the module docstring)."""

    def __init__(self, sources: Mapping[str, object]) -> None:
        opened = open_sources(sources)
        super().__init__(opened.connection)
        self._sources_version = opened.data_version

    def data_version(self) -> str:
        return self._sources_version

    def close(self) -> None:
        self._con.close()


def _is_spark_session(database: object) -> bool:
    cls = type(database)
    return cls.__name__ == "SparkSession" and cls.__module__.startswith("pyspark")


def policy_sources(policy: Any) -> dict[str, object]:
    """Policy table name -> its declared ``source``, for the tables that declare one; a
    relative path is relative to the policy file's folder."""
    origin = getattr(policy, "source", None)
    root = os.path.dirname(os.path.abspath(origin)) if origin and os.path.isfile(origin) else ""
    found: dict[str, object] = {}
    for name, table in policy.tables.items():
        source = getattr(table, "source", None)
        if source:
            found[name] = source if os.path.isabs(source) or not root else os.path.join(root, source)
    return found


def open_engine(database: object, policy: Any, *, tables: Mapping[str, object] | None = None,
                data_version: str | None = None) -> Any:
    """The engine ``dpsql.connect`` runs on: what ``database`` is, and where the tables live.

    - a SparkSession: :class:`~dpsql.spark.SparkEngine` over its views and tables, or over
      the declared sources / ``tables`` (read by Spark);
    - ``None`` with sources (``tables=`` or ``source =`` in the policy): :class:`SourcesEngine`;
    - a DuckDB file path: that file, hardened; policy tables with a source are read from it
      instead, each other table from the file;
    - a ``duckdb.DuckDBPyConnection``: wrapped as the owner configured it.

    Raises:
        Error: a Parquet/CSV/JSON file given as the database, nothing given at all, or
            sources together with a wrapped connection.
        PolicyError: a source that cannot be read; a policy table that is only a DataFrame
            registered on a wrapped connection (DuckDB keeps those out of its catalog).
    """
    sources = {**policy_sources(policy), **dict(tables or {})}
    if _is_spark_session(database):
        from dpsql.spark import SparkEngine

        return SparkEngine(database, tables=sources or None, data_version=data_version)  # type: ignore[arg-type]
    if database is None:
        if not sources:
            raise Error("dpsql.connect needs the data: a DuckDB file or connection, a SparkSession, "
                        "tables={'name': path_or_dataframe}, or `source = ...` for each table in the policy.")
        return SourcesEngine(sources)
    if isinstance(database, str | os.PathLike):
        path = os.fspath(database)
        kind = source_kind(path)
        if kind in ("parquet", "csv", "json"):
            raise Error(
                f"{path!r} is a {kind.upper()} file, not a DuckDB database. Name it as a table's source: "
                f"dpsql.connect(tables={{'visits': {path!r}}}, policy=...), or `source = {path!r}` under "
                "[tables.visits] in the policy (then `dpsql query --policy POLICY` needs no --db).")
        if sources:
            rest = {name: f"{path}:{name}" for name in policy.tables if name not in sources
                    and getattr(policy.tables[name], "model", "central") != "local"}
            return SourcesEngine({**rest, **sources})
        return DuckDBEngine(path, data_version=data_version)
    if sources:
        raise Error("tables= and policy sources are read by dpsql's own DuckDB; they cannot be added to a "
                    "connection you pass in. Pass the sources without the connection, or register the "
                    "tables in your database.")
    engine = DuckDBEngine(database, data_version=data_version)  # type: ignore[arg-type]
    _check_registered_frames(database, policy, engine)
    return engine


def _check_registered_frames(con: Any, policy: Any, engine: DuckDBEngine) -> None:
    """A policy table that exists only as a DataFrame registered on the connection (a temporary
    view, which DuckDB keeps out of the catalog dpsql reads) gets a clear error, not "missing"."""
    schema = engine.schema()
    try:
        temporary = {str(r[0]).casefold() for r in con.sql(
            "SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
    except duckdb.Error:
        return
    for name in policy.tables:
        if name.casefold() not in schema and name.casefold() in temporary:
            engine.close()
            raise PolicyError(
                f"table {name!r} is a DataFrame or Arrow table registered on the DuckDB connection; dpsql "
                f"reads only tables and views of the database. Pass it as dpsql.connect(tables={{{name!r}: "
                "frame}, policy=...) (copied into dpsql's own hardened DuckDB), or CREATE TABLE it.")


def cli_database(args: Any) -> object:
    """What ``dpsql query`` connects to: ``--db`` (or nothing: the policy's sources), or,
    with ``--engine spark``, a Spark session at ``--spark-master`` reading the sources."""
    if getattr(args, "engine", "duckdb") != "spark":
        return args.db
    if args.db is not None:
        raise Error("--engine spark reads the policy's `source =` tables (Parquet, CSV, JSON) or a Spark "
                    "catalog, not a DuckDB file: drop --db, or use --engine duckdb.")
    from dpsql.spark import local_session

    return local_session(args.spark_master)


def export_parquet(database: str | os.PathLike[str], folder: str | os.PathLike[str]) -> dict[str, str]:
    """Every table of a DuckDB file as ``folder/TABLE.parquet`` (written once, then reused):
    table name -> path, for ``dpsql.connect(tables=...)``."""
    os.makedirs(folder, exist_ok=True)
    paths: dict[str, str] = {}
    with duckdb.connect(os.fspath(database), read_only=True) as con:
        names = [r[0] for r in con.sql("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()]
        for name in names:
            path = os.path.join(os.fspath(folder), f"{name}.parquet")
            if not os.path.exists(path):
                partial = f"{path}.{os.getpid()}.partial"
                con.execute(f"COPY {_ident(name)} TO {_literal(partial)} (FORMAT parquet)")
                os.replace(partial, path)
            paths[name] = path
    return paths

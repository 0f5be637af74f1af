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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Protocol

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.errors import Error, InternalError

__all__ = ["DuckDBEngine", "Engine"]

_ATTACHED = "dpsql_data"

_LOCKED_SETTINGS = (
    "SET enable_external_access = false",
    "SET lock_configuration = true",
)

_CONFIG = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,
}


class Engine(Protocol):
    """What the pipeline needs from a database."""

    dialect: str

    def schema(self) -> Mapping[str, Mapping[str, str]]:
        """Casefolded table name -> casefolded column name -> type name."""
        ...

    def table(self, name: str) -> exp.Table:
        """The fully qualified reference to a table of the schema."""
        ...

    def row_id(self, alias: str) -> exp.Expression:
        """An expression unique per row of a base table (for keyed row sampling)."""
        ...

    def run(self, query: exp.Expression) -> pa.Table:
        """Run a query tree and return all of its rows."""
        ...

    def close(self) -> None: ...


class DuckDBEngine:
    """DuckDB, opened from a file path or wrapping an existing connection."""

    dialect = "duckdb"

    def __init__(self, database: str | os.PathLike[str] | duckdb.DuckDBPyConnection) -> None:
        self._lock = threading.Lock()
        if isinstance(database, duckdb.DuckDBPyConnection):
            self._con = database
            self._catalog: str | None = None
            self._owned = False
        else:
            self._con = _open_hardened(os.fspath(database))
            self._catalog = _ATTACHED
            self._owned = True
        self._schema = self._read_schema()

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

    def row_id(self, alias: str) -> exp.Expression:
        return exp.column("rowid", table=alias)

    def run(self, query: exp.Expression) -> pa.Table:
        sql = query.sql(dialect=self.dialect)
        with self._lock:
            return self._con.sql(sql).to_arrow_table()

    def close(self) -> None:
        if self._owned:
            self._con.close()


def _open_hardened(path: str) -> duckdb.DuckDBPyConnection:
    if not os.path.exists(path):
        raise Error(f"database file {path!r} does not exist. Pass the path of an existing DuckDB file.")
    con = duckdb.connect(":memory:", config=_CONFIG)
    literal = exp.Literal.string(path).sql(dialect="duckdb")
    try:
        con.execute(f"ATTACH {literal} AS {_ATTACHED} (READ_ONLY)")
    except duckdb.Error as e:
        con.close()
        raise Error(
            f"cannot open {path!r} read-only: {e}. If this process already has the file open "
            "read-write, pass that connection to dpsql.connect instead of the path."
        ) from None
    for statement in _LOCKED_SETTINGS:
        con.execute(statement)
    return con

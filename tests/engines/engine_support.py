"""Helpers shared by the engine-conformance tests (a module name of its own: tests/ has
another conftest.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

import dpsql
from dpsql.engine import DuckDBEngine
from dpsql.policy import Policy, parse_policy

#: Every engine the contract runs on.
ENGINES = ("duckdb", "spark")

#: A table: (DDL column list, rows).
TableData = tuple[str, Sequence[tuple[Any, ...]]]


def connection(engine: Any, policy: str | Policy, *, noise_source: Any = None) -> dpsql.Connection:
    """A pipeline over ``engine`` for analyst "t", in-memory ledger, every execute charged
    and freshly noised (no repeats)."""
    loaded = policy if isinstance(policy, Policy) else parse_policy(policy)
    ledger = dpsql.Ledger(None, accountant=loaded.accountant)
    return dpsql.Connection(engine, loaded, "t", ledger, noise_source=noise_source, repeats=False)


def sorted_rows(table: Any) -> list[tuple[Any, ...]]:
    """An Arrow table's rows as tuples, in a fixed order (engines return groups in any order)."""
    rows = [tuple(r.values()) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: tuple((v is None, str(type(v)), v if v is not None else 0) for v in r))


def _spark_type(ddl_type: str) -> str:
    return {"VARCHAR": "STRING", "INTEGER": "INT"}.get(ddl_type.upper(), ddl_type)


def _spark_schema(columns: str) -> str:
    parts = []
    for column in columns.split(","):
        name, dtype = column.strip().split(None, 1)
        parts.append(f"{name} {_spark_type(dtype)}")
    return ", ".join(parts)


def make_engine(name: str, tables: Mapping[str, TableData], spark_session: Any = None) -> Any:
    """An engine ``name`` holding ``tables``: a private in-memory DuckDB, or DataFrames of
    ``spark_session`` (the engine does not own the session: closing it leaves it running)."""
    if name == "duckdb":
        con = duckdb.connect()
        for table, (columns, rows) in tables.items():
            con.execute(f"CREATE TABLE {table}({columns})")
            if rows:
                placeholders = ", ".join("?" for _ in rows[0])
                con.executemany(f"INSERT INTO {table} VALUES ({placeholders})", list(rows))
        return _OwnedDuckDB(con)
    from dpsql.spark import SparkEngine

    frames = {t: spark_session.createDataFrame(list(rows), _spark_schema(cols)) for t, (cols, rows) in tables.items()}
    return SparkEngine(spark_session, tables=frames)


class _OwnedDuckDB(DuckDBEngine):
    """A wrapped DuckDB connection that the test owns: closed with the engine."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        super().__init__(con)
        self._test_con = con

    def close(self) -> None:
        self._test_con.close()

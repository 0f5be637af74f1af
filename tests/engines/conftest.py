"""Engines under one contract: every test here that takes ``engine_name`` runs on DuckDB and
on Spark (local), the way dp_accounting runs one suite over every accountant.

One local Spark session (``local[2]``) is shared by the whole run (starting one costs
several seconds). Spark tests skip, with the reason, where pyspark or a Java runtime is
missing; ``.ci/run`` installs both, so in CI they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import duckdb
import pytest

import dpsql
from dpsql.engine import DuckDBEngine

#: A table for :func:`build_engine`: (DDL column list, rows).
TableData = tuple[str, Sequence[tuple[Any, ...]]]


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")
    from dpsql.spark import find_java, local_session

    try:
        find_java()
    except dpsql.Error as e:
        pytest.skip(f"no Java runtime for Spark: {e}")
    session = local_session("local[2]", app_name="dpsql-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


def _spark_type(ddl_type: str) -> str:
    return {"VARCHAR": "STRING", "INTEGER": "INT"}.get(ddl_type.upper(), ddl_type)


def _spark_schema(columns: str) -> str:
    parts = []
    for column in columns.split(","):
        name, dtype = column.strip().split(None, 1)
        parts.append(f"{name} {_spark_type(dtype)}")
    return ", ".join(parts)


@pytest.fixture
def build_engine(request: pytest.FixtureRequest) -> Iterator[Callable[[str, Mapping[str, TableData]], Any]]:
    """``build_engine(name, tables)``: the engine ``name`` holding ``tables`` (name -> (DDL
    columns, rows)), closed after the test."""
    opened: list[Any] = []

    def build(name: str, tables: Mapping[str, TableData]) -> Any:
        if name == "duckdb":
            con = duckdb.connect()
            for table, (columns, rows) in tables.items():
                con.execute(f"CREATE TABLE {table}({columns})")
                if rows:
                    placeholders = ", ".join("?" for _ in rows[0])
                    con.executemany(f"INSERT INTO {table} VALUES ({placeholders})", list(rows))
            engine = DuckDBEngine(con)
            opened.append(con)
            return engine
        session = request.getfixturevalue("spark_session")
        from dpsql.spark import SparkEngine

        frames = {t: session.createDataFrame(list(rows), _spark_schema(cols)) for t, (cols, rows) in tables.items()}
        return SparkEngine(session, tables=frames)

    yield build
    for con in opened:
        con.close()

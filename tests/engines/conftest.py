"""Engines under one contract: every test here that takes ``engine_name`` runs on DuckDB and
on Spark (local), the way dp_accounting runs one suite over every accountant.

One local Spark session (``local[2]``) is shared by the whole run (starting one costs
several seconds). Spark tests skip, with the reason, where pyspark or a Java runtime is
missing; ``.ci/run`` installs both, so in CI they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

import dpsql
from engine_support import TableData, make_engine, start_watched


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")
    from dpsql.spark import find_java, local_session

    try:
        find_java()
    except dpsql.Error as e:
        pytest.skip(f"no Java runtime for Spark: {e}")
    session = start_watched(lambda: local_session("local[2]", app_name="dpsql-tests",
                                                  **{"spark.sql.shuffle.partitions": "2"}))
    yield session
    session.stop()


@pytest.fixture
def build_engine(request: pytest.FixtureRequest) -> Iterator[Callable[[str, Mapping[str, TableData]], Any]]:
    """``build_engine(name, tables)``: the engine ``name`` holding ``tables`` (name -> (DDL
    columns, rows)), closed after the test."""
    opened: list[Any] = []

    def build(name: str, tables: Mapping[str, TableData]) -> Any:
        session = request.getfixturevalue("spark_session") if name == "spark" else None
        engine = make_engine(name, tables, session)
        opened.append(engine)
        return engine

    yield build
    for engine in opened:
        engine.close()

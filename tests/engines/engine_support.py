"""Helpers shared by the engine-conformance tests (a module name of its own: tests/ has
another conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb
import pytest

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


#: Seconds a local session may take to start before its JVM is killed and it is started again
#: (it starts in 5-15 s on a 2-core machine). pyspark waits for its JVM without a limit: one
#: CI run hung at its first Spark test until the run's own 15-minute limit.
START_LIMIT = 120.0


def start_watched(start: Callable[[], Any], limit: float = START_LIMIT, tries: int = 2,
                  kills: Callable[[str], bool] = lambda cmd: "java" in cmd or "spark" in cmd) -> Any:
    """``start()`` on a thread; when it has not returned after ``limit`` seconds, kill this
    process's JVMs (descendants whose command line ``kills`` picks: pyspark then raises and
    lets go of its lock) and try again, ``tries`` in all, then fail the tests that need Spark
    with what happened."""
    for attempt in range(1, tries + 1):
        box: list[tuple[bool, Any]] = []  # each try its own: a killed try may answer late
        thread = threading.Thread(target=_into, args=(box, start), name="spark-start", daemon=True)
        thread.start()
        thread.join(limit)
        if not thread.is_alive():
            ok, value = box[0]
            if ok:
                return value
            raise value
        killed = kill_descendants(os.getpid(), kills)
        thread.join(30.0)
        print(f"spark_session: start {attempt} of {tries} took over {limit:.0f} s; killed "
              f"processes {killed}", file=sys.stderr)
    pytest.fail(f"a local Spark session did not start in {tries} tries of {limit:.0f} s each "
                "(the JVM hung before pyspark's gateway answered)")


def _into(box: list[tuple[bool, Any]], start: Callable[[], Any]) -> None:
    try:
        box.append((True, start()))
    except BaseException as e:  # noqa: BLE001 - raised again on the test's thread
        box.append((False, e))


def kill_descendants(root: int, kills: Callable[[str], bool]) -> list[int]:
    """SIGKILL each process below ``root`` (read from /proc) whose command line ``kills``
    picks; the pids killed."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    killed = []
    for pid in found:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if kills(cmd):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


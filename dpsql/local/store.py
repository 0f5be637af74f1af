"""The report store: where the collector keeps shuffled reports of local tables.

A SQLite file (the standard library's :mod:`sqlite3`, WAL, ``synchronous=FULL``), safe to
share between the processes that ingest and the ones that query. It takes only shuffled
:class:`~dpsql.local.shuffle.Batch` objects, whose pools each hold at least ``k`` reports,
and records for each report its table, column, mechanism parameters, the batch it came in
and its value: no sender, no arrival time, and, within a batch, only the shuffled order.

Reports are already ``epsilon``-LDP when they arrive, so the store holds nothing more
private than what it is given; queries over it (:mod:`dpsql.local.query`) are
post-processing and charge no central budget.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from types import TracebackType

import numpy as np

from dpsql.local._common import ReportError
from dpsql.local.reports import Reports
from dpsql.local.shuffle import Batch
from dpsql.sqlitefile import make_durable, open_database, write_transaction

__all__ = ["ReportStore", "open_report_store"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS batches (batch INTEGER PRIMARY KEY, size INTEGER NOT NULL, "
    "k INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reports (batch INTEGER NOT NULL, tbl TEXT NOT NULL, "
    "col TEXT NOT NULL, params TEXT NOT NULL, value REAL, item INTEGER, key INTEGER, bits BLOB)",
    "CREATE INDEX IF NOT EXISTS reports_by_column ON reports (tbl, col, params)",
)


class ReportStore:
    """Shuffled reports of local tables, in a SQLite file (or in memory).

    Args:
        path: The SQLite file, created if missing; ``None`` or ``":memory:"`` keeps the
            reports in memory for as long as the store is open.

    >>> import numpy as np
    >>> from dpsql.local.shuffle import Shuffler
    >>> shuffler = Shuffler(k=2)
    >>> shuffler.submit(Reports("t", "x", "p", values=np.array([1.0, -1.0])))
    >>> store = ReportStore()
    >>> store.ingest(shuffler.release())
    2
    >>> store.read("t", "x")["p"].values.size
    2
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        target = ":memory:" if path is None else os.fspath(path)
        try:
            self._db = open_database(None if target == ":memory:" else target, _prepare)
        except sqlite3.Error as exc:
            raise ReportError(f"{target}: cannot open the report store: {exc}; check the path "
                              "and that it is a report store (a SQLite file)") from exc
        self._lock = threading.Lock()
        self.path = target

    def ingest(self, batch: Batch) -> int:
        """Store a shuffled batch in one transaction; returns how many reports were stored.

        Raises:
            ReportError: ``batch`` is not a shuffled :class:`Batch`, or a pool is below its k.
        """
        if not isinstance(batch, Batch):
            raise ReportError(f"the store takes shuffled batches (Shuffler.release()), got "
                              f"{type(batch).__name__}; pass reports through a Shuffler first")
        small = [p for p in batch.pools if len(p) < batch.k]
        if small:
            raise ReportError(f"a pool of {len(small[0])} reports is below the batch's k = {batch.k}; "
                              "release batches only through Shuffler.release()")
        with self._lock, write_transaction(self._db):
            cursor = self._db.execute("INSERT INTO batches (size, k) VALUES (?, ?)", (len(batch), batch.k))
            number = cursor.lastrowid
            for pool in batch.pools:
                self._db.executemany(
                    "INSERT INTO reports (batch, tbl, col, params, value, item, key, bits) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _rows(number, pool))  # type: ignore[arg-type]
        return len(batch)

    def counts(self, table: str, column: str) -> dict[str, int]:
        """How many reports of ``table.column`` are stored, per mechanism parameters."""
        with self._lock:
            rows = self._db.execute(
                "SELECT params, COUNT(*) FROM reports WHERE tbl = ? AND col = ? GROUP BY params",
                (table.casefold(), column.casefold())).fetchall()
        return {params: int(n) for params, n in rows}

    def read(self, table: str, column: str) -> dict[str, Reports]:
        """Every stored report of ``table.column``, one bundle per mechanism parameters."""
        with self._lock:
            rows = self._db.execute(
                "SELECT params, value, item, key, bits FROM reports WHERE tbl = ? AND col = ? "
                "ORDER BY params, rowid", (table.casefold(), column.casefold())).fetchall()
        grouped: dict[str, list[tuple[object, ...]]] = {}
        for params, *rest in rows:
            grouped.setdefault(params, []).append(tuple(rest))
        return {params: _bundle(table.casefold(), column.casefold(), params, group)
                for params, group in grouped.items()}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ReportStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _prepare(db: sqlite3.Connection) -> None:
    make_durable(db)
    for statement in _SCHEMA:
        db.execute(statement)


def _rows(batch: int, pool: Reports) -> list[tuple[object, ...]]:
    n = len(pool)
    values = pool.values.tolist() if pool.values is not None else [None] * n
    items = pool.items.tolist() if pool.items is not None else [None] * n
    keys = pool.keys.tolist() if pool.keys is not None else [None] * n
    bits = [row.tobytes() for row in pool.bits] if pool.bits is not None else [None] * n
    return [(batch, pool.table, pool.column, pool.params, v, i, k, b)
            for v, i, k, b in zip(values, items, keys, bits)]


def _bundle(table: str, column: str, params: str, rows: list[tuple[object, ...]]) -> Reports:
    value, item, key, bits = rows[0]
    arrays: dict[str, np.ndarray] = {}
    if value is not None:
        arrays["values"] = np.array([r[0] for r in rows], dtype=np.float64)
    if item is not None:
        arrays["items"] = np.array([r[1] for r in rows], dtype=np.int64)
    if key is not None:
        arrays["keys"] = np.array([r[2] for r in rows], dtype=np.int64)
    if bits is not None:
        width = len(bits)  # type: ignore[arg-type]
        arrays["bits"] = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.uint8).reshape(-1, width)  # type: ignore[misc]
    return Reports(table, column, params, **arrays)


def open_report_store(reports: str | os.PathLike[str] | ReportStore | None) -> tuple[ReportStore | None, bool]:
    """A store from a path (opened here: the caller owns it) or as given; and whether owned."""
    if reports is None or isinstance(reports, ReportStore):
        return reports, False
    return ReportStore(reports), True

"""The one way dpsql opens and writes the SQLite files it keeps.

Three stores are SQLite files that several threads and processes may share: the budget
ledger (:mod:`dpsql.privacy.ledger`), the repeat answers (:mod:`dpsql.repeats`) and the
local reports (:mod:`dpsql.local.store`). Each opens its file the same way:

* autocommit mode (``isolation_level=None``: dpsql writes its own ``BEGIN IMMEDIATE``), one
  connection shared by the object's threads behind its lock, a 30 s busy timeout;
* a *prepare* step (pragmas, then create or check the schema) that is retried with a
  jittered back-off while another process holds the file: switching a new file to WAL can
  fail with "database is locked" at once, without waiting on the busy timeout, when
  several processes create the same file together. Preparing must be idempotent;
* write-ahead logging with ``synchronous = FULL`` (:func:`make_durable`), and every write
  in ``BEGIN IMMEDIATE`` ... ``COMMIT`` (:func:`write_transaction`).

Errors stay :class:`sqlite3.Error` here; each store words its own message (what the file
is and what to do), with :func:`guarded` for the calls after opening.

>>> conn = open_database(None, lambda c: c.execute("CREATE TABLE t (x)"))
>>> with write_transaction(conn):
...     _ = conn.execute("INSERT INTO t VALUES (1)")
>>> conn.execute("SELECT x FROM t").fetchall()
[(1,)]
>>> conn.close()
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["BUSY_TIMEOUT_MS", "guarded", "is_busy", "make_durable", "open_database", "write_transaction"]

#: How long a writer waits for another process's write transaction, in milliseconds.
BUSY_TIMEOUT_MS = 30_000


def open_database(path: str | None, prepare: Callable[[sqlite3.Connection], object], *,
                  timeout_ms: int = BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """Connect to ``path`` (``None``: a private in-memory database) and run ``prepare`` on
    the connection, retried while another process holds the file; close it on any failure.

    Raises:
        sqlite3.Error: the file cannot be opened or prepared (the caller words the message).
    """
    conn = sqlite3.connect(path if path is not None else ":memory:", isolation_level=None,
                           check_same_thread=False, timeout=timeout_ms / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
        _prepare_patiently(conn, prepare, timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


def _prepare_patiently(conn: sqlite3.Connection, prepare: Callable[[sqlite3.Connection], object],
                       timeout_ms: int) -> None:
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            prepare(conn)
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() > deadline:
                raise
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            time.sleep(0.001 + secrets.randbelow(19_000) / 1_000_000)  # jitter, not noise


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says another connection holds the database."""
    message = str(exc)
    return "locked" in message or "busy" in message


def make_durable(conn: sqlite3.Connection) -> None:
    """Write-ahead logging, and every commit on disk before it returns."""
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Run the body in ``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def guarded(lock: threading.Lock | threading.RLock,
            failure: Callable[[sqlite3.Error], Exception]) -> Iterator[None]:
    """Hold ``lock``; turn a :class:`sqlite3.Error` in the body into ``failure(exc)``."""
    with lock:
        try:
            yield
        except sqlite3.Error as exc:
            raise failure(exc) from exc

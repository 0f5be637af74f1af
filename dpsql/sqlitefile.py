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
* write-ahead logging with ``synchronous = FULL`` (:func:`make_durable`; the ledger: ``NORMAL``
  and its own :class:`WalSync` after each commit, :mod:`dpsql.privacy.reservation`), and every write
  in ``BEGIN IMMEDIATE`` ... ``COMMIT`` (:func:`write_transaction`), optionally after taking
  a *writer queue* (:func:`open_writer_queue`): an exclusive ``flock`` of ``<file>.lock``
  that writers from several processes wait on, woken by the kernel the moment it is
  released (or its holder dies), where SQLite's busy handler polls in sleeps of up to
  100 ms. The SQLite transaction still decides; the queue only makes the wait short.

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

import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

try:
    import fcntl
except ImportError:  # not POSIX: SQLite's busy handler alone queues the writers
    fcntl = None  # type: ignore[assignment]

__all__ = ["BUSY_TIMEOUT_MS", "LOCK_SUFFIX", "guarded", "is_busy", "make_durable", "open_database",
           "open_writer_queue", "WalSync", "write_transaction"]

#: The writer queue's file, beside the database.
LOCK_SUFFIX = ".lock"

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


def make_durable(conn: sqlite3.Connection, *, sync: bool = True) -> None:
    """Write-ahead logging, and every commit on disk before it returns; with ``sync=False``
    a commit is only written to the WAL (``synchronous = NORMAL``), and the owner syncs it
    with a :class:`WalSync` before anything depends on its durability.

    Raises:
        sqlite3.Error: the file cannot be put in WAL mode (``sync=False`` needs it).
    """
    row = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    mode = str(row[0]).lower() if row is not None else "?"
    if not sync and mode not in ("wal", "memory"):  # (an in-memory database has nothing to sync)
        raise sqlite3.OperationalError(f"the file cannot use write-ahead logging (journal mode {mode!r})")
    conn.execute(f"PRAGMA synchronous = {'FULL' if sync else 'NORMAL'}")


class WalSync:
    """fdatasync of one database's WAL: every commit made so far is then on disk.

    Under ``synchronous = NORMAL`` SQLite syncs the WAL before each checkpoint and the
    database after it, so a commit is either in the WAL, synced here, or in a database file
    already synced. The WAL is opened once, by its absolute path (a later ``chdir`` changes
    nothing), on the first call: its owner's connection has committed by then and keeps the
    file while it is open. The folder is synced then too (a new WAL's directory entry). The
    handle is kept because Linux reports a failed write-back once per open handle: after one
    failure every later call fails too, so no answer leaves on a WAL that may have lost a
    commit.

    Raises (on call):
        OSError: the sync failed, now or before.
    """

    def __init__(self, path: str) -> None:
        self._wal = os.path.abspath(path) + "-wal"
        self._fd: int | None = None
        self._failed: OSError | None = None
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            if self._failed is not None:
                raise OSError(self._failed.errno, f"an earlier sync of {self._wal} failed ({self._failed})")
            try:
                if self._fd is None:
                    self._fd = os.open(self._wal, os.O_RDONLY)
                    _sync(os.path.dirname(self._wal))
                _datasync(self._fd)
            except OSError as exc:
                self._failed = exc
                raise

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _sync(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _datasync(fd: int) -> None:
    (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(fd)


def open_writer_queue(path: str | None) -> IO[bytes] | None:
    """``<path>.lock``, the writers' queue of :func:`write_transaction`; ``None`` for an
    in-memory database, off POSIX, or where the file cannot be made (SQLite's own locking
    then queues the writers alone). Close it with the database."""
    if path is None or fcntl is None:
        return None
    try:
        return open(path + LOCK_SUFFIX, "ab")  # noqa: SIM115 - the caller closes it
    except OSError:
        return None


@contextmanager
def write_transaction(conn: sqlite3.Connection, queue: IO[bytes] | None = None) -> Iterator[None]:
    """Run the body in ``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any exception.
    With a ``queue`` (:func:`open_writer_queue`), wait on its flock first."""
    if queue is not None and fcntl is not None:
        fcntl.flock(queue.fileno(), fcntl.LOCK_EX)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        if queue is not None and fcntl is not None:
            fcntl.flock(queue.fileno(), fcntl.LOCK_UN)


@contextmanager
def guarded(lock: threading.Lock | threading.RLock,
            failure: Callable[[sqlite3.Error], Exception]) -> Iterator[None]:
    """Hold ``lock``; turn a :class:`sqlite3.Error` in the body into ``failure(exc)``."""
    with lock:
        try:
            yield
        except sqlite3.Error as exc:
            raise failure(exc) from exc

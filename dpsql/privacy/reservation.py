"""A charge whose fsync overlaps the caller's next step (issue 16: a new query's fixed cost).

A charge must be *committed* before any private table is read, and *on disk* before any
answer leaves (DESIGN §6). The ledger's commit does the first: ``COMMIT`` writes the
transaction's frames to the WAL file, where every other process sees it and a crash of this
process cannot lose it. Only power loss or an OS crash can, until the WAL is fdatasync'ed:
that sync (about 0.3 ms here, a sixth of a small query) is all that makes a charge durable,
and nothing needs it before the data is read.

So the ledger runs its file with ``synchronous = NORMAL`` (no sync inside ``COMMIT``) and
syncs the WAL itself after every commit (:class:`dpsql.sqlitefile.WalSync`):
:meth:`~dpsql.privacy.Ledger.charge` before it returns, :meth:`~dpsql.privacy.Ledger.reserve`
on the ledger's sync thread, while the caller reads the data (DuckDB and the sync both
release the GIL). The caller calls :meth:`Reservation.wait` before it releases anything: it
returns once the WAL is on disk, or raises the ledger's :class:`~dpsql.errors.Error` (nothing
may then be released). What an analyst observes is unchanged: a charge is decided, checked
and written before the read, and durable before the answer.

Why the WAL file is enough: SQLite under ``NORMAL`` syncs the WAL before each checkpoint and
the database after it, so a commit's frames are either still in the WAL (synced here) or
already checkpointed into a synced database file.

>>> from types import SimpleNamespace
>>> from dpsql.privacy import Charge, Ledger
>>> with Ledger() as ledger:
...     ledger.reserve("alice", SimpleNamespace(epsilon=1.0, delta=0.0), Charge(0.25, 0.0, "q")).wait().epsilon_remaining
0.75
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["Reservation", "Syncer"]

T = TypeVar("T")


class Reservation(Generic[T]):
    """A committed charge (``value``: what the charge returned) whose sync may be under way."""

    def __init__(self, value: T, synced: Future[None] | None) -> None:
        self._value = value
        self._synced = synced

    def wait(self) -> T:
        """The charge's value once it is on disk; the sync's exception if it failed."""
        if self._synced is not None:
            self._synced.result()
        return self._value


class Syncer:
    """One thread that runs a ledger's syncs, started on first use; in a forked child, a new
    one (the parent's thread is not there); after :meth:`close`, work runs in the caller."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], None]) -> Future[None]:
        with self._lock:
            if not self._closed:
                if self._pool is None or self._pid != os.getpid():
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsql-ledger-sync")
                    self._pid = os.getpid()
                return self._pool.submit(work)
        done: Future[None] = Future()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - carried to wait()
            done.set_exception(exc)
        else:
            done.set_result(None)
        return done

    def close(self) -> None:
        """Wait for the syncs under way, then stop the thread."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=True)

"""Free repeats: the same query on the same data gets the same noisy answer, uncharged.

Without this, asking a query again would draw fresh noise, and an analyst willing to pay
could average it away; with it, a repeat returns exactly the answer already released (and
paid for), charges nothing, and teaches nothing new. Serving a released answer again is
post-processing: it costs no privacy.

The key
-------
An answer is stored under a SHA-256 of:

- the analyst (answers are never shared between analysts: each pays for their own);
- the SQL, normalised by sqlglot (parsed and printed back in the DuckDB dialect, comments
  dropped): whitespace and the case of keywords and function names do not matter;
  identifiers, aliases and literals do (``AS n`` and ``AS m`` are different queries);
- the query's (epsilon, delta), after defaulting (``execute(sql)`` and
  ``execute(sql, epsilon=default_epsilon)`` are the same query);
- the policy's table rules (:func:`policy_fingerprint`) and the plan's noise (each
  measurement's mechanism, sensitivity, lattice and scale), so a changed policy or a changed
  calibration never reuses an answer;
- the version of the data, named without reading it (``Engine.data_version``: for a file
  opened by path, its identity and modification time; for a wrapped connection, the
  ``data_version`` its owner passed to :func:`dpsql.connect`).

When answers are invalidated
----------------------------
- **Data changes** that the owner makes visible: a rewritten database file, or a new
  ``data_version``. Nothing reads the data to decide whether a stored answer still
  applies: an earlier version keyed answers on a digest of every row read, so whether a
  repeat was served told the analyst, for free and exactly, whether anyone's rows had
  changed (DESIGN §7). Serving an earlier release is post-processing, so a stale answer
  costs no privacy; it is stale, though: a wrapped connection whose data changes should
  pass a new ``data_version`` (or ``repeats=False``).
- **Policy changes**: any change to a table's rules (bounds, caps, columns, public values,
  privacy unit) or to how noise is calibrated. Budget changes do not invalidate (they do
  not change an answer).
- **Ledger reset**: each answer records the analyst's first ledger event (its id and time)
  when it was stored; an answer is served only while the ledger still starts that way. A
  deleted and recreated ledger therefore starts every analyst afresh.
- **Not stored at all**: a query that uses a registered UDF (the function's code is not in
  the key; re-registering a name must not serve the old function's answer), and a query
  whose run failed after the charge (:class:`~dpsql.errors.QueryFailed`).
- **Never**, otherwise: answers do not expire. Delete the answers file to drop them all.

Where answers are kept
----------------------
With a ledger file, in a SQLite file beside it, ``<ledger>.answers`` (WAL,
``synchronous=NORMAL``), so repeats are free across connections and processes. With an
in-memory ledger, in memory, for the life of the connection.

Why NORMAL and not FULL: a commit is still atomic and ordered (WAL), and a process that
crashes loses nothing the OS already has; only a power failure or an OS crash can lose the
last commits. What is lost is an *answer*, never a *charge*: the ledger (``synchronous=FULL``)
recorded the charge before the answer left, so the next ask pays again and draws fresh
noise, both charged: the accounting stays exact, the analyst overpays once. Saving this
file's fsync takes one of the two fdatasyncs of a new query off its critical path.

Concurrency and crashes
-----------------------
Writers of the file from several processes (a server's workers) queue on the flock of
``<answers>.lock`` before ``BEGIN IMMEDIATE``, as the ledger's do: the kernel wakes the next
one when it is released, where SQLite's busy handler sleeps up to 100 ms between looks (a
worker was seen waiting 103 ms for a lock held a millisecond, past its query's deadline).
The miss path claims its *key*, not the file: a short ``BEGIN IMMEDIATE`` transaction
looks again (another process may have just answered) and, when there is no answer, writes
a ``pending`` row for the key and commits. The charge, the read and the noise then run with
no lock held, so new queries with different keys run side by side (the server's workers do);
a second transaction stores the answer and deletes the pending row, and only then is the
answer returned. Whoever finds a live pending row for its key waits for it (a few ms polls)
and is served that answer. Two processes asking the same new query therefore serialise: the
first pays and stores, the second finds the stored answer and pays nothing, and both return
the same answer. A claim whose owner failed is deleted by it; one whose owner process died
(kill -9) is taken over once that process no longer exists (or after
``_STALE_CLAIM_SECONDS``). A crash before the storing ``COMMIT`` stores nothing and releases
nothing (a charge already made is lost budget, never privacy): the next ask pays again and
gets the first answer anyone saw.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import sqlglot

from dpsql.analyze.parse import DIALECT
from dpsql.codec import cells_from_payload, cells_payload, dumps, loads, report_from_payload, report_payload
from dpsql.errors import Error, InternalError
from dpsql.plan import QueryPlan
from dpsql.policy import Policy
from dpsql.report import described
from dpsql.result import Accuracy, Result
from dpsql.sqlitefile import guarded, open_database, open_writer_queue, write_transaction

__all__ = [
    "ANSWERS_SUFFIX",
    "REPEAT_NOTE",
    "CachedAnswer",
    "PlanKeys",
    "RepeatCache",
    "Released",
    "answer_once",
    "normalise_sql",
    "plan_key",
    "policy_fingerprint",
    "repeat_key",
]

#: Bump when the key or the stored answer changes meaning: old answers are then ignored.
CACHE_FORMAT = 3  # 3: the key's SQL is the analyzer's normalised text, not parsed again
ANSWERS_SUFFIX = ".answers"
REPEAT_NOTE = "repeat: served from cache, charged nothing"
_FILE_FORMAT = "dpsql-answers"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS answers (
        key TEXT PRIMARY KEY,
        analyst TEXT NOT NULL,
        query TEXT NOT NULL,
        anchor TEXT NOT NULL,
        time REAL NOT NULL,
        answer BLOB NOT NULL,
        cells TEXT NOT NULL,
        privacy TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS pending (
        key TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        pid INTEGER NOT NULL,
        time REAL NOT NULL
    )""",
)
#: A pending claim older than this is taken over even if its process seems alive (pid reuse).
_STALE_CLAIM_SECONDS = 600.0
#: Answers kept decoded per cache (:meth:`RepeatCache._get`), each at most this many bytes of Arrow.
_DECODED = 256
_DECODED_BYTES = 1 << 16
_CLAIM_POLL_SECONDS = 0.002


@dataclass(frozen=True)
class CachedAnswer:
    """An answer as it was first released: the visible table, its per-cell half-widths and
    its privacy report (as JSON-able data: epsilon, delta, columns, notes)."""

    table: pa.Table
    cells: Mapping[str, list[float | None]]
    time: float
    privacy: Mapping[str, Any]

    def result(self, plan: QueryPlan, sql: str) -> Result:
        """The stored answer, under this query's column names, with the privacy report it
        was released with, marked as a free repeat."""
        table = self.table
        if table.num_columns != len(plan.output_names):
            raise InternalError("a stored answer does not match this query's columns; delete the answers file "
                                "beside the ledger")
        renamed = table.rename_columns(list(plan.output_names))
        pairs = list(zip(table.column_names, plan.output_names))
        cells = {new: list(self.cells.get(old, [None] * table.num_rows)) for old, new in pairs}
        stored = report_from_payload(self.privacy)
        columns = {new: stored.columns[old] for old, new in pairs}
        report = replace(stored, columns=columns, notes=(*stored.notes, REPEAT_NOTE))
        result = Result(renamed, report, Accuracy(cells), sql)
        result.cached = True
        return result


@dataclass(frozen=True)
class Released:
    """A fresh answer as the pipeline released it: the result, and the visible table and
    accuracy cells the repeat store keeps."""

    result: Result
    table: pa.Table
    cells: Mapping[str, list[float | None]]


def answer_once(store: RepeatCache, key: str, anchor: Callable[[], str], analyst: str, plan: QueryPlan,
                sql: str, fresh: Callable[[], Released]) -> Result:
    """The repeat store as a wrapper around the pipeline: the answer stored under ``key``
    (free), else ``fresh()`` (which charges, reads and releases) stored under ``key`` in
    the same transaction of the answers file (see the module docstring). ``anchor()`` names
    the analyst's first ledger event; it is asked again after ``fresh()`` has charged (a
    first query creates it)."""
    cached = store.get(key, anchor())
    if cached is not None:
        return cached.result(plan, sql)
    with store.claim() as claim:
        cached = claim.get(key, anchor)  # anchor read again after waiting for another asker
        if cached is not None:  # another connection answered it meanwhile
            return cached.result(plan, sql)
        released = fresh()
        claim.put(key, anchor(), analyst, sql, released.table, released.cells, report_payload(released.result.privacy))
    return released.result


@functools.lru_cache(maxsize=1024)
def normalise_sql(sql: str) -> str:
    """The SQL as sqlglot prints it back: spacing, comments and keyword case removed.

    >>> normalise_sql("select  count(*) AS n\\nFROM visits -- hi")
    'SELECT COUNT(*) AS n FROM visits'
    >>> normalise_sql("SELECT COUNT(*) AS m FROM visits")
    'SELECT COUNT(*) AS m FROM visits'
    """
    statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    return ";\n".join(s.sql(dialect=DIALECT, comments=False) for s in statements)


def plan_key(plan: QueryPlan, *, analyst: str, policy: str, data: str) -> str:
    """The key of a plan's answer: the query as the analyzer read it, its (epsilon, delta),
    its noise, the policy's fingerprint and the data's version (never its contents)."""
    sql = plan.normalized or normalise_sql(plan.sql)  # the analyzer's text is normalised already
    return repeat_key(analyst=analyst, sql=sql, epsilon=plan.epsilon, delta=plan.delta,
                      policy=policy, noise=described(plan), data=data)


class PlanKeys:
    """:func:`plan_key` remembered per plan object (a connection's plans are remembered per
    SQL text, so a repeat asks with the same object): a repeat's key is then a lookup, with
    the data's version compared each time."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._keys: dict[int, tuple[QueryPlan, str, str, str, str]] = {}
        self._lock = threading.Lock()  # a plan can be dropped on another analyst's thread

    def key(self, plan: QueryPlan, *, analyst: str, policy: str, data: str) -> str:
        known = self._keys.get(id(plan))
        if known is not None and known[0] is plan and known[1:4] == (analyst, policy, data):
            return known[4]
        key = plan_key(plan, analyst=analyst, policy=policy, data=data)
        with self._lock:
            if len(self._keys) >= self._size:
                del self._keys[next(iter(self._keys))]  # the oldest
            self._keys[id(plan)] = (plan, analyst, policy, data, key)
        return key

    def drop(self, plan: QueryPlan) -> None:
        """Forget ``plan``'s key (a plan that will not be asked again)."""
        with self._lock:
            known = self._keys.get(id(plan))
            if known is not None and known[0] is plan:
                del self._keys[id(plan)]


def policy_fingerprint(policy: Policy) -> str:
    """A digest of the policy's table rules (everything that shapes an answer)."""
    tables = sorted((name, repr(table)) for name, table in policy.tables.items())
    return hashlib.sha256(repr(tables).encode("utf-8")).hexdigest()


def repeat_key(
    *,
    analyst: str,
    sql: str,
    epsilon: float,
    delta: float,
    policy: str,
    noise: Sequence[Mapping[str, Any]],
    data: str,
) -> str:
    """The cache key of one query (see the module docstring); ``sql`` already normalised
    (:func:`normalise_sql`, or the analyzer's text: not parsed again here)."""
    parts = {
        "format": CACHE_FORMAT,
        "analyst": analyst,
        "sql": sql,
        "epsilon": repr(float(epsilon)),
        "delta": repr(float(delta)),
        "policy": policy,
        "noise": list(noise),
        "data": data,
    }
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class RepeatCache:
    """Released answers by key, in a SQLite file (or in memory).

    Args:
        path: the answers file, created if missing; ``None`` keeps answers in memory.

    Raises:
        Error: the file exists but is not a dpsql answers file, or cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        self._lock = threading.RLock()
        self._conn = _open(self.path)
        self._queue = open_writer_queue(self.path)  # processes' writers queue on its flock
        # Answers decoded before, by (key, anchor): a repeat reads the row's identity only and
        # decodes nothing when it is the row decoded last time (the server's front serves
        # repeats on one thread: decoding was a third of its time per repeat).
        self._decoded: OrderedDict[tuple[str, str], tuple[tuple[int, float], tuple[pa.Table, dict[str, list[float | None]], str]]] = OrderedDict()

    @classmethod
    def beside(cls, ledger_path: str | None) -> RepeatCache:
        """The cache that goes with a ledger: ``<ledger>.answers``, or in memory."""
        return cls(None if ledger_path is None else ledger_path + ANSWERS_SUFFIX)

    def get(self, key: str, anchor: str) -> CachedAnswer | None:
        """The answer stored under ``key`` for a ledger starting at ``anchor``, if any."""
        with self._guarded():
            return self._get(key, anchor)

    @contextmanager
    def claim(self) -> Iterator[_Claim]:
        """Claim a key for answering it (see "Concurrency and crashes" above).

        ``claim.get(key, anchor)`` returns the stored answer (waiting for one another
        process is computing), or ``None`` after recording that this caller computes it;
        ``claim.put(...)`` then stores the answer and drops the claim in one commit. An
        exception, or leaving without ``put``, drops the claim. No lock is held between.
        """
        claim = _Claim(self)
        try:
            yield claim
        finally:
            claim.release()

    def _write(self) -> AbstractContextManager[None]:
        """One short write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), rolled back on error."""
        return _transaction(self)

    def close(self) -> None:
        """Close the file. Closing twice is harmless."""
        with self._lock:
            self._conn.close()
            if self._queue is not None and not self._queue.closed:
                self._queue.close()

    def __enter__(self) -> RepeatCache:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RepeatCache({self.path or ':memory:'!r})"

    # -- private ---------------------------------------------------------------------

    def _guarded(self) -> AbstractContextManager[None]:
        return guarded(self._lock, lambda exc: Error(
            f"the repeat cache {self!r} failed: {exc}. Check that the file is readable "
            "and writable, or delete it to drop every stored answer."))

    def _get(self, key: str, anchor: str) -> CachedAnswer | None:
        found = self._conn.execute("SELECT rowid, time FROM answers WHERE key = ? AND anchor = ?",
                                   (key, anchor)).fetchone()
        if found is None:
            return None
        identity = (int(found[0]), float(found[1]))
        decoded = self._decoded.get((key, anchor))
        if decoded is None or decoded[0] != identity:
            row = self._conn.execute("SELECT rowid, time, answer, cells, privacy FROM answers "
                                     "WHERE key = ? AND anchor = ?", (key, anchor)).fetchone()
            if row is None:  # replaced between the two reads (another process's write): look again
                return self._get(key, anchor)
            table = ipc.open_stream(io.BytesIO(row[2])).read_all()
            decoded = ((int(row[0]), float(row[1])), (table, cells_from_payload(loads(row[3])), row[4]))
            if table.nbytes <= _DECODED_BYTES:  # a large answer is decoded each time, not kept
                self._decoded[(key, anchor)] = decoded
                if len(self._decoded) > _DECODED:
                    self._decoded.popitem(last=False)
        else:
            self._decoded.move_to_end((key, anchor))
        table, cells, privacy = decoded[1]  # each caller its own lists and report payload
        return CachedAnswer(table, {name: list(values) for name, values in cells.items()}, decoded[0][1],
                            loads(privacy))

    def _put(self, key: str, anchor: str, analyst: str, sql: str, table: pa.Table,
             cells: Mapping[str, list[float | None]], privacy: Mapping[str, Any]) -> None:
        sink = io.BytesIO()
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        self._conn.execute(
            "INSERT OR REPLACE INTO answers (key, analyst, query, anchor, time, answer, cells, privacy) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key, analyst, sql, anchor, time.time(), sink.getvalue(), dumps(cells_payload(cells)), dumps(privacy)),
        )


@contextmanager
def _transaction(cache: RepeatCache) -> Iterator[None]:
    with cache._guarded(), write_transaction(cache._conn, cache._queue):
        yield


class _Claim:
    """What may be done inside :meth:`RepeatCache.claim`: look up (claiming the key when
    there is no answer yet), then store."""

    def __init__(self, cache: RepeatCache) -> None:
        self._cache = cache
        self._owner = secrets.token_hex(8)
        self._key: str | None = None

    def get(self, key: str, anchor: str | Callable[[], str]) -> CachedAnswer | None:
        """The stored answer, else ``None`` with the key claimed. ``anchor`` may be a function:
        it is then read again after each wait (the first charge of a new analyst, made by the
        caller waited for, sets the anchor its answer is stored under)."""
        while True:
            now = anchor() if callable(anchor) else anchor
            with self._cache._write():
                found = self._cache._get(key, now)
                if found is not None:
                    return found
                row = self._cache._conn.execute("SELECT pid, time FROM pending WHERE key = ?", (key,)).fetchone()
                if row is None or _stale(int(row[0]), float(row[1])):
                    self._cache._conn.execute(
                        "INSERT OR REPLACE INTO pending (key, owner, pid, time) VALUES (?, ?, ?, ?)",
                        (key, self._owner, os.getpid(), time.time()))
                    self._key = key
                    return None
            time.sleep(_CLAIM_POLL_SECONDS)  # another caller is answering this key: wait for it

    def put(self, key: str, anchor: str, analyst: str, sql: str, table: pa.Table,
            cells: Mapping[str, list[float | None]], privacy: Mapping[str, Any]) -> None:
        with self._cache._write():
            self._cache._put(key, anchor, analyst, sql, table, cells, privacy)
            self._drop(key)
        self._key = None

    def release(self) -> None:
        """Drop this caller's claim, if it still holds one (it failed or did not store)."""
        if self._key is None:
            return
        key, self._key = self._key, None
        try:
            with self._cache._write():
                self._drop(key)
        except Error:  # a closed cache: the claim goes stale with this process
            pass

    def _drop(self, key: str) -> None:
        self._cache._conn.execute("DELETE FROM pending WHERE key = ? AND owner = ?", (key, self._owner))


def _stale(pid: int, since: float) -> bool:
    """A pending claim nobody will finish: its process is gone, or it is very old."""
    if time.time() - since > _STALE_CLAIM_SECONDS:
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, owned by someone else
        return False
    return False


def _open(path: str | None) -> sqlite3.Connection:
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise Error(f"cannot keep repeat answers in {path!r}: its directory does not exist.")
    try:
        return open_database(path, lambda conn: _prepare(conn, path))
    except sqlite3.Error as exc:
        raise Error(f"cannot open the repeat cache {path!r}: {exc}. Delete the file to start afresh.") from exc


def _prepare(conn: sqlite3.Connection, path: str | None) -> None:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if tables and not {"meta", "answers"} <= tables:
        raise Error(f"{path!r} is not a dpsql repeat-answers file; move it away or choose another ledger path.")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")  # an answer lost to power failure is paid again (docstring)
    with write_transaction(conn):
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('format', ?)", (_FILE_FORMAT,))
        fmt = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0]
        if fmt != _FILE_FORMAT:
            raise Error(f"{path!r} is not a dpsql repeat-answers file; move it away or choose another ledger path.")

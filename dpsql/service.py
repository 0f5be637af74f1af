"""The service behind every server front (Flight, Postgres): one shared engine, policy and
ledger, a connection per analyst, deadlines always on (:mod:`dpsql.timing`) and a
per-analyst query rate limit. With ``workers`` > 1, the engine work of fresh queries runs
in a pool of worker processes (:mod:`dpsql.workers`) and answers are held to their
deadlines here (the release-only hold); planning, repeats, explain and budget stay here."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dpsql.connection import Connection
from dpsql.datasources import open_engine
from dpsql.engine import DuckDBEngine
from dpsql.errors import RateLimited
from dpsql.explain import Explanation
from dpsql.local.store import ReportStore
from dpsql.policy import Policy, check_against_schema, load_policy
from dpsql.privacy import BudgetStatus, Ledger
from dpsql.result import Result
from dpsql.calibration import calibrate, warm_up
from dpsql.timing import ReleaseTiming, Timing, TimingModel, available_cores, contention, table_sizes
from dpsql.errors import Error
from dpsql.workers import FrontConnection, WorkerPool, WorkerSpec

__all__ = ["RateLimiter", "Service", "server_timing"]

log = logging.getLogger("dpsql.server")


class Service:
    """The embedded pipeline for many analysts: one engine, one ledger, one Connection each.

    The Connections share the engine and the ledger, so they are never closed one by one;
    :meth:`close` closes everything once.
    """

    def __init__(self, engine: DuckDBEngine, policy: Policy, ledger: Ledger, *, timing: Timing | None = None,
                 reports: ReportStore | None = None, pool: WorkerPool | None = None) -> None:
        self._engine = engine
        self._policy = policy
        self._ledger = ledger
        self._shared = _shared_options(ledger)
        if timing is not None:
            self._shared["timing"] = timing
        if reports is not None:  # the local tables' report store (closed with the service)
            self._shared["reports"] = reports
        self.timing = timing
        self.reports = reports
        self._rate = RateLimiter(policy.server.queries_per_minute)
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.pool = pool

    @classmethod
    def open(cls, database: str | os.PathLike[str] | object | None, policy: str | os.PathLike[str],
             ledger: str | os.PathLike[str],
             *, reports: str | os.PathLike[str] | None = None, model: TimingModel | None = None,
             workers: int = 1) -> Service:
        """Open the database hardened and read-only (or the policy's sources, or a Spark
        session: :func:`dpsql.datasources.open_engine`), check it against the policy, open the
        ledger and, given ``reports``, the report store of the policy's local tables.

        ``model``: the speed model to use instead of the policy's or a measurement (a worker
        gets its server's). ``workers`` > 1: answer queries in that many worker processes
        (:mod:`dpsql.workers`; ``database`` must then be a file path or ``None``)."""
        loaded = load_policy(policy)
        if workers > 1 and not (database is None or isinstance(database, str | os.PathLike)):
            raise Error("--workers above 1 needs a DuckDB file (--db) or the policy's sources: each worker "
                        "opens its own engine. Use --workers 1 with --engine spark.")
        engine = open_engine(database, loaded)
        book: Ledger | None = None
        store: ReportStore | None = None
        pool: WorkerPool | None = None
        try:
            check_against_schema(loaded, engine.schema())
            timing = server_timing(loaded, engine, model, slots=workers, front=workers > 1)
            book = Ledger(ledger, accountant=loaded.accountant)  # as dpsql.connect does
            store = None if reports is None else ReportStore(reports)
            if workers > 1:
                path = os.fspath(database) if isinstance(database, str | os.PathLike) else None
                spec = WorkerSpec(cls.open, path, os.fspath(policy), os.fspath(ledger),
                                  None if reports is None else os.fspath(reports), timing.model,
                                  logging.getLogger("dpsql.server").getEffectiveLevel())
                pool = WorkerPool(spec, workers)
                log.info("answering queries in %d worker processes (%d cores: contention %g)", workers,
                         available_cores(), timing.model.contention)
            return cls(engine, loaded, book, timing=timing, reports=store, pool=pool)
        except BaseException:
            if pool is not None:
                pool.close()
            if store is not None:
                store.close()
            if book is not None:
                book.close()
            engine.close()
            raise

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    def connection(self, analyst: str) -> Connection:
        """The analyst's Connection, made on first use."""
        with self._lock:
            if self._closed:
                raise Error("the dpsql server is shutting down; try again when it is back.")
            conn = self._connections.get(analyst)
            if conn is None:
                if self.pool is not None:  # plans, refusals and repeats here; engine work in a worker
                    conn = FrontConnection(self._engine, self._policy, analyst, self._ledger, pool=self.pool,
                                           **self._shared)
                else:
                    conn = Connection(self._engine, self._policy, analyst, self._ledger, **self._shared)
                self._connections[analyst] = conn
            return conn

    def execute(self, analyst: str, sql: str, epsilon: float | None, delta: float | None, *,
                bias: bool = False, dialect: str | None = None) -> Result:
        """Answer a query for ``analyst``: rate-limited, then the pipeline, whose answers
        (when it reads data) are released at their deadline (:mod:`dpsql.timing`); ``bias``
        asks for the bias estimates (:mod:`dpsql.release.bias`, inside the same deadline);
        ``dialect``: the SQL dialect ``sql`` is written in (default DuckDB's)."""
        self._rate.take(analyst)
        return self.connection(analyst).execute(sql, epsilon=epsilon, delta=delta, bias=bias, dialect=dialect)

    def explain(self, analyst: str, sql: str, epsilon: float | None, delta: float | None,
                dialect: str | None = None) -> Explanation:
        return self.connection(analyst).explain(sql, epsilon=epsilon, delta=delta, dialect=dialect)

    def budget(self, analyst: str) -> BudgetStatus:
        return self.connection(analyst).budget()

    def close(self) -> None:
        """Close every Connection (their scratch engines), then the shared engine and ledger."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections.values())
        if isinstance(self.timing, ReleaseTiming):
            log.info("%s", self.timing.usage.summary())
        if self.pool is not None:
            self.pool.close()
        for conn in connections:
            conn.close()  # also closes the shared engine, ledger and answers: all idempotent
        for shared in self._shared.values():
            if hasattr(shared, "close"):
                shared.close()
        self._engine.close()
        self._ledger.close()


def server_timing(policy: Policy, engine: DuckDBEngine, model: TimingModel | None = None, *,
                  slots: int = 1, front: bool = False) -> Timing:
    """The deadlines of a server (always on): this machine's speed measured on synthetic
    data, the policy's slack or fixed deadline, the tables' public or coarsened sizes, and
    the contention of ``slots`` runs side by side (:func:`dpsql.timing.contention`).
    ``model`` given (a worker's, from its server): used as it is, after a warm-up.
    ``front``: the release-only hold of a server with workers (:class:`ReleaseTiming`)."""
    limits = policy.server
    if model is not None:
        warm_up(Connection)
        return Timing(model, table_sizes(policy, engine), engine.interrupt)
    if limits.deadline_ms is not None:
        model = TimingModel(0.0, 0.0, fixed=limits.deadline_ms / 1e3)
        warm_up(Connection)
    elif limits.deadline_base_ms is not None and limits.deadline_ms_per_million_rows is not None:
        model = TimingModel(limits.deadline_base_ms / 1e3, limits.deadline_ms_per_million_rows / 1e9,
                            slack=limits.deadline_slack, margin=limits.deadline_margin_ms / 1e3)
        warm_up(Connection)
    else:  # measuring runs the pipeline, which warms it up too
        model = dataclasses.replace(calibrate(pipeline=Connection, engine=engine), slack=limits.deadline_slack,
                                    margin=limits.deadline_margin_ms / 1e3)
    model = dataclasses.replace(model, contention=contention(slots))
    log.info("deadlines: %s", model)
    if front:
        return ReleaseTiming(model, table_sizes(policy, engine), engine.interrupt, lanes=slots)
    return Timing(model, table_sizes(policy, engine), engine.interrupt)


_QUERY_REFUSAL = ("analyst {name!r} sent more than {per_minute} queries a minute (the server's rate limit, "
                  "[server] queries_per_minute in the policy); wait {wait:.1f} s and try again. Nothing was charged.")


class RateLimiter:
    """Per-analyst token buckets: ``per_minute`` queries a minute, bursts of a tenth of it.

    A refusal is :class:`~dpsql.errors.RateLimited`, decided before anything is read or
    charged. It bounds how fast an analyst can probe anything that costs little.

    >>> limiter = RateLimiter(60, clock=lambda: 0.0)
    >>> for _ in range(6):
    ...     limiter.take("alice")
    >>> limiter.take("alice")
    Traceback (most recent call last):
    ...
    dpsql.errors.RateLimited: analyst 'alice' sent more than 60 queries a minute (the server's rate limit, [server] queries_per_minute in the policy); wait 1.0 s and try again. Nothing was charged.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic, *,
                 refusal: str = _QUERY_REFUSAL) -> None:
        self.per_minute = per_minute
        self._refusal = refusal  # the message, with {name}, {per_minute} and {wait}
        self._capacity = max(1.0, per_minute / 10)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, analyst: str) -> None:
        with self._lock:
            now = self._clock()
            tokens, then = self._buckets.get(analyst, (self._capacity, now))
            tokens = min(self._capacity, tokens + (now - then) * self._rate)
            if tokens < 1:
                self._buckets[analyst] = (tokens, now)
                wait = (1 - tokens) / self._rate
                raise RateLimited(self._refusal.format(name=analyst, per_minute=self.per_minute, wait=wait))
            self._buckets[analyst] = (tokens - 1, now)


def _shared_options(ledger: Ledger) -> dict[str, Any]:
    """What every analyst's Connection shares besides the engine and the ledger.

    Where Connection keeps released answers for free repeats (``answers=``, a file beside the
    ledger), the server opens that file once for everyone: one SQLite connection whose
    writers queue on a lock. One connection per analyst would queue them on SQLite's busy
    handler instead, which sleeps in steps of up to 100 ms and made 8 concurrent clients 30
    times slower.
    """
    if "answers" not in inspect.signature(Connection).parameters:
        return {}
    from dpsql.repeats import RepeatCache

    return {"answers": RepeatCache.beside(ledger.path)}


# ---------------------------------------------------------------- requests

"""Worker processes behind one server: fresh queries use every core (``dpsql serve --workers N``).

Why processes. A fresh query spends most of its time in Python (planning, the bounded SQL,
noise, post-processing, the ledger commit), and one process runs Python on one core at a
time. With the deadline defence on (:mod:`dpsql.timing`) and the slot hold, a slot is also
held for the whole of each deadline, so one slot answers at most one fresh query per deadline;
workers with the release-only hold below are held by nothing but their engine work.

The design (the release-only hold of :mod:`dpsql.timing`). The server process keeps the
fronts (Flight, Postgres), token checks, the rate limit, ``explain`` and ``budget``, and each
analyst's :class:`FrontConnection`, which plans every query (reading public data only),
answers refusals and serves repeats (a stored answer reads no data: no worker, no hold), and
gives each fresh query its deadline. The engine work (charge, read, noise, store) goes to a
:class:`WorkerPool` of N processes, each with its own read-only engine on the same database,
its own handles on the shared ledger and repeat store, and its analysts' Connections: the
plan is sent (pickled, a few KB), the first free worker runs it with an interrupt armed at
the deadline and takes its next query as soon as it is done; the answer waits for its
deadline in the server process. A query that waits past its deadline for a free worker is
answered QueryFailed at the deadline and charged at once by the server process (its ledger
handle; no worker is taken, so a backlog drains instead of feeding itself). N bounds how many
runs share the cores (the contention factor of the deadlines).

What is shared, and why it stays safe:

- **The ledger** is one SQLite file; each worker's charge is its own ``BEGIN IMMEDIATE``
  transaction (WAL, ``synchronous=FULL``): the guarantees of any number of processes sharing
  it (:mod:`dpsql.privacy.ledger`: never overspent, a kill -9 loses budget, never privacy).
- **The repeat store** claims a key, not the file (:mod:`dpsql.repeats`): workers answer
  different new queries side by side, and the same new query is paid once.
- **The speed model** is measured once, by the server before the workers start, and handed
  to every worker with ``contention = max(1, N / cores)``: all workers give one query the
  same deadline, sized for N runs sharing the cores ("CPU contention" in :mod:`dpsql.timing`).

A worker that dies (killed, out of memory) is replaced in the background; the query it held
is answered with :class:`~dpsql.errors.QueryFailed` at its deadline (charged if the worker had
charged it: the ledger says).
The workers ignore SIGINT and SIGTERM: the server stops them after its calls in flight are
answered, and a worker also exits when the server's end of its pipe closes.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from typing import Any

from dpsql.connection import Connection
from dpsql.errors import Error, QueryFailed
from dpsql.plan import QueryPlan
from dpsql.report import charge_of
from dpsql.repeats import Released
from dpsql.result import Result
from dpsql.timing import Deadline, Overrun, TimingModel, settle

__all__ = ["FrontConnection", "WorkerDied", "WorkerPool", "WorkerSpec"]

log = logging.getLogger("dpsql.server")

#: At most this many analysts' Connections are made in each worker before it is ready.
PREOPENED = 64

#: How long a worker may take to open its engine and warm up.
_START_SECONDS = 300.0
_STOP_SECONDS = 30.0


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker opens: the same database, policy, ledger and report store as the server,
    and the server's speed model (with its contention factor), with ``opener`` (the server's
    ``Service.open``, passed in so that this module does not import the service that
    imports it)."""

    opener: Callable[..., Any]
    database: str | None
    policy: str
    ledger: str
    reports: str | None
    model: TimingModel
    log_level: int = logging.INFO
    analysts: tuple[str, ...] = ()  # whose Connections a worker makes before it says ready


class _Bug(Exception):
    """A worker's unexpected exception, by type name only (its message could quote data)."""


class WorkerPool:
    """N worker processes, each running one query's engine work at a time (:meth:`run`).

    Raises:
        Error: a worker could not start (its reason is in the server's log).
    """

    def __init__(self, spec: WorkerSpec, count: int) -> None:
        if count < 1:
            raise Error(f"--workers must be at least 1, got {count}.")
        self._spec = spec
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.size = count
        workers = [_Worker.start(self._context, spec) for _ in range(count)]
        try:
            for worker in workers:
                worker.wait_ready()
        except BaseException:
            for worker in workers:
                worker.kill()
            raise
        for worker in workers:
            self._idle.put(worker)
        # The workers ignore SIGTERM, which is what multiprocessing sends its daemonic children
        # at interpreter exit before it joins them: a program that exits without close() would
        # wait for them forever. Closing first (exit priority >= 0 runs before that) stops them.
        self._at_exit = multiprocessing.util.Finalize(None, self.close, exitpriority=10)

    def run(self, analyst: str, plan: QueryPlan, sql: str, at: float | Deadline, *, bias: bool = False,
            charge: Callable[[], None] | None = None) -> Result:
        """Charge, read and release ``plan`` (planned by ``analyst``'s Connection in the front)
        in the first free worker, with its deadline at ``at`` (``time.monotonic()``; a
        :class:`~dpsql.timing.Deadline` is also told the worker's run time, ``ran``).
        ``charge``: how the front charges a query that no worker took by its deadline (in a
        thread of its own, at once); without it, such a query waits for a free worker,
        which charges it. A :class:`~dpsql.timing.Deadline`'s ``need`` (its modelled run
        time) moves "by its deadline" earlier: a query that could not start by ``at - need``
        is not started, an overrun at once, so that under overload the workers spend their
        time on queries that can still make their deadlines instead of on hopeless ones
        (a backlog drains instead of making every query behind it late).

        Raises:
            Overrun: no worker was free, or the worker did not answer, by ``at``; the query
                is still charged (by ``charge``, or by a worker when one is free).
            WorkerDied: the worker died; another is started.
            Error: the worker's refusal or failure, as it is.
        """
        deadline = at if isinstance(at, Deadline) else None
        need = deadline.need if deadline is not None else 0.0
        at = at.at if isinstance(at, Deadline) else at
        message = (analyst, plan, sql, at, bias)
        try:
            worker = self._idle.get(timeout=max(0.0, at - need - time.monotonic()))
        except queue.Empty:  # waited behind other queries until it could no longer fit
            worker = None
        if worker is not None and need > 0 and time.monotonic() > at - need:
            self._idle.put(worker)  # free too late for its modelled run: not started (see below)
            worker = None
        if worker is None:
            if charge is not None:  # the front charges it: no worker is taken from the backlog
                threading.Thread(target=_charge_late, args=(charge,), name="dpsql-late", daemon=True).start()
            else:
                threading.Thread(target=self._late, args=(message,), name="dpsql-late", daemon=True).start()
            raise Overrun()
        if self._closed:
            self._idle.put(worker)
            raise Error("the dpsql server is shutting down; try again when it is back.")
        try:
            worker.pipe.send(message)
            if not worker.pipe.poll(max(0.0, at - time.monotonic())):
                threading.Thread(target=self._drain, args=(worker,), name="dpsql-drain", daemon=True).start()
                raise Overrun()
            kind, value, ran = worker.pipe.recv()
        except (EOFError, OSError):
            self._replace(worker)
            raise WorkerDied() from None
        self._idle.put(worker)
        if deadline is not None:
            deadline.ran = ran
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        if kind == "error":
            raise value
        raise _Bug(f"a worker failed with an unexpected {value} (its stack is in the server's log)")

    def _late(self, message: tuple[Any, ...]) -> None:
        """A query that waited past its deadline: charged when a worker is free (its worker
        finds the deadline passed: charge, nothing released), its outcome dropped."""
        worker = self._idle.get()
        if self._closed:
            self._idle.put(worker)
            return
        try:
            worker.pipe.send(message)
        except OSError:
            self._replace(worker)
            return
        self._drain(worker)

    def _drain(self, worker: _Worker) -> None:
        """Wait for the outcome of a query whose analyst was answered already; then the
        worker is free again."""
        try:
            worker.pipe.recv()
        except (EOFError, OSError):
            self._replace(worker)
            return
        self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        """A worker died: start another in the background (the pool has one worker fewer
        until it is ready)."""
        log.error("worker %s died while answering a query; starting another (the analyst got QueryFailed)",
                  worker.process.pid)
        worker.kill()

        def start() -> None:
            try:
                fresh = _Worker.start(self._context, self._spec)
                fresh.wait_ready()
            except Exception as exc:  # noqa: BLE001 - logged; the pool goes on with fewer workers
                log.error("could not start a replacement worker (%s); %d workers left", type(exc).__name__,
                          self.size - 1)
                with self._lock:
                    self.size -= 1
                return
            self._idle.put(fresh)

        threading.Thread(target=start, name="dpsql-restart", daemon=True).start()

    def close(self) -> None:
        """Stop every worker once it is idle (bounded wait), then reap it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._at_exit.cancel()
        for _ in range(self.size):
            try:
                worker = self._idle.get(timeout=_STOP_SECONDS)
            except queue.Empty:
                log.error("a worker is still busy after %.0f s; leaving it to exit with the server", _STOP_SECONDS)
                continue
            worker.stop()
            self._idle.put(worker)  # a late run finds it and says the server is stopping


def _charge_late(charge: Callable[[], None]) -> None:
    """Charge a query that waited past its deadline (its analyst has QueryFailed already)."""
    try:
        charge()
    except Error as exc:  # a budget that cannot pay: nothing was read, nothing to charge
        log.info("a query that waited past its deadline was not charged: %s", type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - logged; the analyst was answered already
        log.error("charging a query that waited past its deadline failed with an unexpected %s",
                  type(exc).__name__)


class FrontConnection(Connection):
    """An analyst's Connection in the server process of a server with workers: it plans,
    refuses and serves repeats here; the engine work of each fresh query goes to a worker
    (:meth:`WorkerPool.run`) and its answer is held to its deadline here
    (:class:`~dpsql.timing.ReleaseTiming`)."""

    def __init__(self, *args: Any, pool: WorkerPool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool = pool

    def _answer(self, plan: QueryPlan, sql: str, late: threading.Event | None = None) -> Result:
        if late is None:  # a repeat (execute found it in the store): no data read, served here
            return super()._answer(plan, sql)
        return self._pool.run(self.analyst, plan, sql, _deadline_of(late), charge=lambda: self._charge(plan, sql))

    def _execute_with_bias(self, plan: QueryPlan, sql: str, late: threading.Event | None = None) -> Result:
        if late is None:
            raise QueryFailed()  # never: the front always has deadlines
        return self._pool.run(self.analyst, plan, sql, _deadline_of(late), bias=True,
                              charge=lambda: self._charge(plan, sql))

    def _charge(self, plan: QueryPlan, sql: str) -> None:
        """What a worker does with a query it finds late (:meth:`Connection.answer_plan`):
        charge it, read nothing; here, so that a backlog does not take workers."""
        self._ledger.charge(self.analyst, self._policy.budget_for(self.analyst), charge_of(plan, sql))

    def _fresh(self, plan: QueryPlan, sql: str, charge: Any, late: threading.Event | None = None) -> Released:
        # Reached only when a stored answer vanished between execute's look and the repeat
        # store's (a reset ledger): the front reads no data, and this is not held.
        raise QueryFailed()


def _deadline_of(late: threading.Event) -> Deadline:
    if not isinstance(late, Deadline):
        raise QueryFailed()  # never: ReleaseTiming hands a Deadline
    return late


class _Worker:
    def __init__(self, process: BaseProcess, pipe: Pipe) -> None:
        self.process = process
        self.pipe = pipe

    @classmethod
    def start(cls, context: Any, spec: WorkerSpec) -> _Worker:
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(spec, theirs), name="dpsql-worker", daemon=True)
        process.start()
        theirs.close()
        return cls(process, ours)

    def wait_ready(self) -> None:
        if not self.pipe.poll(_START_SECONDS):
            raise Error(f"a dpsql worker did not start within {_START_SECONDS:.0f} s; see the server's log.")
        try:
            kind, value = self.pipe.recv()
        except EOFError:
            raise Error("a dpsql worker exited while starting; see the server's log.") from None
        if kind != "ready":
            raise value

    def stop(self) -> None:
        try:
            self.pipe.send(None)
        except OSError:
            pass
        self.process.join(_STOP_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.pipe.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.pipe.close()


class WorkerDied(QueryFailed):
    """A worker died while answering (its query may have charged: the ledger says). Its
    death may depend on the data (memory, a crash on one person's row), so the server
    answers it at the query's deadline, like any failure after the charge
    (:meth:`dpsql.service.Service.execute`)."""


def _serve(spec: WorkerSpec, pipe: Pipe) -> None:
    """A worker's life: open the service, say ready, answer queries until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _configure_logging(spec.log_level)
    try:
        service = spec.opener(spec.database, spec.policy, spec.ledger, reports=spec.reports, model=spec.model)
    except Error as exc:
        pipe.send(("error", exc))
        return
    # An analyst's Connection (its post-processing engine: tens of milliseconds on a loaded
    # machine) made at an analyst's first query would be made inside that query's deadline.
    for analyst in spec.analysts[:PREOPENED]:
        service.connection(analyst)
    settle()
    try:
        pipe.send(("ready", os.getpid()))
        while True:
            try:
                message = pipe.recv()
            except EOFError:  # the server is gone
                return
            if message is None:
                return
            pipe.send(_answer(service, *message))
            del message  # the plan: nothing of it kept
    finally:
        service.close()


def _answer(service: Any, analyst: str, plan: QueryPlan, sql: str, at: float,
            bias: bool) -> tuple[str, object, float]:
    """One query's engine work, its deadline armed at ``at``: charge, read, release; with
    the seconds it took (the front's evidence for the slack, :class:`~dpsql.timing.DeadlineUsage`)."""
    started = time.monotonic()
    try:
        conn = service.connection(analyst)
        result = service.timing.run_until(lambda late: conn.answer_plan(plan, sql, late, bias=bias), at)
        return "ok", result, time.monotonic() - started
    except Error as exc:
        return "error", exc.with_traceback(None), time.monotonic() - started
    except Exception as exc:  # noqa: BLE001 - the server turns it into an InternalError
        log.error("worker %d: a query failed with an unexpected %s; stack:\n%s", os.getpid(), type(exc).__name__,
                  "".join(traceback.format_tb(exc.__traceback__)))
        return "bug", type(exc).__name__, time.monotonic() - started


def _configure_logging(level: int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s[worker {os.getpid()}]: %(message)s"))
    for name in ("dpsql", "dpsql.server"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False

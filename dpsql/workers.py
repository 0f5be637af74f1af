"""Worker processes behind one server: fresh queries use every core (``dpsql serve --workers N``).

Why processes. A fresh query spends most of its time in Python (planning, the bounded SQL,
noise, post-processing, the ledger commit), and one process runs Python on one core at a
time. With the deadline defence on (:mod:`dpsql.timing`) a slot is also held for the whole
of each deadline, so a server with one slot answers at most one fresh query per deadline.

The design. The server process keeps the fronts (Flight, Postgres), token checks, the rate
limit, ``explain`` and ``budget``. Each query goes to a :class:`WorkerPool` of N processes,
each with its own read-only engine on the same database, its own handles on the shared
ledger and repeat store, its analysts' Connections, and one deadline slot. A query takes an
idle worker (waiting, when all are busy, for the first to come free: the wait is made of
other queries' deadlines, which are public), the worker runs the whole pipeline, holds the
answer to its deadline and sends it back, and only then takes the next query. So a worker is
the slot of :mod:`dpsql.timing`, and the pool has N of them.

What is shared, and why it stays safe:

- **The ledger** is one SQLite file; each worker's charge is its own ``BEGIN IMMEDIATE``
  transaction (WAL, ``synchronous=FULL``): the guarantees of any number of processes sharing
  it (:mod:`dpsql.privacy.ledger`: never overspent, a kill -9 loses budget, never privacy).
- **The repeat store** claims a key, not the file (:mod:`dpsql.repeats`): workers answer
  different new queries side by side, and the same new query is paid once.
- **The speed model** is measured once, by the server before the workers start, and handed
  to every worker with ``contention = max(1, N / cores)``: all workers give one query the
  same deadline, sized for N runs sharing the cores ("CPU contention" in :mod:`dpsql.timing`).

A worker that dies (killed, out of memory) is replaced; the query it held is answered with
:class:`~dpsql.errors.QueryFailed` (charged if the worker had charged it: the ledger says).
The workers ignore SIGINT and SIGTERM: the server stops them after its calls in flight are
answered, and a worker also exits when the server's end of its pipe closes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from typing import Any

from dpsql.errors import Error, QueryFailed
from dpsql.result import Result
from dpsql.timing import TimingModel

__all__ = ["WorkerPool", "WorkerSpec"]

log = logging.getLogger("dpsql.server")

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


class _Bug(Exception):
    """A worker's unexpected exception, by type name only (its message could quote data)."""


class WorkerPool:
    """N worker processes answering :meth:`execute` one query each at a time.

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

    def execute(self, analyst: str, sql: str, epsilon: float | None, delta: float | None, *,
                bias: bool = False, dialect: str | None = None) -> Result:
        """The pipeline of ``analyst``'s Connection in a free worker: its Result, or its error."""
        worker = self._idle.get()
        try:
            if self._closed:
                raise Error("the dpsql server is shutting down; try again when it is back.")
            try:
                worker.pipe.send((analyst, sql, epsilon, delta, bias, dialect))
                kind, value = worker.pipe.recv()
            except (EOFError, OSError):
                log.error("worker %s died while answering a query; starting another (the analyst "
                          "got QueryFailed)", worker.process.pid)
                worker.kill()
                worker = _Worker.start(self._context, self._spec)
                worker.wait_ready()
                raise WorkerDied() from None
        finally:
            self._idle.put(worker)
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        if kind == "error":
            raise value
        raise _Bug(f"a worker failed with an unexpected {value} (its stack is in the server's log)")

    def close(self) -> None:
        """Stop every worker once it is idle (bounded wait), then reap it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in range(self.size):
            try:
                worker = self._idle.get(timeout=_STOP_SECONDS)
            except queue.Empty:
                log.error("a worker is still busy after %.0f s; leaving it to exit with the server", _STOP_SECONDS)
                continue
            worker.stop()
            self._idle.put(worker)  # a late execute finds it and says the server is stopping


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
    finally:
        service.close()


def _answer(service: Any, analyst: str, sql: str, epsilon: float | None, delta: float | None,
            bias: bool, dialect: str | None = None) -> tuple[str, object]:
    try:
        return "ok", service.connection(analyst).execute(sql, epsilon=epsilon, delta=delta, bias=bias, dialect=dialect)
    except Error as exc:
        return "error", exc.with_traceback(None)
    except Exception as exc:  # noqa: BLE001 - the server turns it into an InternalError
        log.error("worker %d: a query failed with an unexpected %s; stack:\n%s", os.getpid(), type(exc).__name__,
                  "".join(traceback.format_tb(exc.__traceback__)))
        return "bug", type(exc).__name__


def _configure_logging(level: int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s[worker {os.getpid()}]: %(message)s"))
    for name in ("dpsql", "dpsql.server"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False

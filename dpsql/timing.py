"""Time that tells nothing: answers released at a deadline computed from public facts.

The problem (DESIGN §7). The time from a request to its answer is an output. A guard that
makes work appear only for one person's rows (``CASE WHEN zip = '99999' THEN note LIKE
'%a%a%…' END``), partition selection that keeps one more group, an order statistic over a
few more values: each makes the answer come back measurably later when that person is in
the data, and an analyst who times answers learns it, uncharged.

The defence, after Haeberlen, Pierce and Narayan, "Differential Privacy Under Fire"
(USENIX Security 2011), adapted to a database engine that cannot time out single rows:

1. **Bounded per-row work** comes from the grammar (:mod:`dpsql.analyze.predicates`): every
   accepted operation is total and at most linear in the row's own size, so no guard can
   make one row cost seconds.
2. **Predictable query processing.** Every query that reads private data is given a
   deadline *before* it runs, from facts that do not depend on the private data: the
   query's shape (tables read, joins, aggregates, order statistics, private keys), the
   policy, the declared or coarsened table sizes (below) and a machine speed measured on
   synthetic data (:func:`dpsql.calibration.calibrate`). The answer, or its error, is held until the deadline
   and released then, never earlier.
3. **A default outcome on overrun.** A run still going at its deadline is interrupted and
   the analyst gets the fixed :class:`~dpsql.errors.QueryFailed` at the deadline. The
   query was charged before it read anything, so the overrun is a charged release whose
   only content is its outcome class.
4. **Slots and the hold.** How long a query waits for the engine must not show either.
   Two designs, both here:

   - *Slot hold* (:meth:`Timing.hold`: the embedded API and a one-process server): a
     query holds the engine slot for exactly its deadline, so the wait for a slot is made
     of deadlines, which are public. One fresh query per deadline per slot: a server's
     throughput is ``slots / deadline``, whatever the CPU.
   - *Release-only hold* (:class:`ReleaseTiming` in the server process and
     :meth:`Timing.run_until` in the workers of ``--workers N``, :mod:`dpsql.workers`):
     the query's deadline starts when one of N *lanes* is free (at once when one is idle;
     planning, before it, reads public data only), and a lane is taken for
     :data:`HEADROOM` (1.5) times the query's modelled run time (its deadline without slack
     and margin), so the start is scheduled from public facts (arrivals and plans); its
     engine work goes to the first free worker, which arms an interrupt at the deadline,
     runs it and takes its next query as soon as it is done; the answer waits for its
     deadline in the server process (a sleeping thread, no worker and no slot held).
     Throughput is then about ``N / (1.5 x run time)``, twice the slot hold's at slack 3,
     and set by what a query costs, not by how long answers are held. The N workers bound how many runs share the cores (the
     contention model below).

What the analyst observes with the release-only hold. For a query that reads private data:
the release time is its scheduled start (arrival, or later when all lanes are taken:
other analysts' arrivals and plans, no data) plus a deadline computed before any data is
read (public facts only), and the outcome is the answer (or the worker's refusal or failure: all are
released at the deadline, a budget refusal included), unless the query *overran*. It
overruns when its wait for a free worker plus its run did not fit in its deadline; the
real wait is made of the other queries' real run times, which can depend on their private
data, so whether a query overran is a bit about other runs (its own run time too). The
lanes keep the real queue short: the workers fall behind the public schedule only when
real runs are slower than modelled, and a query overruns only when they fall behind by
more than the slack's room (``(slack - 1) x run time + margin``). An overrun is
answered with the plain :class:`~dpsql.errors.QueryFailed` *at the deadline* (the front
does not wait for a worker that is late: the worker's own interrupt stops the run, its
outcome is dropped), and it is charged: a query that waited past its deadline for a worker is
charged by the server process at once (no worker is taken from the backlog; it reads
nothing), one whose worker was too slow by the worker. So an overrun tells one bit, at a public time, paid for; the slack and
the contention factor size deadlines so that honest queries do not overrun, each overrun
is logged, and ``benchmarks/bench_server.py`` reports how many there were. With the slot
hold the wait is public, so its overruns come only from the run itself; the price is
throughput. Measured side by side (``benchmarks/RESULTS.md``, "Server: release-only
hold"), the release-only hold is the server's design.

Backlogs (release-only hold). A query that no worker could start by its deadline minus its
modelled run time (:attr:`Deadline.need`) is not started: it is an overrun at once, charged
by the server process, which reads nothing; the workers spend their time on queries that
can still make their deadlines, and a backlog (the machine slower than modelled) drains
instead of making every query behind it late.

What the defence guarantees, and what one overrun tells. Guaranteed: every outcome of a
query that reads private data (its answer, its error, its budget refusal from a worker) is
released at ``start + deadline``, both computed before the run from public facts (arrival
times and plans of the queries before it, the policy, table sizes, the speed model); the
charge is made before any read, and stands. Not guaranteed: that it is an answer. An
overrun replaces the answer by the fixed :class:`~dpsql.errors.QueryFailed`, released at the
same time and charged the same, so it tells the analyst one bit: "the run, plus its wait
for a worker, did not fit". That bit depends on the machine's load and on the other
queries' real run times, which can depend on their private data (bounded per-row work
bounds how much), and on this query's own run. The slack and margin are chosen so that
honest queries do not overrun on the machine the server is sized for (and the server's
processes settle their heaps once ready, :func:`settle`, so that Python's full garbage
collections, 50-120 ms each, no longer stop a worker inside a deadline); each overrun is
logged, and at stop the server logs how much of their deadlines answers used and their
workers' run time against the model (:class:`DeadlineUsage`), the owner's evidence for
``[server] deadline_slack`` and ``deadline_margin_ms``. Measured (``bench_server.py``, 8
clients, COUNT on 1,000 rows, 2 cores, 2026-11-25 01:27-01:53 UTC on a machine shared with
other work): at load 3.4, workers' runs were p50 0.28 / p99 1.8 / p99.9 2.8 of a
calibrated (unscaled) model and answers used p99 0.45 / p99.9 0.81 of their deadlines, no
overrun in the measured phases; at loads 7-11 (3-5 runnable processes per core besides the
server), runs were p50 0.5-1.5 / p99 3-5 of the model and 3-70% of queries overran with
slack 3 and a 20 ms margin, whichever model: no slack that keeps latency useful holds
when the machine is shared that much, and the calibration at start, made on the loaded
machine, is then what keeps deadlines in reach.

CPU contention (several slots or workers). With N slots on C cores, the runs in the other slots
share the CPU with this one, and how much CPU they use can depend on their private data
(a guarded LIKE that only works on the target's row). The deadline must not depend on it,
so the model assumes the worst case: every other slot busy for the whole of its deadline
(no run outlives its deadline: it is interrupted there). A run then gets at least C/N of
a core, and the model multiplies the measured single-run time by ``contention = max(1,
N / C)`` (:attr:`TimingModel.contention`), before the slack. An overrun stays what it was:
rare by construction, answered with the charged :class:`~dpsql.errors.QueryFailed` at the
deadline, one bit whose probability is bounded by the slack covering the worst case. What
this does not cover is load from outside the server (other programs on the machine): the
slack is the only room for it, as with one slot. Throughput is then at most about
``C / (slack * t)`` fresh queries a second for a run time ``t``: N slots buy cores, not a
way around the slack.

What the analyst then observes is a function of public facts, except: whether a run
overran (a charged, one-bit outcome: choose the slack so that it does not happen for
honest queries; each one is logged), the few milliseconds an interrupt takes to land,
and the scheduler's jitter. Refusals made before any data is read (the analyzer's, the
budget's, the rate limit's) are answered at once: they depend on the query, the policy
and the ledger only (with the release-only hold, a budget refusal is made by the worker,
after the wait for it, so it is released at the deadline like everything a worker returns).

Table sizes. The deadline needs a size for each table read. A private table's row count is
itself (weakly) private, so the model uses ``declared_rows`` from the policy where the
owner gave one, and otherwise the count in DuckDB's catalog rounded up to a power of two
(at least 1,024), read once when the server starts: one unit more or less changes it only
where the count crosses a power of two. Owners who want no such edge declare the sizes.

Where it applies. Always on the server fronts (an analyst there sees only what the server
sends). In the embedded API the analyst shares the process and can time anything, so there
it is an option (``dpsql.connect(..., deadline=True)``); the server is the security boundary.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from dpsql.deadline_use import DeadlineUsage
from dpsql.errors import BudgetExceeded, QueryFailed, RateLimited
from dpsql.watchdog import Watchdog

__all__ = [
    "CALIBRATION_WORK", "Deadline", "DeadlineUsage", "Overrun", "ReleaseTiming", "Timing", "TimingModel", "available_cores",
    "coarse_rows", "contention", "plan_work", "settle", "table_sizes", "unsettle",
]

log = logging.getLogger("dpsql")

_T = TypeVar("_T")

#: Refusals decided before any private data is read: released at once.
_BEFORE_DATA = (BudgetExceeded, RateLimited)

#: The smallest size a table is assumed to have (coarsening).
MIN_ROWS = 1024

#: The work (:func:`plan_work`) of the calibration query (``SELECT g, COUNT(*), AVG(x) FROM
#: t GROUP BY g``), on which :attr:`TimingModel.base` is measured.
CALIBRATION_WORK = 1.95

#: How many modelled run times a query takes its lane for (:class:`ReleaseTiming`): the
#: workers' room to catch up when real runs are slower than modelled (other processes on
#: the cores), so that a backlog drains instead of growing into overruns.
HEADROOM = 1.5


@dataclass(frozen=True)
class TimingModel:
    """How long a query may take:
    ``slack * contention * (base * max(1, work / CALIBRATION_WORK) + per_row * rows * work) + margin``.

    Attributes:
        base: seconds the calibration query costs whatever its size (its SQL, the engine's
            fixed cost, noise, post-processing, the ledger's and the repeat store's commits;
            :func:`dpsql.calibration.calibrate`). A plan of more work than the calibration
            query's (:data:`CALIBRATION_WORK`) gets that many times the base; one of less
            keeps the whole base. Measured (``benchmarks/deadline_work.py --heavy``): eight
            aggregates cost 3.4-4.5x the calibration query's fixed cost (work ratio 4.23),
            and overran 819 times in 911 answers under 8 clients with the base alone (0 in
            377 scaled); lighter plans given less overran under load (HISTORY.md, 2026-12).
        per_row: seconds per row of one bounded pass, on this machine.
        slack: how much slower than the model a run may be before it counts as an overrun.
        margin: seconds added to every deadline (scheduler jitter, a loaded machine).
        fixed: a fixed deadline in seconds for every query instead of the model (taken as
            given: the owner sizes it for the server's slots).
        contention: how many runs may share one core at worst (``max(1, slots / cores)``,
            see "CPU contention" above); multiplies the measured time.
    """

    base: float
    per_row: float
    slack: float = 3.0
    margin: float = 0.02
    fixed: float | None = None
    contention: float = 1.0

    def seconds(self, rows: float, work: float) -> float:
        if self.fixed is not None:
            return self.fixed
        fixed_cost = self.base * max(1.0, work / CALIBRATION_WORK)
        return self.slack * self.contention * (fixed_cost + self.per_row * rows * work) + self.margin

    def run_time(self, seconds: float) -> float:
        """The modelled run time of a query whose deadline is ``seconds``: the deadline
        without its margin and slack (a fixed deadline: divided by the slack).

        >>> round(TimingModel(base=0.01, per_row=0.0, slack=3.0, margin=0.005).run_time(0.035), 9)
        0.01
        """
        if self.fixed is not None:
            return seconds / self.slack
        return max(0.0, seconds - self.margin) / self.slack


def contention(slots: int, cores: int | None = None) -> float:
    """The worst-case number of runs sharing one core: ``max(1, slots / cores)``.

    >>> contention(1, 2), contention(2, 2), contention(8, 2)
    (1.0, 1.0, 4.0)
    """
    if cores is None:
        cores = available_cores()
    return max(1.0, slots / max(1, cores))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def coarse_rows(count: int) -> int:
    """A row count rounded up to a power of two, at least :data:`MIN_ROWS`.

    >>> coarse_rows(0), coarse_rows(1024), coarse_rows(1025), coarse_rows(1_000_000)
    (1024, 1024, 2048, 1048576)
    """
    return max(MIN_ROWS, 1 << max(0, math.ceil(math.log2(max(1, count)))))


def plan_work(plan: object) -> tuple[list[str], float]:
    """The tables a plan reads and how many bounded passes' worth of work it is.

    A pass is the one ``GROUP BY unit, group`` scan every query pays; each further
    aggregate, key, join, order statistic (which reads the values again, sorted), partition
    selection and a WHERE clause adds a share, from measurements of
    ``benchmarks/bench_timing.py`` and ``benchmarks/deadline_work.py``.
    """
    sources = [getattr(s, "table") for s in getattr(plan, "sources", ()) or ()]
    tables = sorted({getattr(plan, "table"), *sources})
    work = 1.0
    work += 0.15 * len(getattr(plan, "measurements", ()))
    work += 0.5 * len(getattr(plan, "group_keys", ()))
    work += 1.0 * max(0, len(sources) - 1)
    work += 3.0 * len(getattr(plan, "value_releases", ()))
    work += 0.5 if getattr(plan, "selection", None) is not None else 0.0
    work += 0.5 if getattr(plan, "where", None) is not None else 0.0
    return tables, work


class Timing:
    """Deadlines and the engine slot for one engine (see the module docstring).

    Args:
        model: the speed model.
        rows: casefolded table name -> the size the model assumes (public or coarsened).
        interrupt: stops the engine's running statement (``DuckDBEngine.interrupt``).
    """

    def __init__(self, model: TimingModel, rows: Mapping[str, int], interrupt: Callable[[], None]) -> None:
        self.model = model
        self._rows = {name.casefold(): int(n) for name, n in rows.items()}
        self._interrupt = interrupt
        self._slot = threading.Lock()
        self._watchdog = Watchdog(interrupt)  # run_until's interrupts: one thread, re-armed per query
        self.overruns = 0

    @property
    def slot(self) -> threading.Lock:
        """Held by every read of the engine made for an analyst (planning's reads of public
        tables included), so that none of them can time another's run."""
        return self._slot

    def deadline(self, plan: object) -> float:
        """Seconds from the start of the run to the release of ``plan``'s answer."""
        tables, work = plan_work(plan)
        rows = sum(self._rows.get(t.casefold(), MIN_ROWS) for t in tables)
        return self.model.seconds(rows, work)

    def hold(self, work: Callable[[threading.Event], _T], seconds: float) -> _T:
        """Run ``work`` in the slot and release its outcome ``seconds`` after it started.

        ``work`` gets an event that is set when the deadline has passed: it must then give
        up before reading data, or discard what it read. Its answer or error is returned or
        raised at the deadline; a refusal made before any data was read
        (:class:`BudgetExceeded`, :class:`RateLimited`) at once. A run still going at the
        deadline is interrupted and :class:`QueryFailed` is raised.
        """
        with self._slot:
            deadline = time.monotonic() + seconds
            cancelled = Deadline(deadline)
            done = threading.Event()
            box: list[tuple[bool, object]] = []

            def run() -> None:
                try:
                    box.append((True, work(cancelled)))
                except BaseException as exc:  # noqa: BLE001 - carried to the caller
                    box.append((False, exc))
                finally:
                    done.set()

            threading.Thread(target=run, name="dpsql-deadline", daemon=True).start()
            overran = not done.wait(seconds)
            if overran:
                cancelled.set()
                self._interrupt()
                done.wait()
                self.overruns += 1
                log.warning("a query ran past its deadline of %.3f s and was interrupted; the analyst "
                            "got QueryFailed (charged). Raise [server] deadline_slack if honest "
                            "queries overrun.", seconds)
            ok, value = box[0]
            if not overran and not ok and isinstance(value, _BEFORE_DATA):
                raise value  # decided before any data was read: nothing to hide
            _sleep_until(deadline)
        if overran:
            raise QueryFailed()
        if ok:
            return value  # type: ignore[return-value]
        raise value  # type: ignore[misc]

    def run_until(self, work: Callable[[threading.Event], _T], at: float) -> _T:
        """The engine half of a release-only hold (a worker's, :mod:`dpsql.workers`): run
        ``work`` in this thread now, its :class:`Deadline` set and the engine interrupted at
        ``at`` (``time.monotonic()``, one clock for every process of the machine); return
        at once, holding nothing: the front holds the release (:class:`ReleaseTiming`).

        A query whose deadline passed before it started (it waited behind others) still
        runs with its deadline already set: it is charged and reads nothing it releases.

        Raises:
            QueryFailed: the deadline passed before ``work`` finished (its outcome is dropped).
        """
        late = Deadline(at)
        with self._slot:
            armed = at > time.monotonic()
            if armed:
                self._watchdog.arm(at, late)
            else:
                late.set()
            try:
                value = work(late)
            except BaseException:
                if late.is_set():
                    raise QueryFailed() from None
                raise
            finally:
                if armed:
                    self._watchdog.disarm()  # an interrupt in flight lands before the next query starts
        if late.is_set():
            raise QueryFailed()
        return value


class Overrun(QueryFailed):
    """An answer that missed its deadline (or a query that waited past it): the analyst
    gets the plain :class:`~dpsql.errors.QueryFailed` at the deadline (:class:`ReleaseTiming`)."""


class ReleaseTiming(Timing):
    """The front's half of a release-only hold: the answer waits for its release here (a
    sleeping thread, no process and no engine slot held), while the engine work runs in a
    worker that takes its next query as soon as it is done (:meth:`Timing.run_until`).

    When the clock of a query's deadline starts is scheduled from public facts only: ``lanes``
    virtual slots (one per worker), each taken for the query's *modelled run time*
    (:meth:`TimingModel.run_time`: the deadline without its slack and margin), not for its
    whole deadline. A query's deadline starts when the first lane is free (at once when one
    is idle), and it is released that deadline later. A burst of queries then queues at
    public times, as with the slot hold, but a lane is held for ``headroom`` (1.5) modelled
    run times where the slot hold holds a slot for ``slack`` (3) of them and the margin:
    throughput is about ``lanes / (headroom x run time)``. The real workers take the queries
    in order as soon as they are free; a query overruns only if the real work falls behind
    the schedule by more than the slack's room.

    ``work`` gets a :class:`Deadline` whose ``at`` it hands to the worker; it must return
    or raise by then, raising :class:`Overrun` when the worker did not answer in time.
    Everything that comes back from a worker is released at the deadline, refusals by the
    budget included (the wait behind other queries, which is in their time, must not show).
    """

    def __init__(self, model: TimingModel, rows: Mapping[str, int], interrupt: Callable[[], None], *,
                 lanes: int = 1, headroom: float = HEADROOM) -> None:
        super().__init__(model, rows, interrupt)
        self._lanes = [0.0] * max(1, lanes)  # when each lane is free again (time.monotonic())
        self._headroom = headroom
        self._schedule = threading.Lock()
        self.usage = DeadlineUsage()

    def start(self, seconds: float) -> float:
        """When the deadline of a query whose deadline is ``seconds`` starts, arriving now:
        the first free lane's time (public: arrivals and plans only), the lane then taken
        for the modelled run time."""
        run = self._headroom * self.model.run_time(seconds)
        with self._schedule:
            now = time.monotonic()
            lane = min(range(len(self._lanes)), key=self._lanes.__getitem__)
            start = max(now, self._lanes[lane])
            self._lanes[lane] = start + run
        return start

    def hold(self, work: Callable[[threading.Event], _T], seconds: float) -> _T:
        start = self.start(seconds)
        late = Deadline(start + seconds, need=self.model.run_time(seconds))
        try:
            value = work(late)
        except QueryFailed as exc:  # an overrun, a dead worker, a failed run: one fixed outcome
            overran = True
            if isinstance(exc, Overrun):
                self.overruns += 1
                self.usage.record(None, None)
                log.warning("a query missed its deadline of %.3f s (waiting for a worker or running); the "
                            "analyst got QueryFailed (charged). Raise [server] deadline_slack if honest "
                            "queries overrun.", seconds)
        except BaseException:
            _sleep_until(late.at)
            raise
        else:
            overran = False
            run = self.model.run_time(seconds)
            self.usage.record((time.monotonic() - start) / seconds,
                              None if late.ran is None or run <= 0 else late.ran / run)
        if overran:
            _sleep_until(late.at)
            raise QueryFailed() from None
        _sleep_until(late.at)
        return value


class Deadline(threading.Event):
    """Set once a query's deadline has passed; ``at`` is that deadline on ``time.monotonic()``."""

    def __init__(self, at: float, need: float = 0.0) -> None:
        super().__init__()
        self.at = at
        self.need = need  # the modelled run time: a worker does not start it with less time left
        self.ran: float | None = None  # the worker's run time, when a worker says (ReleaseTiming)


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def table_sizes(policy: object, engine: object) -> dict[str, int]:
    """The size the deadline model assumes for each policy table: ``declared_rows``, else
    the catalog's count (a view's, counted once) coarsened by :func:`coarse_rows`."""
    counts: dict[str, int] = getattr(engine, "row_counts")()
    sizes = {}
    for name, table in getattr(policy, "tables").items():
        if getattr(table, "model", "central") == "local":
            continue  # answered from the report store, never by the engine
        declared = getattr(table, "declared_rows", None)
        if declared is not None:
            sizes[name] = int(declared)
            continue
        count = counts.get(name)
        if count is None:  # a view: count it once, at open
            ref = getattr(engine, "table")(name)
            count = int(getattr(engine, "run")(f"SELECT COUNT(*) FROM {ref.sql(dialect='duckdb')}").column(0)[0].as_py())
        sizes[name] = coarse_rows(count)
    return sizes


def settle() -> None:
    """Collect, then put every object alive now (modules, the policy, the engine, warmed-up
    caches) out of the garbage collector's reach (:func:`gc.freeze`), in a server process
    ready to serve: its full collections then scan only what it made since. A collection
    stops the process, and a stop inside a query's deadline is an overrun (or a late
    release) that says nothing about the data but costs an answer. Measured (issue 16,
    ``benchmarks/bench_server.py``, both models pinned at a 4 ms base, interleaved with the
    code before): 4 overruns in ~1,900 answers against 24; a worker's full collections had
    taken up to 97 ms (~126,000 tracked objects, deadlines ~35 ms). :func:`unsettle` when
    it stops serving (a server run in a thread of a longer process, as in the tests)."""
    gc.collect()
    gc.freeze()


def unsettle() -> None:
    """Give the objects :func:`settle` set apart back to the collector."""
    gc.unfreeze()

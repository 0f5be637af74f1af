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
   synthetic data (:func:`calibrate`). The answer, or its error, is held until the deadline
   and released then, never earlier.
3. **A default outcome on overrun.** A run still going at its deadline is interrupted and
   the analyst gets the fixed :class:`~dpsql.errors.QueryFailed` at the deadline. The
   query was charged before it read anything, so the overrun is a charged release whose
   only content is its outcome class.
4. **Slots.** A query that reads private data holds an engine slot for exactly its
   deadline, so one query's run time cannot show in another's: the wait for a slot is
   made of deadlines, which are public. One process has one slot; a server with
   ``--workers N`` has N (one per worker process, :mod:`dpsql.workers`), so N fresh
   queries run side by side and throughput scales with the cores.

CPU contention (several slots). With N slots on C cores, the runs in the other slots
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
and the ledger only.

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

import logging
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from dpsql.engine import DuckDBEngine
from dpsql.errors import BudgetExceeded, QueryFailed, RateLimited
from dpsql.policy import parse_policy
from dpsql.privacy import Ledger

__all__ = ["Timing", "TimingModel", "available_cores", "calibrate", "coarse_rows", "contention", "table_sizes", "warm_up"]

log = logging.getLogger("dpsql")

_T = TypeVar("_T")

#: Refusals decided before any private data is read: released at once.
_BEFORE_DATA = (BudgetExceeded, RateLimited)

#: The smallest size a table is assumed to have (coarsening).
MIN_ROWS = 1024


@dataclass(frozen=True)
class TimingModel:
    """How long a query may take: ``slack * (base + per_row * rows * work) + margin``.

    Attributes:
        base: seconds a query costs whatever its size (planning, SQL, noise, ledger).
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
        return self.slack * self.contention * (self.base + self.per_row * rows * work) + self.margin


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
    aggregate, key, join, order statistic (which reads the values again, sorted) and
    partition selection adds a share, from measurements of ``benchmarks/bench_timing.py``.
    """
    sources = [getattr(s, "table") for s in getattr(plan, "sources", ()) or ()]
    tables = sorted({getattr(plan, "table"), *sources})
    work = 1.0
    work += 0.15 * len(getattr(plan, "measurements", ()))
    work += 0.5 * len(getattr(plan, "group_keys", ()))
    work += 1.0 * max(0, len(sources) - 1)
    work += 3.0 * len(getattr(plan, "value_releases", ()))
    work += 0.5 if getattr(plan, "selection", None) is not None else 0.0
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
            cancelled = threading.Event()
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


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def calibrate(rows: tuple[int, int] = (2_000, 200_000), repeats: int = 3, *,
              pipeline: Callable[..., Any], engine: Any = None) -> TimingModel:
    """Measure this machine's speed on synthetic data (never the private data).

    ``pipeline`` is the :class:`~dpsql.connection.Connection` class whose path is timed
    (passed in: the connection sits above this module and uses it). ``engine``: the engine
    the deadlines are for; its ``scratch(rows)`` gives an engine of the same kind over the
    generated table (a Spark query costs a second where DuckDB's costs milliseconds);
    ``None`` or an engine without it: DuckDB.

    Runs ``SELECT g, COUNT(*), AVG(x) FROM t GROUP BY g`` through the whole pipeline on two
    generated tables of ``rows`` rows and fits ``base + per_row * rows`` to the median of
    ``repeats`` runs of each (after one warm-up run), each rounded up to a 19% step. The
    tails are the slack's job. Takes one to two seconds on DuckDB.
    """
    policy = parse_policy(_CALIBRATION_POLICY, "<timing calibration>")
    scratch = getattr(engine, "scratch", None) or _duckdb_scratch
    times = []
    with tempfile.TemporaryDirectory(prefix="dpsql-calibration-") as folder:
        for n in rows:
            synthetic = scratch(int(n))
            # A ledger file and an answers file, as the server has: their commits are part
            # of every new query's time.
            ledger = Ledger(os.path.join(folder, f"ledger{n}.sqlite"))
            conn = pipeline(synthetic, policy, "calibration", ledger)
            try:
                runs = []
                for i in range(repeats + 1):  # the first run warms caches up and is not counted
                    sql = "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY g"
                    plan = conn.plan(sql, epsilon=1.0 - i * 1e-6)  # a new query each time
                    started = time.perf_counter()
                    conn._answer(plan, sql)  # what a deadline covers: from the charge on
                    runs.append(time.perf_counter() - started)
                times.append(statistics.median(runs[1:] or runs))
            finally:
                conn.close()
                synthetic.close()
    per_row = max(1e-9, (times[1] - times[0]) / (rows[1] - rows[0]))
    base = max(1e-3, times[0] - per_row * rows[0])
    return TimingModel(base=_quantized(base), per_row=_quantized(per_row))


def _duckdb_scratch(rows: int) -> DuckDBEngine:
    """A DuckDB engine over the calibration table ``t``: ``u`` (four rows each), ``g``
    (seven groups), ``x`` in [0, 1000); closed with its connection."""
    import duckdb

    con = duckdb.connect(":memory:", config={"python_enable_replacements": False})
    con.execute(f"CREATE TABLE t AS SELECT range // 4 AS u, 'g' || (range % 7) AS g, "
                f"(range * 7919 % 1000)::DOUBLE AS x FROM range({int(rows)})")
    return _ScratchDuckDB(con)


class _ScratchDuckDB(DuckDBEngine):
    def close(self) -> None:
        self._con.close()


def warm_up(pipeline: Callable[..., Any]) -> None:
    """Run the pipeline once on a small synthetic table, so that what a process does only
    the first time (imports, caches) does not fall inside the first analyst's deadline.
    :func:`calibrate` does this itself; a server whose model is pinned calls this."""
    calibrate(rows=(100, 200), repeats=0, pipeline=pipeline)


def _quantized(value: float) -> float:
    """``value`` rounded up to a step of 2**(1/4) (19%): two calibrations on one machine
    then mostly agree, and the model carries less of the moment it was measured.

    >>> _quantized(1.0), round(_quantized(1.1), 4)
    (1.0, 1.1892)
    """
    return float(2.0 ** (math.ceil(4 * math.log2(value) - 1e-9) / 4))


_CALIBRATION_POLICY = """
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 1.0
[budget]
default = { epsilon = 1000000.0, delta = 1e-5 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 4
[tables.t.columns]
g = { public_values = ["g0", "g1", "g2", "g3", "g4", "g5", "g6"] }
x = { bounds = [0, 1000] }
"""


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

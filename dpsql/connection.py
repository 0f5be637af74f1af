"""Connection: chains the passes (DESIGN §2).

``execute`` is the whole pipeline, one line per pass (:meth:`Connection._fresh`)::

    plan    = bind(analyze(sql, policy, schema, epsilon, delta), engine)  # every refusal, no data read
    bounded = bounded_query(plan)                            # rewrite: the plan alone -> bounded SQL
    ledger.reserve(analyst, budget, charge_of(plan, sql))    # decided before any private table is read
    exact   = engine.run(prepared, bounded.arguments())      # engine: bounded, clipped, exact sums
    noisy   = noisy_table(plan, exact)                       # release: discrete noise, aggregates
    table   = postprocessor.run(plan, noisy)                 # postprocess: select list, HAVING, ORDER BY
    result  = fresh_result(plan, table, cells, sql)          # report: privacy report and accuracy

with the repeat store (:func:`dpsql.repeats.answer_once`) wrapped around the last five.
The analyst's SQL is read (parsed and normalized) once per new query text, epsilon is
checked once (:func:`dpsql.analyze.budget.resolve_budget`) and split once
(:func:`dpsql.analyze.budget.split_budget`); ``docs/pipeline.md`` follows epsilon hop by hop.

Everything an analyst observes is a release (DESIGN §7), so the order matters:

- A query refused by ``analyze`` charges nothing and has read nothing.
- The ledger decides and records the charge *before* the engine reads a private table, for
  every accountant: a query the budget cannot pay is refused (:class:`BudgetExceeded`)
  without running.
- If reading the data then fails, the charge stands and the analyst gets one fixed,
  message-free :class:`~dpsql.errors.QueryFailed` (:mod:`dpsql.read`).
- An error in post-processing (HAVING, casts of the select list) depends only on noisy
  values and is charged like an answer.

Free repeats (:mod:`dpsql.repeats`): a query answered before, on the same data version, is
served its first answer again, charged nothing (``res.cached``); not with ``repeats=False``
nor for a query using a registered UDF. Timing (:mod:`dpsql.timing`): with ``deadline=`` an
answer that read data is held until a deadline computed from public facts only. Dry runs
(:mod:`dpsql.explain`): ``explain`` and ``epsilon_for`` read no data and charge nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

import sqlglot.expressions as exp

from dpsql.analyze import analyze
from dpsql.normalize import Normalized, check_dialect, normalize
from dpsql.normalize import without_options as _without_options
from dpsql.privacy import BudgetStatus, Charge, Ledger
from dpsql.public import engine_query, public_only, public_result
from dpsql.repeats import CachedAnswer, PlanKeys, Released, RepeatCache, answer_once, policy_fingerprint
from dpsql.cursor import DBAPIConnection
from dpsql.engine import Engine, bind
from dpsql.errors import Error, QueryFailed, QueryRejected
from dpsql.explain import Explanation, dry_run_composition, smallest_epsilon
from dpsql.local.query import answer as answer_local
from dpsql.local.query import references_local_table
from dpsql.local.store import ReportStore, open_report_store
from dpsql.noise import RandomSource
from dpsql.plan import QueryPlan
from dpsql.plancache import PlanCache
from dpsql.remembered import Bound, Memo
from dpsql.policy import Policy
from dpsql.postprocess import Postprocessor
from dpsql.release import noisy_schema
from dpsql.release.bias import DEADLINE_FACTOR, attach, estimate_bias
from dpsql.release.clamp import clamp_result
from dpsql.result import Result
from dpsql.read import Reader
from dpsql.rewrite import bounded_query
from dpsql.timing import Timing
from dpsql.release.udf.registry import UDF, check_strategy, validate_udf
from dpsql.report import charge_of, fresh_result, listed_keys_result, privacy_report, uses_udf, with_values

__all__ = ["Connection", "Explanation"]

log = logging.getLogger("dpsql")
T = TypeVar("T")

#: Plans remembered per connection (and their repeat keys), and over all the connections of a
#: process (dpsql.remembered); one not remembered is made again from its template (~0.3 ms).
_PLAN_CACHE, _PLANS = 32, Bound(256)

#: Keys from a joined public table with more distinct values than this are treated as private.
MAX_PUBLIC_KEYS = 10_000


class Connection(DBAPIConnection):
    """A differentially private view of one database for one analyst; also a DB-API 2.0
    connection (``cursor()``, ``commit()``, ``rollback()``, ``close()``: :mod:`dpsql.dbapi`).

    Attributes:
        epsilon, delta: what a cursor's ``execute`` spends when neither the cursor nor the
            call names it (``None``: the policy's ``default_epsilon``, and 0).
    """

    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        analyst: str,
        ledger: Ledger,
        *,
        noise_source: RandomSource | None = None,
        repeats: bool = True,
        answers: RepeatCache | None = None,
        timing: Timing | None = None,
        reports: str | os.PathLike[str] | ReportStore | None = None,
        dialect: str | None = None,
    ) -> None:
        """Chain the passes over ``engine`` for ``analyst``.

        Args:
            repeats: serve a repeated query its first answer, free (see :mod:`dpsql.repeats`);
                ``False`` charges every execute and draws fresh noise each time.
            answers: where released answers are kept for free repeats; by default beside
                the ledger's file (``<ledger>.answers``), or in memory for an in-memory
                ledger. No repeats when the engine has no ``data_version``.
            timing: hold every answer that reads data until its deadline
                (:mod:`dpsql.timing`); ``None``: answer as soon as done.
            reports: the report store of the policy's local tables (:mod:`dpsql.local`): a
                path (opened here, closed with the connection) or a ``ReportStore``.
            dialect: the SQL dialect queries are written in unless ``execute`` names one.
        """
        if not isinstance(analyst, str) or not analyst:
            raise Error("analyst must be a non-empty string naming whose budget is charged.")
        self._engine = engine
        self._policy = policy
        self._analyst = analyst
        self._dialect = check_dialect(dialect)
        self._ledger = ledger
        self._source = noise_source
        self._reports, self._owns_reports = open_report_store(reports)
        self._closed = False
        self._anchor_cache: str | None = None
        self._keys = PlanKeys(_PLAN_CACHE)
        self._udfs: dict[str, UDF] = {}
        self._plans: Memo[QueryPlan] = Memo(_PLAN_CACHE, _PLANS, self._dropped)
        self._templates = PlanCache()
        self._reader = Reader(engine, noise_source, self._udfs)
        self._answers: RepeatCache | None = None
        self._timing = timing
        if repeats and hasattr(engine, "data_version"):
            self._answers = answers if answers is not None else RepeatCache.beside(getattr(ledger, "path", None))
        self._policy_fingerprint = policy_fingerprint(policy)
        self._post = Postprocessor()

    @property
    def analyst(self) -> str:
        return self._analyst

    @property
    def policy(self) -> Policy:
        return self._policy

    def plan(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
             dialect: str | None = None) -> QueryPlan:
        """Analyze ``sql``: every check, no data read, nothing charged.

        ``dialect`` names the SQL dialect ``sql`` is written in (sqlglot's readers:
        "postgres", "bigquery", "tsql", "spark" ...; default: the connection's, else
        DuckDB's). Plans are remembered per (SQL text, epsilon, delta, dialect) for this
        connection (they depend only on those, the policy, the schema and the registered
        UDFs, which clears them)."""
        plan = self._query(sql, epsilon, delta, dialect, public=False)
        assert isinstance(plan, QueryPlan)
        return plan

    def _query(self, sql: str, epsilon: float | None, delta: float | None, dialect: str | None, *,
               public: bool, bias: bool = False) -> QueryPlan | exp.Select:
        """The plan of ``sql`` (remembered per SQL text, requested epsilon and delta,
        dialect and ``bias``: a remembered plan passed every check), or with ``public``, the
        normalized query when it reads public tables only. The SQL is read once here;
        epsilon and delta are checked and split once, by the analyzer (with ``bias``, the
        bias estimates' share too)."""
        self._check_open()
        dialect = dialect or self._dialect
        # a remembered plan is found only by values the analyzer accepted (any other is
        # refused by it, and may not even be hashable)
        plain = all(v is None or type(v) in (int, float) for v in (epsilon, delta))
        key = (sql, epsilon, delta, dialect, bias) if isinstance(sql, str) and plain else None
        cached = self._plans.get(key) if key is not None else None
        if cached is not None:
            return cached
        normalized = self._normalize(sql, dialect)
        select = normalized.select if normalized is not None else None
        if public and select is not None and public_only(select, self._policy, self._engine.schema()):
            return select
        plan = self._templates.plan(  # learned with other constants or aliases: rebound (dpsql.plancache)
            sql, normalized, None if key is None else key[1:], self._checked,
            lambda n: self._analyze(sql, epsilon=epsilon, delta=delta, dialect=dialect, normalized=n, bias=bias))
        if key is not None:
            self._plans.put(key, plan)
        return plan

    def _dropped(self, plan: QueryPlan) -> None:  # nor are its repeat key and prepared query
        self._keys.drop(plan)
        self._reader.forget(plan)

    def _normalize(self, sql: str, dialect: str | None) -> Normalized | None:
        """The analyst's SQL, parsed and normalized (:mod:`dpsql.normalize`); ``None`` when
        it cannot be read (the analyzer then gives the refusal, after its budget check)."""
        try:
            return normalize(sql, self._policy, self._engine.schema(), dialect=dialect, public_query=self._public_rows)
        except QueryRejected:
            return None

    def _analyze(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
                 dialect: str | None = None, normalized: Normalized | None = None, bias: bool = False) -> QueryPlan:
        """Analyze and bind ``sql``, then the refusals post-processing and the release
        would make, before any charge."""
        return self._checked(self._bound_plan(sql, epsilon, delta, dialect, normalized=normalized, bias=bias))

    def _checked(self, plan: QueryPlan) -> QueryPlan:
        """``plan``, after the refusals post-processing and the release would make."""
        self._post.check(plan, noisy_schema(plan))
        for release in plan.value_releases:  # refusals the release would make: before the charge
            check_strategy(release.target, plan.delta)
        return plan

    def _public_rows(self, query: exp.Select) -> list[tuple[object, ...]]:
        """The rows of a query over public tables only (:mod:`dpsql.normalize` checked it)."""
        text = engine_query(query, self._engine)
        return self._apart(lambda: [tuple(r.values()) for r in self._engine.run(text).to_pylist()])

    def _apart(self, work: Callable[[], T]) -> T:
        """``work()``, not while another query runs when answers are timed: its time would show."""
        if self._timing is None:
            return work()
        with self._timing.slot:
            return work()

    def _public_values(self, table: str, column: str) -> tuple[object, ...] | None:
        """A public table's distinct values of a column (public data), ``None`` past
        ``MAX_PUBLIC_KEYS`` (such a key then goes through partition selection)."""
        if not self._policy.table(table) or not self._policy.table(table).public:  # type: ignore[union-attr]
            return None
        return self._apart(lambda: self._engine.distinct_values(table, column, MAX_PUBLIC_KEYS))

    def explain(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
                dialect: str | None = None) -> Explanation:
        """What ``sql`` would be charged, its mechanisms, bounded SQL and expected accuracy.

        Reads no data and charges nothing (see :class:`~dpsql.explain.Explanation`). The
        charge shown is the query's own (epsilon, delta) and, when the ledger's accountant
        can compose without recording, what the analyst's total would become. A repeat of
        a query already answered on unchanged data would be free; telling whether the data
        changed needs a read, so the full cost is shown.

        Examples are in :mod:`dpsql.explain`.
        """
        plan = self.plan(sql, epsilon=epsilon, delta=delta, dialect=dialect)
        bounded = self._engine.shown_sql(bounded_query(plan, salt=0).query)
        budget = self._policy.budget_for(self._analyst)
        composition = dry_run_composition(self._ledger, self._analyst, budget, charge_of(plan, sql))
        return Explanation(
            plan, bounded, privacy_report(plan), composition,
            replan=lambda eps: self._replan(sql, eps, plan.delta, dialect),
            max_epsilon=self._policy.max_epsilon_per_query,
        )

    def epsilon_for(
        self,
        sql: str,
        column: str,
        half_width: float,
        *,
        delta: float | None = None,
        count: float | None = None,
        mean: float | None = None,
    ) -> float:
        """The smallest epsilon for which output ``column`` of ``sql`` has an expected 95%
        half-width of at most ``half_width``. Plans only: reads no data, charges nothing.

        Args:
            sql: the query.
            column: an output column (a bare COUNT, SUM or AVG).
            half_width: the target 95% half-width, in the column's units.
            delta: the query's delta (0 by default: Laplace noise).
            count: for an AVG, the rows averaged per group (after contribution bounding).
            mean: for an AVG, the assumed mean (default: the worst case, a bound).

        Raises:
            Error: even the policy's ``max_epsilon_per_query`` cannot reach the target, or
                the column's accuracy depends on the data (an expression; an AVG without
                ``count``).
        """
        plan = self.plan(sql, epsilon=self._policy.max_epsilon_per_query, delta=delta)
        return smallest_epsilon(
            lambda eps: self._replan(sql, eps, plan.delta), column, half_width,
            self._policy.max_epsilon_per_query, count=count, mean=mean,
        )

    def _bound_plan(self, sql: str, epsilon: float | None, delta: float | None, dialect: str | None, *,
                    normalized: Normalized | None = None, bias: bool = False) -> QueryPlan:
        """``analyze`` then ``bind``: the one place a plan is made (no data, no charge)."""
        return bind(analyze(
            sql, self._policy, self._engine.schema(), epsilon=epsilon, delta=delta,
            public_values=self._public_values, udfs={name: udf.spec for name, udf in self._udfs.items()},
            dialect=dialect, public_rows=self._public_rows,
            normalized=normalized, bias=bias,
        ), self._engine)

    def _replan(self, sql: str, epsilon: float, delta: float, dialect: str | None = None) -> QueryPlan:
        """Plan an already-checked query at another epsilon (pure: no data, no charge)."""
        self._check_open()
        return self._bound_plan(_without_options(sql), epsilon, delta, dialect or self._dialect)

    def execute(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
                clamp_counts: bool = False,
                bias: bool = False,
                dialect: str | None = None) -> Result:
        """Answer ``sql`` with differential privacy, charging (epsilon, delta).

        A repeat (same analyst, normalised SQL, epsilon, delta, policy and data version)
        returns the answer already released and charges nothing; see the module docstring.
        ``clamp_counts=True`` shows a negative bare COUNT, or SUM of a column with lower
        bound >= 0, as 0 (post-processing, free; the interval stays valid:
        :mod:`dpsql.release.clamp`).
        ``bias=True`` spends 10% of the query's epsilon (charged with it, before any data is
        read) on noisy counts, per cell, of the selected rows the caps dropped and of the
        values clipped into their bounds: ``res.bias`` (totals, and ``res.bias.cells``), a
        note in ``res.privacy``, and a second table in ``res.format()`` (:mod:`dpsql.release.bias`).
        Under deadlines it is held for ``DEADLINE_FACTOR`` (4) times the deadline; never a free repeat.

        Raises:
            QueryRejected, PolicyViolation: the query cannot be answered; nothing charged.
            BudgetExceeded: the budget cannot pay; nothing charged, no data read.
            QueryFailed: charged, then the run failed (one fixed message, see above).
        """
        if references_local_table(sql, self._policy):  # local DP: post-processing, no charge
            self._check_open()
            return answer_local(sql, self._policy, self._reports)
        # analyze: every refusal, no data read; with bias, the estimates' share of epsilon is set aside
        plan = self._query(sql, epsilon, delta, dialect, public=True, bias=bias)
        if not isinstance(plan, QueryPlan):  # only public tables: exact, free
            return public_result(plan, self._engine, sql)
        if not plan.measurements and plan.selection is None and not plan.value_releases:
            return listed_keys_result(plan, self._post, sql)  # keys the policy lists: free
        timing = self._timing
        if bias and timing is None:
            result = self._execute_with_bias(plan, sql)
        elif bias and timing is not None:  # a second pass over the same rows, grouped as the query's
            result = timing.hold(lambda late: self._execute_with_bias(plan, sql, late),
                                 DEADLINE_FACTOR * timing.deadline(plan))
        elif timing is None:
            result = self._answer(plan, sql)
        elif (stored := self._stored(plan)) is not None:  # a free repeat: reads no data, not held
            result = stored.result(plan, sql)
        else:
            result = timing.hold(lambda late: self._answer(plan, sql, late), timing.deadline(plan))
        return clamp_result(result, plan) if clamp_counts else result

    def _execute_with_bias(self, plan: QueryPlan, sql: str, late: threading.Event | None = None) -> Result:
        """The query at ``plan.epsilon`` and the bias estimates at ``plan.bias_epsilon``
        (the analyzer's split, :mod:`dpsql.release.bias`): one charge for both, before any
        data is read, and both reads inside the deadline; no repeat store."""
        share = plan.bias_epsilon
        charge = charge_of(plan, sql)
        self._ledger.charge(self._analyst, self._policy.budget_for(self._analyst), charge)
        noisy, values = self._reader.read(plan, late)
        try:
            if late is not None and late.is_set():
                raise TimeoutError
            estimate, per_group = estimate_bias(plan, self._engine, share, noisy, self._source)
            if late is not None and late.is_set():
                raise TimeoutError
        except Exception as exc:  # noqa: BLE001 - charged: the one fixed failure, as in read.py
            log.warning("a charged bias estimate failed (%s)", type(exc).__name__)
            estimate = None
        if estimate is None:
            raise QueryFailed()
        table, cells = self._post.run(plan, noisy)
        result = with_values(fresh_result(plan, table, cells, sql, cached=False), plan, values)
        names = [n for n in per_group.column_names if n.startswith("__bias")]
        return attach(result, plan, estimate, self._post.carry(plan, per_group, names), charge.epsilon)

    def answer_plan(self, plan: QueryPlan, sql: str, late: threading.Event | None = None, *,
                    bias: bool = False) -> Result:
        """The charge, read and release of :meth:`execute` for a plan that a Connection of the
        same analyst, policy and database made (a server's front, :mod:`dpsql.workers`):
        no planning, no hold (``late``: the deadline, :meth:`dpsql.timing.Timing.run_until`),
        nothing of the plan kept. ``bias``: with the bias estimates, as ``execute(bias=True)``."""
        self._check_open()
        if late is not None and late.is_set():
            # It waited past its deadline (the analyst has QueryFailed already): charged as an
            # overrun is, and nothing read, so a backlog costs the workers little.
            self._ledger.charge(self._analyst, self._policy.budget_for(self._analyst), charge_of(plan, sql))
            raise QueryFailed()
        try:
            if bias:
                return self._execute_with_bias(plan, sql, late)
            return self._answer(plan, sql, late)
        finally:
            self._reader.forget(plan)  # the plan came from elsewhere: never asked again here
            self._keys.drop(plan)

    def is_repeat(self, plan: QueryPlan, sql: str) -> bool:
        """Whether ``execute`` would serve ``plan`` from the repeat store, free (reads no data)."""
        return self._stored(plan) is not None

    def _stored(self, plan: QueryPlan) -> CachedAnswer | None:
        """``plan``'s answer in the repeat store, if any: one look (key, read, decode)."""
        if self._answers is None or uses_udf(plan):
            return None
        return self._answers.get(self._repeat_key(plan), self._anchor())

    def _answer(self, plan: QueryPlan, sql: str, late: threading.Event | None = None) -> Result:
        """A fresh answer, with the repeat store wrapped around it (keyed on the plan)."""
        if self._answers is None or uses_udf(plan):
            return self._fresh(plan, sql, charge_of(plan, sql), late).result
        return answer_once(self._answers, self._repeat_key(plan), self._anchor, self._analyst, plan, sql,
                           lambda: self._fresh(plan, sql, charge_of(plan, sql), late))

    def _fresh(self, plan: QueryPlan, sql: str, charge: Charge, late: threading.Event | None = None) -> Released:
        """charge -> engine -> release -> postprocess -> report: the charge is decided before
        any private table is read and on disk before anything is returned (its fsync
        overlaps the read: :mod:`dpsql.privacy.reservation`)."""
        reservation = self._ledger.reserve(self._analyst, self._policy.budget_for(self._analyst), charge)
        try:
            noisy, values = self._reader.read(plan, late)
            table, cells = self._post.run(plan, noisy)
            result = with_values(fresh_result(plan, table, cells, sql, cached=False), plan, values)
        finally:
            reservation.wait()
        return Released(result, table, cells)

    def register_udf(
        self,
        name: str,
        fn: object,
        bounds: tuple[float, float] | None = None,
        local_sensitivity: object = None,
        strategy: str = "auto",
        *,
        time_limit: float = 0.1,
    ) -> None:
        """Make ``name(column)`` usable in SQL as a private aggregate (DESIGN §4, §5).

        ``fn`` gets one block's values (a float64 numpy array) and returns a float, clipped
        into ``bounds``; a block that raises, returns NaN/inf or runs past ``time_limit``
        seconds contributes the midpoint of ``bounds``. With ``local_sensitivity(values, k)``
        (the most ``fn`` can change when k rows change) and a delta, PTR or smooth sensitivity
        may be used; otherwise sample-and-aggregate. ``strategy`` forces one.
        """
        udf = validate_udf(name, fn, bounds, local_sensitivity, strategy, time_limit=time_limit)
        self._udfs[udf.name] = udf
        self._plans.clear()
        self._templates.clear()
        self._reader.forget()

    def _repeat_key(self, plan: QueryPlan) -> str:
        return self._keys.key(plan, analyst=self._analyst, policy=self._policy_fingerprint,
                              data=self._engine.data_version())

    def _anchor(self) -> str:
        """The analyst's first ledger event (id and time): it changes only when the ledger
        is reset, which then invalidates every stored answer (see :mod:`dpsql.repeats`)."""
        if self._anchor_cache is None:
            events = getattr(self._ledger, "events", None)
            first = events(self._analyst)[:1] if events is not None else []
            if not first:
                return "no events"
            self._anchor_cache = f"{first[0].id}:{first[0].time!r}"
        return self._anchor_cache

    @property
    def closed(self) -> bool:
        return self._closed

    def budget(self) -> BudgetStatus:
        """What this analyst has spent and has left."""
        self._check_open()
        return self._ledger.status(self._analyst, self._policy.budget_for(self._analyst))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._templates.clear()  # their share of the process's bound (dpsql.remembered)
            self._plans.clear()
            self._post.close()
            if self._answers is not None:
                self._answers.close()
            self._engine.close()
            self._ledger.close()
            if self._owns_reports and self._reports is not None:
                self._reports.close()

    def _check_open(self) -> None:
        if self._closed:
            raise Error("this dpsql connection is closed; open a new one with dpsql.connect().")

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

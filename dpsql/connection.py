"""Connection: chains the passes (DESIGN §2).

``execute`` is the whole pipeline, one line per pass::

    plan  = analyze(sql, policy, schema, epsilon, delta)      # every refusal, no data read
    ledger.charge(analyst, budget, charge)                    # before any private table is read
    exact = engine.run(bounded_query(plan, engine))           # bounded, clipped, exact sums
    noisy = noisy_table(plan, exact)                          # discrete noise, aggregates
    table = postprocessor.run(plan, noisy)                    # select list, HAVING, ORDER BY

Everything an analyst observes is a release (DESIGN §7), so the order matters:

- A query refused by ``analyze`` charges nothing and has read nothing.
- The ledger decides and records the charge *before* the engine reads a private table, for
  every accountant: a query the budget cannot pay is refused (:class:`BudgetExceeded`)
  without running.
- If reading the data then fails (an engine error, an interrupt at the deadline, anything
  raised before the noise is added), the charge stands and the analyst gets one fixed,
  message-free :class:`~dpsql.errors.QueryFailed`: never the engine's text, which could
  quote or depend on one person's row. The cause goes to the ``dpsql`` logger (type and
  stack, no message) for the data owner.
- An error in post-processing (HAVING, casts of the select list) depends only on noisy
  values and is charged like an answer.

Free repeats (:mod:`dpsql.repeats`). Before anything is charged, ``execute`` looks the query
up by (analyst, normalised SQL, epsilon, delta, policy and noise, data version): an answer
released before is returned again, charged nothing, with ``res.cached`` true and a note in
``res.privacy.notes``. The data version is named without reading the data (see
:mod:`dpsql.engine`). Otherwise the charge, the run and the stored answer happen in one
transaction of the answers file, so that two processes asking the same new query pay once
and see one answer. A connection opened with ``repeats=False``, and a query that uses a
registered UDF (its code is not in the key) get no repeats: each execute is charged and
draws fresh noise.

Timing (:mod:`dpsql.timing`). With ``deadline=`` the answer (or error) of a query that reads
data is held until a deadline computed from public facts only; the server always does this.

Dry runs (:mod:`dpsql.explain`). ``explain`` and ``epsilon_for`` work on plans alone: they
read no data and charge nothing.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import traceback
from collections.abc import Mapping
from dataclasses import asdict, replace
from types import TracebackType
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.privacy import BudgetStatus, Charge, Ledger
from dpsql.analyze import analyze, resolve_budget
from dpsql.normalize import check_dialect, query_budget
from dpsql.normalize import without_options as _without_options
from dpsql.public import engine_query, public_only, public_result
from dpsql.repeats import RepeatCache, policy_fingerprint, repeat_key
from dpsql.datasources import open_engine
from dpsql.engine import Engine
from dpsql.errors import Error, QueryFailed
from dpsql.explain import Explanation, dry_run_composition, smallest_epsilon
from dpsql.local.query import answer as answer_local
from dpsql.local.query import references_local_table
from dpsql.local.store import ReportStore, open_report_store
from dpsql.noise import RandomSource
from dpsql.plan import QueryPlan
from dpsql.policy import Policy, check_against_schema, load_policy
from dpsql.postprocess import Postprocessor
from dpsql.release import noisy_schema, noisy_table
from dpsql.release.bias import BIAS_SHARE, DEADLINE_FACTOR, attach, bias_mechanisms, estimate_bias
from dpsql.release.clamp import clamp_result
from dpsql.result import Accuracy, Result
from dpsql.rewrite import bounded_query, bounded_sql, key_parameters, salt_parameters, value_query
from dpsql.timing import Timing, TimingModel, calibrate, table_sizes
from dpsql.release.udf.registry import UDF, check_strategy, validate_udf
from dpsql.report import charge_of, described, fresh_result, privacy_report, repeat_result, uses_udf, with_values

if TYPE_CHECKING:
    from dpsql.dbapi import Cursor

__all__ = ["Connection", "Explanation", "connect"]

log = logging.getLogger("dpsql")

#: Plans remembered per connection.
_PLAN_CACHE = 256

#: Keys from a joined public table with more distinct values than this are treated as private.
MAX_PUBLIC_KEYS = 10_000


class Connection:
    """A differentially private view of one database for one analyst; also a DB-API 2.0
    connection (``cursor()``, ``commit()``, ``rollback()``, ``close()``: :mod:`dpsql.dbapi`).

    Attributes:
        epsilon, delta: what a cursor's ``execute`` spends when neither the cursor nor the
            call names it (``None``: the policy's ``default_epsilon``, and 0).
    """

    epsilon: float | None = None
    delta: float | None = None

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
        self._udfs: dict[str, UDF] = {}
        self._plans: dict[tuple[str, float | None, float | None, str | None], QueryPlan] = {}
        self._sql_texts: dict[int, tuple[QueryPlan, str]] = {}
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
        self._check_open()
        dialect = dialect or self._dialect
        epsilon, delta = query_budget(sql, epsilon, delta)  # a BigQuery OPTIONS clause's
        epsilon, delta = resolve_budget(self._policy, epsilon, delta)  # checked before any lookup
        key = (sql, epsilon, delta, dialect)
        cached = self._plans.get(key) if isinstance(sql, str) else None
        if cached is not None:
            return cached
        plan = self._analyze(sql, epsilon=epsilon, delta=delta, dialect=dialect)
        if isinstance(sql, str):
            if len(self._plans) >= _PLAN_CACHE:
                self._plans.pop(next(iter(self._plans)))
                self._sql_texts.clear()
            self._plans[key] = plan
        return plan

    def _analyze(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
                 dialect: str | None = None) -> QueryPlan:
        plan = analyze(
            sql, self._policy, self._engine.schema(), epsilon=epsilon, delta=delta,
            public_values=self._public_values, udfs=self._udfs, dialect=dialect, public_rows=self._public_rows,
        )
        self._post.check(plan, noisy_schema(plan))
        for release in plan.value_releases:  # refusals the release would make: before the charge
            check_strategy(release.target, plan.delta)  # type: ignore[arg-type]
        return plan

    def _public_rows(self, query: exp.Select) -> list[tuple[object, ...]]:
        """The rows of a query over public tables only (:mod:`dpsql.normalize` checked it)."""
        text = engine_query(query, self._engine)
        if self._timing is not None:  # not while another query runs: its time would show
            with self._timing.slot:
                return [tuple(r.values()) for r in self._engine.run(text).to_pylist()]
        return [tuple(r.values()) for r in self._engine.run(text).to_pylist()]

    def _public_values(self, table: str, column: str) -> tuple[object, ...] | None:
        """A public table's distinct values of a column (public data), ``None`` past
        ``MAX_PUBLIC_KEYS`` (such a key then goes through partition selection)."""
        if not self._policy.table(table) or not self._policy.table(table).public:  # type: ignore[union-attr]
            return None
        if self._timing is not None:  # not while another query runs: its time would show
            with self._timing.slot:
                return self._engine.distinct_values(table, column, MAX_PUBLIC_KEYS)
        return self._engine.distinct_values(table, column, MAX_PUBLIC_KEYS)

    def explain(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
                dialect: str | None = None) -> Explanation:
        """What ``sql`` would be charged, its mechanisms, bounded SQL and expected accuracy.

        Reads no data and charges nothing (see :class:`~dpsql.explain.Explanation`). The
        charge shown is the query's own (epsilon, delta) and, when the ledger's accountant
        can compose without recording, what the analyst's total would become. A repeat of
        a query already answered on unchanged data would be free; telling whether the data
        changed needs a read, so the full cost is shown.

        >>> import duckdb, dpsql
        >>> from dpsql.policy import parse_policy
        >>> con = duckdb.connect()
        >>> _ = con.execute("CREATE TABLE t AS SELECT range AS uid, range % 100 AS x FROM range(1000)")
        >>> policy = parse_policy('''
        ... [privacy]
        ... max_epsilon_per_query = 1.0
        ... max_delta_per_query = 1e-6
        ... default_epsilon = 0.5
        ... [budget]
        ... default = { epsilon = 5.0, delta = 1e-5 }
        ... [tables.t]
        ... privacy_unit = "uid"
        ... max_groups_per_unit = 1
        ... max_rows_per_unit = 1
        ... [tables.t.columns]
        ... x = { bounds = [0, 100] }
        ... ''')
        >>> conn = dpsql.connect(con, policy=policy)
        >>> e = conn.explain("SELECT COUNT(*) AS n, AVG(x) AS mean_x FROM t", epsilon=0.5)
        >>> e.columns["n"].half_width, e.columns["mean_x"].depends_on
        (18.0, 'count')
        >>> round(e.half_width_for("mean_x", count=1000, mean=50), 2)
        0.9
        >>> conn.epsilon_for("SELECT COUNT(*) AS n FROM t", "n", 10)
        0.2996
        >>> conn.budget().queries
        0
        """
        plan = self.plan(sql, epsilon=epsilon, delta=delta, dialect=dialect)
        bounded = self._engine.shown_sql(bounded_query(plan, self._engine, salt=0))
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

    def _replan(self, sql: str, epsilon: float, delta: float, dialect: str | None = None) -> QueryPlan:
        """Plan an already-checked query at another epsilon (pure: no data, no charge)."""
        self._check_open()
        return analyze(
            _without_options(sql), self._policy, self._engine.schema(), epsilon=epsilon, delta=delta,
            public_values=self._public_values, udfs=self._udfs, dialect=dialect or self._dialect,
            public_rows=self._public_rows,
        )

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
        Under deadlines the answer is held for ``DEADLINE_FACTOR`` (4) times the query's deadline. Such a query is never a
        free repeat.

        Raises:
            QueryRejected, PolicyViolation: the query cannot be answered; nothing charged.
            BudgetExceeded: the budget cannot pay; nothing charged, no data read.
            QueryFailed: charged, then the run failed (one fixed message, see above).
        """
        if references_local_table(sql, self._policy):  # local DP: post-processing, no charge
            self._check_open()
            return answer_local(sql, self._policy, self._reports)
        self._check_open()
        public = public_only(sql, self._policy, self._engine.schema(), dialect=dialect or self._dialect,
                             public_query=self._public_rows)
        if public is not None:  # only public tables: exact, free
            return public_result(public, self._engine, sql)
        if bias:  # the estimate takes its share of the query's epsilon
            epsilon = (self._policy.default_epsilon if epsilon is None else epsilon) * (1 - BIAS_SHARE)
        plan = self.plan(sql, epsilon=epsilon, delta=delta, dialect=dialect)
        if not plan.measurements and plan.selection is None and not plan.value_releases:
            return self._listed_keys(plan, sql)
        timing = self._timing
        if bias and timing is None:
            result = self._execute_with_bias(plan, sql)
        elif bias and timing is not None:  # a second pass over the same rows, grouped as the query's
            result = timing.hold(lambda late: self._execute_with_bias(plan, sql, late),
                                 DEADLINE_FACTOR * timing.deadline(plan))
        elif self._timing is None or self.is_repeat(plan, sql):
            result = self._execute(plan, sql)
        else:
            result = self._timing.hold(lambda late: self._execute(plan, sql, late), self._timing.deadline(plan))
        return clamp_result(result, plan) if clamp_counts else result

    def _execute_with_bias(self, plan: QueryPlan, sql: str, late: threading.Event | None = None) -> Result:
        """The query at ``1 - BIAS_SHARE`` of the epsilon asked and the bias estimates at the
        rest (:mod:`dpsql.release.bias`): one charge for both, before any data is read, and
        both reads inside the deadline; no repeat store."""
        share = plan.epsilon * BIAS_SHARE / (1 - BIAS_SHARE)
        base = charge_of(plan, sql)
        charge = Charge(base.epsilon + share, base.delta, sql, (*base.mechanisms, *bias_mechanisms(plan, share)))
        self._ledger.charge(self._analyst, self._policy.budget_for(self._analyst), charge)
        noisy, report = self._read(plan, late)
        try:
            if late is not None and late.is_set():
                raise TimeoutError
            estimate, per_group = estimate_bias(plan, self._engine, share, noisy, self._source)
            if late is not None and late.is_set():
                raise TimeoutError
        except Exception as exc:  # noqa: BLE001 - charged: the one fixed failure, as in _read
            log.warning("a charged bias estimate failed (%s)", type(exc).__name__)
            estimate = None
        if estimate is None:
            raise QueryFailed()
        table, cells = self._post.run(plan, noisy)
        result = with_values(fresh_result(plan, table, cells, sql, cached=False), plan, report)
        names = [n for n in per_group.column_names if n.startswith("__bias")]
        return attach(result, plan, estimate, self._post.carry(plan, per_group, names), charge.epsilon)

    def _listed_keys(self, plan: QueryPlan, sql: str) -> Result:
        """GROUP BY keys the policy lists, and nothing measured (``SELECT DISTINCT region``):
        the answer is every listed value, known without the data, so nothing is read or
        charged (issue 14, item 3)."""
        schema = noisy_schema(plan)
        grid = list(itertools.product(*(k.public_values or () for k in plan.group_keys)))
        columns = [pa.array([row[i] for row in grid], type=schema.field(k.name).type) for i, k in enumerate(plan.group_keys)]
        noisy = pa.table(columns, names=[k.name for k in plan.group_keys])
        table, cells = self._post.run(plan, noisy)
        report = privacy_report(plan)
        note = "only keys the policy lists were asked for: the answer is known without the data, and free"
        return Result(table, replace(report, epsilon=0.0, delta=0.0, notes=(*report.notes, note)), Accuracy(cells), sql)

    def is_repeat(self, plan: QueryPlan, sql: str) -> bool:
        """Whether ``execute`` would serve ``plan`` from the repeat store, free (reads no data)."""
        if self._answers is None or uses_udf(plan):
            return False
        return self._answers.get(self._repeat_key(plan, sql), self._anchor()) is not None

    def _execute(self, plan: QueryPlan, sql: str, late: threading.Event | None = None) -> Result:
        if self._answers is None or uses_udf(plan):
            return self._charge_and_answer(plan, sql, charge_of(plan, sql), late)[0]
        key = self._repeat_key(plan, sql)
        cached = self._answers.get(key, self._anchor())
        if cached is not None:
            return repeat_result(plan, cached, sql)
        with self._answers.claim() as claim:
            cached = claim.get(key, self._anchor)  # read again after waiting for another asker
            if cached is not None:  # another connection answered it meanwhile
                return repeat_result(plan, cached, sql)
            result, table, cells = self._charge_and_answer(plan, sql, charge_of(plan, sql), late)
            claim.put(key, self._anchor(), self._analyst, sql, table, cells, asdict(result.privacy))
        return result

    def _charge_and_answer(
        self, plan: QueryPlan, sql: str, charge: Charge, late: threading.Event | None = None
    ) -> tuple[Result, pa.Table, dict[str, list[float | None]]]:
        """Charge (before any data is read), read and noise, post-process: a fresh answer,
        with the table and cells the repeat store keeps."""
        self._ledger.charge(self._analyst, self._policy.budget_for(self._analyst), charge)
        noisy, report = self._read(plan, late)
        table, cells = self._post.run(plan, noisy)
        return with_values(fresh_result(plan, table, cells, sql, cached=False), plan, report), table, cells

    def _read(self, plan: QueryPlan, late: threading.Event | None = None) -> tuple[pa.Table, dict[str, list[object]]]:
        """Run the bounded query and add the noise: the only step that reads private data.

        Called after the charge. Whatever goes wrong here (an engine error, an interrupt, a
        bug) becomes one :class:`QueryFailed` with a fixed message; the exception is
        logged for the data owner (type and stack, never its message) and raised outside
        this ``except`` block, so not even ``__context__`` carries it to the caller.
        ``late`` is set when the query's deadline has passed (:mod:`dpsql.timing`): what was
        read is then discarded.
        """
        try:
            text = self._bounded_sql(plan)
            exact = self._engine.run(text, {**salt_parameters(text), **key_parameters(plan, self._engine)})
            if late is None or not late.is_set():
                return self._noisy(plan, exact)
        except Exception as exc:  # noqa: BLE001 - every cause gets the same answer
            log.warning("a charged query failed while reading the data (%s); stack:\n%s",
                        type(exc).__name__, "".join(traceback.format_tb(exc.__traceback__)))
        raise QueryFailed()

    def _bounded_sql(self, plan: QueryPlan) -> str:
        """The bounded query's text, its salts left as parameters: generated once per plan
        (a plan is immutable; generating SQL is most of a small query's fixed cost)."""
        text = self._sql_texts.get(id(plan))
        if text is None or text[0] is not plan:
            text = (plan, bounded_sql(plan, self._engine))
            self._sql_texts[id(plan)] = text
        return text[1]

    def _noisy(self, plan: QueryPlan, exact: pa.Table) -> tuple[pa.Table, dict[str, list[object]]]:
        """Noisy aggregates, fetching first the values order statistics and UDFs read."""
        values = {r.name: self._engine.run(value_query(plan, r, self._engine)) for r in plan.value_releases}
        report: dict[str, list[object]] = {}
        return noisy_table(plan, exact, self._source, values=values, report=report), report

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
        self._sql_texts.clear()

    def _repeat_key(self, plan: QueryPlan, sql: str) -> str:
        return repeat_key(
            analyst=self._analyst, sql=plan.normalized or sql, epsilon=plan.epsilon, delta=plan.delta,
            policy=self._policy_fingerprint, noise=described(plan), data=self._engine.data_version(),
        )

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

    def cursor(self, *, epsilon: float | None = None, delta: float | None = None) -> Cursor:
        """A DB-API cursor spending ``epsilon``/``delta`` per execute (default: the
        connection's ``epsilon``/``delta``); see :mod:`dpsql.dbapi`."""
        from dpsql.dbapi import Cursor  # noqa: PLC0415 - dbapi builds on this module

        self._check_open()
        return Cursor(self, epsilon=self.epsilon if epsilon is None else epsilon,
                      delta=self.delta if delta is None else delta)

    def commit(self) -> None:
        """Nothing to commit (DB-API): dpsql only reads, and a charge is recorded when made."""

    def rollback(self) -> None:
        """Nothing to roll back (DB-API): a charge is final and is never undone."""

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


def connect(
    database: str | os.PathLike[str] | duckdb.DuckDBPyConnection | object | None = None,
    policy: str | os.PathLike[str] | Policy | None = None,
    analyst: str = "default",
    ledger: str | os.PathLike[str] | Ledger | None = None,
    *,
    noise_source: RandomSource | None = None,
    repeats: bool = True,
    data_version: str | None = None,
    deadline: bool | TimingModel = False,
    tables: Mapping[str, object] | None = None,
    reports: str | os.PathLike[str] | ReportStore | None = None,
    dialect: str | None = None,
) -> Connection:
    """Open a differentially private connection.

    Args:
        database: a DuckDB file (opened read-only and hardened), an existing
            ``duckdb.DuckDBPyConnection`` (trusted as configured; see :mod:`dpsql.engine`),
            a ``pyspark.sql.SparkSession`` (:mod:`dpsql.spark`), or ``None`` when the
            tables come from ``tables=`` or the policy's ``source =`` entries.
        tables: policy table name -> its data: a Parquet/CSV/JSON path, glob or folder,
            ``"file.duckdb:table"``, or a pandas/polars DataFrame or Arrow table
            (:mod:`dpsql.datasources`); read through dpsql's own hardened DuckDB, or by
            Spark when ``database`` is a SparkSession.
        policy: the policy file, or a loaded :class:`~dpsql.policy.Policy`.
        analyst: whose budget queries are charged to.
        ledger: a SQLite ledger path (shared safely by every process that opens it), a
            :class:`~dpsql.privacy.Ledger`, or ``None`` for an in-memory ledger that
            lasts as long as the connection.
        noise_source: for tests only: a seeded :class:`~dpsql.noise.RandomSource`.
            Production noise always comes from the operating system's CSPRNG.
        repeats: ``True`` (the default): a repeated query (same analyst, SQL up to spacing
            and keyword case, epsilon, delta, policy and data) gets its first answer again,
            free; answers are kept beside the ledger file (``<ledger>.answers``) or in
            memory. ``False``: every execute is charged and draws fresh noise (for
            statistical tests of the noise).
        data_version: for a wrapped connection whose data changes: a name for the data's
            current version (a load date, a snapshot id). Stored answers are served again
            only under the same version; nothing reads the data to find out whether it
            changed (see :mod:`dpsql.repeats`). A file opened by path is versioned by its
            identity and modification time.
        deadline: hold each answer that reads data until a deadline computed from public
            facts (:mod:`dpsql.timing`): ``True`` measures this machine's speed first
            (about a second), or pass a :class:`~dpsql.timing.TimingModel`. Off by default:
            in the embedded API the analyst shares the process; the server always does it.
        reports: the report store (a SQLite path or a ``ReportStore``) holding the shuffled
            reports of the policy's ``model = "local"`` tables; queries over them are
            answered from it, free of central budget (:mod:`dpsql.local`).
        dialect: the SQL dialect queries are written in (sqlglot's reader names:
            "postgres", "bigquery", "tsql", "spark" ...); ``execute(dialect=...)``
            overrides it per query. Default: DuckDB's.

    Raises:
        PolicyError: the policy is malformed or does not match the database.
    """
    if policy is None:
        raise Error("dpsql.connect needs policy=: the policy file, or a loaded dpsql.Policy.")
    loaded = policy if isinstance(policy, Policy) else load_policy(policy)
    engine = open_engine(database, loaded, tables=tables, data_version=data_version)
    try:
        check_against_schema(loaded, engine.schema())
        timing = None
        if deadline is not False:
            model = deadline if isinstance(deadline, TimingModel) else calibrate(pipeline=Connection, engine=engine)
            timing = Timing(model, table_sizes(loaded, engine), engine.interrupt)
        book = ledger if isinstance(ledger, Ledger) else Ledger(ledger, accountant=loaded.accountant)
    except BaseException:
        engine.close()
        raise
    try:
        return Connection(engine, loaded, analyst, book, noise_source=noise_source, repeats=repeats, timing=timing,
                          reports=reports, dialect=dialect)
    except BaseException:
        engine.close()
        if book is not ledger:
            book.close()
        raise

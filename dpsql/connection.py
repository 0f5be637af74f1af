"""Connection: chains the passes (DESIGN §2).

``execute`` is the whole pipeline, one line per pass::

    plan  = analyze(sql, policy, schema, epsilon, delta)      # every refusal, no data read
    exact = engine.run(bounded_query(plan, engine))           # bounded, clipped, exact sums
    noisy = noisy_table(plan, exact)                          # discrete noise, aggregates
    ledger.charge(analyst, budget, charge)                    # before anything leaves
    table = postprocessor.run(plan, noisy)                    # select list, HAVING, ORDER BY

A query refused by ``analyze`` or by the budget pre-check charges nothing. A query whose
engine run fails charges nothing either (nothing noisy was made). The charge is committed
before the result is returned; a crash after it loses budget, never privacy.
"""

from __future__ import annotations

import os
from types import TracebackType

import duckdb
import sqlglot.expressions as exp

from dpsql.accounting import BudgetStatus, Charge, Ledger
from dpsql.analyze import analyze
from dpsql.engine import DuckDBEngine, Engine
from dpsql.errors import BudgetExceeded, Error
from dpsql.mechanisms import RandomSource
from dpsql.plan import Aggregate, QueryPlan
from dpsql.policy import Policy, check_against_schema, load_policy
from dpsql.postprocess import Postprocessor
from dpsql.release import count_half_width, noisy_schema, noisy_table
from dpsql.result import Accuracy, ColumnPrivacy, PrivacyReport, Result
from dpsql.rewrite import bounded_query

__all__ = ["Connection", "Explanation", "connect"]


class Explanation:
    """What a query would cost and use, computed without reading data or spending budget."""

    def __init__(self, plan: QueryPlan, bounded_sql: str) -> None:
        self.plan = plan
        self.epsilon = plan.epsilon
        self.delta = plan.delta
        self.bounded_sql = bounded_sql
        self.mechanisms = {m.name: m.describe() for m in plan.measurements}
        self.accuracy = {a.sql: _expected_half_width(plan, a) for a in plan.aggregates if a.function != "avg"}

    def __repr__(self) -> str:
        lines = [f"Explanation(epsilon={self.epsilon:g}, delta={self.delta:g}, mechanism={self.plan.mechanism})"]
        lines += [f"  {sql}: ±{hw:.4g} (95%)" for sql, hw in self.accuracy.items()]
        return "\n".join(lines)


def _expected_half_width(plan: QueryPlan, aggregate: Aggregate) -> float:
    first = plan.measurement(aggregate.measurements[0])
    return count_half_width(first) if aggregate.function.startswith("count") else first.half_width()


class Connection:
    """A differentially private view of one database for one analyst."""

    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        analyst: str,
        ledger: Ledger,
        *,
        noise_source: RandomSource | None = None,
    ) -> None:
        if not isinstance(analyst, str) or not analyst:
            raise Error("analyst must be a non-empty string naming whose budget is charged.")
        self._engine = engine
        self._policy = policy
        self._analyst = analyst
        self._ledger = ledger
        self._post = Postprocessor()
        self._source = noise_source
        self._closed = False

    @property
    def analyst(self) -> str:
        return self._analyst

    @property
    def policy(self) -> Policy:
        return self._policy

    def plan(self, sql: str, *, epsilon: float | None = None, delta: float | None = None) -> QueryPlan:
        """Analyze ``sql``: every check, no data read, nothing charged."""
        self._check_open()
        plan = analyze(sql, self._policy, self._engine.schema(), epsilon=epsilon, delta=delta)
        self._post.check(plan, noisy_schema(plan))
        return plan

    def explain(self, sql: str, *, epsilon: float | None = None, delta: float | None = None) -> Explanation:
        """What ``sql`` would be charged, its mechanisms, bounded SQL and expected accuracy."""
        plan = self.plan(sql, epsilon=epsilon, delta=delta)
        bounded = bounded_query(plan, self._engine, salt=0).sql(dialect=self._engine.dialect, pretty=True)
        return Explanation(plan, bounded)

    def execute(self, sql: str, *, epsilon: float | None = None, delta: float | None = None) -> Result:
        """Answer ``sql`` with differential privacy, charging (epsilon, delta)."""
        plan = self.plan(sql, epsilon=epsilon, delta=delta)
        budget = self._policy.budget_for(self._analyst)
        self._precheck(plan, budget)
        exact = self._engine.run(bounded_query(plan, self._engine))
        noisy = noisy_table(plan, exact, self._source)
        charge = Charge(plan.epsilon, plan.delta, sql, _described(plan))
        self._ledger.charge(self._analyst, budget, charge)
        table, cells = self._post.run(plan, noisy)
        return Result(table, _privacy_report(plan), Accuracy(cells), sql)

    def _precheck(self, plan: QueryPlan, budget: object) -> None:
        status = self._ledger.status(self._analyst, budget)  # type: ignore[arg-type]
        if plan.epsilon > status.epsilon_remaining + 1e-12 or plan.delta > status.delta_remaining + 1e-18:
            raise BudgetExceeded(
                f"Budget exceeded for analyst {self._analyst!r}: this query needs "
                f"epsilon={plan.epsilon:g}, delta={plan.delta:g} but only "
                f"epsilon={status.epsilon_remaining:g}, delta={status.delta_remaining:g} remain "
                f"(short by epsilon={max(0.0, plan.epsilon - status.epsilon_remaining):g}, "
                f"delta={max(0.0, plan.delta - status.delta_remaining):g}). Nothing was charged. "
                "Ask for a smaller epsilon or a larger budget.",
                requested=(plan.epsilon, plan.delta),
                remaining=(status.epsilon_remaining, status.delta_remaining),
            )

    def budget(self) -> BudgetStatus:
        """What this analyst has spent and has left."""
        self._check_open()
        return self._ledger.status(self._analyst, self._policy.budget_for(self._analyst))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._post.close()
            self._engine.close()
            self._ledger.close()

    def _check_open(self) -> None:
        if self._closed:
            raise Error("this dpsql connection is closed; open a new one with dpsql.connect().")

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _described(plan: QueryPlan) -> tuple[dict[str, object], ...]:
    """Every noisy quantity of the plan, as the ledger records it."""
    selection = (plan.selection.describe(),) if plan.selection is not None else ()
    return selection + tuple(m.describe() for m in plan.measurements)


def _privacy_report(plan: QueryPlan) -> PrivacyReport:
    by_name = {a.name: a for a in plan.aggregates}
    keys = {k.name: k for k in plan.group_keys}
    columns: dict[str, ColumnPrivacy] = {}
    for name, projection in zip(plan.output_names, plan.output.expressions):
        refs = [c.name for c in projection.find_all(exp.Column)]
        used = [by_name[r] for r in refs if r in by_name]
        measurements = tuple(plan.measurement(n) for a in used for n in a.measurements)
        if not measurements:
            private = any(r in keys and not keys[r].is_public for r in refs)
            public = any(r in keys for r in refs)
            mechanism = "partition_selection" if private else "public" if public else "none"
            described = (plan.selection.describe(),) if private and plan.selection else ()
            columns[name] = ColumnPrivacy(mechanism, None, described)
            continue
        mechanisms = "+".join(sorted({m.mechanism for m in measurements}))
        bare = projection.unalias()
        simple = len(used) == 1 and used[0].function in ("count", "count_distinct", "sum") and bare.name in by_name
        std = measurements[0].noise_std if simple else None
        columns[name] = ColumnPrivacy(mechanisms, std, tuple(m.describe() for m in measurements))
    return PrivacyReport(plan.epsilon, plan.delta, columns, plan.notes)


def connect(
    database: str | os.PathLike[str] | duckdb.DuckDBPyConnection,
    policy: str | os.PathLike[str] | Policy,
    analyst: str = "default",
    ledger: str | os.PathLike[str] | Ledger | None = None,
    *,
    noise_source: RandomSource | None = None,
) -> Connection:
    """Open a differentially private connection.

    Args:
        database: a DuckDB file (opened read-only and hardened), or an existing
            ``duckdb.DuckDBPyConnection`` (trusted as configured; see :mod:`dpsql.engine`).
        policy: the policy file, or a loaded :class:`~dpsql.policy.Policy`.
        analyst: whose budget queries are charged to.
        ledger: a SQLite ledger path (shared safely by every process that opens it), a
            :class:`~dpsql.accounting.Ledger`, or ``None`` for an in-memory ledger that
            lasts as long as the connection.
        noise_source: for tests only: a seeded :class:`~dpsql.mechanisms.RandomSource`.
            Production noise always comes from the operating system's CSPRNG.

    Raises:
        PolicyError: the policy is malformed or does not match the database.
    """
    loaded = policy if isinstance(policy, Policy) else load_policy(policy)
    engine = DuckDBEngine(database)
    try:
        check_against_schema(loaded, engine.schema())
        book = ledger if isinstance(ledger, Ledger) else Ledger(ledger, accountant=None)
    except BaseException:
        engine.close()
        raise
    return Connection(engine, loaded, analyst, book, noise_source=noise_source)

"""Empirical privacy audit: what epsilon does this deployment really spend?

``audit`` runs one query many times through the whole pipeline (``dpsql.connect`` and
``execute``: parse, policy, bounded rewrite on DuckDB, noise, ledger, post-processing) on a
database D and on a neighbouring database D' (D plus one worst-case unit, made by
:func:`~dpsql.audit.neighbour.neighbour_database` unless given), and turns the two samples of
answers into a lower confidence bound on epsilon (:mod:`dpsql.audit.stats`). For a query
answered with Gaussian noise alone it also bounds mu, the Gaussian-DP parameter. A bound
above the claim is proof that the deployment leaks more than it says; a bound below it is
evidence, not proof, that it does not (an audit sees one pair of databases and one family
of events).

How many runs? With claimed epsilon 1 and a mechanism that really spends 2, 500 runs on
each database found the excess in 99 of 100 simulated audits; claimed 0.25 needs about
2,000 (``benchmarks/audit_power.py`` measures it; the table is in README.md).

>>> from dpsql.audit.stats import lower_bound
>>> lower_bound([{("x",): 0}] * 50, [{("x",): 0}] * 50).value   # same answers: no loss
0.0
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import pyarrow as pa

from dpsql.privacy import Ledger
from dpsql.audit.neighbour import AUDIT_KEY_PREFIX, neighbour_database
from dpsql.audit.stats import TOTAL, Bound, is_number, lower_bound
from dpsql.connection import Connection
from dpsql.opener import connect
from dpsql.errors import BudgetExceeded, Error
from dpsql.noise import gdp_mu
from dpsql.plan import GaussianParams, QueryPlan
from dpsql.policy import Budget, Policy, load_policy

__all__ = ["AuditReport", "audit", "neighbour_database"]

_AUDITOR = "dpsql-audit"
_KEY_MECHANISMS = ("public", "partition_selection")


@dataclass(frozen=True)
class AuditReport:
    """What an audit found.

    Attributes:
        sql: the query audited.
        epsilon: the epsilon each run was charged (the claim).
        delta: the delta each run was charged.
        runs: runs on each of the two databases.
        confidence: the probability that each lower bound is not above the truth.
        epsilon_bound: the lower bound on epsilon, with its evidence.
        mu: the claimed Gaussian-DP mu, when every measurement is Gaussian, else None.
        mu_bound: the lower bound on mu (then), else None.
        seconds: how long the runs took.
    """

    sql: str
    epsilon: float
    delta: float
    runs: int
    confidence: float
    epsilon_bound: Bound
    mu: float | None = None
    mu_bound: Bound | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when no lower bound exceeds its claim."""
        excess_mu = self.mu is not None and self.mu_bound is not None and self.mu_bound.value > self.mu
        return self.epsilon_bound.value <= self.epsilon and not excess_mu

    def format(self) -> str:
        level = f"{self.confidence * 100:g}%"
        lines = [f"audit: {self.sql}",
                 f"  runs: {self.runs} on D and {self.runs} on D' ({self.seconds:.1f} s)",
                 f"  claimed: epsilon={self.epsilon:g}, delta={self.delta:g}",
                 f"  epsilon >= {self.epsilon_bound.value:.3f} ({level} lower bound)",
                 f"    event: {self.epsilon_bound.describe()}"]
        if self.mu is not None and self.mu_bound is not None:
            lines += [f"  Gaussian DP: claimed mu={self.mu:.4g}; mu >= {self.mu_bound.value:.3f} ({level} lower bound)",
                      f"    event: {self.mu_bound.describe()}"]
        verdict = "PASS: no excess found" if self.passed else "FAIL: the lower bound exceeds the claim"
        return "\n".join([*lines, f"  {verdict}"])


def audit(
    database: str | os.PathLike[str],
    policy: str | os.PathLike[str] | Policy,
    sql: str,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    runs: int = 1000,
    neighbour: str | os.PathLike[str] | None = None,
    unit_rows: int = 1000,
    unit_groups: int = 20,
    confidence: float = 0.95,
    setup: Callable[[Connection], None] | None = None,
    progress: TextIO | None = None,
    samples: dict[str, list[dict[tuple[Hashable, ...], object]]] | None = None,
) -> AuditReport:
    """Audit ``sql``: run it ``runs`` times on D and on D', and bound the epsilon it spends.

    Args:
        database: the DuckDB file D.
        policy: the policy file or a loaded Policy (its budgets are ignored: the audit's
            runs are charged to a throwaway in-memory ledger).
        sql: the query.
        epsilon, delta: what each run spends (the policy's defaults when None).
        runs: runs on each database; half choose the event, half bound it.
        neighbour: the DuckDB file D'; by default D plus one worst-case unit
            (``unit_rows`` rows over ``unit_groups`` groups; see :mod:`dpsql.audit.neighbour`).
        confidence: for each lower bound.
        setup: called with each new connection, e.g. to ``register_udf``.
        progress: where to draw a progress bar (e.g. ``sys.stderr``); None for none.
        samples: if given, filled with the answers: ``{"D": [...], "D'": [...]}``, one
            mapping from cell (group key values..., column) to value per run.

    Raises:
        Error: the query is refused, the files are unusable, or the arguments are bad.
    """
    if not isinstance(runs, int) or runs < 8:
        raise Error(f"an audit needs at least 8 runs on each database, got runs={runs!r}")
    if not 0.5 <= confidence < 1:
        raise Error(f"confidence must be in [0.5, 1), got {confidence!r}")
    loaded = policy if isinstance(policy, Policy) else load_policy(policy)
    loaded = replace(loaded, accountant="basic", analysts={_AUDITOR: Budget(1e6, 0.5)})
    with tempfile.TemporaryDirectory(prefix="dpsql-audit-") as scratch:
        other = Path(neighbour) if neighbour is not None else neighbour_database(
            database, loaded, Path(scratch) / "neighbour.duckdb", rows=unit_rows, groups=unit_groups)
        pair = (_Runner(database, loaded, setup), _Runner(other, loaded, setup))
        try:
            plan = pair[0].conn.plan(sql, epsilon=epsilon, delta=delta)
            pair[1].conn.plan(sql, epsilon=epsilon, delta=delta)  # refused on D' too, before any run
            outputs: tuple[list[dict[tuple[Hashable, ...], object]], ...] = ([], [])
            bar = _Progress(progress, 2 * runs)
            start = time.perf_counter()
            for i in range(2 * runs):
                outputs[i % 2].append(pair[i % 2].answer(sql, plan.epsilon, plan.delta))
                bar.update(i + 1)
            seconds = time.perf_counter() - start
            bar.close()
        finally:
            pair[0].close()
            pair[1].close()
    if samples is not None:
        samples["D"], samples["D'"] = outputs
    bound = lower_bound(outputs[0], outputs[1], delta=plan.delta, confidence=confidence)
    mu = _claimed_mu(plan)
    mu_bound = lower_bound(outputs[0], outputs[1], confidence=confidence, measure="mu") if mu else None
    return AuditReport(sql, plan.epsilon, plan.delta, runs, confidence, bound, mu, mu_bound, seconds)


def _claimed_mu(plan: QueryPlan) -> float | None:
    """mu of the (epsilon, delta) claim when every noisy quantity is Gaussian (no selection)."""
    if (plan.selection is not None or plan.value_releases or not plan.measurements or plan.delta <= 0
            or not all(isinstance(m.noise, GaussianParams) for m in plan.measurements)):
        return None
    return gdp_mu(plan.epsilon, plan.delta)


class _Runner:
    """One database's connection, reopened with a fresh ledger if ever refused for budget."""

    def __init__(self, database: str | os.PathLike[str], policy: Policy,
                 setup: Callable[[Connection], None] | None) -> None:
        self._open: Callable[[], Connection] = lambda: connect(database, policy, _AUDITOR, Ledger(None), repeats=False)
        self._setup = setup
        self.conn = self._connect()

    def _connect(self) -> Connection:
        conn = self._open()
        if self._setup is not None:
            self._setup(conn)
        return conn

    def answer(self, sql: str, epsilon: float, delta: float) -> dict[tuple[Hashable, ...], object]:
        try:
            result = self.conn.execute(sql, epsilon=epsilon, delta=delta)
        except BudgetExceeded:  # the throwaway ledger's delta ran out: start another
            self.conn.close()
            self.conn = self._connect()
            result = self.conn.execute(sql, epsilon=epsilon, delta=delta)
        keys = [name for name, col in result.privacy.columns.items() if col.mechanism in _KEY_MECHANISMS]
        return cells(result.arrow(), keys)

    def close(self) -> None:
        self.conn.close()


def cells(table: pa.Table, keys: list[str]) -> dict[tuple[Hashable, ...], object]:
    """One answer as ``{(key values..., occurrence, column): value}`` for its non-key columns.

    A grouped answer also gets, per numeric column, the total over its rows under the key
    ``(TOTAL, 0, column)`` (a tuple, which no group key value is): one unit moves several
    groups, and their total moves most; its number of rows as ``(TOTAL, 0, "rows")``; and
    how many of its rows have a key made up for the audit's worst-case unit
    (:data:`~dpsql.audit.neighbour.AUDIT_KEY_PREFIX`) as ``(TOTAL, 0, "new keys")``: such a
    key is held by one unit, so releasing it is the plainest leak.

    >>> cells(pa.table({"g": ["a", "b"], "n": [1.5, None]}), ["g"])
    {('a', 0, 'n'): 1.5, ('b', 0, 'n'): None, (('all groups',), 0, 'n'): 1.5, (('all groups',), 0, 'rows'): 2, (('all groups',), 0, 'new keys'): 0}
    """
    rows = table.to_pylist()
    seen: dict[tuple[Hashable, ...], int] = {}
    out: dict[tuple[Hashable, ...], object] = {}
    for row in rows:
        key = tuple(_hashable(row[k]) for k in keys)
        seen[key] = seen.get(key, -1) + 1
        for name, value in row.items():
            if name not in keys:
                out[(*key, seen[key], name)] = value
    if keys:
        for name in table.column_names:
            numbers = [row[name] for row in rows if is_number(row[name])]
            if name not in keys and numbers:
                out[(TOTAL, 0, name)] = math.fsum(v for v in numbers if math.isfinite(v))
        out[(TOTAL, 0, "rows")] = table.num_rows
        out[(TOTAL, 0, "new keys")] = sum(any(isinstance(row[k], str) and row[k].startswith(AUDIT_KEY_PREFIX)
                                              for k in keys) for row in rows)
    return out


def _hashable(value: object) -> Hashable:
    return value if isinstance(value, Hashable) else repr(value)


class _Progress:
    """A progress bar on a terminal (redrawn in place) or a log (a line every 10%)."""

    def __init__(self, stream: TextIO | None, total: int) -> None:
        self._stream, self._total = stream, total
        self._start = time.perf_counter()
        self._tty = stream is not None and stream.isatty()
        self._next = 0.0

    def update(self, done: int) -> None:
        if self._stream is None:
            return
        fraction = done / self._total
        if not self._tty and fraction < self._next and done != self._total:
            return
        self._next = math.floor(fraction * 10 + 1) / 10
        elapsed = time.perf_counter() - self._start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self._total - done) / rate if rate else 0.0
        filled = int(30 * fraction)
        line = (f"audit [{'#' * filled}{'.' * (30 - filled)}] {done}/{self._total} runs, "
                f"{rate:.0f} runs/s, {eta:.0f} s left")
        self._stream.write(("\r" + line) if self._tty else line + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._stream is not None and self._tty:
            self._stream.write("\n")
            self._stream.flush()


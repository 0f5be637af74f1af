"""Dry runs: what a query would cost, use and be accurate to, before any data is read.

Everything here works on the :class:`~dpsql.plan.QueryPlan` alone (plus the ledger's record
of past charges, to show how the accountant would compose the new one). Plans are pure, so
:func:`smallest_epsilon` can plan a query at many epsilons and bisect for the cheapest one
that meets a target accuracy.

Expected accuracy. A bare COUNT or SUM column's 95% half-width is known from the plan: it is
exactly what :mod:`dpsql.release` will report. An AVG's depends on the count it divides by,
which is data: :meth:`Explanation.half_width_for` gives it for an assumed count (the
group's number of rows after contribution bounding) and an assumed mean, by default the
worst case (a mean on one of the bounds), with the same formula the release uses
(:func:`dpsql.release.average_half_width`). A public group key has half-width 0; an
expression over several aggregates has none.

Through a connection (:meth:`dpsql.Connection.explain`, :meth:`dpsql.Connection.epsilon_for`):

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

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import sqlglot.expressions as exp

from dpsql.privacy import Charge
from dpsql.privacy.events import describe
from dpsql.errors import Error
from dpsql.plan import Aggregate, QueryPlan
from dpsql.release.aggregates import average_half_width, count_half_width, half_width
from dpsql.result import PrivacyReport

__all__ = ["ColumnExplanation", "Composition", "Explanation", "column_half_width", "smallest_epsilon"]

#: The search for an epsilon stops when the bracket is this tight (relative).
_EPSILON_PRECISION = 1e-9
#: The smallest epsilon searched, relative to the policy's cap.
_LOWEST_EPSILON = 1e-6
#: The group size an AVG's typical half-width assumes (rows after contribution bounding).
TYPICAL_ROWS = 1000
#: The group size an order statistic's or UDF's typical half-width is modelled at (units).
TYPICAL_UNITS = 1000
#: 95% half-width of Laplace noise per unit of mean absolute error: ln(20).
_LAPLACE_95 = math.log(20)


@dataclass(frozen=True)
class ColumnExplanation:
    """How one output column would be protected, and how accurate it would be.

    Attributes:
        mechanism: "laplace", "gaussian", "public" (a listed key), "none", or several
            joined by "+" for an expression over aggregates of different mechanisms.
        noise_std: the noise's standard deviation in the column's units, for a bare COUNT
            or SUM; ``None`` where it depends on the data or is not defined.
        half_width: the expected 95% half-width; ``None`` when it depends on the data
            (see ``depends_on``).
        depends_on: ``""`` (known now), ``"count"`` (AVG: use
            :meth:`Explanation.half_width_for`) or ``"data"`` (expressions, other aggregates).
        measurements: the noisy quantities behind the column (JSON-able dicts).
        bounds: the clipping bounds of the column it aggregates (SUM, AVG, VAR, order
            statistics, UDFs); ``None`` for counts and keys.
        typical: where ``half_width`` depends on the data, the expected 95% half-width of a
            typical group (see ``typical_note``): an AVG at :data:`TYPICAL_ROWS` rows, an
            order statistic or UDF modelled at :data:`TYPICAL_UNITS` units.
        typical_note: what ``typical`` assumes.
    """

    mechanism: str
    noise_std: float | None
    half_width: float | None
    depends_on: str = ""
    measurements: tuple[dict[str, object], ...] = ()
    bounds: tuple[float, float] | None = None
    typical: float | None = None
    typical_note: str = ""


@dataclass(frozen=True)
class Composition:
    """The analyst's spending as the ledger's accountant composes it, before and after."""

    accountant: str
    before: tuple[float, float]
    after: tuple[float, float]
    budget: tuple[float, float]

    @property
    def epsilon(self) -> float:
        """What the query adds to the composed epsilon (at most its own epsilon)."""
        return max(0.0, self.after[0] - self.before[0])

    @property
    def delta(self) -> float:
        return max(0.0, self.after[1] - self.before[1])

    @property
    def fits(self) -> bool:
        """Whether the budget would still cover everything spent."""
        return self.after[0] <= self.budget[0] * (1 + 1e-12) and self.after[1] <= self.budget[1] * (1 + 1e-12)


class Explanation:
    """What a query would be charged, the mechanisms it would use, its bounded SQL and its
    expected accuracy, computed without reading data or spending budget.

    Attributes:
        plan: the query plan.
        epsilon, delta: the query's own (epsilon, delta): what the ledger records for it.
        mechanism: "laplace" or "gaussian".
        composition: how the ledger's accountant would compose the charge with what the
            analyst has spent (``composition.after``, ``composition.epsilon`` added,
            ``composition.fits``); ``None`` when the accountant cannot say.
        bounded_sql: the rewritten SQL, with a placeholder salt (the real one is secret and
            fresh per query).
        mechanisms: per measurement (``__m0`` ...), its mechanism, sensitivity and noise.
        privacy: per output column, as a result's ``privacy`` would show it.
        columns: per output column, a :class:`ColumnExplanation` with its expected accuracy.
        accuracy: per aggregate call of the SQL (``"COUNT(*)"`` ...), the expected 95%
            half-width of those known before reading data (COUNT, SUM).
    """

    def __init__(
        self,
        plan: QueryPlan,
        bounded_sql: str,
        privacy: PrivacyReport,
        composition: Composition | None = None,
        replan: Callable[[float], QueryPlan] | None = None,
        max_epsilon: float | None = None,
    ) -> None:
        self.plan = plan
        self.epsilon = plan.epsilon
        self.delta = plan.delta
        self.mechanism = plan.mechanism
        self.composition = composition
        self.bounded_sql = bounded_sql
        self.mechanisms = {m.name: describe(m) for m in plan.measurements}
        selection = getattr(plan, "selection", None)
        if selection is not None:
            self.mechanisms[selection.name] = describe(selection)
        self.privacy = privacy
        self.columns = _column_explanations(plan, self.privacy)
        self.accuracy = {
            a.sql: hw for a in plan.aggregates if (hw := _aggregate_half_width(plan, a)) is not None
        }
        self._replan = replan
        self._max_epsilon = max_epsilon

    def half_width_for(self, column: str, count: float | None = None, mean: float | None = None) -> float:
        """The expected 95% half-width of an output column.

        Args:
            column: the output column's name.
            count: for an AVG, the number of rows averaged in a group (after contribution
                bounding); ignored otherwise.
            mean: for an AVG, the assumed mean; default: the worst case, a bound.

        Raises:
            Error: an unknown column, an AVG without ``count``, or an expression.
        """
        return column_half_width(self.plan, column, count=count, mean=mean)

    def epsilon_for(self, column: str, half_width: float, count: float | None = None,
                    mean: float | None = None) -> float:
        """The smallest epsilon (at this delta) meeting ``half_width``; see
        :meth:`dpsql.connection.Connection.epsilon_for`."""
        if self._replan is None or self._max_epsilon is None:
            raise Error("this explanation cannot re-plan; use Connection.epsilon_for instead.")
        return smallest_epsilon(self._replan, column, half_width, self._max_epsilon, count=count, mean=mean)

    def describe(self) -> str:
        """What would be charged and how accurate each output column would be, as text
        (the same for an embedded and a remote explanation: :func:`dpsql.display.explanation_text`)."""
        from dpsql.display import explanation_text  # noqa: PLC0415

        composition = None if self.composition is None else asdict(self.composition)
        text = explanation_text(self.epsilon, self.delta, self.mechanism,
                                {name: asdict(col) for name, col in self.columns.items()}, composition,
                                self.mechanisms)
        return "\n".join([text, *self._bounds_text(), *self.bias_text()])

    def bias_text(self) -> list[str]:
        """What ``execute(sql, bias=True)`` would add (:mod:`dpsql.release.bias`): known from
        the plan alone, like every half-width here."""
        from dpsql.release.bias import bias_split, quantities  # the bias module reads through the rewrite

        if not self.plan.measurements and not self.plan.value_releases:
            return []
        query, share = bias_split(self.epsilon)
        lines = [f"with bias=True: the query runs at epsilon={query:g} and epsilon={share:g} buys, "
                 "per cell, noisy counts of what bounding loses (95% half-widths):"]
        for q in quantities(self.plan, share):
            what = ("rows dropped by the caps" if q.bounds is None
                    else f"values of {q.name} clipped into [{q.bounds[0]:g}, {q.bounds[1]:g}]")
            lines.append(f"  {what}: ±{_short(q.half_width)} (counting at most {q.clip:,} per person)")
        return lines

    def __repr__(self) -> str:
        return self.describe()

    def bounds(self) -> list[tuple[str, float, float, str]]:
        """Per aggregate of a bounded value: (the aggregate as written, lower, upper, where the
        bounds came from: "policy", "interval arithmetic" or "analyst"; see
        :mod:`dpsql.intervals`). Every value is clipped into them before it is summed."""
        by_name = {m.name: m for m in self.plan.measurements}
        out = []
        for agg in self.plan.aggregates:
            bounded = [by_name[n] for n in agg.measurements if n in by_name and by_name[n].bounds is not None]
            if bounded:
                m = bounded[0]
                assert m.bounds is not None
                out.append((agg.sql, float(m.bounds[0]), float(m.bounds[1]), m.bounds_from))
        return out

    def _bounds_text(self) -> list[str]:
        return [f"  {sql}: clipped to [{lo:g}, {hi:g}] ({origin} bounds)" for sql, lo, hi, origin in self.bounds()]


# -- per column -----------------------------------------------------------------------


def column_half_width(plan: QueryPlan, column: str, *, count: float | None = None,
                      mean: float | None = None) -> float:
    """The expected 95% half-width of output ``column`` (see the module docstring).

    Raises:
        Error: an unknown column, an AVG without ``count``, or an expression.
    """
    projection = _projection(plan, column)
    aggregate = _bare_aggregate(plan, projection)
    if aggregate is None:
        if _is_key(plan, projection):
            return 0.0
        raise Error(
            f"column {column!r} is an expression: its accuracy depends on the data. Ask about a "
            "bare aggregate column (COUNT, SUM or AVG) instead."
        )
    known = _aggregate_half_width(plan, aggregate)
    if known is not None:
        return known
    if aggregate.function != "avg":
        raise Error(f"column {column!r} ({aggregate.function.upper()}): its accuracy depends on the data.")
    if count is None or not (isinstance(count, (int, float)) and math.isfinite(count) and count > 0):
        raise Error(
            f"column {column!r} is an AVG, whose accuracy depends on how many rows it averages; "
            f"pass count=N (rows per group after contribution bounding), got count={count!r}."
        )
    total, rows = (plan.measurement(n) for n in aggregate.measurements[:2])
    assert aggregate.bounds is not None
    lo, hi = (float(b) for b in aggregate.bounds)
    centred = (hi - lo) / 2 if mean is None else float(mean) - (lo / 2 + hi / 2)
    width = average_half_width(total, rows, np.array([centred]), np.array([float(count)]), (lo, hi))
    return float(width[0])


def smallest_epsilon(
    replan: Callable[[float], QueryPlan],
    column: str,
    half_width: float,
    max_epsilon: float,
    *,
    count: float | None = None,
    mean: float | None = None,
) -> float:
    """The smallest epsilon in ``(0, max_epsilon]`` whose plan gives ``column`` an expected
    95% half-width of at most ``half_width``, by bisection on ``log(epsilon)``.

    The half-width falls as epsilon grows (up to lattice rounding); the epsilon returned is
    one whose plan was checked to meet the target, rounded up to 4 significant digits
    when that still meets it, and at least ``1e-6 * max_epsilon``.

    Raises:
        Error: a bad target, or not even ``max_epsilon`` meets it.
    """
    if isinstance(half_width, bool) or not isinstance(half_width, (int, float)) or not half_width > 0 \
            or not math.isfinite(half_width):
        raise Error(f"half_width must be a positive finite number, got {half_width!r}.")

    def width(epsilon: float) -> float:
        try:
            return column_half_width(replan(epsilon), column, count=count, mean=mean)
        except Error as exc:
            if epsilon == max_epsilon:
                raise exc
            return math.inf  # e.g. noise too large to calibrate at a tiny epsilon

    best = width(max_epsilon)
    if best == 0:
        raise Error(f"column {column!r} is a group key: it carries no noise at any epsilon.")
    if best > half_width:
        raise Error(
            f"even epsilon={max_epsilon:g} (the policy's max_epsilon_per_query) gives column "
            f"{column!r} a 95% half-width of ±{best:.6g}, wider than ±{half_width:.6g}. Accept at "
            "least that, pass a delta (Gaussian noise), query fewer aggregates at once (each "
            "takes a share of epsilon), or ask the data owner for tighter caps or bounds."
        )
    # an epsilon a million times below the cap is as good as none (and far smaller ones
    # leave the range the calibration's exact integer noise supports)
    low, high = max_epsilon * _LOWEST_EPSILON, max_epsilon
    if width(low) <= half_width:
        return low
    while high / low > 1 + _EPSILON_PRECISION:
        middle = math.sqrt(low * high)
        if width(middle) <= half_width:
            high = middle
        else:
            low = middle
    rounded = _round_up(high, 4)
    return rounded if rounded <= max_epsilon and width(rounded) <= half_width else high


def _short(value: float) -> str:
    return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.3g}"


def _round_up(value: float, digits: int) -> float:
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    return math.ceil(value * scale) / scale


def _column_explanations(plan: QueryPlan, privacy: PrivacyReport) -> dict[str, ColumnExplanation]:
    out: dict[str, ColumnExplanation] = {}
    releases = {r.name: r for r in plan.value_releases}
    for name, projection in zip(plan.output_names, plan.output.expressions):
        col = privacy.columns[name]
        aggregate = _bare_aggregate(plan, projection)
        if aggregate is None:
            known = 0.0 if _is_key(plan, projection) else None
            out[name] = ColumnExplanation(col.mechanism, col.noise_std, known, "" if known is not None else "data",
                                          col.measurements)
            continue
        known = _aggregate_half_width(plan, aggregate)
        depends = "" if known is not None else ("count" if aggregate.function == "avg" else "data")
        release = releases.get(aggregate.name)
        bounds = aggregate.bounds if aggregate.bounds is not None else getattr(getattr(release, "target", None),
                                                                               "bounds", None)
        typical, note = None, ""
        if depends == "count":
            typical = column_half_width(plan, name, count=TYPICAL_ROWS)
            note = (f"at {TYPICAL_ROWS:,} rows per group, the mean on a bound (it shrinks as 1/rows; "
                    "half_width_for(column, count=N) for your groups)")
        elif release is not None:
            typical, note = _value_half_width(release)
        out[name] = ColumnExplanation(col.mechanism, col.noise_std, known, depends, col.measurements,
                                      None if bounds is None else (float(bounds[0]), float(bounds[1])),
                                      typical, note)
    return out


def _value_half_width(release: Any) -> tuple[float, str]:
    """An order statistic's or UDF's expected 95% half-width in a group of
    :data:`TYPICAL_UNITS` units, from the strategy models (mean absolute error x ln 20,
    as for Laplace noise), never more than its bounds' width (the answer is clamped)."""
    from dpsql.release.udf import choose_strategy  # noqa: PLC0415 - the release models

    ptr, smooth, sample_and_aggregate = (importlib.import_module(f"dpsql.release.udf.{name}")
                                         for name in ("ptr", "smooth", "sample_and_aggregate"))

    target = release.target
    epsilon = release.epsilon * (1 - release.COUNT_SHARE)
    choice = choose_strategy(target, TYPICAL_UNITS, epsilon, release.delta, rows_per_unit=release.rows_per_unit)
    bounds = target.bounds
    if choice.strategy == "ptr":
        error = ptr.expected_error(bounds, TYPICAL_UNITS, epsilon, release.delta, rows_per_unit=release.rows_per_unit)
    elif choice.strategy == "smooth":
        error = smooth.expected_error(bounds, TYPICAL_UNITS, epsilon, release.delta,
                                      rows_per_unit=release.rows_per_unit)
    else:
        error = sample_and_aggregate.expected_error(bounds, TYPICAL_UNITS, epsilon)
    width = float(bounds[1]) - float(bounds[0])
    names = {"ptr": "PTR", "smooth": "smooth sensitivity", "sample_and_aggregate": "sample-and-aggregate"}
    note = (f"modelled for {TYPICAL_UNITS:,} units per group with {names[choice.strategy]} (chosen per group at "
            "run time)")
    if error * _LAPLACE_95 >= width:
        return width, note + f"; no better than the bounds' width: the answer is clamped into [{bounds[0]:g}, {bounds[1]:g}]"
    return error * _LAPLACE_95, note


def _aggregate_half_width(plan: QueryPlan, aggregate: Aggregate) -> float | None:
    """The half-width of a COUNT or SUM (what the release reports); ``None`` for others."""
    if not aggregate.measurements:  # an order statistic or UDF: depends on the data
        return None
    first = plan.measurement(aggregate.measurements[0])
    if aggregate.function in ("count", "count_distinct"):
        return count_half_width(first)
    if aggregate.function == "sum":
        return half_width(first)
    return None


def _projection(plan: QueryPlan, column: str) -> exp.Expression:
    names = list(plan.output_names)
    matches = [i for i, n in enumerate(names) if n == column] or [
        i for i, n in enumerate(names) if n.casefold() == str(column).casefold()
    ]
    if len(matches) != 1:
        raise Error(f"no single output column {column!r}; the query's columns are: {', '.join(names)}.")
    projection: exp.Expression = plan.output.expressions[matches[0]]
    return projection


def _bare_aggregate(plan: QueryPlan, projection: exp.Expression) -> Aggregate | None:
    inner = projection.unalias()
    if not isinstance(inner, exp.Column):
        return None
    return next((a for a in plan.aggregates if a.name == inner.name), None)


def _is_key(plan: QueryPlan, projection: exp.Expression) -> bool:
    keys = {k.name for k in plan.group_keys}
    return any(c.name in keys for c in projection.find_all(exp.Column))


# -- composition ----------------------------------------------------------------------


def dry_run_composition(ledger: Any, analyst: str, budget: Any, charge: Charge) -> Composition | None:
    """How the ledger's accountant would compose ``charge`` with the analyst's past charges,
    without recording anything; ``None`` when the ledger or accountant cannot say."""
    accountant = getattr(ledger, "accountant", None)
    compose = getattr(accountant, "compose", None)
    events = getattr(ledger, "events", None)
    if compose is None or events is None:
        return None
    try:
        history = [record.to_charge() for record in events(analyst)]
        before = _compose(compose, history, float(budget.delta)) if history else (0.0, 0.0)
        after = _compose(compose, [*history, charge], float(budget.delta))
    except Exception:  # noqa: BLE001 - a dry run is advice: an accountant that cannot answer gives none
        return None
    name = str(getattr(accountant, "name", type(accountant).__name__))
    return Composition(name, before, after, (float(budget.epsilon), float(budget.delta)))


def _compose(compose: Callable[..., Any], events: Sequence[Charge], target_delta: float) -> tuple[float, float]:
    """Call ``compose(events)`` or ``compose(events, target_delta=...)``, whichever it takes;
    accept an (epsilon, delta) pair or an epsilon (at ``target_delta``)."""
    parameters: Mapping[str, inspect.Parameter] = inspect.signature(compose).parameters
    if "target_delta" in parameters:
        result = compose(events, target_delta=target_delta)
    else:
        result = compose(events)
    if isinstance(result, tuple):
        return float(result[0]), float(result[1])
    return float(result), target_delta

"""An opt-in, differentially private estimate of the bias of bounding (issue 15 item 2).

``conn.execute(sql, bias=True)`` spends ``BIAS_SHARE`` (10%) of the query's epsilon on
estimates, per group (so per output row and cell), of

- the rows the query selected (after WHERE, in its groups) that the contribution caps
  dropped, and
- per bounded column an aggregate reads (``SUM(x)``, ``AVG(x)``, ``VAR(x)`` ...), how many
  of the values the caps kept were clipped into the column's bounds.

The query itself runs at the other 90%. That 10% is split evenly between the quantities
(one for dropped rows, one per bounded column), each pure epsilon-DP, so they compose to
the 10% by basic composition. The ledger records one charge for the query and its
estimates, with each estimate listed among the mechanisms, and it is charged before any
data is read, like everything else. An answer whose estimate is large next to it is
biased: its interval (noise only) does not show that, this does.

What is measured. Per unit ``u`` with ``n_ug`` selected rows in each of its ``g_u`` groups,
in expectation over the caps' random choice of rows and groups (the bounded query weighs
rows by exactly these fractions):

- rows dropped in group g: ``d_ug = n_ug - (min(g_u, L0) / g_u) min(n_ug, R)`` (exact when
  ``g_u <= L0``);
- values of column x clipped in group g, among the rows kept: ``c_ug (min(n_ug, R) / n_ug)
  (min(g_u, L0) / g_u)``, with ``c_ug`` the unit's non-NULL values of x outside its bounds.

Each quantity is scaled, per unit, so that the unit's total over all groups is at most C
(public: from the policy's caps): ``CLIP_FACTOR * R * L0`` for dropped rows (a unit beyond
that counts C), ``R * L0`` for clipped values (a unit keeps no more values than that, so
nothing is lost: ``sum_g min(n_ug, R) min(g_u, L0) / g_u <= R L0``).

Sensitivity. Each unit's terms depend only on its own rows, so adding or removing a unit
changes the vector of per-group sums by at most C in L1 norm. The sums are taken in fixed
point (``2**FRACTION_BITS`` steps per row, floored per unit and group, so one unit adds at
most ``C * 2**FRACTION_BITS`` steps) and every group gets independent discrete Laplace noise
calibrated to that L1 sensitivity: epsilon-DP for the whole vector of groups, whatever the
query's own noise. Only the groups the answer releases (public keys, or keys that passed
partition selection) are released.

What it is not. A unit with more than C dropped rows counts C, so that estimate is a lower
bound when some units are far beyond the caps (the note says so); how
far values lie outside their bounds is not measured (one value's excess is unbounded, so a
DP sum of it would need a cap of its own and be far noisier); a row-level table without
joins has no caps (nothing dropped; one row clips at most one value per column).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.analyze.budget import BIAS_SHARE, bias_split  # the split is the analyzer's
from dpsql.engine import Engine
from dpsql.noise import DiscreteLaplace, RandomSource, laplace_noise
from dpsql.plan import Measurement, QueryPlan
from dpsql.privacy.events import LaplaceEvent
from dpsql.result import Result
from dpsql.rewrite import (  # the query's own FROM, joins, WHERE and columns
    _row_id,
    _rows,
    _unit,
)
from dpsql.rewrite.nodes import column as _col

__all__ = [
    "BIAS_SHARE",
    "DEADLINE_FACTOR",
    "BiasEstimate",
    "CellBias",
    "Quantity",
    "attach",
    "bias_events",
    "bias_query",
    "bias_split",
    "clip_per_unit",
    "estimate_bias",
    "quantities",
]

#: Dropped rows (or clipped values) counted per unit: at most CLIP_FACTOR x R x L0.
CLIP_FACTOR = 10
#: Fixed-point steps per row of the sums.
FRACTION_BITS = 8
#: Confidence of the half-widths.
CONFIDENCE = 0.95
#: Under deadlines (:mod:`dpsql.timing`) a query with the estimates is held for this many times
#: its own deadline: the estimates' pass reads the same rows, grouped by unit and key as the
#: query's, and measured 2.2 times the query's own run on the 1M-row demo and 2 times on a
#: 20k-row one (a loaded machine, load ~12); 4 leaves the model's slack on top.
DEADLINE_FACTOR = 4
#: Bounded aggregates whose values are clipped.
_CLIPPED_KINDS = ("sum", "sum_centred", "sum_squares")


@dataclass(frozen=True)
class Quantity:
    """One estimated quantity: rows dropped by the caps, or values of one column clipped.

    Attributes:
        name: ``"dropped_rows"`` or the column (its expression's text for ``SUM(a * b)``).
        bounds: the column's bounds (``None`` for dropped rows).
        clip: at most this many rows or values are counted per unit.
        epsilon: its share of the query's epsilon.
    """

    name: str
    bounds: tuple[float, float] | None
    clip: int
    epsilon: float
    measurement: Measurement | None = field(default=None, compare=False, repr=False)

    @property
    def noise(self) -> DiscreteLaplace:
        return laplace_noise(self.clip << FRACTION_BITS, self.epsilon)

    @property
    def half_width(self) -> float:
        """The 95% half-width of one cell's estimate, in rows or values."""
        return math.ldexp(self.noise.quantile_abs(CONFIDENCE), -FRACTION_BITS)

    def describe(self) -> dict[str, object]:
        """The ledger's description (a discrete Laplace, epsilon-DP over the vector of groups)."""
        kind = "dropped_rows" if self.bounds is None else "clipped_values"
        return {"measurement": kind, "column": None if self.bounds is None else self.name,
                "bounds": None if self.bounds is None else list(self.bounds), "mechanism": "laplace",
                "epsilon": self.epsilon, "sensitivity": self.clip << FRACTION_BITS,
                "lattice": 2.0**-FRACTION_BITS, "clip_per_unit": self.clip}


@dataclass(frozen=True)
class CellBias:
    """One cell's estimates: rows the caps dropped in its group, and values of each bounded
    column it reads that were clipped, each ``(estimate, 95% half-width)``."""

    dropped_rows: tuple[float, float]
    clipped: tuple[tuple[str, float, float], ...] = ()

    def text(self) -> str:
        """``1,234 ± 80 rows dropped, 12 ± 16 income values clipped``."""
        rows, hw = self.dropped_rows
        parts = [f"{rows:,.0f} ± {hw:,.0f} rows dropped"]
        parts += [f"{value:,.0f} ± {half:,.0f} {name} values clipped" for name, value, half in self.clipped]
        return ", ".join(parts)


@dataclass(frozen=True)
class BiasEstimate:
    """The query's bias estimates: totals over the released groups, and per output cell.

    Attributes:
        dropped_rows: rows the caps dropped, over all released groups (may be negative
            where nothing was dropped: it is noisy).
        half_width: the 95% half-width of ``dropped_rows`` (noise only).
        clip: at most this many dropped rows (or clipped values) were counted per unit.
        epsilon: what the estimates cost (part of the query's charge).
        clipped: per bounded column, ``(values clipped over all released groups, 95% half-width)``.
        cells: per output column, per row: its :class:`CellBias` (``None`` for a key).
    """

    dropped_rows: float
    half_width: float
    clip: int
    epsilon: float
    clipped: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    cells: Mapping[str, list[CellBias | None]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BiasEstimate:
        """The estimate :func:`dataclasses.asdict` made JSON-able (the Flight wire format)."""
        def cell(c: Mapping[str, Any] | None) -> CellBias | None:
            if c is None:
                return None
            rows = (float(c["dropped_rows"][0]), float(c["dropped_rows"][1]))
            return CellBias(rows, tuple((str(n), float(v), float(h)) for n, v, h in c["clipped"]))

        return cls(float(data["dropped_rows"]), float(data["half_width"]), int(data["clip"]), float(data["epsilon"]),
                   {k: (float(v[0]), float(v[1])) for k, v in data.get("clipped", {}).items()},
                   {k: [cell(c) for c in v] for k, v in data.get("cells", {}).items()})

    def note(self) -> str:
        clipped = "".join(f"; about {v:,.0f} ± {h:,.0f} values of {name} were clipped into its bounds"
                          for name, (v, h) in self.clipped.items())
        return (f"bias estimate: about {self.dropped_rows:,.0f} ± {self.half_width:,.0f} of the rows this "
                f"query selected were dropped by the caps (counting at most {self.clip:,} per person, so a "
                f"lower bound if some have more){clipped}; per cell in res.bias.cells; epsilon "
                f"{self.epsilon:g} of this query's charge")


def clip_per_unit(plan: QueryPlan) -> int:
    """C: how many dropped rows (or clipped values) of one unit are counted."""
    return CLIP_FACTOR * plan.max_rows_per_unit * plan.max_groups_per_unit


def _bounded(plan: QueryPlan) -> bool:
    return plan.unit_column is not None or plan.unit_is_row


def quantities(plan: QueryPlan, epsilon: float) -> tuple[Quantity, ...]:
    """What the estimates measure, each with its even share of ``epsilon``."""
    columns: dict[tuple[str, str, tuple[float, float]], Measurement] = {}
    for m in plan.measurements:
        if m.kind in _CLIPPED_KINDS and m.bounds is not None and m.column is not None:
            columns.setdefault((m.source, m.column, (float(m.bounds[0]), float(m.bounds[1]))), m)
    share = epsilon / (1 + len(columns))
    clip = clip_per_unit(plan)
    # A unit's kept values number at most R x L0 (one row of a row-level table: 1), so its
    # clipped values need no further cap.
    value_clip = plan.max_rows_per_unit * plan.max_groups_per_unit if _bounded(plan) else 1
    out = [Quantity("dropped_rows", None, clip, share)]
    out += [Quantity(column, bounds, value_clip, share, m) for (_, column, bounds), m in columns.items()]
    return tuple(out)


def bias_events(plan: QueryPlan, epsilon: float) -> tuple[LaplaceEvent, ...]:
    """The estimates' typed privacy events: one discrete Laplace vector each, ``epsilon``-DP
    at its share (:func:`quantities`), with the ledger's description."""
    return tuple(LaplaceEvent(epsilon=q.epsilon, description=q.describe()) for q in quantities(plan, epsilon))


def _value(q: Quantity) -> exp.Expression:
    m = q.measurement
    assert m is not None and m.column is not None
    column = exp.Paren(this=m.expression.copy()) if m.expression is not None else _col(m.column, m.source)
    return exp.cast(column, exp.DataType.build("DOUBLE"))


def bias_query(plan: QueryPlan, engine: Engine, qs: Sequence[Quantity]) -> exp.Expression | str:
    """SQL for, per group, ``sum_u floor(2**FRACTION_BITS * t_ug)`` of each quantity ``t``
    (one column ``__b<i>`` per quantity, after the group keys)."""
    d = "duckdb"  # written in DuckDB's SQL; another engine gets the tree, transpiled
    unit = _unit(plan) if _bounded(plan) else _row_id(plan.sources[0])
    projections: list[exp.Expr] = [exp.alias_(unit, "__u", quoted=True)]
    projections += [exp.alias_(k.expression.copy(), k.name, quoted=True) for k in plan.group_keys]
    for i, q in enumerate(qs[1:], 1):
        v = _value(q)
        lo, hi = q.bounds  # type: ignore[misc]
        outside = f"({v.sql(dialect=d)} < {lo!r} OR {v.sql(dialect=d)} > {hi!r})"
        projections.append(exp.alias_(exp.maybe_parse(
            f"CASE WHEN {outside} AND NOT isnan({v.sql(dialect=d)}) THEN 1 ELSE 0 END", dialect=d), f"__c{i}", quoted=True))
    rows = _rows(plan, projections=projections, filter_keys=True).sql(dialect=d)
    keys = [exp.to_identifier(k.name, quoted=True).sql(dialect=d) for k in plan.group_keys]
    key_list = "".join(f"{k}, " for k in keys)
    r, l0 = (plan.max_rows_per_unit, plan.max_groups_per_unit) if _bounded(plan) else (1, 1)
    counts = "".join(f", sum(\"__c{i}\")::DOUBLE AS \"__c{i}\"" for i in range(1, len(qs)))
    kept = f"least(n, {r}) * least(g, {l0}) / g"
    terms = [f"n - {kept} AS \"__t0\""] + [f"\"__c{i}\" * {kept} / n AS \"__t{i}\"" for i in range(1, len(qs))]
    scaled = [f"\"__t{i}\" * least(1.0, {q.clip} / greatest(sum(\"__t{i}\") OVER (PARTITION BY \"__u\"), 1e-300)) "
              f"AS \"__t{i}\"" for i, q in enumerate(qs)]
    sums = [f"CAST(coalesce(sum(floor({1 << FRACTION_BITS} * \"__t{i}\")), 0) AS HUGEINT) AS \"__b{i}\"" for i in range(len(qs))]
    group_by = f" GROUP BY {', '.join(keys)}" if keys else ""
    text = f"""
        SELECT {key_list}{', '.join(sums)}
        FROM (SELECT "__u", {key_list}{', '.join(scaled)}
              FROM (SELECT "__u", {key_list}{', '.join(terms)}
                    FROM (SELECT *, count(*) OVER (PARTITION BY "__u")::DOUBLE AS g
                          FROM (SELECT "__u", {key_list}count(*)::DOUBLE AS n{counts}
                                FROM ({rows}) AS "__r" GROUP BY ALL) AS "__p") AS "__w") AS "__d") AS "__s"
        {group_by}
    """
    return text if engine.dialect == d else exp.maybe_parse(text, dialect=d)


def estimate_bias(plan: QueryPlan, engine: Engine, epsilon: float, groups: pa.Table,
                  source: RandomSource | None = None) -> tuple[BiasEstimate, pa.Table]:
    """Run :func:`bias_query` and release it, per row of ``groups`` (the noisy table: its
    group-key columns name the released groups), with discrete Laplace noise.

    Returns the totals and ``groups`` with one column ``__bias<i>`` per quantity (the noisy
    estimate of each group, in rows or values), for :func:`cells`. Charge
    ``bias_events(plan, epsilon)`` before calling this."""
    qs = quantities(plan, epsilon)
    keys = [k.name for k in plan.group_keys]
    exact = engine.run(bias_query(plan, engine, qs)).to_pylist()
    by_group = {tuple(row[k] for k in keys): row for row in exact}
    released = [tuple(v) for v in zip(*(groups[k].to_pylist() for k in keys))] if keys else [()] * max(1, groups.num_rows)
    step = math.ldexp(1.0, -FRACTION_BITS)
    columns, totals = [], []
    for i, q in enumerate(qs):
        noise = q.noise.sample(len(released), source)
        values = [(int(by_group.get(g, {}).get(f"__b{i}") or 0) + int(z)) * step for g, z in zip(released, noise)]
        columns.append(pa.array(values, pa.float64()))
        totals.append((sum(values), _total_half_width(q.noise, len(released)) * step))
    estimate = BiasEstimate(totals[0][0], totals[0][1], qs[0].clip, epsilon,
                            {q.name: totals[i] for i, q in enumerate(qs) if i})
    if groups.num_rows != len(released):  # an ungrouped query always has its one row
        return estimate, pa.table({f"__bias{i}": c for i, c in enumerate(columns)})
    table = groups
    for i, c in enumerate(columns):
        table = table.append_column(f"__bias{i}", c)
    return estimate, table


def _total_half_width(noise: DiscreteLaplace, k: int) -> float:
    """The 95% half-width, in lattice steps, of a sum of ``k`` independent draws of ``noise``:
    the exact quantile for one draw; for more, :func:`_laplace_sum_quantile` (continuous
    Laplace of the same scale) plus one step per draw for the lattice."""
    if k <= 1:
        return noise.quantile_abs(CONFIDENCE)
    return float(math.ceil(_laplace_sum_quantile(k) * noise.scale) + k)


@functools.lru_cache(maxsize=256)
def _laplace_sum_quantile(k: int) -> float:
    """t with ``P(|S| > t) = 1 - CONFIDENCE`` for S a sum of k Laplace(1) draws.

    Up to 64 draws, from the closed form of the tail: ``P(S > t) = e^-t / (2^(2k-1) (k-1)!)
    sum_j (2k-2-j)! / (k-1-j)! 2^j sum_{i<=j} t^i / i!`` (the density of the sum is
    ``e^-|x|`` times a polynomial in ``|x|``, integrated term by term), solved by bisection.
    Beyond, the normal quantile of the sum's variance ``2k``, 2% wider (the sum's excess
    kurtosis is 3 / k, so the normal is then within 1%).

    >>> round(_laplace_sum_quantile(1), 4) == round(math.log(20), 4)
    True
    """
    if k > 64:
        return 1.02 * 1.959963984540054 * math.sqrt(2 * k)
    log_norm = (2 * k - 1) * math.log(2) + math.lgamma(k)
    weights = [math.exp(math.lgamma(2 * k - 1 - j) - math.lgamma(k - j) + j * math.log(2) - log_norm) for j in range(k)]

    def tail(t: float) -> float:  # P(|S| > t)
        total, partial, power = 0.0, 0.0, 1.0
        for j, w in enumerate(weights):
            power = 1.0 if j == 0 else power * t / j
            partial += power
            total += w * partial
        return 2 * math.exp(-t) * total

    lo, hi = 0.0, 10.0 + 10.0 * math.sqrt(k)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > 1 - CONFIDENCE else (lo, mid)
    return hi


def cells(plan: QueryPlan, estimate: BiasEstimate, per_row: Mapping[str, list[float]]) -> dict[str, list[CellBias | None]]:
    """Per output column, per row: its estimates (``per_row``: the ``__bias<i>`` columns of
    :func:`estimate_bias`, aligned with the answer's rows by the post-processor)."""
    qs = quantities(plan, estimate.epsilon)
    half = [q.half_width for q in qs]
    by_name = {a.name: a for a in plan.aggregates}
    measured = {m.name: m for m in plan.measurements}
    values = {r.name for r in plan.value_releases}
    out: dict[str, list[CellBias | None]] = {}
    rows = len(per_row.get("__bias0", []))
    for name, projection in zip(plan.output_names, plan.output.expressions):
        refs = {c.name for c in projection.find_all(exp.Column)}
        aggregates = [by_name[r] for r in refs if r in by_name]
        if not aggregates and not refs & values:
            out[name] = [None] * rows
            continue
        columns = {measured[n].column for a in aggregates for n in a.measurements
                   if n in measured and measured[n].kind in _CLIPPED_KINDS}
        chosen = [i for i, q in enumerate(qs) if i and q.name in columns]
        out[name] = [CellBias((per_row["__bias0"][j], half[0]),
                              tuple((qs[i].name, per_row[f"__bias{i}"][j], half[i]) for i in chosen))
                     for j in range(rows)]
    return out


def attach(result: Result, plan: QueryPlan, estimate: BiasEstimate, per_row: Mapping[str, list[object]] | None,
           epsilon: float) -> Result:
    """``result`` with its bias estimates (``res.bias``, per cell when ``per_row`` aligns
    them with the answer's rows), the whole charge ``epsilon`` and the note."""
    table = cells(plan, estimate, per_row) if per_row is not None else {}  # type: ignore[arg-type]
    result.bias = replace(estimate, cells=table)
    result.privacy = replace(result.privacy, epsilon=epsilon, notes=(*result.privacy.notes, estimate.note()))
    return result

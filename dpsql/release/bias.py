"""An opt-in, differentially private estimate of the rows the caps dropped (issue 15 item 2).

``conn.execute(sql, bias=True)`` spends ``BIAS_SHARE`` (10%) of the query's epsilon on one
more number: how many of the rows the query selected (after WHERE, in its groups) the
contribution caps dropped. The query itself runs at the other 90%; the ledger records one
charge for both, with this estimate listed among its mechanisms, and it is charged before
any data is read, like everything else. An answer whose estimate is large next to it is
biased low: the interval (noise only) does not show that, this does.

What is measured. Per unit ``u`` with ``n_ug`` selected rows in each of its ``g_u`` groups,
the rows the caps drop, in expectation over the random choice of groups:
``d_u = sum_g n_ug - (min(g_u, L0) / g_u) sum_g min(n_ug, R)`` (exact when ``g_u <= L0``),
clipped at ``C = CLIP_FACTOR * R * L0`` rows per unit (public: from the policy's caps). The
released number is ``sum_u min(d_u, C)`` plus discrete Laplace noise.

Sensitivity. ``d_u`` depends only on unit ``u``'s own rows, so adding or removing a unit
adds or removes one term, of size at most C, and changes no other term: L1 sensitivity C.
The sum is taken in fixed point (``2**FRACTION_BITS`` steps per row, floored per unit, so
each term stays at most ``C * 2**FRACTION_BITS`` steps), and the noise is calibrated to that
integer sensitivity: pure (BIAS_SHARE epsilon)-DP whatever the query's own noise.

What it is not. A unit with more than C dropped rows counts C, so the estimate is a lower
bound when some units are far beyond the caps (the note says so); values clipped into
bounds are not counted (only rows); a row-level table without caps drops nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.engine import Engine
from dpsql.noise import RandomSource, laplace_noise
from dpsql.plan import QueryPlan

__all__ = ["BIAS_SHARE", "BiasEstimate", "bias_mechanism", "bias_split", "clip_per_unit", "dropped_rows_query", "estimate_dropped"]

#: The share of a query's epsilon the estimate takes.
BIAS_SHARE = 0.1
#: Dropped rows counted per unit: at most CLIP_FACTOR x R x L0.
CLIP_FACTOR = 10
#: Fixed-point steps per row of the sum.
FRACTION_BITS = 8


@dataclass(frozen=True)
class BiasEstimate:
    """The noisy count of rows the caps dropped, and its 95% half-width (noise only).

    Attributes:
        dropped_rows: the estimate, in rows (may be negative where nothing was dropped).
        half_width: the 95% half-width of its noise.
        clip: at most this many dropped rows were counted per unit.
        epsilon: what it cost (part of the query's charge).
    """

    dropped_rows: float
    half_width: float
    clip: int
    epsilon: float

    def note(self) -> str:
        return (f"bias estimate: about {self.dropped_rows:,.0f} ± {self.half_width:,.0f} of the rows this "
                f"query selected were dropped by the caps (counting at most {self.clip:,} per person, so a "
                f"lower bound if some have more); epsilon {self.epsilon:g} of this query's charge")


def clip_per_unit(plan: QueryPlan) -> int:
    """C: how many dropped rows of one unit are counted."""
    return CLIP_FACTOR * plan.max_rows_per_unit * plan.max_groups_per_unit


def bias_split(epsilon: float) -> tuple[float, float]:
    """The query's epsilon and the estimate's, from the epsilon asked: ``1 - BIAS_SHARE`` of
    it plans the query (the analyzer checks it), the rest goes to the estimate. A value
    that is not a number is passed on for the analyzer to refuse.

    >>> bias_split(1.0)
    (0.9, 0.1)
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        return epsilon, 0.0
    query = epsilon * (1 - BIAS_SHARE)
    return query, query * BIAS_SHARE / (1 - BIAS_SHARE)


def bias_mechanism(plan: QueryPlan, epsilon: float) -> dict[str, object]:
    """The ledger's description of the estimate (a discrete Laplace, epsilon-DP)."""
    sensitivity = clip_per_unit(plan) << FRACTION_BITS
    return {"measurement": "dropped_rows", "mechanism": "laplace", "epsilon": epsilon,
            "sensitivity": sensitivity, "lattice": 2.0**-FRACTION_BITS, "clip_per_unit": clip_per_unit(plan)}


def _bounded(plan: QueryPlan) -> bool:
    return plan.unit_column is not None or plan.unit_is_row


def dropped_rows_query(plan: QueryPlan, engine: Engine) -> exp.Expression:
    """SQL for ``sum_u floor(2**FRACTION_BITS * min(d_u, C))`` over the query's selected rows."""
    from dpsql.rewrite import _rows, _unit  # noqa: PLC0415 - the query's own FROM, joins and WHERE

    projections = [exp.alias_(_unit(plan), "__u", quoted=True)]
    projections += [exp.alias_(k.expression.copy(), k.name, quoted=True) for k in plan.group_keys]
    rows = _rows(plan, projections=projections, filter_keys=True).sql(dialect=engine.dialect)
    keys = ", ".join(exp.to_identifier(k.name, quoted=True).sql(dialect=engine.dialect) for k in plan.group_keys)
    r, l0, c, scale = plan.max_rows_per_unit, plan.max_groups_per_unit, clip_per_unit(plan), 1 << FRACTION_BITS
    return exp.maybe_parse(f"""
        SELECT CAST(coalesce(sum(floor({scale} * least(t - c * least(g, {l0}) / g, {c}))), 0) AS HUGEINT) AS steps
        FROM (SELECT "__u", count(*)::DOUBLE AS g, sum(n)::DOUBLE AS t, sum(least(n, {r}))::DOUBLE AS c
              FROM (SELECT "__u", {keys + ", " if keys else ""}count(*) AS n FROM ({rows}) AS "__r"
                    GROUP BY ALL) AS "__p"
              GROUP BY "__u") AS "__units"
    """, dialect=engine.dialect)


def estimate_dropped(plan: QueryPlan, engine: Engine, epsilon: float,
                     source: RandomSource | None = None) -> BiasEstimate:
    """Run :func:`dropped_rows_query` and release it with discrete Laplace noise at ``epsilon``.

    Charge ``bias_mechanism(plan, epsilon)`` before calling this."""
    clip = clip_per_unit(plan)
    noise = laplace_noise(clip << FRACTION_BITS, epsilon)
    step = math.ldexp(1.0, -FRACTION_BITS)
    if not _bounded(plan):  # a row-level table, not joined: no caps, nothing dropped
        exact = 0
    else:
        exact = int(engine.run(dropped_rows_query(plan, engine)).column(0)[0].as_py() or 0)
    noisy = exact + int(noise.sample(1, source)[0])
    return BiasEstimate(noisy * step, float(noise.quantile_abs(0.95)) * step, clip, epsilon)

"""The query's budget: epsilon and delta checked once against the policy (here and only
here), then split once: the bias estimate's share (``bias=True``) first, then partition
selection, the measurements and each values-based release."""

from __future__ import annotations

import math

from dpsql.analyze.calibrate import calibrate, partition_selection, selection_share
from dpsql.analyze.context import Context
from dpsql.analyze.parse import reject
from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.plan import QuantileSpec, ValueRelease
from dpsql.policy import Policy

#: The smallest non-zero delta accepted (a smaller one would overflow ln(1/delta) bounds).
MIN_DELTA = 1e-100

#: The share of a query's epsilon the bias estimates take (``execute(sql, bias=True)``,
#: :mod:`dpsql.release.bias`).
BIAS_SHARE = 0.1


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def resolve_budget(policy: Policy, epsilon: float | None, delta: float | None) -> tuple[float, float]:
    """The query's (epsilon, delta), defaulted and checked against the policy caps."""
    eps = policy.default_epsilon if epsilon is None else epsilon
    dlt = 0.0 if delta is None else delta
    for name, value in (("epsilon", eps), ("delta", dlt)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise QueryRejected(f"{name} must be a finite number, got {str(value)[:40]!r}.")
    if eps <= 0:
        raise QueryRejected(f"epsilon must be > 0, got {eps}; pass e.g. epsilon=0.5.")
    if eps < policy.min_epsilon_per_query:
        raise PolicyViolation(
            f"epsilon={eps} is below the policy's min_epsilon_per_query="
            f"{policy.min_epsilon_per_query}: every query that reads data is also a chance to probe "
            "a side channel, so the policy sets a floor on what one costs. Ask for at least that."
        )
    if eps > policy.max_epsilon_per_query:
        raise PolicyViolation(
            f"epsilon={eps} is above the policy's max_epsilon_per_query="
            f"{policy.max_epsilon_per_query}; ask for at most that."
        )
    if dlt < 0 or dlt >= 1:
        raise QueryRejected(f"delta must be in [0, 1), got {dlt}; use 0 for pure epsilon-DP.")
    if 0 < dlt < MIN_DELTA:
        raise QueryRejected(
            f"delta={dlt} is below {MIN_DELTA:g}, which no mechanism can tell from 0; pass delta=0 "
            "for pure epsilon-DP."
        )
    if dlt > policy.max_delta_per_query:
        raise PolicyViolation(
            f"delta={dlt} is above the policy's max_delta_per_query="
            f"{policy.max_delta_per_query}; ask for at most that, or 0."
        )
    return float(eps), float(dlt)


def bias_split(epsilon: float) -> tuple[float, float]:
    """The query's epsilon and the bias estimates', from the (checked) epsilon asked:
    ``1 - BIAS_SHARE`` of it plans the query, the rest goes to the estimates.

    >>> bias_split(1.0)
    (0.9, 0.1)
    """
    query = epsilon * (1 - BIAS_SHARE)
    return query, query * BIAS_SHARE / (1 - BIAS_SHARE)


def check_budget(ctx: Context) -> None:
    """Pass: the query's (epsilon, delta), defaulted and checked against the policy; with
    ``bias``, the bias estimates' share (:func:`bias_split`) set aside from the epsilon
    checked, which is what the query is charged in all."""
    epsilon, ctx.delta = resolve_budget(ctx.policy, *ctx.requested)
    ctx.epsilon, ctx.bias_epsilon = bias_split(epsilon) if ctx.bias else (epsilon, 0.0)


def split_budget(ctx: Context) -> None:
    """Pass: split (epsilon, delta) once: partition selection (private keys) first, then
    equal parts (basic composition) for the measurements together and for each
    values-based release, each of those divided by the groups a unit may touch."""
    eps, dlt = ctx.epsilon, ctx.delta
    l0 = ctx.l0
    agg_eps, agg_dlt = eps, dlt
    if any(not k.is_public for k in ctx.keys.values()):
        if dlt == 0:
            private = next(k for k in ctx.keys.values() if not k.is_public)
            raise reject(
                f"grouping by {private.column or 'an expression'!r}, whose values the policy does "
                "not list, needs DP partition selection, which needs a delta: pass e.g. delta=1e-7.",
                ctx.sql,
                ctx.select.args.get("group"),
            )
        if ctx.specs or ctx.values:
            eps_sel, dlt_sel = selection_share(eps, dlt, len(ctx.specs) + len(ctx.values))
        else:  # GROUP BY keys alone (issue 14): the keys are the whole answer
            eps_sel, dlt_sel = eps, dlt
        ctx.selection = partition_selection(eps_sel, dlt_sel, l0)
        agg_eps, agg_dlt = eps - eps_sel, dlt - dlt_sel
    parts = len(ctx.values) + (1 if ctx.specs else 0)  # basic composition between the parts
    if parts == 0:
        return
    part_eps, part_dlt = agg_eps / parts, agg_dlt / parts
    max_rows = ctx.scope.max_rows_per_unit
    if ctx.specs:
        ctx.measurements = tuple(
            calibrate(list(ctx.specs.values()), epsilon=part_eps, delta=part_dlt, l0=l0, max_rows=max_rows)
        )
    # An order statistic reads one value per unit and group (the tightest local sensitivity);
    # a UDF reads up to max_rows_per_unit (sample-and-aggregate blocks are whole units).
    ctx.value_releases = tuple(
        ValueRelease(
            agg.name, target, col.policy.name, col.entry.canonical, part_eps / l0, part_dlt / l0,
            1 if isinstance(target, QuantileSpec) else max_rows,
        )
        for agg, target, col in ctx.values.values()
    )

"""Caps and bounds for a table: the data owner's ``dpsql policy suggest`` (issue 15).

OWNER ONLY, like :mod:`dpsql.bounding` (whose records, SQL helpers and report it uses): it
reads raw rows and returns exact figures. Split from :mod:`dpsql.bounding` (issue 16: modules
under ~500 lines); code moved unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import sqlglot.expressions as exp

from dpsql.bounding import (
    DEFAULT_SHARE,
    REFERENCE_EPSILON,
    Suggestion,
    _engine,
    _ident,
    _policy_inputs,
    _Source,
    format_report,
    table_report,
)
from dpsql.engine import DuckDBEngine
from dpsql.errors import PolicyError

__all__ = ["add_suggest_command", "format_suggestion", "run_suggest", "suggest"]


# ---------------------------------------------------------------- suggestions


def _smallest_cap(counts: np.ndarray, weights: np.ndarray, share: float) -> int:
    """The smallest R with ``sum_i w_i min(n_i, R) >= share * sum_i w_i n_i``.

    ``counts`` are per-unit row counts n_i (any order), ``weights`` how many units have
    each. ``kept(R)`` is piecewise linear and non-decreasing in R; solved exactly.
    """
    order = np.argsort(counts)
    n, w = counts[order].astype(np.float64), weights[order].astype(np.float64)
    total = float((n * w).sum())
    if total <= 0:
        return 1
    target = share * total
    below = np.concatenate([[0.0], np.cumsum(n * w)])        # rows of units with n <= n_j (before j)
    above = np.concatenate([np.cumsum(w[::-1])[::-1], [0.0]])  # units with n >= n_j
    # For R in [n_{j-1}, n_j]: kept(R) = below[j] + R * above[j].
    for j in range(len(n)):
        if below[j] + n[j] * above[j] >= target:
            need = (target - below[j]) / above[j]
            return max(1, math.ceil(float(need) - 1e-9))
    return max(1, int(n[-1]))


def _suggest_rows(src: _Source, share: float, bounds: Mapping[str, tuple[float, float]]) -> int:
    """The smallest R keeping ``share`` of the rows and, for each bounded column, ``share``
    of its absolute sum once clipped (what an ungrouped SUM keeps, exactly as in
    :func:`_column_figures`, against the sum of ``|x|`` over finite values)."""
    rows = src.rows(f"SELECT n, count(*) FROM (SELECT count(*) AS n FROM {src.ref} GROUP BY {src.unit}) GROUP BY n")
    if not rows:
        return 1
    n, w = (np.array(c, dtype=np.int64) for c in zip(*rows))
    r = _smallest_cap(n, w, share)
    for column, (lo, hi) in bounds.items():
        x = f"CAST({_ident(column)} AS DOUBLE)"
        per_unit = src.engine.run(
            f"SELECT count(*) AS n, sum(abs(least(greatest(x, {float(lo)!r}), {float(hi)!r}))) AS m, "
            f"sum(abs(x)) FILTER (WHERE isfinite(x)) AS t FROM "
            f"(SELECT {src.unit} AS u, {x} AS x FROM {src.ref} WHERE {x} IS NOT NULL AND NOT isnan({x})) GROUP BY u")
        counts = per_unit.column("n").to_numpy(zero_copy_only=False).astype(np.float64)
        mass = np.nan_to_num(per_unit.column("m").to_numpy(zero_copy_only=False).astype(np.float64))
        total = float(np.nansum(per_unit.column("t").to_numpy(zero_copy_only=False).astype(np.float64)))
        r = max(r, _smallest_mass_cap(counts, mass, share * total))
    return r


def _smallest_mass_cap(counts: np.ndarray, mass: np.ndarray, target: float) -> int:
    """The smallest R with ``sum_u m_u min(n_u, R) / n_u >= target`` (bisection: the kept
    mass is non-decreasing in R); the largest n_u if no R reaches it."""
    if not len(counts) or target <= 0:
        return 1

    def kept(cap: int) -> float:
        return float((mass * np.minimum(counts, cap) / counts).sum())

    lo, hi = 1, int(counts.max())
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if kept(mid) >= target else (mid + 1, hi)
    return lo


def _suggest_groups(src: _Source, column: str, values: Sequence[object] | None, r: int, share: float) -> int:
    """The smallest L0 with expected kept rows >= ``share`` of the grouping's rows (or, if R
    alone keeps less than that, of what R keeps)."""
    key = _ident(column)
    listed = "TRUE" if values is None else (
        f"{key} IN ({', '.join(exp.convert(v).sql(dialect='duckdb') for v in values)})" if values else "FALSE")
    rows = src.rows(f"""
        SELECT g, sum(capped), sum(total) FROM (
            SELECT u, count(*) AS g, sum(least(n, {r})) AS capped, sum(n) AS total FROM (
                SELECT {src.unit} AS u, {key} AS k, count(*) AS n FROM {src.ref}
                WHERE {key} IS NOT NULL AND {listed} GROUP BY ALL) GROUP BY u) GROUP BY g ORDER BY g""")
    if not rows:
        return 1
    g = np.array([row[0] for row in rows], dtype=np.float64)
    capped = np.array([float(row[1]) for row in rows])
    target = min(share * sum(float(row[2]) for row in rows), capped.sum())
    for l0 in range(1, int(g.max()) + 1):
        if (capped * np.minimum(g, l0) / g).sum() >= target - 1e-9:
            return l0
    return int(g.max())


def _nice(value: float, up: bool) -> float:
    """Round to two significant digits, away from the data (up for an upper bound)."""
    if value == 0 or not math.isfinite(value):
        return value
    step = 10 ** (math.floor(math.log10(abs(value))) - 1)
    rounded = (math.ceil if up else math.floor)(value / step) * step
    return float(round(rounded, 12))


def _suggest_bounds(src: _Source, column: str, share: float) -> tuple[float, float] | None:
    """Bounds clipping at most ``1 - share`` of the values and half that of the column's
    absolute sum (the row cap may take the other half: a SUM then keeps ``share``, since
    the row cap's weights are at most 1 and cannot make clipping cost more).

    Non-negative data: ``[0, u]``, ``u`` the larger of the ``share`` quantile and the
    smallest value whose excess mass ``sum (x - u)+`` is at most ``(1 - share) / 2 sum x``.
    Otherwise the two tails share both allowances equally.
    """
    x = src.engine.run(f"SELECT CAST({_ident(column)} AS DOUBLE) AS x FROM {src.ref} "
                       f"WHERE {_ident(column)} IS NOT NULL").column(0).to_numpy(zero_copy_only=False)
    x = np.sort(x[np.isfinite(x)])
    if not len(x):
        return None
    if x[0] >= 0:
        upper = max(_upper_by_mass(x, (1 - share) / 2), float(np.quantile(x, share)))
        return 0.0, _nice(upper, up=True) if upper > 0 else 1.0
    tail, total = (1 - share) / 2, float(np.abs(x).sum())
    upper = max(_upper_by_mass(np.clip(x, 0, None), tail / 2, total), float(np.quantile(x, 1 - tail)))
    lower = min(-_upper_by_mass(np.sort(np.clip(-x, 0, None)), tail / 2, total), float(np.quantile(x, tail)))
    lo, hi = _nice(lower, up=False), _nice(upper, up=True)
    return (lo, hi) if lo < hi else (lo, lo + 1.0)


def _upper_by_mass(sorted_x: np.ndarray, allowance: float, total: float | None = None) -> float:
    """The smallest u with ``sum (x - u)+ <= allowance * total`` (x sorted, >= 0; ``total``
    defaults to ``sum x``: the whole column's absolute sum when x is one of its tails)."""
    total = float(np.abs(sorted_x).sum()) if total is None else total
    if total <= 0:
        return 0.0
    # excess(u) at u = x_j: sum_{i > j} x_i - (n - j - 1) x_j, non-increasing in j.
    tail = np.concatenate([np.cumsum(sorted_x[::-1])[::-1][1:], [0.0]])
    excess = tail - (len(sorted_x) - 1 - np.arange(len(sorted_x))) * sorted_x
    ok = np.flatnonzero(excess <= allowance * total)
    return float(sorted_x[ok[0]]) if ok.size else float(sorted_x[-1])


def suggest(
    database: str | DuckDBEngine,
    table: str,
    *,
    unit: str | None,
    share: float = DEFAULT_SHARE,
    columns: Sequence[str] | None = None,
    groupings: Mapping[str, Sequence[object] | None] | None = None,
    epsilon: float = REFERENCE_EPSILON,
) -> Suggestion:
    """Caps and bounds for ``table`` that keep ``share`` of its rows and column sums.

    - bounds per numeric column (``columns``, default every numeric column but the
      unit): see :func:`_suggest_bounds`; they clip at most half the allowance;
    - ``max_rows_per_unit``: the smallest R that keeps ``share`` of the rows of an
      ungrouped query (where R binds hardest: a unit's rows are all in one group), and
      ``share`` of each column's sum once clipped (so an ungrouped SUM keeps ``share``);
    - ``max_groups_per_unit``: the smallest L0 that, for every grouping column, keeps
      ``share`` of its rows (1 when there is none).

    The report of the suggestion shows what it keeps and the noise it costs.
    """
    if not 0 < share < 1:
        raise PolicyError(f"share must be between 0 and 1 (e.g. 0.99), got {share!r}")
    engine, owned = _engine(database)
    try:
        src = _Source(engine, table, unit)
        if columns is None:
            columns = [c for c in src.types if src.numeric(c) and (unit is None or c != unit.casefold())]
        bounds = {}
        for c in columns:
            b = _suggest_bounds(src, c, share)
            if b is not None:
                bounds[c] = b
        r = _suggest_rows(src, share, bounds) if unit is not None else 1
        groupings = dict(groupings or {})
        l0 = max([_suggest_groups(src, c, v, r, share) for c, v in groupings.items()] or [1]) if unit is not None else 1
        report = table_report(engine, table, unit=unit, max_rows=r, max_groups=l0, bounds=bounds,
                              groupings=groupings, epsilon=epsilon)
        return Suggestion(table, share, r, l0, bounds, report)
    finally:
        if owned:
            engine.close()


def format_suggestion(s: Suggestion) -> list[str]:
    """TOML to paste into the policy, then the report of what it keeps and costs."""
    lines = [f"# suggested for {s.table}: keeps {100 * s.share:g}% of rows and of column sums",
             f"[tables.{s.table}]"]
    if s.report.unit is not None:
        lines += [f'privacy_unit = "{s.report.unit}"', f"max_groups_per_unit = {s.max_groups}",
                  f"max_rows_per_unit = {s.max_rows}"]
    if s.bounds:
        lines.append(f"[tables.{s.table}.columns]")
        lines += [f"{c} = {{ bounds = [{lo:g}, {hi:g}] }}" for c, (lo, hi) in s.bounds.items()]
    lines.append("")
    lines.append("# what these keep, and the noise they cost (exact figures: do not share them)")
    lines += ["# " + line.strip() for line in format_report(s.report)]
    return lines


# ---------------------------------------------------------------- the command line


def add_suggest_command(commands: object) -> None:
    """Register ``dpsql policy suggest`` on the ``policy`` subparsers."""
    suggest_cmd = commands.add_parser(  # type: ignore[attr-defined]
        "suggest", help="propose caps and bounds that keep a share of the rows and sums (owner only)")
    suggest_cmd.add_argument("table", metavar="TABLE", help="the table to bound")
    suggest_cmd.add_argument("--db", required=True, help="the DuckDB file (read-only)")
    suggest_cmd.add_argument("--policy", help="take the unit, columns and group keys from this policy")
    suggest_cmd.add_argument("--unit", help="the privacy unit column (default: the policy's; none: each row)")
    suggest_cmd.add_argument("--share", type=float, default=DEFAULT_SHARE,
                             help="share of rows and of column sums to keep (default 0.99)")
    suggest_cmd.add_argument("--epsilon", type=float, default=REFERENCE_EPSILON,
                             help="epsilon at which to price the noise (default 1)")
    suggest_cmd.set_defaults(command=run_suggest)


def run_suggest(args: object) -> int:
    """``dpsql policy suggest --db DB TABLE``: print the suggestion as TOML, then its report."""
    unit, columns, groupings = getattr(args, "unit", None), None, None
    if getattr(args, "policy", None):
        from dpsql.policy import load_policy  # noqa: PLC0415

        table = load_policy(args.policy).table(args.table)  # type: ignore[attr-defined]
        if table is None or table.public:
            raise PolicyError(f"{args.policy}: table {args.table!r} is not a private table of the policy")  # type: ignore[attr-defined]
        bounds, groupings = _policy_inputs(table)
        unit, columns = unit or table.privacy_unit, list(bounds) or None
    s = suggest(args.db, args.table, unit=unit, share=args.share, columns=columns,  # type: ignore[attr-defined]
                groupings=groupings, epsilon=args.epsilon)  # type: ignore[attr-defined]
    print("\n".join(format_suggestion(s)))
    return 0

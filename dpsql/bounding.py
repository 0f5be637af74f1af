"""What the caps and bounds cost in bias: the data owner's bounding report (issue 15).

OWNER ONLY. Everything here reads raw rows and returns EXACT figures (no noise, no
charge): it is for the trusted data owner at the command line (``dpsql policy check
POLICY --db DB`` and ``dpsql policy suggest --db DB TABLE``). No analyst path imports this
module (:class:`dpsql.Connection`, the Flight server and the Postgres front do not; a test
in ``tests/attacks`` pins that), and nothing it computes is stored where an analyst could
read it.

Contribution bounding trades noise for bias. The caps (``max_rows_per_unit`` R,
``max_groups_per_unit`` L0) and the clipping bounds fix the sensitivity, so the noise; every
row they drop and every value they clip moves the answer away from the truth, always in
the same direction, and no error bar shows it. This module measures that bias exactly:

- :func:`table_report`: per table, the share of rows the caps keep (ungrouped, and grouped
  by each groupable column), the share of units the caps leave whole, and per bounded
  column the share of values clipped and the share of the column's sum that survives
  clipping and the caps; with the noise a query pays at a reference epsilon.
- :func:`dpsql.bounding_suggest.suggest`: the smallest caps and the tightest bounds that keep a chosen share
  (default 99%) of rows and of the column sums, with the same figures for them.

Figures are *expected* values under dpsql's own bounding (DESIGN §1,
:mod:`dpsql.rewrite`): a unit with ``n`` rows in a group keeps ``min(n, R)`` of them (a
sum of ``n`` values is weighed down to ``min(n, R)`` values); a unit in ``g`` groups keeps
each with probability ``min(g, L0) / g`` (a uniform choice of ``min(g, L0)`` groups).
Ungrouped queries have one group, so only R binds there.

>>> import duckdb, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.duckdb")
>>> with duckdb.connect(path) as con:
...     _ = con.execute("CREATE TABLE t AS SELECT i % 10 AS u, i::DOUBLE AS x FROM range(40) r(i)")
>>> report = table_report(path, "t", unit="u", max_rows=2, max_groups=1, bounds={"x": (0, 30)})
>>> report.ungrouped.rows, report.ungrouped.rows_kept, report.ungrouped.row_share
(40, 20.0, 0.5)
>>> report.columns[0].clipped_above
9
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot.expressions as exp

from dpsql.engine import DuckDBEngine
from dpsql.errors import PolicyError
from dpsql.sqltypes import parse_type

__all__ = [
    "DEFAULT_SHARE",
    "check_lines",
    "CapFigures",
    "ColumnFigures",
    "DeltaProblem",
    "Suggestion",
    "TableReport",
    "delta_guard",
    "delta_limit",
    "format_report",
    "policy_reports",
    "table_report",
]

#: The share of rows and of column sums a suggestion keeps, unless told otherwise.
DEFAULT_SHARE = 0.99
#: The epsilon at which the report prices the noise of a query.
REFERENCE_EPSILON = 1.0
#: The delta guard: a policy's per-query delta must be at most 1 / (DELTA_FACTOR n).
DELTA_FACTOR = 10



# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class CapFigures:
    """What the row and group caps keep, for one grouping (``None``: no GROUP BY).

    Attributes:
        grouping: the GROUP BY column, or None for an ungrouped query.
        rows: rows of the table (with a non-NULL key, when grouped; rows outside a
            column's public values count, and are reported as ``rows_unlisted``).
        units: distinct units among those rows.
        rows_kept: expected rows the caps keep.
        units_whole: units none of whose rows the caps drop.
        rows_unlisted: rows whose key is not among the column's ``public_values``
            (dropped by the key list, not by the caps; 0 when there is no list).
    """

    grouping: str | None
    rows: int
    units: int
    rows_kept: float
    units_whole: int
    rows_unlisted: int = 0

    @property
    def row_share(self) -> float:
        return self.rows_kept / self.rows if self.rows else 1.0

    @property
    def unit_share(self) -> float:
        return self.units_whole / self.units if self.units else 1.0


@dataclass(frozen=True)
class ColumnFigures:
    """What clipping (and the row cap) does to one numeric column, ungrouped.

    Attributes:
        column: its name.
        bounds: the clipping bounds.
        values: non-NULL values.
        nan: NaN values (dropped by dpsql).
        clipped_below, clipped_above: values outside the bounds (±inf included).
        total: the sum of the finite values (the truth a SUM aims at).
        clipped_total: the sum after clipping, before the caps.
        kept_total: the expected sum after clipping and the row cap (what SUM estimates).
    """

    column: str
    bounds: tuple[float, float]
    values: int
    nan: int
    clipped_below: int
    clipped_above: int
    total: float
    clipped_total: float
    kept_total: float

    @property
    def clipped_share(self) -> float:
        return (self.clipped_below + self.clipped_above) / self.values if self.values else 0.0

    @property
    def sum_bias(self) -> float:
        """Relative bias of an ungrouped SUM: ``kept_total / total - 1`` (0 if total is 0)."""
        return self.kept_total / self.total - 1 if self.total else 0.0


@dataclass(frozen=True)
class TableReport:
    """The bounding report of one private table under given caps and bounds.

    Attributes:
        table, unit: the table and its privacy unit column (None: each row is a unit).
        max_rows, max_groups: the caps R and L0 the figures are for.
        ungrouped: what the caps keep in a query without GROUP BY.
        groupings: the same per groupable column.
        columns: per bounded column.
        noise: the 95% half-widths of ``COUNT(*)`` and of each ``SUM(col)``, each asked
            alone at ``epsilon`` (Laplace, delta 0), ungrouped: the price of these caps.
        epsilon: the reference epsilon of ``noise``.
    """

    table: str
    unit: str | None
    max_rows: int
    max_groups: int
    ungrouped: CapFigures
    groupings: tuple[CapFigures, ...]
    columns: tuple[ColumnFigures, ...]
    noise: Mapping[str, float] = field(default_factory=dict)
    epsilon: float = REFERENCE_EPSILON


@dataclass(frozen=True)
class Suggestion:
    """Caps and bounds that keep ``share`` of the rows and of the column sums, with their report."""

    table: str
    share: float
    max_rows: int
    max_groups: int
    bounds: Mapping[str, tuple[float, float]]
    report: TableReport


@dataclass(frozen=True)
class DeltaProblem:
    """A per-query delta cap too large for a table's size (see :func:`delta_guard`)."""

    table: str
    units: int
    limit: float
    delta: float

    def message(self, source: str) -> str:
        return (
            f"{source}: [privacy] max_delta_per_query = {self.delta:g} is too large for table "
            f"{self.table!r}, which has {self.units:,} privacy units: delta must be at most "
            f"1/({DELTA_FACTOR} n) = {self.limit:.3g}. A mechanism that publishes everyone's "
            f"data with probability delta is (epsilon, delta)-DP, so with n units a delta "
            f"near 1/n lets someone's data out whole. Set max_delta_per_query = {_round_down(self.limit):g} "
            f"or less (0 allows pure DP only)."
        )


# ---------------------------------------------------------------- SQL helpers


def _ident(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


class _Source:
    """A table of the database, read by its owner (hardened, read-only engine)."""

    def __init__(self, engine: DuckDBEngine, table: str, unit: str | None) -> None:
        schema = engine.schema()
        if table.casefold() not in schema:
            raise PolicyError(f"table {table!r} is not in the database; tables: {', '.join(sorted(schema))}")
        self.engine = engine
        self.table = table
        self.types = schema[table.casefold()]
        self.ref = engine.table(table).sql(dialect="duckdb")
        if unit is not None and unit.casefold() not in self.types:
            raise PolicyError(f"table {table!r} has no column {unit!r} (its privacy unit)")
        # A row-level table: each row is its own unit.
        self.unit = _ident(unit) if unit is not None else "rowid"

    def rows(self, sql: str) -> list[tuple[Any, ...]]:  # SQL values, as Arrow gives them
        table = self.engine.run(sql)
        return list(zip(*(table.column(i).to_pylist() for i in range(table.num_columns)))) if table.num_rows else []

    def numeric(self, column: str) -> bool:
        return parse_type(self.types.get(column.casefold(), "")).family == "number"


def _cap_figures(src: _Source, r: int, l0: int, grouping: str | None,
                 public_values: Sequence[object] | None = None) -> CapFigures:
    key = _ident(grouping) if grouping is not None else "NULL"
    where = f"WHERE {key} IS NOT NULL" if grouping is not None else ""
    listed = "TRUE"
    if public_values is not None:
        listed = f"{key} IN ({', '.join(exp.convert(v).sql(dialect='duckdb') for v in public_values)})" if public_values else "FALSE"
    sql = f"""
        WITH pairs AS (
            SELECT {src.unit} AS u, {key} AS k, count(*) AS n, bool_or({listed}) AS listed
            FROM {src.ref} {where} GROUP BY ALL),
        units AS (
            SELECT u, count(*) FILTER (WHERE listed) AS g,
                   sum(least(n, {r})) FILTER (WHERE listed) AS capped,
                   bool_and(n <= {r}) FILTER (WHERE listed) AS rows_fit,
                   sum(n) AS total, sum(n) FILTER (WHERE NOT listed) AS unlisted
            FROM pairs GROUP BY u)
        SELECT count(*), sum(total)::BIGINT, coalesce(sum(unlisted), 0)::BIGINT,
               coalesce(sum(CASE WHEN g > 0 THEN capped * least(g, {l0})::DOUBLE / g END), 0),
               count(*) FILTER (WHERE coalesce(unlisted, 0) = 0 AND coalesce(rows_fit, TRUE) AND g <= {l0})
        FROM units"""
    ((units, rows, unlisted, kept, whole),) = src.rows(sql)
    return CapFigures(grouping, int(rows or 0), int(units or 0), float(kept or 0.0), int(whole or 0), int(unlisted or 0))


def _column_figures(src: _Source, column: str, bounds: tuple[float, float], r: int) -> ColumnFigures:
    lo, hi = float(bounds[0]), float(bounds[1])
    x = f"CAST({_ident(column)} AS DOUBLE)"
    sql = f"""
        WITH v AS (SELECT {src.unit} AS u, {x} AS x FROM {src.ref} WHERE {x} IS NOT NULL),
        per AS (
            SELECT u, count(*) FILTER (WHERE NOT isnan(x)) AS n,
                   sum(least(greatest(x, {lo!r}), {hi!r})) FILTER (WHERE NOT isnan(x)) AS s
            FROM v GROUP BY u)
        SELECT (SELECT count(*) FROM v), (SELECT count(*) FILTER (WHERE isnan(x)) FROM v),
               (SELECT count(*) FILTER (WHERE x < {lo!r}) FROM v),
               (SELECT count(*) FILTER (WHERE x > {hi!r} AND NOT isnan(x)) FROM v),  -- NaN sorts above all in DuckDB
               (SELECT coalesce(sum(x) FILTER (WHERE isfinite(x)), 0) FROM v),
               (SELECT coalesce(sum(s), 0) FROM per),
               (SELECT coalesce(sum(CASE WHEN n > {r} THEN s * {r} / n ELSE s END), 0) FROM per)"""
    ((values, nan, below, above, total, clipped, kept),) = src.rows(sql)
    return ColumnFigures(column, (lo, hi), int(values), int(nan), int(below), int(above),
                         float(total), float(clipped), float(kept))


def _noise(r: int, bounds: Mapping[str, tuple[float, float]], epsilon: float) -> dict[str, float]:
    """95% half-widths of COUNT(*) and SUM(col), each alone, ungrouped, at ``epsilon``."""
    from dpsql.analyze.calibrate import MeasurementSpec, calibrate
    from dpsql.noise import half_width

    out: dict[str, float] = {}
    (count,) = calibrate([MeasurementSpec("n", "count_rows")], epsilon=epsilon, delta=0.0, l0=1, max_rows=r)
    # whole, as the release shows it (a whole count covers within the rounded-up half-width)
    hw = half_width(count, 0.95)
    out["COUNT(*)"] = float(math.ceil(hw)) if count.shift < 0 else hw
    for column, b in bounds.items():
        spec = MeasurementSpec("s", "sum", column, (float(b[0]), float(b[1])))
        (total,) = calibrate([spec], epsilon=epsilon, delta=0.0, l0=1, max_rows=r)
        out[f"SUM({column})"] = half_width(total, 0.95)
    return out


# ---------------------------------------------------------------- the report


def table_report(
    database: str | DuckDBEngine,
    table: str,
    *,
    unit: str | None,
    max_rows: int,
    max_groups: int,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    groupings: Mapping[str, Sequence[object] | None] | None = None,
    epsilon: float = REFERENCE_EPSILON,
) -> TableReport:
    """Exact bounding figures of ``table`` under the caps and bounds given.

    Args:
        database: a DuckDB file (opened read-only, hardened) or an open engine.
        table: the table's name.
        unit: its privacy unit column; None for a row-level table (caps are then 1).
        max_rows, max_groups: the caps R and L0.
        bounds: clipping bounds per numeric column to report on.
        groupings: groupable columns, each with its public values (or None: partition
            selection, every key counts).
        epsilon: the reference epsilon for the noise figures.
    """
    engine, owned = _engine(database)
    try:
        src = _Source(engine, table, unit)
        r, l0 = (max_rows, max_groups) if unit is not None else (1, 1)
        bounds = dict(bounds or {})
        return TableReport(
            table=table, unit=unit, max_rows=r, max_groups=l0,
            ungrouped=_cap_figures(src, r, 1, None),
            groupings=tuple(_cap_figures(src, r, l0, c, v) for c, v in (groupings or {}).items()),
            columns=tuple(_column_figures(src, c, b, r) for c, b in bounds.items()),
            noise=_noise(r, bounds, epsilon), epsilon=epsilon)
    finally:
        if owned:
            engine.close()


def _engine(database: str | DuckDBEngine) -> tuple[DuckDBEngine, bool]:
    if isinstance(database, DuckDBEngine):
        return database, False
    return DuckDBEngine(database), True


def _policy_inputs(table_policy: object) -> tuple[dict[str, tuple[float, float]], dict[str, Sequence[object] | None]]:
    """Bounded columns and groupable key columns of a table policy."""
    bounds: dict[str, tuple[float, float]] = {}
    groupings: dict[str, Sequence[object] | None] = {}
    for c in table_policy.columns.values():  # type: ignore[attr-defined]
        if c.access == "deny":
            continue
        if c.bounds is not None:
            bounds[c.name] = (float(c.bounds[0]), float(c.bounds[1]))
        if c.public_values is not None:
            groupings[c.name] = tuple(c.public_values)
        elif c.access == "group":
            groupings[c.name] = None
    return bounds, groupings


def policy_reports(policy: object, database: str | DuckDBEngine, epsilon: float = REFERENCE_EPSILON) -> list[TableReport]:
    """The report of every private, central table of a policy."""
    engine, owned = _engine(database)
    try:
        reports = []
        for t in policy.tables.values():  # type: ignore[attr-defined]
            if t.public or t.model != "central":
                continue
            bounds, groupings = _policy_inputs(t)
            reports.append(table_report(engine, t.name, unit=t.privacy_unit, max_rows=t.max_rows_per_unit,
                                        max_groups=t.max_groups_per_unit, bounds=bounds,
                                        groupings=groupings, epsilon=epsilon))
        return reports
    finally:
        if owned:
            engine.close()


# ---------------------------------------------------------------- the delta guard


def delta_limit(units: int) -> float:
    """The largest per-query delta the guard allows for a table of ``units`` units.

    >>> delta_limit(11), delta_limit(100_000)
    (0.00909090909090909, 1e-06)
    """
    return 1.0 / (DELTA_FACTOR * max(int(units), 1))


def delta_guard(policy: object, database: str | DuckDBEngine) -> list[DeltaProblem]:
    """Private tables whose size makes the policy's per-query delta cap unsafe.

    Rule: ``max_delta_per_query <= 1 / (10 n)``, n the number of privacy units of the table
    (rows, for a row-level table). A mechanism that publishes the whole data with
    probability delta and otherwise nothing is (epsilon, delta)-DP for any epsilon: with
    n units, someone is fully exposed with probability about ``n delta``. The rule keeps
    that at most 10% per query even in that worst case; the default 1e-6 of the demo
    policy is fine up to 100,000 units.
    """
    delta = float(policy.max_delta_per_query)  # type: ignore[attr-defined]
    if delta <= 0:
        return []
    engine, owned = _engine(database)
    try:
        problems = []
        for t in policy.tables.values():  # type: ignore[attr-defined]
            if t.public or t.model != "central" or t.name.casefold() not in engine.schema():
                continue
            src = _Source(engine, t.name, t.privacy_unit)
            ((units,),) = src.rows(f"SELECT count(DISTINCT {src.unit}) FROM {src.ref}")
            limit = delta_limit(int(units))
            if delta > limit:
                problems.append(DeltaProblem(t.name, int(units), limit, delta))
        return problems
    finally:
        if owned:
            engine.close()


def _round_down(value: float) -> float:
    exponent = math.floor(math.log10(value))
    return math.floor(value / 10.0**exponent) * 10.0**exponent


# ---------------------------------------------------------------- text


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.999 or x >= 1 else f"{100 * x:.2f}%"


def format_report(report: TableReport) -> list[str]:
    """Lines for ``dpsql policy check --db`` (exact figures: for the owner only)."""
    u = report.ungrouped
    unit = report.unit or "each row"
    lines = [
        f"  table {report.table} (unit {unit}; caps: {report.max_rows} rows per group, "
        f"{report.max_groups} groups per unit): {u.rows:,} rows, {u.units:,} units",
        f"    no GROUP BY: caps keep {_pct(u.row_share)} of rows; {_pct(u.unit_share)} of units keep all their rows",
    ]
    for g in report.groupings:
        extra = f"; {g.rows_unlisted:,} rows have a key outside public_values" if g.rows_unlisted else ""
        lines.append(f"    GROUP BY {g.grouping}: caps keep {_pct(g.row_share)} of rows; "
                     f"{_pct(g.unit_share)} of units keep all their rows{extra}")
    for c in report.columns:
        nan = f", {c.nan:,} NaN dropped" if c.nan else ""
        lines.append(
            f"    {c.column} [{c.bounds[0]:g}, {c.bounds[1]:g}]: {_pct(c.clipped_share)} of values clipped "
            f"({c.clipped_below:,} below, {c.clipped_above:,} above{nan}); SUM bias {100 * c.sum_bias:+.1f}% "
            f"(clipping {100 * (c.clipped_total / c.total - 1) if c.total else 0.0:+.1f}%)")
    if report.noise:
        cost = ", ".join(f"{k} ± {v:,.4g}" for k, v in report.noise.items())
        lines.append(f"    noise at epsilon {report.epsilon:g} (each alone, 95%): {cost}")
    return lines


# ---------------------------------------------------------------- the command line


def check_lines(policy: object, database: str | DuckDBEngine) -> list[str]:
    """``dpsql policy check POLICY --db DB``: the delta guard (raises), then the report.

    Raises:
        PolicyError: the per-query delta cap is too large for a table (:func:`delta_guard`).
    """
    engine, owned = _engine(database)
    try:
        problems = delta_guard(policy, engine)
        if problems:
            raise PolicyError("\n".join(p.message(policy.source) for p in problems))  # type: ignore[attr-defined]
        lines = ["bounding (exact figures read from the data: for the data owner only, never share them):"]
        for report in policy_reports(policy, engine):
            lines += format_report(report)
        return lines
    finally:
        if owned:
            engine.close()

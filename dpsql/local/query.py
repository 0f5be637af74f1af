"""SQL over a local table: unbiased estimates from stored reports, as a normal Result.

Answers are post-processing of reports that were already ``epsilon``-LDP when they left
the clients, so they charge no central budget: ``res.privacy.epsilon`` is 0 and a note
says why. What a local table can answer, and how:

- ``COUNT(*)``: the number of records, i.e. the most reports any column has (each record
  sends one per column). Exact: the local model hides values, not participation.
  ``COUNT(col)`` is the number of reports of ``col``.
- ``SUM(x)`` and ``AVG(x)`` of a column with bounds: the sum and mean of its reports,
  unbiased for the sum and mean of the *clipped* values (not clamped into the bounds,
  which would bias them). The variance of the sum is ``n A^2 - sum (w_i - c)^2``; the
  ``w_i`` are unknown, so the interval uses ``n A^2 - n (mean - c)^2``, the largest
  variance consistent with the estimated mean. That is exact when all clients hold the
  same value and otherwise too wide by at most ``r^2 / (A^2 - r^2)`` in variance
  (27% at eps = 1, for values piled at both bounds; about 0 for values near the centre).
- ``SELECT cat, COUNT(*) FROM t GROUP BY cat`` for a column with categories: one row per
  listed category (the policy lists them, so no key depends on the data), with the
  oracle's unbiased count and its variance, the true count plugged in as the estimate.

Intervals are 95% normal approximations from those variances.

What it refuses (:class:`~dpsql.errors.QueryRejected`, saying why): anything relating two
columns of one record (a WHERE, a GROUP BY with SUM/AVG of another column, two GROUP BY
keys), because each column's reports were shuffled apart from the others; joins and other
tables; aggregates other than COUNT, SUM and AVG (a two-valued report carries no minimum,
median or spread); expressions, DISTINCT, HAVING, ORDER BY and LIMIT (do them on the result:
it is free post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import sqlglot
import sqlglot.expressions as exp

from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.local.reporter import ColumnMechanism, mechanisms_for
from dpsql.local.frequency import CategoryReports
from dpsql.local.store import ReportStore
from dpsql.policy import ColumnPolicy, Policy, TablePolicy
from dpsql.result import Accuracy, ColumnPrivacy, PrivacyReport, Result

__all__ = ["answer", "references_local_table"]

_Z95 = 1.959963984540054
_AGGREGATES: dict[type[exp.Expr], str] = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}
_UNANSWERABLE = {
    "where": "a WHERE relates the filtered column to the others of the same record, but each "
             "column's reports were shuffled apart, so no report knows the other columns; ask "
             "for the whole table, or GROUP BY one categorical column to count by it",
    "having": "HAVING is not supported on a local table; filter the result instead (free post-processing)",
    "order": "ORDER BY is not supported on a local table; sort the result instead (free post-processing)",
    "limit": "LIMIT is not supported on a local table; cut the result instead (free post-processing)",
    "offset": "OFFSET is not supported on a local table",
    "distinct": "DISTINCT is not supported on a local table",
    "joins": "a local table cannot be joined: its reports carry no identity to join on",
    "with": "WITH is not supported on a local table; query it directly",
    "qualify": "QUALIFY is not supported on a local table",
}


def references_local_table(sql: str, policy: Policy) -> bool:
    """Whether ``sql`` names a local table (``model = "local"``) of ``policy``.

    Cheap when the policy has no local table; text that does not parse is left to the
    central path, which reports the syntax error.
    """
    if not any(t.model == "local" for t in policy.tables.values()) or not isinstance(sql, str):
        return False
    try:
        statements = sqlglot.parse(sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return False
    for statement in statements:
        for table in statement.find_all(exp.Table) if statement is not None else ():
            found = policy.table(table.name)
            if found is not None and found.model == "local":
                return True
    return False


@dataclass(frozen=True)
class _Item:
    """One select-list entry: an output name, and what it computes."""

    name: str
    function: str  # "key", "count_star", "count", "sum" or "avg"
    column: str | None


def answer(sql: str, policy: Policy, store: ReportStore | None) -> Result:
    """Answer ``sql`` over a local table from the reports in ``store``; no budget is charged.

    Raises:
        QueryRejected: the query needs what the local model cannot give (see module doc),
            or there is no report store.
        PolicyViolation: a column the local table does not list.
    """
    select, table = _parse(sql, policy)
    mechanisms = mechanisms_for(table)
    key = _group_key(select, table, sql)
    items = [_item(p, table, key, sql) for p in select.expressions]
    if store is None:
        raise QueryRejected(f"{table.name!r} is a local table, whose reports live in a report store; "
                            "open the connection with dpsql.connect(..., reports=PATH)")
    reports, notes = _current_reports(store, table, mechanisms)
    if key is None:
        return _ungrouped(sql, table, items, mechanisms, reports, notes)
    return _grouped(sql, table, items, key, mechanisms[key], reports[key], notes)


def _parse(sql: str, policy: Policy) -> tuple[exp.Select, TablePolicy]:
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        raise QueryRejected(f"the SQL does not parse: {exc}") from None
    if len(statements) != 1:
        raise QueryRejected("send one SQL statement at a time")
    select = statements[0]
    if not isinstance(select, exp.Select):
        raise QueryRejected("only SELECT can be asked of a local table")
    for clause, why in _UNANSWERABLE.items():
        if select.args.get(clause):
            raise QueryRejected(f"cannot answer {sql!r}: {why}")
    source = select.args.get("from_") or select.args.get("from")
    tables = list(select.find_all(exp.Table))
    if source is None or not isinstance(source.this, exp.Table) or len(tables) != 1:
        raise QueryRejected("a local table can only be queried alone: FROM one local table, no "
                            "subqueries or other tables (its reports carry no identity to combine on)")
    table = policy.table(tables[0].name)
    if table is None or table.model != "local":
        raise QueryRejected(f"{tables[0].name!r} is not a local table")
    return select, table


def _group_key(select: exp.Select, table: TablePolicy, sql: str) -> str | None:
    group = select.args.get("group")
    if group is None:
        return None
    keys = group.expressions
    if len(keys) != 1 or not isinstance(keys[0], exp.Column):
        raise QueryRejected(f"cannot answer {sql!r}: a local table groups by one categorical column "
                            "only; two keys would need both values of one record, and each column's "
                            "reports were shuffled apart")
    name = keys[0].name.casefold()
    column = _column(table, name)
    if column.categories is None:
        raise QueryRejected(f"cannot answer {sql!r}: {keys[0].name!r} is a number; a local table "
                            "groups only by a column with categories")
    return name


def _column(table: TablePolicy, name: str) -> ColumnPolicy:
    column = table.columns.get(name.casefold())
    if column is None:
        raise PolicyViolation(f"column {name!r} is not in local table {table.name!r} "
                              f"(columns: {', '.join(sorted(table.columns))}); check the name")
    return column


def _item(projection: exp.Expression, table: TablePolicy, key: str | None, sql: str) -> _Item:
    node = projection.unalias()
    name = projection.alias if isinstance(projection, exp.Alias) else (
        node.name if isinstance(node, exp.Column) else node.sql(dialect="duckdb"))
    if isinstance(node, exp.Column):
        _column(table, node.name)
        if key is not None and node.name.casefold() == key:
            return _Item(name, "key", key)
        raise QueryRejected(f"cannot answer {sql!r}: {node.name!r} is selected raw; a local table "
                            "releases only COUNT, SUM and AVG (and the GROUP BY key)")
    function = _AGGREGATES.get(type(node))
    if function is None or isinstance(node.this, exp.Distinct):
        raise QueryRejected(f"cannot answer {sql!r}: {node.sql(dialect='duckdb')} is not something "
                            "two-valued reports can estimate; a local table answers COUNT(*), "
                            "COUNT(col), SUM(col) and AVG(col) of a column with bounds, and "
                            "COUNT(*) by a categorical column. Compute expressions from the result")
    argument = node.this
    if isinstance(argument, exp.Star):
        return _Item(name, "count_star", None)
    if not isinstance(argument, exp.Column):
        raise QueryRejected(f"cannot answer {sql!r}: aggregate a bare column, not "
                            f"{argument.sql(dialect='duckdb')}; compute expressions from the result")
    column = _column(table, argument.name)
    folded = argument.name.casefold()
    if key is not None and folded != key:
        raise QueryRejected(f"cannot answer {sql!r}: {function.upper()}({argument.name}) by {key} "
                            f"needs each client's {argument.name} and {key} together, but each "
                            "column's reports were shuffled apart; ask for them separately")
    if function in ("sum", "avg") and column.bounds is None:
        raise QueryRejected(f"cannot answer {sql!r}: {argument.name!r} is a category; SUM and AVG "
                            "need a column with bounds. Count it with GROUP BY instead")
    if function == "count":
        return _Item(name, "count" if key is None else "count_star", folded)
    return _Item(name, function, folded)


def _current_reports(store: ReportStore, table: TablePolicy,
                     mechanisms: dict[str, ColumnMechanism]) -> tuple[dict[str, object], list[str]]:
    """Each column's reports made under the policy's current parameters; notes on the rest."""
    reports: dict[str, object] = {}
    notes: list[str] = []
    for key, mechanism in mechanisms.items():
        stored = store.read(table.name, key)
        reports[key] = stored.pop(mechanism.params, None)
        stale = sum(len(r) for r in stored.values())
        if stale:
            notes.append(f"{key}: {stale} report(s) made under other parameters (an earlier policy) "
                         "were left out")
    return reports, notes


def _ungrouped(sql: str, table: TablePolicy, items: list[_Item], mechanisms: dict[str, ColumnMechanism],
               reports: dict[str, object], notes: list[str]) -> Result:
    sizes = {key: (0 if r is None else len(r)) for key, r in reports.items()}  # type: ignore[arg-type]
    records = max(sizes.values(), default=0)
    values: dict[str, list[object]] = {}
    cells: dict[str, list[float | None]] = {}
    privacy: dict[str, ColumnPrivacy] = {}
    for item in items:
        if item.function in ("count_star", "count"):
            n = records if item.function == "count_star" else sizes[item.column]  # type: ignore[index]
            values[item.name], cells[item.name] = [n], [0.0]
            privacy[item.name] = ColumnPrivacy("local_report_count", 0.0, ({"model": "local", "exact": True},))
            continue
        mechanism = mechanisms[item.column].range  # type: ignore[index]
        bundle = reports[item.column]  # type: ignore[index]
        data = np.zeros(0) if bundle is None else bundle.values  # type: ignore[attr-defined]
        total, variance = _sum_estimate(data, mechanism)
        estimate: float | None = total
        if item.function == "avg":
            n = data.size
            estimate = total / n if n else None
            variance = variance / n**2 if n else math.nan
        values[item.name] = [estimate]
        std = math.sqrt(variance) if math.isfinite(variance) else None
        cells[item.name] = [None if std is None else _Z95 * std]
        privacy[item.name] = ColumnPrivacy("local_adaptive_range", std, (_described(table, mechanisms[item.column], data.size),))  # type: ignore[index]
    arrays = {name: pa.array(v, type=pa.int64() if privacy[name].mechanism == "local_report_count" else pa.float64())
              for name, v in values.items()}
    return _result(sql, table, pa.table(arrays), cells, privacy, notes, records)


def _sum_estimate(data: np.ndarray, mechanism: object) -> tuple[float, float]:
    """The sum of the reports and the largest variance consistent with their mean."""
    n = data.size
    if n == 0:
        return 0.0, 0.0
    total = float(data.sum())
    c, r, a = mechanism.center, mechanism.radius, mechanism.magnitude  # type: ignore[attr-defined]
    spread = min((total / n - c) ** 2, r**2)
    return total, n * (a**2 - spread)


def _grouped(sql: str, table: TablePolicy, items: list[_Item], key: str, mechanism: ColumnMechanism,
             bundle: object, notes: list[str]) -> Result:
    categories = list(mechanism.column.categories or ())
    oracle = mechanism.oracle
    if bundle is None:
        counts, half = np.zeros(len(categories)), np.zeros(len(categories))
        n = 0
    else:
        reports = CategoryReports(oracle, items=bundle.items, keys=bundle.keys, bits=bundle.bits)  # type: ignore[arg-type, attr-defined]
        estimate = reports.estimate()
        counts, half, n = estimate.counts, estimate.half_widths(), estimate.n
    arrays: dict[str, pa.Array] = {}
    cells: dict[str, list[float | None]] = {}
    privacy: dict[str, ColumnPrivacy] = {}
    for item in items:
        if item.function == "key":
            arrays[item.name] = pa.array(categories)
            cells[item.name] = [None] * len(categories)
            privacy[item.name] = ColumnPrivacy("public", None, ())
        else:
            arrays[item.name] = pa.array(counts.astype(np.float64))
            cells[item.name] = [float(h) for h in half]
            privacy[item.name] = ColumnPrivacy(f"local_{oracle.kind}", None, (_described(table, mechanism, n),))  # type: ignore[union-attr]
    return _result(sql, table, pa.table(arrays), cells, privacy, notes, n)


def _described(table: TablePolicy, mechanism: ColumnMechanism, n: int) -> dict[str, object]:
    return {"model": "local", "column": mechanism.column.name, "params": mechanism.params,
            "epsilon_per_report": table.epsilon, "reports": n}


def _result(sql: str, table: TablePolicy, arrow: pa.Table, cells: dict[str, list[float | None]],
            columns: dict[str, ColumnPrivacy], notes: list[str], records: int) -> Result:
    why = (f"local table {table.name!r}: estimated from {records} record(s) of {table.epsilon:g}-LDP "
           "reports per column; post-processing of already private reports, so no central "
           "budget is charged. Intervals: 95%, from the mechanisms' variances")
    result = Result(arrow, PrivacyReport(0.0, 0.0, columns, (why, *notes)), Accuracy(cells), sql)
    result.cached = False
    return result

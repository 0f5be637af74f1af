"""Noisy aggregates -> the analyst's result: select list, HAVING, ORDER BY, LIMIT.

The plan's output query runs over the noisy table alone, on a scratch DuckDB instance that
holds no data and cannot reach files, so nothing here can touch a raw value: it is
post-processing, free under differential privacy. Each output column that is a bare
aggregate (or a public key) carries its per-cell 95% half-width through ORDER BY and LIMIT
as a hidden column.
"""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.errors import QueryRejected, first_line
from dpsql.hardened import lock, open_private
from dpsql.plan import NOISY_TABLE, QueryPlan
from dpsql.analyze.parse import DIALECT

__all__ = ["Postprocessor"]

_HIDDEN = "__acc"


class Postprocessor:
    """Runs output queries over noisy tables on a private, data-free DuckDB."""

    def __init__(self) -> None:
        self._con = open_private()
        self._con.execute("SET error_on_division_by_zero = false")
        lock(self._con)
        self._lock = threading.Lock()

    def check(self, plan: QueryPlan, noisy_schema: pa.Schema) -> None:
        """Run the output query on one row of made-up values, so mistakes surface before
        any charge. (An empty table would not do: DuckDB casts lazily, per row.)"""
        if _direct_columns(plan) is None:
            self._run(plan, _sample_row(plan, noisy_schema))

    def run(self, plan: QueryPlan, noisy: pa.Table) -> tuple[pa.Table, dict[str, list[float | None]]]:
        """The visible result and, per output column, its per-row half-widths."""
        direct = _direct_columns(plan)
        if direct is not None:
            return _take_direct(plan, noisy, direct)
        table = self._run(plan, noisy)
        visible = table.select(list(range(len(plan.output_names))))
        visible = visible.rename_columns(list(plan.output_names))
        cells: dict[str, list[float | None]] = {}
        for i, name in enumerate(plan.output_names):
            hidden = f"{_HIDDEN}{i}"
            if hidden in table.schema.names:
                cells[name] = table[hidden].to_pylist()
            else:
                cells[name] = [None] * table.num_rows
        return visible, cells

    def carry(self, plan: QueryPlan, noisy: pa.Table, names: list[str]) -> dict[str, list[object]] | None:
        """Columns ``names`` of the noisy table, one value per row of the answer (after the
        output query's HAVING, ORDER BY and LIMIT), or ``None`` when the output query's rows
        are not the noisy table's (SELECT DISTINCT over it). Post-processing, like :meth:`run`."""
        if _direct_columns(plan) is not None:
            return {n: noisy[n].to_pylist() for n in names}
        if plan.output.args.get("distinct") or plan.output.args.get("group"):
            return None
        extra: list[exp.Expression] = [exp.column(n, quoted=True) for n in names]
        table = self._run(plan, noisy, extra)
        return {n: table.column(table.num_columns - len(names) + i).to_pylist() for i, n in enumerate(names)}

    def _run(self, plan: QueryPlan, noisy: pa.Table, extra: list[exp.Expression] | None = None) -> pa.Table:
        query = _with_accuracy(plan)
        if extra:
            query = query.select(*extra, copy=False)
        sql = query.sql(dialect=DIALECT)
        with self._lock:
            try:
                self._con.register(NOISY_TABLE, noisy)
                return self._con.sql(sql).to_arrow_table()
            except duckdb.Error as e:
                raise QueryRejected(
                    f"the select list, HAVING or ORDER BY cannot be evaluated on the noisy "
                    f"aggregates: {first_line(e)}"
                ) from None
            finally:
                self._con.unregister(NOISY_TABLE)

    def close(self) -> None:
        self._con.close()


def _sample_row(plan: QueryPlan, schema: pa.Schema) -> pa.Table:
    samples = {"string": "x", "number": 1.0, "boolean": True}
    keys = {
        k.name: k.public_values[0] if k.public_values else samples.get(k.family)
        for k in plan.group_keys
    }
    columns = [
        pa.array([keys[f.name]] if f.name in keys else [1], type=f.type) for f in schema
    ]
    return pa.table(columns, schema=schema)


def _direct_columns(plan: QueryPlan) -> list[str] | None:
    """For the common shape (bare aggregates and keys, nothing after), the noisy columns to
    take as they are; else ``None`` (the output query runs on the scratch engine)."""
    query = plan.output
    if any(query.args.get(k) for k in ("where", "order", "limit", "offset")):
        return None
    if not all(isinstance(p.unalias(), exp.Column) for p in query.expressions):
        return None
    return [p.unalias().name for p in query.expressions]


def _take_direct(plan: QueryPlan, noisy: pa.Table, columns: list[str]) -> tuple[pa.Table, dict[str, list[float | None]]]:
    visible = pa.table([noisy[c] for c in columns], names=list(plan.output_names))
    cells: dict[str, list[float | None]] = {}
    for name, column in zip(plan.output_names, columns):
        hidden = f"__hw{column}"
        cells[name] = noisy[hidden].to_pylist() if hidden in noisy.schema.names else [0.0] * noisy.num_rows
    return visible, cells


def _with_accuracy(plan: QueryPlan) -> exp.Select:
    """The output query plus one hidden half-width column per bare aggregate or key."""
    query = plan.output.copy()
    keys = {k.name for k in plan.group_keys}
    for i, projection in enumerate(list(query.expressions)):
        inner = projection.unalias()
        if not isinstance(inner, exp.Column):
            continue
        if inner.name.startswith("__a"):
            accuracy: exp.Expression = exp.column(f"__hw{inner.name}", quoted=True)
        elif inner.name in keys:
            accuracy = exp.cast(exp.Literal.number(0), exp.DataType.build("DOUBLE"))
        else:
            continue
        query = query.select(exp.alias_(accuracy, f"{_HIDDEN}{i}", quoted=True), copy=False)
    return query

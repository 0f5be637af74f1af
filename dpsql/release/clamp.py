"""``clamp_counts``: non-negative counts and sums (issue 15 item 6; SmartNoise's name).

Noise can push a small count below zero (a weekly count of -533). With
``conn.execute(sql, clamp_counts=True)`` every output column that is a bare ``COUNT``,
``COUNT(DISTINCT unit)``, or ``SUM`` of a column whose lower bound is at least 0 is
replaced by ``max(value, 0)``. It is post-processing of released values (free, no privacy
cost), and it keeps the reported 95% interval valid: for a truth ``t >= 0``,
``|max(x, 0) - t| <= |x - t|``, so a cell whose interval covered the truth still does.
It does bias the answer upwards where the truth is near 0 (the average of clamped noisy
zeros is positive), which is why it is an option, off by default. Counts stay integers.
Expressions over aggregates (``COUNT(*) - 10``) are left as they are.

>>> import pyarrow as pa
>>> clamp_table(pa.table({"n": [-3, 5], "s": [-1.5, 2.0], "m": [-1.0, 1.0]}), ["n", "s"]).to_pylist()
[{'n': 0, 's': 0.0, 'm': -1.0}, {'n': 5, 's': 2.0, 'm': 1.0}]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from dpsql.plan import QueryPlan
from dpsql.result import Result

__all__ = ["clamp_result", "clamp_table", "clamped_columns"]


def clamped_columns(plan: QueryPlan) -> list[str]:
    """The output columns ``clamp_counts`` applies to: bare non-negative aggregates."""
    by_name = {a.name: a for a in plan.aggregates}
    names = []
    for name, projection in zip(plan.output_names, plan.output.expressions):
        bare = projection.unalias()
        agg = by_name.get(bare.name) if isinstance(bare, exp.Column) else None
        if agg is None:
            continue
        if agg.function in ("count", "count_distinct") or (
            agg.function == "sum" and agg.bounds is not None and agg.bounds[0] >= 0
        ):
            names.append(name)
    return names


def clamp_table(table: pa.Table, columns: Iterable[str]) -> pa.Table:
    """``table`` with each of ``columns`` replaced by ``max(value, 0)`` (NULL stays NULL)."""
    for name in columns:
        i = table.column_names.index(name)
        column = table.column(i)
        zero = pa.scalar(0, type=column.type)
        table = table.set_column(i, name, pc.max_element_wise(column, zero, skip_nulls=False))
    return table


def clamp_result(result: Result, plan: QueryPlan) -> Result:
    """``result`` with its bare non-negative aggregates clamped at 0, and a note saying so.

    Post-processing of the released answer: the same object, its table replaced."""
    names = [n for n in clamped_columns(plan) if n in result.columns]
    if not names:
        return result
    result._table = clamp_table(result.arrow(), names)  # noqa: SLF001 - post-processing in place
    note = f"clamp_counts: {', '.join(names)} shown as 0 where the noise made them negative"
    result.privacy = replace(result.privacy, notes=(*result.privacy.notes, note))
    return result

"""Shared tools of the attack battery: small databases, neighbours, exact bounded outputs.

An attack test plays the adversary: it builds the worst input it can think of (a unit with
thousands of rows or groups, a NaN, a look-alike identifier, a second process racing for
the last bit of budget) and asserts that what leaves dpsql does not give it away. Most
tests compare two *neighbouring* databases, ``D`` and ``D'`` = ``D`` plus every row of one
adversarial unit (DESIGN §1: add/remove one unit).

Two kinds of evidence:

- **exact bounded outputs** (:func:`exact_bounded`): the integers the engine returns before
  any noise, for a fixed salt, so a test can check deterministically that one unit moves
  them by no more than the sensitivity the noise is calibrated to (first principles, not
  the plan's own numbers);
- **released outputs** through ``Connection.execute`` with the production noise path (the
  operating system's CSPRNG: no ``noise_source`` is ever passed here), for statistical
  tests whose false-failure rates are derived in their docstrings and in README.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

import dpsql
from dpsql.plan import Measurement, QueryPlan
from dpsql.policy import Policy, parse_policy
from dpsql.rewrite import bounded_query, value_query

__all__ = [
    "Outcome",
    "connect",
    "exact_bounded",
    "make_db",
    "measurement_for",
    "outcome",
    "policy",
    "unit_values",
]

#: A generous budget: attack tests run queries many times and must never run out by accident.
BUDGET = "[budget]\ndefault = { epsilon = 1e12, delta = 0.99 }\n"


def policy(tables: str, *, max_epsilon: float = 1e6, max_delta: float = 0.5,
           budget: str = BUDGET, accountant: str = "basic") -> Policy:
    """A policy with the given ``[tables.*]`` sections and a practically unlimited budget."""
    text = (
        "[privacy]\n"
        f"max_epsilon_per_query = {max_epsilon!r}\n"
        f"max_delta_per_query = {max_delta!r}\n"
        "default_epsilon = 1.0\n"
        f'accountant = "{accountant}"\n'
        f"{budget}\n{tables}"
    )
    return parse_policy(text, source="<attack policy>")


def make_db(path: Path, tables: Mapping[str, tuple[str, Sequence[tuple[Any, ...]] | pa.Table]]) -> Path:
    """Write ``{name: (column definitions, rows)}`` to a new DuckDB file, rows in order.

    ``rows`` is a list of tuples or an Arrow table. Rows are inserted in the given order, so
    a unit appended last does not change any other row's ``rowid``.
    """
    con = duckdb.connect(str(path))
    try:
        for name, (columns, rows) in tables.items():
            con.execute(f"CREATE TABLE {name} ({columns})")
            data = rows if isinstance(rows, pa.Table) else _arrow(rows)
            if data is not None:  # one Arrow scan (executemany is slow); DuckDB casts on insert
                con.register("__rows", data)
                con.execute(f"INSERT INTO {name} SELECT * FROM __rows")
                con.unregister("__rows")
    finally:
        con.close()
    return path


def _arrow(rows: Sequence[tuple[Any, ...]]) -> pa.Table | None:
    """Rows as an Arrow table: booleans, int64, float64, or text (which DuckDB casts into
    DATE, TIMESTAMP, HUGEINT ... on insert)."""
    if not rows:
        return None
    columns = {}
    for i, values in enumerate(zip(*rows)):
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            kind = pa.bool_()
        elif present and all(isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63 for v in present):
            kind = pa.int64()
        elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present) \
                and any(isinstance(v, float) for v in present) and all(abs(v) < 2**53 or isinstance(v, float) for v in present):
            kind = pa.float64()
        else:
            kind = pa.string()
            values = tuple(None if v is None else str(v) for v in values)
        columns[f"c{i}"] = pa.array(values, type=kind)
    return pa.table(columns)


def connect(database: Path | duckdb.DuckDBPyConnection, pol: Policy, **kwargs: Any) -> dpsql.Connection:
    """A connection with the production noise source, an in-memory ledger and, unless
    asked, no free repeats (so that every execute draws fresh noise)."""
    kwargs.setdefault("analyst", "mallory")
    kwargs.setdefault("repeats", False)
    assert "noise_source" not in kwargs, "attack tests use the production noise path"
    return dpsql.connect(database, policy=pol, **kwargs)


def measurement_for(plan: QueryPlan, output: str) -> tuple[Measurement, ...]:
    """The measurements behind output column ``output`` (in the plan's order)."""
    by_agg = {a.name: a for a in plan.aggregates}
    for name, projection in zip(plan.output_names, plan.output.expressions):
        if name == output:
            refs = {c.name for c in projection.find_all(exp.Column)}
            return tuple(plan.measurement(m) for a in refs if a in by_agg for m in by_agg[a].measurements)
    raise KeyError(output)


def exact_bounded(conn: dpsql.Connection, sql: str, *, salt: int, epsilon: float = 1.0,
                  delta: float = 0.0) -> dict[tuple[str, str | None], dict[tuple[object, ...], float]]:
    """The exact bounded (clipped, capped, not yet floored) sums of every measurement of
    ``sql``, in the column's own units, keyed by ``(kind, column)`` and group key tuple.

    The release lattice's flooring is switched off (``shift`` <= 0), so the values are
    the fixed-point sums themselves: one unit's effect on them is what the sensitivity
    must bound. Groups the bounded query does not return are absent (the release gives
    them exact zeros).
    """
    plan = conn.plan(sql, epsilon=epsilon, delta=delta)
    unfloored = replace(plan, measurements=tuple(replace(m, shift=min(m.shift, 0)) for m in plan.measurements))
    bounded = bounded_query(unfloored, salt=salt)
    table = conn._engine.run(bounded.query, dict(bounded.lists) or None)
    keys = list(zip(*(table[k.name].to_pylist() for k in plan.group_keys))) if plan.group_keys else [()] * table.num_rows
    out: dict[tuple[str, str | None], dict[tuple[object, ...], float]] = {}
    for m in plan.measurements:
        step = 2.0 ** -m.frac_bits
        out[(m.kind, m.column)] = {key: v * step for key, v in zip(keys, table[m.name].to_pylist())}
    return out


def unit_values(conn: dpsql.Connection, sql: str, *, salt: int, epsilon: float = 1.0,
                delta: float = 1e-6) -> list[dict[str, Any]]:
    """The rows an order statistic or UDF of ``sql`` reads (keys, opaque unit id, value)."""
    plan = conn.plan(sql, epsilon=epsilon, delta=delta)
    rows: list[dict[str, Any]] = []
    for release in plan.value_releases:
        rows += conn._engine.run(value_query(plan, release, salt=salt)).to_pylist()
    return rows


def differences(before: Mapping[Any, Mapping[tuple[object, ...], float]],
                after: Mapping[Any, Mapping[tuple[object, ...], float]]) -> dict[Any, dict[tuple[object, ...], float]]:
    """Per measurement and group, ``after - before`` (absent groups count as 0)."""
    out: dict[Any, dict[tuple[object, ...], float]] = {}
    for key in set(before) | set(after):
        b, a = before.get(key, {}), after.get(key, {})
        out[key] = {g: a.get(g, 0.0) - b.get(g, 0.0) for g in set(a) | set(b)}
    return out


class Outcome(tuple):  # type: ignore[type-arg]
    """(kind, detail): ("answer", column names), ("refused", error class), or
    ("raw", exception type) for anything that is not a dpsql.Error."""

    @property
    def kind(self) -> str:
        return str(self[0])


def outcome(conn: dpsql.Connection, sql: str, **kwargs: Any) -> Outcome:
    """What an adversary observes of one execute, without the noisy values themselves:
    whether it was answered (and in which shape), refused (and with which error class and
    message, data-free), or failed with a raw, non-dpsql exception."""
    try:
        res = conn.execute(sql, **kwargs)
    except dpsql.Error as e:
        return Outcome(("refused", type(e).__name__, str(e)))
    except Exception as e:  # noqa: BLE001 - the point: what else can escape
        return Outcome(("raw", f"{type(e).__module__}.{type(e).__name__}", str(e)))
    table = res.arrow()
    return Outcome(("answer", tuple(table.column_names), tuple(str(t) for t in table.schema.types)))


def l1(values: Iterable[float]) -> float:
    return math.fsum(abs(v) for v in values)


def row_bound(kind: str, bounds: tuple[float, float] | None) -> float:
    """How much one kept row can move a measurement, from DESIGN §1 (first principles):
    1 for counts, ``max(|lo|, |hi|)`` for SUM, ``(hi - lo) / 2`` for AVG's centred sum and
    ``h**2 / 2`` (``h = (hi - lo) / 2``) for VAR's centred squares."""
    if kind in ("count_rows", "count_values", "count_units"):
        return 1.0
    assert bounds is not None
    lo, hi = (float(b) for b in bounds)
    if kind == "sum":
        return max(abs(lo), abs(hi))
    h = (hi - lo) / 2
    return h if kind == "sum_centred" else h * h / 2


def assert_neighbour_bounded(conn_d: dpsql.Connection, conn_dp: dpsql.Connection, sql: str, *,
                             rows: int, groups: int, bounds: Mapping[str | None, tuple[float, float]],
                             salts: Iterable[int] = (1, 2, 3), delta: float = 0.0) -> None:
    """For each salt, one unit (D' minus D) moves every measurement of ``sql``:

    - in at most ``groups`` groups (L0),
    - in each by at most ``rows`` x the per-row bound (Linf; 1 for a count of units),
    - and in all groups together by at most ``groups`` x that (L1),

    with ``rows``, ``groups`` and the column ``bounds`` given by the test from the policy
    (first principles), not read back from the plan. A relative slack of 1e-9 covers the
    fixed-point rounding (one part in 2**40 per row).
    """
    for salt in salts:
        diff = differences(exact_bounded(conn_d, sql, salt=salt, delta=delta),
                           exact_bounded(conn_dp, sql, salt=salt, delta=delta))
        for (kind, column), per_group in diff.items():
            per_row = row_bound(kind, bounds.get(column))
            cap = per_row * (1 if kind == "count_units" else rows)
            slack = 1e-9 * cap + 1e-12
            moved = {g: v for g, v in per_group.items() if abs(v) > slack}
            assert len(moved) <= groups, (sql, kind, column, salt, moved)
            assert all(abs(v) <= cap + slack for v in moved.values()), (sql, kind, column, salt, cap, moved)
            assert l1(moved.values()) <= groups * cap + groups * slack, (sql, kind, column, salt, moved)

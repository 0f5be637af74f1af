"""The bounded query's per-row values without a CASE guard (issue 16, ``dpsql.rewrite._row_value``).

NULL stays NULL, NaN is not a value (not counted, not summed), +-inf clip to the bounds, and
every other value rounds as it always did. Checked on columns of every numeric type holding
NULL, NaN, +-inf, -0.0, half-way values, subnormals and huge values, two ways: each per-row
value against an independent Python computation from the same doubles, and the exact
bounded answers of every shape against those of the old CASE-guarded form (kept below as
the reference, as it was written before the change).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal

import duckdb
import pytest
import sqlglot.expressions as exp

import dpsql
from dpsql import rewrite
from dpsql.analyze.calibrate import clip_range, midpoint, square_offset
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query
from dpsql.rewrite.columns import RowValue
from dpsql.rewrite.nodes import call, cast
from dpsql.sqltypes import parse_type

COLUMNS = {"d": "DOUBLE", "f": "FLOAT", "i": "INTEGER", "b": "BIGINT", "m": "DECIMAL(18,3)", "hh": "HUGEINT"}
NUMBERS = "\n".join(f"{c} = {{ bounds = [-7.5, 1000] }}" for c in COLUMNS)
POLICY = f"""
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = {{ epsilon = 1000.0, delta = 0.1 }}
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.t.columns]
g = {{ public_values = ["a", "b"] }}
h = {{ public_values = ["a", "b", "c"] }}
k = {{ access = "group" }}
{NUMBERS}
[tables.r]
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.r.columns]
g = {{ public_values = ["a", "b"] }}
d = {{ bounds = [-3, 7] }}
"""

INF, NAN = float("inf"), float("nan")
#: Half-way values: with bounds [-7.5, 1000] a SUM's fixed point is 2^30 and AVG's (centred
#: on 496.25) 2^31, so these land exactly on k + 1/2 (ROUND takes them away from zero; a
#: double -> BIGINT cast would take them to even).
HALF = [2.0**-31, 3 * 2.0**-31, -(2.0**-31), -5 * 2.0**-31, 496.25 + 2.0**-32, 496.25 - 3 * 2.0**-32,
        999.5 + 2.0**-31]
FLOATS = [None, NAN, INF, -INF, -0.0, 0.0, *HALF, 1000.0, -7.5, 1000.0000001, -7.50001, 1e300, -1e300,
          5e-324, -5e-324, 3.4e38, 12.25]
VALUES: dict[str, list[object]] = {
    "d": FLOATS,
    "f": [None, NAN, INF, -INF, -0.0, 2.0**-31, 3 * 2.0**-31, -(2.0**-31), 999.5, 1000.0, -7.5, 3.0e38, -3.0e38, 0.75],
    "i": [None, 0, -7, -8, 496, 1000, 1001, 2**31 - 1, -(2**31)],
    "b": [None, 0, -7, -8, 496, 1000, 1001, 2**63 - 1, -(2**63)],
    "m": [None, Decimal("-7.500"), Decimal("-7.501"), Decimal("496.250"), Decimal("999.999"), Decimal("1000.001"),
          Decimal("999999999999999.999"), Decimal("-999999999999999.999"), Decimal("0.001")],
    "hh": [None, 0, -8, 1000, 1001, 10**30, -(10**30), 2**127 - 1],
}


def _rows() -> list[tuple[object, ...]]:
    """Every special value of every column several times over, in units over both caps."""
    rows = []
    for i in range(600):
        values = [VALUES[c][(i // (j + 1)) % len(VALUES[c])] for j, c in enumerate(COLUMNS)]
        rows.append((i % 41, "ab"[i % 2], "abc"[(i // 2) % 3], f"k{i % 7}", *values))
    return rows


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("guard") / "t.duckdb"
    with duckdb.connect(str(path)) as c:
        typed = ", ".join(f"{name} {dtype}" for name, dtype in COLUMNS.items())
        c.execute(f"CREATE TABLE t(u BIGINT, g VARCHAR, h VARCHAR, k VARCHAR, {typed})")
        c.executemany(f"INSERT INTO t VALUES ({', '.join('?' * (4 + len(COLUMNS)))})", _rows())
        c.execute("CREATE TABLE r(g VARCHAR, d DOUBLE)")
        c.executemany("INSERT INTO r VALUES (?, ?)", [("ab"[i % 2], FLOATS[i % len(FLOATS)]) for i in range(90)])
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="t", repeats=False) as connection:
        yield connection


def _old_row_value(value: RowValue, types: Mapping[str, str]) -> exp.Expression:
    """The per-row value before issue 16's change: a CASE that drops NULL and NaN, then
    ``CAST(ROUND(LEAST(GREATEST(...))) AS BIGINT)``; the reference."""
    m = value.of
    assert m.column is not None
    if m.expression is not None:
        column: exp.Expression = exp.Paren(this=m.expression.copy())
        dtype = m.expression_type
    else:
        column = exp.column(m.column, m.source, quoted=True)
        dtype = types[m.column.casefold()]
    present: exp.Expression = exp.Not(this=exp.Is(this=column, expression=exp.Null()))
    if parse_type(dtype).name in ("FLOAT", "DOUBLE"):
        present = exp.And(this=present, expression=exp.Not(this=call("isnan", cast(column.copy(), "DOUBLE"))))
    if value.kind == "present":
        return exp.Case(ifs=[exp.If(this=present, true=exp.Literal.number(1))])

    def number(v: float) -> exp.Expression:
        return cast(exp.Literal.number(repr(float(v))), "DOUBLE")

    def clip(x: exp.Expression, lo: float, hi: float) -> exp.Expression:
        return call("least", call("greatest", x, number(lo)), number(hi))

    x: exp.Expression = cast(column.copy(), "DOUBLE")
    assert m.bounds is not None
    if value.kind in ("sum_centred", "sum_squares"):
        x = exp.Sub(this=x, expression=number(midpoint(m.bounds)))
    if value.kind == "sum_squares":
        c = clip(x, *clip_range("sum_centred", m.bounds))
        x = exp.Sub(this=exp.Mul(this=c, expression=c.copy()), expression=number(square_offset(m.bounds)))
    scaled = exp.Mul(this=clip(x, *clip_range(value.kind, m.bounds)), expression=number(2.0**value.frac_bits))
    return exp.Case(ifs=[exp.If(this=present, true=cast(exp.Round(this=scaled), "BIGINT"))])


def _reference(x: float | None, kind: str, bounds: tuple[float, float], frac_bits: int) -> int | None:
    """A per-row value in Python: None for NULL and NaN, else the clipped value (centred for
    AVG) times 2^frac_bits, rounded half away from zero, exactly."""
    if x is None or math.isnan(x):
        return None
    if kind == "present":
        return 1
    lo, hi = clip_range(kind, bounds)
    v = x - midpoint(bounds) if kind == "sum_centred" else x
    scaled = math.ldexp(min(max(v, lo), hi), frac_bits)
    return int(Decimal(scaled).to_integral_value(rounding=ROUND_HALF_UP))


@pytest.mark.parametrize("column", list(COLUMNS))
def test_each_row_value_matches_an_independent_computation(conn, column: str) -> None:
    plan = conn.plan(f"SELECT SUM({column}), AVG({column}) FROM t", epsilon=1.0)
    values = [RowValue(f"__x{j}", m.kind, m, m.frac_bits) for j, m in enumerate(plan.measurements)
              if m.kind in ("sum", "sum_centred")]
    values.append(RowValue("__xn", "present", values[0].of, 0))
    types = dict(plan.source(plan.sources[0].alias).types)
    (source,) = plan.sources
    projections = [exp.alias_(cast(exp.column(column, source.alias, quoted=True), "DOUBLE"), "__x", quoted=True)]
    projections += [exp.alias_(rewrite._row_value(v, types), v.name, quoted=True) for v in values]
    rows = conn._engine.run(rewrite._rows(plan, projections)).to_pylist()
    assert len(rows) == 600
    for v in values:
        assert v.of.bounds == (-7.5, 1000.0)
        got = [row[v.name] for row in rows]
        want = [_reference(row["__x"], v.kind, v.of.bounds, v.frac_bits) for row in rows]
        if v.kind == "present":  # only COUNT reads it: which rows are NULL is what counts
            got, want = [g is None for g in got], [w is None for w in want]
        assert got == want, v.kind
    assert {v.kind for v in values} == {"sum", "sum_centred", "present"}
    assert any(row["__x"] is None for row in rows)
    if column in ("d", "f"):  # the data really holds what the test is about
        xs = [row["__x"] for row in rows if row["__x"] is not None]
        assert any(math.isnan(x) for x in xs) and INF in xs and -INF in xs
        assert any(math.copysign(1.0, x) < 0 and x == 0 for x in xs)


SHAPES = [
    "SELECT g, COUNT(*), SUM(d), AVG(d) FROM t GROUP BY g",
    "SELECT g, COUNT(*), SUM(f), AVG(f) FROM t WHERE i > 0 GROUP BY g",
    "SELECT k, COUNT(*), AVG(d) FROM t GROUP BY k",
    "SELECT g, h, COUNT(*), SUM(d), AVG(d), SUM(m) FROM t GROUP BY g, h",
    "SELECT g, VAR_POP(d), STDDEV_SAMP(f), VAR_SAMP(m), AVG(hh), SUM(hh) FROM t GROUP BY g",
    "SELECT g, COUNT(d), COUNT(f), COUNT(i), COUNT(m), COUNT(hh) FROM t GROUP BY g",
    "SELECT g, SUM(d * 2), AVG(i + f), SUM(b), AVG(b), AVG(i), SUM(i) FROM t GROUP BY g",
    "SELECT SUM(d), AVG(m), COUNT(f), VAR_POP(f) FROM t",
    "SELECT g, COUNT(*), SUM(d), AVG(d), VAR_SAMP(d), COUNT(d) FROM r GROUP BY g",
]


def _exact(conn: dpsql.Connection, sql: str, row_value: object, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    plan = conn.plan(sql, epsilon=1.0, delta=1e-6 if "GROUP BY k" in sql else 0.0)
    monkeypatch.setattr(rewrite, "_row_value", row_value)
    table = conn._engine.run(bounded_query(plan, salt=99).query)
    monkeypatch.undo()
    return sorted((tuple(sorted(r.items())) for r in table.to_pylist()), key=repr)


@pytest.mark.parametrize("sql", SHAPES)
def test_every_shape_gives_the_exact_answers_of_the_case_guard(conn, sql: str, monkeypatch: pytest.MonkeyPatch) -> None:
    new = _exact(conn, sql, rewrite._row_value, monkeypatch)
    old = _exact(conn, sql, _old_row_value, monkeypatch)
    assert new and new == old
    # and the old form was really replaced (the comparison is not of a form with itself)
    text = bounded_query(conn.plan(sql, epsilon=1.0, delta=1e-6 if "GROUP BY k" in sql else 0.0), salt=1).query.sql()
    assert "CASE WHEN NOT" not in text and "ISNAN" not in text.upper()

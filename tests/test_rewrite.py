"""Golden rewrite fixtures, plus an execute check against an independent computation.

``tests/fixtures/rewrite.sql`` holds ``-- case: NAME [epsilon delta]`` blocks, each the
analyst's SQL, ``;``, then the bounded SQL dpsql generates with the salt fixed at 0, ``;``.
Review a change to the generated SQL by regenerating the file with
``DPSQL_UPDATE_GOLDEN=1 pytest tests/test_rewrite.py`` and reading the diff.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query

from policy_builder import policy_text

FIXTURES = Path(__file__).parent / "fixtures" / "rewrite.sql"

POLICY = policy_text(max_delta=1e-5, budget=(1000.0, 0.1), tables="""
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.visits.columns]
region = { public_values = ["north", "south", "east"] }
income = { bounds = [0, 1000] }
age = { bounds = [10, 90] }
zip = { access = "filter" }
[tables.events]
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.events.columns]
kind = { public_values = ["a", "b"] }
amount = { bounds = [-5, 5] }
""")

# (user_id, region, income, age, zip): unit 1 exceeds the row cap with identical values, so
# any choice of kept rows gives the same sums; unit 2 has NULL, NaN and +-inf incomes.
ROWS = [
    *[(1, "north", 500.0, 30, "100")] * 7,
    (2, "north", None, 40, "200"),
    (2, "north", float("nan"), 40, "200"),
    (2, "south", float("inf"), 40, "200"),
    (2, "south", float("-inf"), 40, "200"),
    (3, "south", 2000.0, 95, "300"),
    (3, "east", -10.0, 5, "300"),
    (4, "west", 100.0, 50, "400"),
    (5, None, 100.0, 50, "400"),
    (6, "east", 250.25, 61, "150"),
]

EVENTS = [("a", 1.5), ("a", 9.0), ("b", -7.0), ("b", None), ("a", 2.25)]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("rewrite") / "golden.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE visits(user_id BIGINT, region VARCHAR, income DOUBLE, age INTEGER, zip VARCHAR)")
        c.executemany("INSERT INTO visits VALUES (?, ?, ?, ?, ?)", ROWS)
        c.execute("CREATE TABLE events(kind VARCHAR, amount DOUBLE)")
        c.executemany("INSERT INTO events VALUES (?, ?)", EVENTS)
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="t") as connection:
        yield connection


def _cases() -> list[tuple[str, float, float, str, str]]:
    cases = []
    for block in FIXTURES.read_text().split("-- case: ")[1:]:
        header, _, body = block.partition("\n")
        name, epsilon, delta = header.split()
        sql, _, expected = body.partition(";")
        cases.append((name, float(epsilon), float(delta), sql.strip(), expected.strip().rstrip(";").strip()))
    return cases


CASES = _cases()


def _generated(conn: dpsql.Connection, sql: str, epsilon: float, delta: float) -> str:
    plan = conn.plan(sql, epsilon=epsilon, delta=delta)
    return bounded_query(plan, conn._engine, salt=0).sql(dialect="duckdb", pretty=True)


@pytest.mark.parametrize(("name", "epsilon", "delta", "sql", "expected"), CASES, ids=[c[0] for c in CASES])
def test_golden_bounded_sql(conn, name: str, epsilon: float, delta: float, sql: str, expected: str) -> None:
    generated = _generated(conn, sql, epsilon, delta)
    if os.environ.get("DPSQL_UPDATE_GOLDEN"):
        text = FIXTURES.read_text()
        FIXTURES.write_text(text.replace(expected, generated))
        return
    assert generated == expected


def _fixed(value: float, frac_bits: int) -> int:
    """ROUND half away from zero of value * 2**frac_bits, as DuckDB does."""
    scaled = math.ldexp(value, frac_bits)
    return int(math.copysign(math.floor(abs(scaled) + 0.5), scaled))


def _floored(value: int, shift: int) -> int:
    """What the bounded query returns: floored by 2**shift in SQL (refined later in Python)."""
    return value >> shift if shift > 0 else value


def _clip(value: float | None, lo: float, hi: float) -> float | None:
    if value is None or math.isnan(value):
        return None
    return min(max(value, lo), hi)


def _independent_region_sums(frac_bits: int, centred_bits: int, mid: float) -> dict[str, dict[str, int]]:
    """COUNT(*), SUM(income) and AVG(income)'s parts per region, computed row by row."""
    per_pair: dict[tuple[int, str], list[tuple[float | None, float]]] = defaultdict(list)
    for user, region, income, _age, _zip in ROWS:
        if region in ("north", "south", "east"):
            per_pair[(user, region)].append((_clip(income, 0, 1000), income))
    out: dict[str, dict[str, int]] = {r: defaultdict(int) for r in ("north", "south", "east")}
    for (_user, region), rows in per_pair.items():
        kept = rows[:3]  # unit 1's rows are identical, every other unit has <= 3 rows
        present = [c for c, _ in kept if c is not None]
        out[region]["count"] += len(kept)
        out[region]["sum"] += sum(_fixed(c, frac_bits) for c in present)
        out[region]["centred"] += sum(_fixed(c - mid, centred_bits) for c in present)
        out[region]["n"] += len(present)
    return out


def test_bounded_query_matches_independent_computation(conn) -> None:
    sql = "SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region"
    plan = conn.plan(sql, epsilon=1.0)
    rows, total, centred, n = plan.measurements
    assert (rows.kind, total.kind, centred.kind, n.kind) == ("count_rows", "sum", "sum_centred", "count_values")
    assert plan.sample_groups  # 3 public regions > 2 groups per unit (no unit here has more)
    exact = conn._engine.run(bounded_query(plan, conn._engine, salt=7)).to_pylist()
    expected = _independent_region_sums(total.frac_bits, centred.frac_bits, 500.0)
    for row in exact:
        region = row["__g0"]
        assert row[rows.name] == _floored(expected[region]["count"], rows.shift)
        assert row[total.name] == _floored(expected[region]["sum"], total.shift)
        assert row[centred.name] == _floored(expected[region]["centred"], centred.shift)
        assert row[n.name] == expected[region]["n"]
    assert {r["__g0"] for r in exact} <= {"north", "south", "east"}


def test_row_level_table_needs_no_bounding(conn) -> None:
    plan = conn.plan("SELECT kind, COUNT(*), SUM(amount) FROM events GROUP BY kind", epsilon=1.0)
    sql = bounded_query(plan, conn._engine, salt=0).sql(dialect="duckdb")
    assert "min_by" not in sql.lower() and "row_number" not in sql.lower()
    exact = {r["__g0"]: r for r in conn._engine.run(bounded_query(plan, conn._engine)).to_pylist()}
    count, total = plan.measurements
    assert exact["a"][count.name] == 3 and exact["b"][count.name] == 2
    expected_a = sum(_fixed(v, total.frac_bits) for v in (1.5, 5.0, 2.25))
    assert exact["a"][total.name] == _floored(expected_a, total.shift)
    assert exact["b"][total.name] == _floored(_fixed(-5.0, total.frac_bits), total.shift)


@pytest.mark.attack
def test_analyst_identifiers_never_reach_the_engine(conn) -> None:
    sql = 'SELECT "REGION", count(*) FROM VISITS AS "v; DROP TABLE visits" WHERE "v; DROP TABLE visits".zip = \'1\'\'; --\' GROUP BY 1'
    generated = _generated(conn, sql, 1.0, 0.0)
    assert "DROP" not in generated
    assert "'1''; --'" in generated  # the literal survives as one quoted literal

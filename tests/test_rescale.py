"""A unit's weighed-down sum in 64-bit branches where they fit (:mod:`dpsql.rewrite.rescale`):
every branch, at and just past each count bound, with per-row values up to the row limit
2**53, gives the exact integer of the 128-bit form."""

from __future__ import annotations

import random

import duckdb
import pytest
import sqlglot.expressions as exp

from dpsql.rewrite.columns import ROW_LIMIT, Read
from dpsql.rewrite.rescale import _MAX, per_row_bound, rescaled_sum

B = ROW_LIMIT


def _truncated(a: int, b: int) -> int:
    """``a / b`` truncated toward zero, ``b > 0``."""
    return a // b if a >= 0 else -((-a) // b)


def _expected(values: list[tuple[int | None, int]], scale: int, offset: int, cap: int) -> int | None:
    present = [(v, k) for v, k in values if v is not None and k]
    if not present:
        return None
    n = sum(k for _, k in present)
    exact = sum(v * k for v, k in present)
    total = exact if not scale else scale * exact - offset * n
    return _truncated(total * cap, n) if n > cap else total


def _groups(scale: int, offset: int, cap: int, rng: random.Random) -> list[list[tuple[int | None, int]]]:
    """Groups of (value, times) at and around each branch's count bounds, every value at the
    row limit (either sign), mixed, or random; NULLs; and random groups."""
    most = _MAX // (per_row_bound(Read(value="v", count="v", scale=scale, offset=offset)) * cap)
    counts = {1, cap - 1, cap, cap + 1, most - 1, most, most + 1, 2 * most + 3, 3 * cap + 7}
    groups: list[list[tuple[int | None, int]]] = [[(None, 2)], [(None, 1)]]
    for n in sorted(c for c in counts if 1 <= c <= 50_000):
        groups += [[(B, n)], [(-B, n)], [(B - 1, n), (None, 3)], [(0, n)]]
        if n > 1:
            groups += [[(B, n - 1), (-B, 1)], [(-B, n - 1), (rng.randint(-B, B), 1)]]
        groups.append([(rng.randint(-B, B), 1) for _ in range(min(n, 50))] + [(rng.randint(-B, B), max(n - 50, 0))])
    for _ in range(300):  # a few values, each repeated (some pairs over the cap, some not)
        groups.append([(rng.choice([rng.randint(-B, B), rng.randint(-1000, 1000), None]), rng.randint(1, 2 * cap))
                       for _ in range(rng.randint(1, 4))])
    return groups


CASES = [  # (scale, offset, cap): plain sums, centred sums, caps and offsets too large for 64 bits
    (0, 0, 3), (0, 0, 1), (0, 0, 10), (0, 0, 32), (0, 0, 33), (0, 0, 1023), (1, 1048576000000, 10),
    (2, 2**41, 3), (1, -5, 4), (2, 2**53, 3), (1, 2**62, 3), (4, 3, 1000),
]


@pytest.mark.parametrize(("scale", "offset", "cap"), CASES)
def test_every_branch_gives_the_exact_weighed_sum(scale: int, offset: int, cap: int) -> None:
    rng = random.Random(hash((scale, offset, cap)) & 0xFFFF)
    groups = _groups(scale, offset, cap, rng)
    rows = [(g, v, k) for g, values in enumerate(groups) for v, k in values]
    value = rescaled_sum(Read(value="v", count="v", scale=scale, offset=offset), cap)
    query = exp.select("g", exp.alias_(value, "r")).from_("t").group_by("g").sql(dialect="duckdb")
    with duckdb.connect() as c:
        c.execute("CREATE TABLE src(g INTEGER, v BIGINT, k INTEGER)")
        c.executemany("INSERT INTO src VALUES (?, ?, ?)", rows)
        c.execute("CREATE TABLE t AS SELECT g, v FROM src, range(k)")
        got = dict(c.execute(query).fetchall())
    wrong = {g: (got[g], _expected(values, scale, offset, cap)) for g, values in enumerate(groups)
             if got[g] != _expected(values, scale, offset, cap)}
    assert not wrong


def test_the_64_bit_branch_is_written_where_it_fits_and_only_there() -> None:
    def text(scale: int, offset: int, cap: int) -> str:
        return rescaled_sum(Read(value="v", count="v", scale=scale, offset=offset), cap).sql(dialect="duckdb")

    assert 'WHEN COUNT("v") <= 102 THEN' in text(0, 0, 10)  # 102 * 2**53 * 10 < 2**63 <= 103 * ...
    assert 'WHEN COUNT("v") <= 32 THEN' in text(0, 0, 32)  # N = R = 32: one branch
    large = text(0, 0, 1023)  # N = 1 < R: T in 64 bits while n <= R, then 128 bits
    assert 'WHEN COUNT("v") <= 1023 THEN (CAST(' in large and "GREATEST" not in large
    for huge in (text(0, 0, 1024), text(1, 2**62, 3)):  # 1024 * 2**53 = 2**63; offset * 3 > 2**63
        assert "AS BIGINT" not in huge and "GREATEST" not in huge


@pytest.mark.parametrize("bounds", [(0, 1e-300), (0, 0.1), (-5, 5), (1e6, 1e6 + 1), (1e15, 1e15 + 1), (-1e18, 1e18),
                                    (-1e300, 1e300), (2**52, 2**53), (-(2**60), 3)])
def test_every_summed_per_row_value_is_within_the_row_limit(bounds: tuple[float, float]) -> None:
    """What the count bounds above rest on: whatever the column's bounds, each per-row value a
    SUM, AVG or variance adds is within 2**53 (a shared one by its check, an own one by its
    fixed point; :func:`dpsql.rewrite.columns.layout` refuses to build anything else)."""
    import math

    import dpsql
    from dpsql.policy import parse_policy
    from dpsql.rewrite.columns import layout
    from policy_builder import policy_text

    lo, hi = bounds
    policy = parse_policy(policy_text(f'[tables.t]\nprivacy_unit = "u"\nmax_rows_per_unit = 3\nmax_groups_per_unit = 1\n'
                                      f'[tables.t.columns]\nx = {{ bounds = [{lo!r}, {hi!r}] }}\n'))
    with duckdb.connect() as c:
        c.execute("CREATE TABLE t(u BIGINT, x DOUBLE)")
        checked = 0
        with dpsql.connect(c, policy=policy, analyst="t", ledger=None) as conn:
            for sql in ("SELECT SUM(x), AVG(x) FROM t", "SELECT AVG(x) FROM t", "SELECT VAR_POP(x), SUM(x) FROM t"):
                try:
                    plan = conn.plan(sql, epsilon=1.0)
                except dpsql.Error:  # refused with a message (bounds too wide for a variance)
                    continue
                for value in layout(plan).values:
                    m = value.of
                    most = (max(abs(math.ldexp(b, value.frac_bits)) for b in m.bounds) if value.name.startswith("__v")
                            else m.row_bound)
                    assert most <= ROW_LIMIT, (sql, value)
                    checked += 1
    assert checked >= 2

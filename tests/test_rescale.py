"""A unit's weighed-down sum in 64-bit branches where they fit (:mod:`dpsql.rewrite.rescale`):
every branch, at and just past each bound, gives the exact integer of the 128-bit form."""

from __future__ import annotations

import random

import duckdb
import pytest
import sqlglot.expressions as exp

from dpsql.rewrite.columns import Read
from dpsql.rewrite.rescale import _HALF, _MAX, rescaled_sum

BIG = 2**62  # per-row values up to this (BIGINT); a group's sum passes 2**63 with two rows


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


def _group(total: int, n: int) -> list[tuple[int | None, int]]:
    """``n`` BIGINT values summing to ``total`` (|total| may pass 2**63), as (value, times)."""
    assert abs(total) <= n * (BIG - 1)
    base = _truncated(total, n)
    first = base + total - base * n
    assert abs(first) < 2**63
    return [(first, 1), (base, n - 1)] if n > 1 else [(first, 1)]


def _groups(scale: int, offset: int, cap: int, rng: random.Random) -> list[list[tuple[int | None, int]]]:
    """Groups at and around each branch's bounds (of at most 100,000 rows), and random ones."""
    s = scale or 1
    off = offset if scale else 0
    a1 = (_MAX - off * cap) // s
    a2 = _HALF // (cap * s)
    n2 = _HALF // (off * cap) if off else 3 * cap
    sums = {0, 1, -1, a1, a1 + 1, -a1, -a1 - 1, a2, a2 + 1, -a2, -a2 - 1, 2**63, -(2**63), 2**64 + 5}
    counts = {1, cap, cap + 1, max(n2 - 1, 1), n2, n2 + 1, 2 * cap + 3}
    groups: list[list[tuple[int | None, int]]] = [[(None, 2)], [(None, 1)]]
    for n in sorted(c for c in counts if 1 <= c <= 100_000):
        for total in sorted(sums):
            if abs(total) <= n * (BIG - 1):
                groups.append(_group(total, n))
    for _ in range(300):  # a few values, each repeated (some pairs over the cap, some not)
        groups.append([(rng.choice([rng.randint(-BIG, BIG), rng.randint(-1000, 1000), None]), rng.randint(1, 2 * cap))
                       for _ in range(rng.randint(1, 4))])
    return groups


CASES = [  # (scale, offset, cap): a plain sum, centred sums, an offset too large for branch 1
    (0, 0, 3), (0, 0, 1), (0, 0, 10), (1, 1048576000000, 10), (2, 7, 3), (1, -5, 4),
    (1, 2**58, 3), (2, 2**61, 2), (1, 2**62, 3), (4, 3, 1000),
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


def test_the_64_bit_branches_are_written_where_they_fit_and_only_there() -> None:
    def branches(scale: int, offset: int, cap: int) -> int:
        return len(rescaled_sum(Read(value="v", count="v", scale=scale, offset=offset), cap).args["ifs"])

    assert branches(0, 0, 10) == 3  # both 64-bit branches and the 128-bit one
    assert branches(1, 2**62, 3) == 1  # offset * cap past 2**63: only 128 bits
    assert branches(1, 2**61, 3) == 2  # n <= cap in 64 bits; no room for n > cap
    assert branches(1, 2**58, 3) == 3

"""What the per-(unit, group) 128-bit SUM costs, shape by shape (issue 16; measured, not built).

The pairs step sums each column's per-row fixed-point integers, ``SUM(v)`` over BIGINT,
which DuckDB accumulates in 128 bits (HUGEINT). DuckDB has a 64-bit sum, ``sum_no_overflow``,
that its optimizer picks by itself when the value's range and the table's row count prove
the sum fits. This runs each shape's bounded query as dpsql writes it (the pipeline's form,
bound lists, a fixed salt) against the same text with ``sum_no_overflow`` for those sums: the
most a 64-bit state could gain. Both give the same answers here (checked); the variant is
not safe in general (it is DuckDB's to pick), which is why it is a measurement only.

Rounds run both in a random order; the figure is the median of the per-round CPU ratios
(variant / dpsql's), with its quartiles, DuckDB's threads included.

    python benchmarks/bench_sum_state.py --repeat 21
    python benchmarks/bench_sum_state.py --shapes private,core --repeat 31

Result (HISTORY.md, 2026-12-07 20:40 UTC, DuckDB 2.0.0): the 64-bit state is no general
gain. The private key's pairs step is 9% cheaper with it (its 900,000 (unit, city) pairs:
DuckDB's profile puts that aggregate at 966 against 760 ms of CPU), two keys unchanged, and
the core, WHERE and eight-aggregate shapes 7-9% dearer. Getting DuckDB to pick it by itself
costs more again: it learns a value's range only through ``LEAST``/``GREATEST``, ``+``/``-``/
``*`` by constants, ``ROUND`` and casts, and loses it at any NULL branch, negation or
non-constant factor, which the per-row value uses to drop NULL and NaN; and with per-row
values of up to 2**40 no table past 2**23 rows qualifies. Forms it could bound (values within
2**32; NULL and NaN rows as 0 under a CASE, or evaluated at the upper bound and subtracted per
pair; a ``NULLIF(x, NaN)`` column for the present rows) answered the same, and were 8-11%
cheaper for the private key but 4-8% dearer for the core query.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
from pathlib import Path

import duckdb

from _shared import process_cpu
from ab_bounded import bounded_sql

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "visits_10000000x200000.duckdb"

SHAPES = {
    "core": ("SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region", 0.0),
    "where": ("SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits WHERE age >= 30 GROUP BY region", 0.0),
    "private": ("SELECT city, COUNT(*), AVG(income) FROM visits GROUP BY city", 1e-7),
    "two": ("SELECT region, device, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region, device", 0.0),
    "eight": ("SELECT region, COUNT(*), SUM(income), AVG(income), SUM(age), AVG(age), SUM(visits), AVG(visits), "
              "COUNT(income) FROM visits GROUP BY region", 0.0),
}

#: The per-(unit, group) sums of per-row values (``__v0``, ``__m3_v`` ...), not the final step's.
_PER_ROW_SUM = re.compile(r'SUM\(("__v\d+"|"__m\d+_v")\)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    args = parser.parse_args(argv)
    con = duckdb.connect()
    con.execute(f"ATTACH '{DATA}' AS dpsql_data (READ_ONLY)")
    con.execute("SET enable_progress_bar = false")
    order = random.Random(7)
    print(f"| shape (10M rows; {args.repeat} rounds; load {os.getloadavg()[0]:.1f}) | dpsql CPU s | 64-bit sums CPU s "
          "| ratio, median (quartiles) |\n|---|---:|---:|---:|")
    for name in args.shapes.split(","):
        text, params = bounded_sql(ROOT, DATA, ROOT / "policies" / "demo.toml", *SHAPES[name])
        variant = _PER_ROW_SUM.sub(r"sum_no_overflow(\1)", text)
        assert variant != text, f"{name}: no per-row SUM in its bounded query"
        assert "sum_no_overflow" not in con.sql("EXPLAIN " + text, params=params or None).fetchall()[0][1]
        want = sorted(con.sql(text, params=params or None).fetchall(), key=repr)
        assert sorted(con.sql(variant, params=params or None).fetchall(), key=repr) == want, name
        cpu: dict[str, list[float]] = {"dpsql": [], "variant": []}
        for _ in range(args.repeat):
            pair = [("dpsql", text), ("variant", variant)]
            order.shuffle(pair)
            for kind, sql in pair:
                started = process_cpu()
                con.sql(sql, params=params or None).fetchall()
                cpu[kind].append(process_cpu() - started)
        ratios = sorted(v / d for d, v in zip(cpu["dpsql"], cpu["variant"]))
        q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
        print(f"| {name} | {statistics.median(cpu['dpsql']):.3f} | {statistics.median(cpu['variant']):.3f} "
              f"| {statistics.median(ratios):.2f} ({q1:.2f}-{q3:.2f}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The bounded query's per-row value of a DOUBLE column, in several NULL/NaN-guard forms
(issue 16; HISTORY.md "the per-row value without a CASE", h16sql3).

Each form is ``income``'s per-row integer as a SUM or AVG of it reads it (bounds [0, 250000],
2^23 fixed point), summed and counted over the 10M-row demo in one scan, forms interleaved
round by round; the figure is the median CPU time (all DuckDB threads) and its excess over
reading the raw column. Every form gives the same SUM and COUNT (checked before timing).

    python benchmarks/bench_row_guard.py --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import duckdb

DATA = Path(__file__).resolve().parent / "data" / "visits_10000000x200000.duckdb"
X = "CAST(income AS DOUBLE)"
CLIP = f"LEAST(GREATEST({X}, 0.0), 250000.0)"
NAN_CLIP = f"(-GREATEST(-GREATEST({X}, 0.0), -250000.0))"  # NaN stays NaN
FORMS = {
    "raw column (not a valid value)": "income",
    "CASE guard, ROUND (before)": f"CASE WHEN income IS NOT NULL AND NOT isnan({X}) THEN CAST(ROUND({CLIP} * 8388608.0) AS BIGINT) END",
    "CASE guard, no ROUND": f"CASE WHEN income IS NOT NULL AND NOT isnan({X}) THEN CAST({CLIP} * 8388608.0 AS BIGINT) END",
    "x = x factor, TRY_CAST, ROUND (now)": f"TRY_CAST(ROUND({NAN_CLIP} * CAST({X} = {X} AS DOUBLE) * 8388608.0) AS BIGINT)",
    "x = x factor, TRY_CAST, no ROUND": f"TRY_CAST({NAN_CLIP} * CAST({X} = {X} AS DOUBLE) * 8388608.0 AS BIGINT)",
    "divide by x <= inf, TRY_CAST, ROUND": f"TRY_CAST(ROUND({CLIP} * 8388608.0 / CAST({X} <= 'inf'::DOUBLE AS DOUBLE)) AS BIGINT)",
    "COALESCE(x, NaN), TRY_CAST, ROUND": f"TRY_CAST(ROUND((-GREATEST(-GREATEST(COALESCE({X}, 'nan'::DOUBLE), 0.0), -250000.0)) * 8388608.0) AS BIGINT)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    con = duckdb.connect(str(DATA), read_only=True)
    con.execute("SET enable_progress_bar = false")
    queries = {name: f"SELECT SUM(v), COUNT(v) FROM (SELECT {form} AS v FROM visits)" for name, form in FORMS.items()}
    answers = {name: con.sql(q).fetchall() for name, q in queries.items()}
    valid = {str(a) for name, a in answers.items() if not name.startswith("raw")}
    assert len(valid) == 1, answers
    times: dict[str, list[float]] = {name: [] for name in queries}
    for _ in range(args.rounds):
        for name, q in queries.items():
            t = time.process_time()
            con.sql(q).fetchall()
            times[name].append(time.process_time() - t)
    raw = statistics.median(times["raw column (not a valid value)"])
    print(f"| form | median CPU s ({args.rounds} rounds) | over the raw column |\n|---|---:|---:|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m:.3f} | +{m - raw:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does a query's fixed cost grow with its work? (Could the deadline's base scale with it?)

Times what a deadline covers (``Connection._answer``: charge, read, noise, post-process, store)
for a few query shapes on the calibration tables (:mod:`dpsql.calibration`, 2,000 and
200,000 rows), new plans each run, and prints each shape's median over the calibration
query's beside their :func:`~dpsql.timing.plan_work` ratio. The model is conservative for a
shape when its measured ratio is at most its work ratio.

    python benchmarks/deadline_work.py --repeat 25 [--small] [--heavy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpsql.calibration import _CALIBRATION_POLICY, _duckdb_scratch  # noqa: E402
from dpsql.connection import Connection  # noqa: E402
from dpsql.policy import parse_policy  # noqa: E402
from dpsql.privacy import Ledger  # noqa: E402
from dpsql.timing import plan_work  # noqa: E402

QUERIES = {
    "calibration": "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY g",
    "COUNT": "SELECT COUNT(*) AS n FROM t",
    "SUM": "SELECT SUM(x) AS s FROM t",
    "AVG": "SELECT AVG(x) AS m FROM t",
    "grouped COUNT": "SELECT g, COUNT(*) AS n FROM t GROUP BY g",
    "four aggregates": "SELECT COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a, COUNT(x) AS c FROM t",
}
#: ``--heavy``: shapes with more work per query than the calibration query's.
HEAVY = {
    "MEDIAN": "SELECT g, MEDIAN(x) AS m FROM t GROUP BY g",
    "eight aggregates": "SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a, COUNT(x) AS c, MIN(x) AS lo, MAX(x) AS hi, "
                        "STDDEV(x) AS sd, VARIANCE(x) AS v FROM t GROUP BY g",
    "distinct units": "SELECT g, COUNT(DISTINCT u) AS n FROM t GROUP BY g",
    "WHERE and HAVING": "SELECT g, COUNT(*) AS n FROM t WHERE x > 100 AND g <> 'g3' GROUP BY g HAVING COUNT(*) > 5",
}

#: Shapes that need a delta (order statistics go through smooth sensitivity).
DELTA = {"MEDIAN": 1e-7}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--small", action="store_true",
                        help="set the tables up as DuckDB serves a small file (one thread, unoptimized plain queries)")
    parser.add_argument("--heavy", action="store_true", help="also time heavier shapes (order statistics, many aggregates)")
    args = parser.parse_args()
    if args.heavy:
        QUERIES.update(HEAVY)
    policy = parse_policy(_CALIBRATION_POLICY, "<deadline work>")
    print(f"load {os.getloadavg()[0]:.1f}; median and largest ms of {args.repeat} runs (first two dropped), shapes "
          f"interleaved; {'a small file' if args.small else 'DuckDB defaults'}")
    print("| rows | shape | work | median ms | max ms | / calibration query | work ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for rows in (2_000, 200_000):
            conn = Connection(_duckdb_scratch(rows, small=args.small), policy, "w", Ledger(os.path.join(folder, f"l{rows}.sqlite")))
            runs: dict[str, list[float]] = {k: [] for k in QUERIES}
            for i in range(args.repeat + 2):
                for name, sql in QUERIES.items():
                    plan = conn.plan(sql, epsilon=1.0 - i * 1e-6, delta=DELTA.get(name))  # a new plan each time
                    start = time.perf_counter()
                    conn._answer(plan, sql)
                    runs[name].append(time.perf_counter() - start)
            works = {name: plan_work(conn.plan(sql, epsilon=0.5, delta=DELTA.get(name)))[1] for name, sql in QUERIES.items()}
            medians = {name: statistics.median(v[2:]) for name, v in runs.items()}
            for name in QUERIES:
                print(f"| {rows:,} | {name} | {works[name]:.2f} | {1e3 * medians[name]:.2f} | {1e3 * max(runs[name][2:]):.2f} | "
                      f"{medians[name] / medians['calibration']:.2f} | {works[name] / works['calibration']:.2f} |")
            conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

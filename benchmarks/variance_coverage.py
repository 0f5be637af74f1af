"""Coverage of the VAR/STDDEV 95% intervals through the whole pipeline (issue 15).

1,000 runs per (data shape, delta) of ``SELECT VAR_POP(x), STDDEV_POP(x), VAR_SAMP(x),
STDDEV_SAMP(x) FROM t`` at epsilon 1, production noise; 3,000 units with one value each
in [0, 100] (so the truth is the plain variance). Prints the share of runs whose interval
holds the truth (binomial sd 0.7% at 95%).

    python benchmarks/variance_coverage.py [--runs N]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402

import dpsql  # noqa: E402
from dpsql.policy import parse_policy  # noqa: E402

POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-6
default_epsilon = 1.0
[budget]
default = { epsilon = 1e9, delta = 0.5 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [0, 100] }
"""
STATISTICS = ("VAR_POP", "STDDEV_POP", "VAR_SAMP", "STDDEV_SAMP")


def shapes(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "concentrated N(50, 12.5)": np.clip(rng.normal(50, 12.5, 3000), 0, 100),
        "uniform [0, 100]": rng.uniform(0, 100, 3000),
        "skewed Exp(10)": np.clip(rng.exponential(10, 3000), 0, 100),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    rng = np.random.default_rng(4)
    sql = "SELECT " + ", ".join(f"{s}(x)" for s in STATISTICS) + " FROM t"
    with tempfile.TemporaryDirectory() as scratch:
        for name, x in shapes(rng).items():
            x = np.round(x, 3)
            path = str(Path(scratch) / f"{abs(hash(name))}.duckdb")
            with duckdb.connect(path) as con:
                con.execute("CREATE TABLE t (u BIGINT, x DOUBLE)")
                con.executemany("INSERT INTO t VALUES (?, ?)", list(enumerate(x.tolist())))
            truth = []
            for s in STATISTICS:
                var = float(np.var(x, ddof=1 if s.endswith("SAMP") else 0))
                truth.append(math.sqrt(var) if s.startswith("STDDEV") else var)
            for delta in (0.0, 1e-6):
                hits = np.zeros(len(STATISTICS))
                with dpsql.connect(path, policy=parse_policy(POLICY), analyst="v", repeats=False) as conn:
                    for _ in range(args.runs):
                        res = conn.execute(sql, epsilon=1.0, delta=delta)
                        (row,) = res.fetchall()
                        widths = [res.accuracy.cells(c)[0] for c in res.arrow().column_names]
                        hits += [abs(v - t) <= w for v, t, w in zip(row, truth, widths)]
                cover = ", ".join(f"{s} {h / args.runs:.3f}" for s, h in zip(STATISTICS, hits))
                print(f"{name:26s} delta={delta:g}: {cover}", flush=True)


if __name__ == "__main__":
    main()

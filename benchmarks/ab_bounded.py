"""One query's bounded SQL from two checkouts, timed against each other in raw DuckDB (issue 16).

For a change to the bounded SQL, the end-to-end benchmarks are too noisy on a shared 2-core
machine to see 5%: the machine's speed moves more than that between runs. This takes the
bounded query each checkout's pipeline writes for ``--sql`` (``bounded_query(...,
list_parameters=True)``, a fixed salt, each checkout imported in its own process), and runs
the two in the same process, in a random order within each round; the figure is the median
of the per-round ratios (this checkout / ``--compare``), CPU and wall, with quartiles.
``--control`` adds the compared text once more to every round and reports it against
itself: the spread a ratio of 1 has on this machine.

    python benchmarks/ab_bounded.py --compare ../main-before --rounds 41 --control \\
        --sql "SELECT region, device, COUNT(*) FROM visits GROUP BY region, device" --rows 1M

The two answers may differ (another salt use, another rounding); they are compared only when
``--same`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from _shared import process_cpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = {"1M": ("visits_1000000x100000.duckdb", "vs_smartnoise_policy.toml"),
        "10M": ("visits_10000000x200000.duckdb", None)}

_WRITE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import dpsql
from dpsql.rewrite import bounded_query
assert dpsql.__file__.startswith(sys.argv[1]), dpsql.__file__
conn = dpsql.connect(sys.argv[2], policy=sys.argv[3], ledger=None)
plan = conn.plan(sys.argv[4], epsilon=1.0, delta=float(sys.argv[5]) or None)
bounded = bounded_query(plan, salt=123456789, list_parameters=True)
print(json.dumps([bounded.query.sql(dialect="duckdb"), dict(bounded.lists)]))
"""


def bounded_sql(checkout: Path, database: Path, policy: Path, sql: str, delta: float) -> tuple[str, dict[str, object]]:
    """The bounded query ``checkout``'s pipeline writes for ``sql``, and its list parameters."""
    out = subprocess.run([sys.executable, "-c", _WRITE, str(checkout.resolve()), str(database), str(policy), sql, str(delta)],
                         check=True, capture_output=True, text=True).stdout
    text, lists = json.loads(out)
    return text, lists



def _summary(ratios: list[float]) -> str:
    ordered = sorted(ratios)
    n = len(ordered)
    return f"{statistics.median(ordered):.3f} ({ordered[n // 4]:.3f}-{ordered[3 * n // 4]:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--compare", type=Path, required=True, help="the other checkout (its root folder)")
    parser.add_argument("--sql", required=True)
    parser.add_argument("--delta", type=float, default=0.0)
    parser.add_argument("--rows", choices=sorted(DATA), default="10M", help="benchmarks/data's demo table")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--control", action="store_true", help="also run the compared text against itself")
    parser.add_argument("--same", action="store_true", help="check that both answer the same")
    args = parser.parse_args(argv)
    name, policy = DATA[args.rows]
    database = HERE / "data" / name
    policy_path = HERE / "data" / policy if policy else ROOT / "policies" / "demo.toml"
    texts = {"before": bounded_sql(args.compare, database, policy_path, args.sql, args.delta),
             "after": bounded_sql(ROOT, database, policy_path, args.sql, args.delta)}
    con = duckdb.connect()
    con.execute(f"ATTACH '{database}' AS dpsql_data (READ_ONLY)")
    con.execute("SET enable_progress_bar = false")
    if args.same:
        answers = [sorted(con.execute(q, p or None).fetchall(), key=repr) for q, p in texts.values()]
        assert answers[0] == answers[1], "the two checkouts answer differently"
    runs = {"before": texts["before"], "after": texts["after"]}
    if args.control:
        runs["before again"] = texts["before"]
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    order = random.Random(7)
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds + 1):
        kinds = list(runs)
        order.shuffle(kinds)
        for kind in kinds:
            query, params = runs[kind]
            wall, cpu = time.perf_counter(), process_cpu()
            con.execute(query, params or None).fetchall()
            times[kind].append((time.perf_counter() - wall, process_cpu() - cpu))
    load.append(os.getloadavg()[0])
    first = {k: v[1:] for k, v in times.items()}  # the first round warms caches
    print(f"{args.rows} rows, {args.rounds} rounds, load {min(load):.1f}-{max(load):.1f}: {args.sql}")
    for kind, xs in first.items():
        print(f"  {kind}: CPU {statistics.median(c for _, c in xs) * 1e3:.1f} ms, wall {statistics.median(w for w, _ in xs) * 1e3:.1f} ms")
    for kind in [k for k in first if k != "before"]:
        cpu = [c / b for (_, c), (_, b) in zip(first[kind], first["before"])]
        wall = [w / b for (w, _), (b, _) in zip(first[kind], first["before"])]
        print(f"  {kind} / before: CPU {_summary(cpu)}, wall {_summary(wall)} (median, quartiles)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""dpsql against its floor, query shape by query shape (issue 16), interleaved round by round.

For each shape, on the demo data (10M rows / 200k units by default), one round runs the
shape's floor (written by hand: the one ``GROUP BY unit, group`` pass feeding the group
aggregate that every user-level DP system pays, with the shape's WHERE, join and keys) and
dpsql's answer (``execute``, everything included: plan, bounded SQL, noise, charge), one
after the other; the ratio of medians over the rounds is the figure. MEDIAN is compared
with a hand-written *bounded* median (one row per unit and group chosen by a hash, then
DuckDB's median), since no floor without sampling reads the same rows.

    python benchmarks/bench_shapes.py                     # every shape, 5 rounds
    python benchmarks/bench_shapes.py --shapes core,median --repeat 3
    python benchmarks/bench_shapes.py --write             # ... appended to benchmarks/RESULTS.md

dpsql runs with an in-memory ledger and ``repeats=False`` (every run a fresh, charged
answer); its connection is reopened when the budget runs out (that run is redone).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpsql.demo import demo_database  # noqa: E402

from _shared import FLOOR, QUERY, append_results, cpu_model  # noqa: E402
from bench_core import DpsqlRunner, Row, charged, interleaved  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
POLICY = ROOT / "policies" / "demo.toml"


def _floor(keys: str, aggregates: str, outer: str, where: str = "", source: str = "visits") -> str:
    """``GROUP BY unit, keys`` feeding ``GROUP BY keys``."""
    return (f"SELECT {keys}, {outer} FROM (SELECT user_id, {keys}, {aggregates} FROM {source} {where} "
            f"GROUP BY ALL) GROUP BY {keys}")


_THREE = "count(*) AS n, sum(income) AS s, count(income) AS c"
_THREE_OUT = "sum(n), sum(s), sum(s) / sum(c)"
_EIGHT = ("count(*) AS n, sum(income) AS si, count(income) AS ci, sum(age) AS sa, count(age) AS ca, "
          "sum(visits) AS sv, count(visits) AS cv")
_EIGHT_OUT = "sum(n), sum(si), sum(si) / sum(ci), sum(sa), sum(sa) / sum(ca), sum(sv), sum(sv) / sum(cv), sum(ci)"


@dataclass(frozen=True)
class Shape:
    name: str
    sql: str
    floor: str
    goal: float
    delta: float = 0.0
    policy: str = "demo"


SHAPES = (
    Shape("core GROUP BY COUNT/SUM/AVG", QUERY, FLOOR, 1.3),
    Shape("WHERE", QUERY.replace(" GROUP BY", " WHERE age >= 30 GROUP BY"),
          _floor("region", _THREE, _THREE_OUT, "WHERE age >= 30"), 1.4),
    Shape("public join",
          "SELECT r.name, COUNT(*), SUM(v.income), AVG(v.income) FROM visits v JOIN regions r "
          "ON v.region = r.region GROUP BY r.name",
          _floor("name", _THREE, _THREE_OUT, source="visits JOIN regions USING (region)"), 1.4),
    Shape("private key, partition selection", "SELECT city, COUNT(*), AVG(income) FROM visits GROUP BY city",
          _floor("city", _THREE, "count(*), " + _THREE_OUT), 1.4, delta=1e-7),
    Shape("two keys (L0 applies)",
          "SELECT region, device, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region, device",
          _floor("region, device", _THREE, _THREE_OUT), 1.4),
    Shape("8 aggregates",
          "SELECT region, COUNT(*), SUM(income), AVG(income), SUM(age), AVG(age), SUM(visits), AVG(visits), "
          "COUNT(income) FROM visits GROUP BY region",
          _floor("region", _EIGHT, _EIGHT_OUT), 2.0),
    Shape("100,000 public keys", "SELECT zip, COUNT(*) FROM visits GROUP BY zip",
          _floor("zip", "count(*) AS n", "sum(n)"), 1.5, policy="zips"),
    Shape("MEDIAN (vs hand-written bounded median)", "SELECT region, MEDIAN(age) FROM visits GROUP BY region",
          "SELECT region, median(age) FROM (SELECT region, age FROM visits WHERE age IS NOT NULL "
          "QUALIFY row_number() OVER (PARTITION BY user_id, region ORDER BY hash(rowid, 12345)) <= 1) "
          "GROUP BY region", 1.5, delta=1e-7),
)
KEYS = {"core": 0, "where": 1, "join": 2, "private": 3, "two": 4, "eight": 5, "zips": 6, "median": 7}


def zips_policy(directory: str) -> Path:
    """The demo policy with ``zip`` a grouping key of 100,000 public values."""
    values = ", ".join(f'"{i:05d}"' for i in range(100_000))
    text = POLICY.read_text().replace('zip     = { access = "filter" }', f"zip = {{ public_values = [{values}] }}")
    path = Path(directory) / "zips.toml"
    path.write_text(text)
    return path


def ratio_table(pairs: list[tuple[Shape, Row, Row]]) -> list[str]:
    out = ["| shape | floor s | dpsql s | dpsql / floor (wall) | (CPU) | goal |", "|---|---:|---:|---:|---:|---:|"]
    for shape, floor, dp in pairs:
        wall, cpu = dp.median / floor.median, dp.median_cpu / floor.median_cpu
        mark = "" if wall <= shape.goal else " (over)"
        out.append(f"| {shape.name} | {floor.median:.3f} | {dp.median:.3f} | **{wall:.2f}x**{mark} | {cpu:.2f}x | "
                   f"<= {shape.goal}x |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--shapes", default=",".join(KEYS), help=f"comma-separated, of: {', '.join(KEYS)}")
    parser.add_argument("--write", action="store_true", help=f"also append the table to {RESULTS}")
    args = parser.parse_args(argv)

    db = demo_database(DATA_DIR / f"visits_{args.rows}x{args.units}.duckdb", rows=args.rows, units=args.units)
    raw = duckdb.connect(str(db), read_only=True)
    raw.execute("SET enable_progress_bar = false")
    tmp = tempfile.mkdtemp(prefix="dpsql-shapes-")
    policies: dict[str, Path] = {"demo": POLICY}
    pairs: list[tuple[Shape, Row, Row]] = []
    load = [os.getloadavg()[0]]
    for key in args.shapes.split(","):
        shape = SHAPES[KEYS[key.strip()]]
        if shape.policy not in policies:
            policies[shape.policy] = zips_policy(tmp)
        runner = DpsqlRunner(db, policies[shape.policy], args.epsilon)
        run: Callable[[], object] = charged(_Delta(runner, shape.delta, args.epsilon), shape.sql)  # type: ignore[arg-type]
        try:
            floor, dp = interleaved([("floor", lambda f=shape.floor: raw.sql(f).fetchall()), ("dpsql", run)],
                                    args.repeat)
        finally:
            runner.close()
        pairs.append((shape, floor, dp))
        load.append(os.getloadavg()[0])
        print(f"{shape.name}: floor {floor.median:.3f} s, dpsql {dp.median:.3f} s, "
              f"{dp.median / floor.median:.2f}x (load {load[-1]:.1f})", file=sys.stderr)
    out = [
        f"## bench_shapes: dpsql / floor by query shape ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"`python benchmarks/bench_shapes.py --repeat {args.repeat}`; {cpu_model()}, {os.cpu_count()} cores, "
        f"duckdb {duckdb.__version__}; {args.rows:,} rows / {args.units:,} units; floor and dpsql interleaved "
        f"round by round, median of {args.repeat} rounds after one warm-up; load average (1 min) "
        f"{min(load):.1f} to {max(load):.1f} during the run.",
        "",
        *ratio_table(pairs),
    ]
    text = "\n".join(out) + "\n"
    print(text)
    if args.write:
        append_results(RESULTS, text)
    return 0


class _Delta:
    """A :class:`DpsqlRunner` that asks with a delta (partition selection, MEDIAN)."""

    def __init__(self, runner: DpsqlRunner, delta: float, epsilon: float) -> None:
        self.runner, self.delta, self.epsilon = runner, delta, epsilon
        self.budget_exceeded = runner.budget_exceeded

    def __call__(self, sql: str) -> object:
        try:
            return self.runner._conn.execute(sql, epsilon=self.epsilon, delta=self.delta).fetchall()
        except self.budget_exceeded:
            self.runner._conn.close()
            self.runner._conn = self.runner._connect()
            raise


if __name__ == "__main__":
    raise SystemExit(main())

"""How much does dpsql cost over plain DuckDB? The benchmark behind DESIGN.md §7.

On the demo data (10M rows, 200k units by default; generated once and cached under
``benchmarks/data/``) it times one query,

    SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region

four ways, on one machine in one run, interleaved round by round (each round runs every
engine once, so a change in the machine's load hits all of them alike):

- ``raw``: the query as is, on DuckDB (no privacy at all);
- ``floor``: the pass every user-level DP system pays, one ``GROUP BY unit, group``
  feeding the group aggregate, written by hand;
- ``bounded``: the bounding shape ``benchmarks/bounding_strategies.py`` recommends,
  written by hand (clipping, fixed point, caps, AVG as a centred sum; no noise);
- ``dpsql``: ``dpsql.connect(...).execute(sql, epsilon=1.0)``, everything included.

It also times the fixed cost of a query on a tiny table (the same query on 1,000 rows,
median of 200 runs), raw and through dpsql. The target: dpsql within 2x the floor.

    python benchmarks/bench_core.py                    # Markdown table on stdout
    python benchmarks/bench_core.py --write            # ... also appended to benchmarks/RESULTS.md
    python benchmarks/bench_core.py --rows 1000000 --units 100000 --repeat 3
    python benchmarks/bench_core.py --fixed-only       # only the 1,000-row fixed cost

If ``dpsql.connect`` cannot be imported or used yet, the dpsql rows are skipped (the reason
is printed) and the rest still runs. dpsql runs with an in-memory ledger (``ledger=None``)
and ``repeats=False``, so that every run is a fresh, charged answer rather than a free
repeat of the first one (the tiny-table section also times the free repeat). When the demo
budget runs out the connection is reopened and the refused run is not counted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpsql.demo import demo_database  # noqa: E402

from _shared import FLOOR, QUERY, append_results, cpu_model, ram_gib  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


# The recommended shape (see benchmarks/README.md), with the demo policy's numbers:
# income in [0, 250000], 2^22 fixed point, 10 rows and 4 groups per unit, four public
# regions (<= 4, so no L0 step); one SUM(v) and one COUNT(v) per (unit, group) serve SUM,
# AVG's centred sum (2 SUM(v) - M COUNT(v), M = 125000 * 2^23) and AVG's count (issue 16).
_V = (
    "CASE WHEN income IS NULL OR isnan(income) THEN NULL"
    " ELSE CAST(ROUND(LEAST(GREATEST(income, 0), 250000) * 4194304) AS BIGINT) END"
)
BOUNDED = f"""
SELECT g, sum(n), sum(s) >> 31, sum(sc) >> 31, sum(m) FROM (
    SELECT user_id, g,
        least(count(*), 10) AS n,
        CASE WHEN count(v) > 10 THEN CAST(sum(v) AS HUGEINT) * 10 // count(v) ELSE sum(v) END AS s,
        CASE WHEN count(v) > 10 THEN (2 * CAST(sum(v) AS HUGEINT) - 1048576000000 * count(v)) * 10 // count(v)
             ELSE 2 * CAST(sum(v) AS HUGEINT) - 1048576000000 * count(v) END AS sc,
        least(count(v), 10) AS m
    FROM (SELECT user_id, region AS g, {_V} AS v FROM visits)
    GROUP BY user_id, g
) GROUP BY g"""


@dataclass
class Row:
    label: str
    wall: list[float]
    cpu: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)


def measure(label: str, run: Callable[[], object], repeat: int, warmup: int = 1) -> Row:
    for _ in range(warmup):
        run()
    wall, cpu = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        run()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return Row(label, wall, cpu)


class DpsqlRunner:
    """Runs a query through dpsql; when the budget runs out, reopens the connection."""

    def __init__(self, db: Path, policy: Path, epsilon: float, repeats: bool = False) -> None:
        import dpsql  # noqa: PLC0415 - optional until the package is complete

        self.budget_exceeded: type[Exception] = dpsql.BudgetExceeded

        def connect():  # noqa: ANN202 - dpsql.Connection
            kwargs = dict(policy=str(policy), analyst="bench", ledger=None)
            try:  # repeats=False: every run is a fresh, charged answer, not a cache hit
                return dpsql.connect(str(db), **kwargs, repeats=repeats)
            except TypeError:  # a dpsql without free repeats
                return dpsql.connect(str(db), **kwargs)

        self._connect = connect
        self._epsilon = epsilon
        self._conn = self._connect()

    def __call__(self, sql: str) -> object:
        """Run ``sql`` once; on BudgetExceeded reopen the connection and re-raise."""
        try:
            return self._conn.execute(sql, epsilon=self._epsilon).fetchall()
        except self.budget_exceeded:
            self._conn.close()
            self._conn = self._connect()
            raise

    def close(self) -> None:
        self._conn.close()


def interleaved(runs: list[tuple[str, Callable[[], object]]], repeat: int, warmup: int = 1) -> list[Row]:
    """Time every run once per round, ``warmup`` rounds dropped: ratios between runs taken in
    the same rounds hold under a changing load where back-to-back blocks do not."""
    rows = [Row(label, [], []) for label, _ in runs]
    for round_ in range(warmup + repeat):
        for row, (_, run) in zip(rows, runs):
            c0, w0 = time.process_time(), time.perf_counter()
            run()
            if round_ >= warmup:
                row.wall.append(time.perf_counter() - w0)
                row.cpu.append(time.process_time() - c0)
    return rows


def charged(runner: DpsqlRunner, sql: str) -> Callable[[], object]:
    """One fresh dpsql answer; a run refused for lack of budget is redone on the reopened
    connection (so it is never timed as an answer)."""
    def run() -> object:
        try:
            return runner(sql)
        except runner.budget_exceeded:
            return runner(sql)
    return run


def timed_dpsql(label: str, runner: DpsqlRunner, sql: str, repeat: int) -> Row:
    """Like :func:`measure`; a run refused for lack of budget is dropped and redone."""
    wall: list[float] = []
    cpu: list[float] = []
    warm, refused_in_a_row = False, 0
    while len(wall) < repeat:
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            runner(sql)
        except runner.budget_exceeded:
            refused_in_a_row += 1
            if refused_in_a_row > 1:  # refused on a fresh connection too: it never fits
                raise
            continue
        refused_in_a_row = 0
        if warm:
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        warm = True
    return Row(label, wall, cpu)


def open_dpsql(db: Path, policy: Path, epsilon: float, repeats: bool = False) -> tuple[DpsqlRunner | None, str]:
    try:
        runner = DpsqlRunner(db, policy, epsilon, repeats)
        runner(QUERY)  # fail here, not halfway through the table
    except Exception as exc:  # noqa: BLE001 - any failure means: skip dpsql, say why
        return None, f"dpsql skipped: {type(exc).__name__}: {exc}"
    return runner, ""


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB RAM, "
            f"Python {platform.python_version()}, duckdb {duckdb.__version__}")


def report(big: list[Row], tiny: list[Row], args: argparse.Namespace, notes: list[str]) -> str:
    out = [
        f"## bench_core{' (fixed cost only)' if args.fixed_only else ''}, {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"{machine()}; load average {os.getloadavg()[0]:.1f}",
        "",
    ]
    if big:
        out += big_table(big, args)
    out += [f"Fixed cost, the same query on a 1,000-row table, median of {args.tiny_runs} runs:", ""]
    out += ["| engine | median ms | p90 ms |", "|---|---:|---:|"]
    for r in tiny:
        p90 = statistics.quantiles(r.wall, n=10)[-1] if len(r.wall) > 1 else r.wall[0]
        out.append(f"| {r.label} | {r.median * 1e3:.2f} | {p90 * 1e3:.2f} |")
    out += [""] + notes
    return "\n".join(out).rstrip() + "\n"


def big_table(big: list[Row], args: argparse.Namespace) -> list[str]:
    raw = next(r for r in big if r.label == "raw")
    floor = next(r for r in big if r.label == "floor")
    out = [
        f"`{QUERY}` on {args.rows:,} rows / {args.units:,} units, median of {args.repeat} runs:",
        "",
        "| engine | wall s | cpu s | x raw | x floor | cpu x floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in big:
        out.append(
            f"| {r.label} | {r.median:.3f} | {r.median_cpu:.2f} | {r.median / raw.median:.1f} |"
            f" {r.median / floor.median:.2f} | {r.median_cpu / floor.median_cpu:.2f} |"
        )
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny-runs", type=int, default=200)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--policy", type=Path, default=ROOT / "policies" / "demo.toml")
    parser.add_argument("--fixed-only", action="store_true",
                        help="only the fixed cost on the tiny table (bench_scale.py times the big ones)")
    parser.add_argument("--write", action="store_true", help=f"also append the table to {RESULTS}")
    args = parser.parse_args(argv)

    big_db = None if args.fixed_only else demo_database(
        DATA_DIR / f"visits_{args.rows}x{args.units}.duckdb", rows=args.rows, units=args.units)
    tiny_db = demo_database(DATA_DIR / "visits_1000x100.duckdb", rows=1000, units=100)
    notes: list[str] = []

    def raw_runner(db: Path) -> Callable[[str], object]:
        con = duckdb.connect(str(db), read_only=True)
        con.execute("SET enable_progress_bar = false")
        return lambda sql: con.sql(sql).fetchall()

    raw_tiny = raw_runner(tiny_db)
    big: list[Row] = []
    if big_db is not None:
        raw_big = raw_runner(big_db)
        runs: list[tuple[str, Callable[[], object]]] = [
            ("raw", lambda: raw_big(QUERY)),
            ("floor", lambda: raw_big(FLOOR)),
            ("bounded (hand-written)", lambda: raw_big(BOUNDED)),
        ]
        big_runner, why = open_dpsql(big_db, args.policy, args.epsilon)
        if big_runner is None:
            notes.append(why)
        else:
            runs.append(("dpsql", charged(big_runner, QUERY)))
        try:
            big = interleaved(runs, args.repeat)
        finally:
            if big_runner is not None:
                big_runner.close()
    tiny = [measure("raw", lambda: raw_tiny(QUERY), args.tiny_runs, warmup=5)]
    for repeats, label in ((False, "dpsql"), (True, "dpsql, repeated query (free repeat)")):
        runner, why = open_dpsql(tiny_db, args.policy, args.epsilon, repeats)
        if runner is None:
            if why not in notes:
                notes.append(why)
            continue
        try:
            tiny.append(timed_dpsql(label, runner, QUERY, args.tiny_runs))
        finally:
            runner.close()
    for note in notes:
        print(note, file=sys.stderr)

    text = report(big, tiny, args, notes)
    print(text)
    if args.write:
        append_results(RESULTS, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

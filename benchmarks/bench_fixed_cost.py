"""Where a new small query's time goes: per-stage milliseconds against raw DuckDB (issue 16).

Each round runs raw DuckDB's query once and two *new* questions through dpsql, interleaved,
on the 1,000-row demo table, with the default file ledger (a SQLite file, and the answers
file beside it for repeats). Neither the plan cache nor the repeat store can answer either:

- *new alias* (the goal's figure): a new column alias each round. Its bounded query is
  the one already written for an earlier alias (:mod:`dpsql.rewrite.key`), so it pays
  analysis, the engine, noise, charge and repeat store, but not building or writing the
  bounded SQL;
- *new WHERE literal*: ``WHERE income > i`` with a new ``i`` each round, which changes the
  bounded SQL: it pays everything, including a new prepared statement. dpsql's time is split into stages by wrapping the functions
each stage calls (exclusive time: a stage inside another counts once, in the inner one):

- parse: sqlglot's tokenizer and parser, wherever called (analysis, the repeat key ...);
- analyze: planning (``dpsql.analyze``, the public-only check, the post-processing check);
- rewrite tree / SQL text: building the bounded query's tree; writing any tree as text;
- engine: ``DuckDBEngine.run``; release: the noise (``noisy_table``);
- charge: the ledger's charge (SQLite write and commit; the wait for its fsync, which overlaps
  the engine) and building the charge;
- repeat store: the repeat key and the answers file's reads and writes;
- report: post-processing and the Result; other: the rest (total minus the stages).

CPU is the process's (all threads, DuckDB's included) per query: under load from other jobs
it moves less than wall time, and it is what a server pays per fresh query.

    python benchmarks/bench_fixed_cost.py                 # 300 rounds, Markdown on stdout
    python benchmarks/bench_fixed_cost.py --rounds 100 --profile   # plus a cProfile top 25
    python benchmarks/bench_fixed_cost.py --write         # ... appended to benchmarks/RESULTS.md

The goal (issue 16): dpsql's p50 at most 3x raw DuckDB's p50 on the same table.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import sqlglot.generator
import sqlglot.parser
from sqlglot.dialects.dialect import Dialect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dpsql  # noqa: E402
import dpsql.connection as connection  # noqa: E402
import dpsql.read as read  # noqa: E402
from dpsql.demo import demo_database  # noqa: E402
from dpsql.engine import DuckDBEngine  # noqa: E402
from dpsql.postprocess import Postprocessor  # noqa: E402
from dpsql.privacy import Ledger  # noqa: E402
from dpsql.privacy.reservation import Reservation  # noqa: E402
from dpsql.repeats import PlanKeys, RepeatCache  # noqa: E402

from _shared import QUERY, append_results, cpu_model  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
STAGES = ("parse", "analyze", "rewrite tree", "SQL text", "engine", "release", "charge", "repeat store",
          "report", "other")


class StageTimer:
    """Exclusive wall time per stage, for the runs made inside :meth:`run`."""

    def __init__(self) -> None:
        self._stack: list[float] = []
        self._active = False
        self.current: dict[str, float] = defaultdict(float)
        self.runs: list[dict[str, float]] = []

    def wrap(self, owner: Any, attr: str, stage: str) -> None:
        original: Callable[..., Any] = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._active:
                return original(*args, **kwargs)
            self._stack.append(0.0)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                inner = self._stack.pop()
                self.current[stage] += elapsed - inner
                if self._stack:
                    self._stack[-1] += elapsed

        setattr(owner, attr, timed)

    @contextmanager
    def run(self) -> Iterator[None]:
        self.current = defaultdict(float)
        self._active = True
        start = time.perf_counter()
        try:
            yield
        finally:
            self._active = False
            total = time.perf_counter() - start
            self.current["other"] = total - sum(self.current.values())
            self.current["total"] = total
            self.runs.append(dict(self.current))


def instrument(timer: StageTimer) -> None:
    timer.wrap(Dialect, "parse", "parse")
    timer.wrap(Dialect, "tokenize", "parse")
    timer.wrap(sqlglot.parser.Parser, "parse", "parse")
    for name in ("analyze", "public_only", "references_local_table"):
        timer.wrap(connection, name, "analyze")
    timer.wrap(Postprocessor, "check", "analyze")
    timer.wrap(read, "bounded_query", "rewrite tree")
    timer.wrap(sqlglot.generator.Generator, "generate", "SQL text")
    timer.wrap(DuckDBEngine, "run", "engine")
    timer.wrap(read, "noisy_table", "release")
    timer.wrap(Ledger, "charge", "charge")
    timer.wrap(Ledger, "reserve", "charge")  # the pipeline's: the commit; its fsync overlaps the read
    timer.wrap(Reservation, "wait", "charge")  # what of the fsync the read did not cover
    timer.wrap(connection, "charge_of", "charge")
    timer.wrap(PlanKeys, "key", "repeat store")
    timer.wrap(RepeatCache, "_get", "repeat store")
    timer.wrap(RepeatCache, "_put", "repeat store")
    for name in ("fresh_result", "with_values"):
        timer.wrap(connection, name, "report")
    timer.wrap(Postprocessor, "run", "report")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--policy", type=Path, default=ROOT / "policies" / "demo.toml")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top 25 (cumulative)")
    parser.add_argument("--write", action="store_true", help=f"also append the table to {RESULTS}")
    args = parser.parse_args(argv)

    db = demo_database(DATA_DIR / "visits_1000x100.duckdb", rows=1000, units=100)
    raw = duckdb.connect(str(db), read_only=True)
    raw.execute("SET enable_progress_bar = false")
    tmp = tempfile.mkdtemp(prefix="dpsql-fixed-cost-")
    conn = dpsql.connect(str(db), policy=str(args.policy), analyst="alice", ledger=os.path.join(tmp, "ledger.sqlite"))
    timer = StageTimer()
    instrument(timer)
    profile = cProfile.Profile() if args.profile else None
    raw_times: list[float] = []
    raw_cpu: list[float] = []
    load_before = os.getloadavg()

    kinds: dict[str, Callable[[int], str]] = {
        "new alias": lambda i: QUERY.replace("COUNT(*)", f"COUNT(*) AS n_{i}"),
        "new WHERE literal": lambda i: QUERY.replace("GROUP BY", f"WHERE income > {i} GROUP BY"),
    }
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    dp_cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(args.warmup + args.rounds):
        start, cpu = time.perf_counter(), time.process_time()
        raw.sql(QUERY).fetchall()
        elapsed, raw_cpu_used = time.perf_counter() - start, time.process_time() - cpu
        for kind, new_query in kinds.items():
            cpu = time.process_time()
            with timer.run():
                if profile is not None and i >= args.warmup and kind == "new alias":
                    profile.enable()
                conn.execute(new_query(i), epsilon=0.001).fetchall()
                if profile is not None:
                    profile.disable()
            if i >= args.warmup:
                dp_cpu[kind].append(time.process_time() - cpu)
                runs[kind].append(timer.runs[-1])
        if i >= args.warmup:
            raw_times.append(elapsed)
            raw_cpu.append(raw_cpu_used)
    conn.close()
    raw_p50 = statistics.median(raw_times)
    out = [
        f"## bench_fixed_cost: a new small query, stage by stage ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"`python benchmarks/bench_fixed_cost.py --rounds {args.rounds}`; {cpu_model()}, {os.cpu_count()} cores; "
        f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after. `{QUERY}` on 1,000 rows "
        f"/ 100 units; each dpsql run a new question (a new alias; a new `WHERE income > i`), default file "
        f"ledger, epsilon 0.001; raw DuckDB (the query without WHERE) and both dpsql kinds interleaved round by "
        f"round. The goal is read on the new-alias row; the new-WHERE row also builds and writes a new bounded "
        f"query.",
        "",
        "| | p50 ms | p90 ms | mean ms | CPU ms (mean, process) |",
        "|---|---:|---:|---:|---:|",
        f"| raw DuckDB | {raw_p50 * 1e3:.2f} | {percentile(raw_times, 90) * 1e3:.2f} | {statistics.fmean(raw_times) * 1e3:.2f} "
        f"| {statistics.fmean(raw_cpu) * 1e3:.2f} |",
    ]
    for kind in kinds:
        totals = [r["total"] for r in runs[kind]]
        dp_p50, cpu_mean = statistics.median(totals), statistics.fmean(dp_cpu[kind])
        out += [
            f"| dpsql, {kind} | {dp_p50 * 1e3:.2f} | {percentile(totals, 90) * 1e3:.2f} | {statistics.fmean(totals) * 1e3:.2f} "
            f"| {cpu_mean * 1e3:.2f} |",
            f"| **ratio, {kind}** | **{dp_p50 / raw_p50:.1f}x** | | | {cpu_mean / statistics.fmean(raw_cpu):.1f}x |",
        ]
    out += ["", "| stage | " + " | ".join(f"{kind}: median ms | mean ms | share" for kind in kinds) + " |",
            "|---|" + "---:|---:|---:|" * len(kinds)]
    for stage in STAGES:
        cells = []
        for kind in kinds:
            values = [r.get(stage, 0.0) for r in runs[kind]]
            mean_total = statistics.fmean(r["total"] for r in runs[kind])
            cells.append(f"{statistics.median(values) * 1e3:.2f} | {statistics.fmean(values) * 1e3:.2f} | "
                         f"{statistics.fmean(values) / mean_total:.0%}")
        out.append(f"| {stage} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    print(text)
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    if args.write:
        append_results(RESULTS, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

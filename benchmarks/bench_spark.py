"""Spark (local) against DuckDB, each against its own floor, on the same Parquet data.

The demo data (10M rows, 200k units by default; benchmarks/data/, generated once) is
written to Parquet, and the core query of ``_shared.py``

    SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region

is timed on each engine three ways, the engines and the ways interleaved run by run:

- ``raw``: the query as is (no privacy);
- ``floor``: the one ``GROUP BY unit, group`` pass every user-level DP system pays
  (``_shared.FLOOR``), on that engine;
- ``dpsql``: the whole pipeline (analysis, bounded query, noise, charge) over that engine,
  ``epsilon=1``, in-memory ledger, no repeats.

DuckDB reads the Parquet file through a view; Spark (``local[N]``, N = ``--cores``) through a
DataFrame. Also measured: Spark's fixed start-up (``SparkSession`` creation to the first
answer) and its fixed per-query cost (the same query on 1,000 rows), and, with
``--salt-check``, the salt as a bound parameter against a literal.

``--variants`` times instead the bounded query's Spark SQL as :mod:`dpsql.spark.translate`
writes it against the same with one or both of its lean passes undone (``exact_round``:
Spark's ROUND, which goes through BigDecimal; ``exact_sums``' halves: one DECIMAL(38,0)
sum), and the floor, interleaved, each run's wall time and the JVM's CPU time (user +
system, from /proc: much steadier than wall time on a shared machine).

    python benchmarks/bench_spark.py                         # Markdown on stdout
    python benchmarks/bench_spark.py --write                 # ... appended to benchmarks/RESULTS.md
    python benchmarks/bench_spark.py --rows 1000000 --units 20000 --repeat 3

Against a real cluster: start the session with ``--master spark://host:7077`` (or
``yarn``, ``k8s://...``), or run the script under ``spark-submit --master ...``, which
creates the session the script then picks up; the Parquet path must then be one the
executors can read (HDFS, S3, a shared mount). With Spark Connect, ``--remote
sc://host:15002`` builds a Connect session instead (``pyspark[connect]``); the engine uses
only ``spark.sql``, ``read``, ``table`` and ``toArrow``, which Connect sessions have (its
``interrupt`` then needs the Connect tag API; not measured here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dpsql  # noqa: E402
from dpsql.demo import demo_database  # noqa: E402
from dpsql.engine import DuckDBEngine  # noqa: E402

from _shared import FLOOR, QUERY, append_results, cpu_model, ram_gib  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def parquet_data(rows: int, units: int) -> Path:
    """The demo ``visits`` table as one Parquet file (made once from the cached DuckDB file)."""
    path = DATA_DIR / f"visits_{rows}x{units}.parquet"
    if not path.exists():
        db = demo_database(DATA_DIR / f"visits_{rows}x{units}.duckdb", rows=rows, units=units)
        with duckdb.connect(str(db), read_only=True) as con:
            tmp = path.with_suffix(".tmp")
            con.execute(f"COPY visits TO '{tmp}' (FORMAT parquet)")
            tmp.rename(path)
    return path


def bench_policy(path: Path) -> dpsql.Policy:
    """The policy at ``path`` with a budget no benchmark run exhausts (every run is charged)."""
    from dpsql.policy import parse_policy

    text = path.read_text()
    start = text.index("[budget]")
    end = text.find("\n[", start + 1)
    big = "[budget]\ndefault = { epsilon = 1000000.0, delta = 0.5 }\n"
    return parse_policy(text[:start] + big + (text[end:] if end != -1 else ""))


def median_of(run: Callable[[], object]) -> Callable[[], float]:
    def timed() -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    return timed


def duckdb_runners(parquet: Path, policy: dpsql.Policy, epsilon: float, cores: int) -> dict[str, Callable[[], float]]:
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET threads = {cores}")
    con.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{parquet}')")
    conn = dpsql.Connection(DuckDBEngine(con), policy, "bench", dpsql.Ledger(None, accountant=policy.accountant),
                            repeats=False)
    return {
        "raw": median_of(lambda: con.sql(QUERY).fetchall()),
        "floor": median_of(lambda: con.sql(FLOOR).fetchall()),
        "dpsql": median_of(lambda: conn.execute(QUERY, epsilon=epsilon).fetchall()),
    }


def spark_runners(session: object, parquet: Path, policy: dpsql.Policy, epsilon: float) -> dict[str, Callable[[], float]]:
    from dpsql.spark import SparkEngine

    frame = session.read.parquet(str(parquet))  # type: ignore[attr-defined]
    frame.createOrReplaceTempView("visits")
    conn = dpsql.Connection(SparkEngine(session, tables={"visits": frame}), policy, "bench",  # type: ignore[arg-type]
                            dpsql.Ledger(None, accountant=policy.accountant), repeats=False)
    sql = session.sql  # type: ignore[attr-defined]
    return {
        "raw": median_of(lambda: sql(QUERY).collect()),
        "floor": median_of(lambda: sql(FLOOR).collect()),
        "dpsql": median_of(lambda: conn.execute(QUERY, epsilon=epsilon).fetchall()),
    }


def interleaved(runners: dict[str, dict[str, Callable[[], float]]], repeat: int) -> dict[str, dict[str, float]]:
    """One warm-up each, then ``repeat`` rounds, each running every engine's every way once."""
    for ways in runners.values():
        for run in ways.values():
            run()
    times: dict[str, dict[str, list[float]]] = {e: {w: [] for w in ways} for e, ways in runners.items()}
    for _ in range(repeat):
        for engine, ways in runners.items():
            for way, run in ways.items():
                times[engine][way].append(run())
    return {e: {w: statistics.median(t) for w, t in ways.items()} for e, ways in times.items()}


def spark_fixed_costs(session: object, policy: dpsql.Policy, epsilon: float, runs: int) -> dict[str, float]:
    """Per-query cost on a 1,000-row table: the raw query, and dpsql over Spark."""
    from dpsql.spark import SparkEngine

    tiny = demo_database(DATA_DIR / "visits_1000x100.duckdb", rows=1000, units=100)
    with duckdb.connect(str(tiny), read_only=True) as con:
        table = con.sql("SELECT * FROM visits").to_arrow_table()
    frame = session.createDataFrame(table.to_pandas())  # type: ignore[attr-defined]
    frame.createOrReplaceTempView("visits_tiny")
    conn = dpsql.Connection(SparkEngine(session, tables={"visits": frame}), policy, "bench",  # type: ignore[arg-type]
                            dpsql.Ledger(None, accountant=policy.accountant), repeats=False)
    raw = median_of(lambda: session.sql(QUERY.replace("visits", "visits_tiny")).collect())  # type: ignore[attr-defined]
    private = median_of(lambda: conn.execute(QUERY, epsilon=epsilon).fetchall())
    raw(), private()
    return {"raw": statistics.median(raw() for _ in range(runs)),
            "dpsql": statistics.median(private() for _ in range(runs))}


def salt_check(session: object, policy: dpsql.Policy, runs: int) -> dict[str, float]:
    """The bounded query on a tiny table, its salt a bound parameter vs a literal."""
    from dpsql.rewrite import bounded_query
    from dpsql.spark import SparkEngine

    frame = session.sql("SELECT id % 100 AS user_id, CAST(id % 4 AS STRING) AS region, "  # type: ignore[attr-defined]
                        "CAST(id AS DOUBLE) AS income FROM range(1000)")
    engine = SparkEngine(session, tables={"visits": frame})  # type: ignore[arg-type]
    conn = dpsql.Connection(engine, policy, "bench", dpsql.Ledger(None, accountant=policy.accountant), repeats=False)
    plan = conn.plan(QUERY, epsilon=1.0)
    bounded = bounded_query(plan)
    text = bounded.query.sql(dialect=engine.dialect)
    param = median_of(lambda: engine.run(text, bounded.salts()))
    literal = median_of(lambda: engine.run(bounded_query(plan, salt=dpsql_salt()).query.sql(dialect=engine.dialect)))
    param(), literal()
    return {"parameter": statistics.median(param() for _ in range(runs)),
            "literal": statistics.median(literal() for _ in range(runs))}


def translation_variants(session: object, parquet: Path, policy: dpsql.Policy, repeat: int) -> str:
    """The bounded query's Spark SQL with and without the lean passes, and the floor:
    median wall and JVM CPU seconds of ``repeat`` interleaved runs (after one warm-up),
    each variant checked to return the same rows."""
    import sqlglot.expressions as exp

    from dpsql.rewrite import bounded_query
    from dpsql.spark import SparkEngine
    from dpsql.spark import translate as tr

    frame = session.read.parquet(str(parquet))  # type: ignore[attr-defined]
    frame.createOrReplaceTempView("visits")
    engine = SparkEngine(session, tables={"visits": frame})  # type: ignore[arg-type]
    conn = dpsql.Connection(engine, policy, "bench", dpsql.Ledger(None, accountant=policy.accountant), repeats=False)
    tree = tr.parse_bounded(bounded_query(conn.plan(QUERY, epsilon=1.0), engine, salt=1).sql(dialect="duckdb"))

    def decimal_sums(node: exp.Expression) -> exp.Expression:  # SUM(col) -> SUM(CAST(col ...)): no halves
        if isinstance(node, exp.Sum) and isinstance(node.this, exp.Column) and isinstance(node.parent, exp.Cast):
            return exp.Sum(this=exp.cast(node.this, "BIGINT"))
        return node

    without_round = tuple(r for r in tr.RULES if r is not tr.exact_round)
    texts = {
        "floor": FLOOR,
        "before (ROUND, DECIMAL sums)": tr.to_spark(tree.transform(decimal_sums), without_round),
        "exact_round only": tr.to_spark(tree.transform(decimal_sums)),
        "halves only": tr.to_spark(tree, without_round),
        "now (both)": tr.to_spark(tree),
    }
    sqls = {k: v if isinstance(v, str) else v.sql(dialect="spark") for k, v in texts.items()}
    run = session.sql  # type: ignore[attr-defined]
    answers = {k: sorted(map(tuple, run(q).collect())) for k, q in sqls.items() if k != "floor"}
    assert len({repr(a) for a in answers.values()}) == 1, "a variant's rows differ"
    jvm = _jvm_pid()
    wall: dict[str, list[float]] = {k: [] for k in sqls}
    cpu: dict[str, list[float]] = {k: [] for k in sqls}
    for _ in range(repeat):
        for name, sql in sqls.items():
            before, start = _cpu_seconds(jvm), time.perf_counter()
            run(sql).collect()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(_cpu_seconds(jvm) - before)
    floor_wall, floor_cpu = statistics.median(wall["floor"]), statistics.median(cpu["floor"])
    lines = ["| Spark SQL | wall s | / floor | JVM CPU s | / floor |", "|---|---|---|---|---|"]
    for name in sqls:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        lines.append(f"| {name} | {w:.2f} | {w / floor_wall:.2f} | {c:.2f} | {c / floor_cpu:.2f} |")
    return "\n".join(lines) + "\n"


def _jvm_pid() -> int:
    """The Java child process of this one (the local Spark driver and executors)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == me and b"java" in Path(f"/proc/{entry}/cmdline").read_bytes():
                    return int(entry)
            except OSError:
                continue
    raise RuntimeError("no Java child process: --variants needs a local master")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dpsql_salt() -> int:
    from dpsql.rewrite import new_salt

    return new_salt()


def report(args: argparse.Namespace, results: dict[str, dict[str, float]], startup: float,
           fixed: dict[str, float], salts: dict[str, float] | None) -> str:
    lines = [
        f"## bench_spark: Spark local[{args.cores}] vs DuckDB on Parquet, {args.rows:,} rows, {args.units:,} units",
        "",
        f"{cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB; pyspark {_pyspark_version()}, "
        f"duckdb {duckdb.__version__}; median of {args.repeat} interleaved runs after one warm-up. "
        f"Command: `python benchmarks/bench_spark.py --rows {args.rows} --units {args.units} "
        f"--repeat {args.repeat} --cores {args.cores}`.",
        "",
        "| engine | raw s | floor s | dpsql s | floor / raw | dpsql / floor |",
        "|---|---|---|---|---|---|",
    ]
    for engine, t in results.items():
        lines.append(f"| {engine} | {t['raw']:.2f} | {t['floor']:.2f} | {t['dpsql']:.2f} | "
                     f"{t['floor'] / t['raw']:.2f} | {t['dpsql'] / t['floor']:.2f} |")
    lines += [
        "",
        f"Spark fixed costs: session start-up to the first answer {startup:.1f} s (once per process); "
        f"per query on 1,000 rows: raw {fixed['raw'] * 1000:.0f} ms, through dpsql {fixed['dpsql'] * 1000:.0f} ms "
        f"(median of {args.tiny_runs}).",
    ]
    if salts:
        lines.append(f"Salt as a bound parameter: {salts['parameter'] * 1000:.0f} ms per tiny bounded query; "
                     f"as a literal: {salts['literal'] * 1000:.0f} ms.")
    return "\n".join(lines) + "\n"


def _pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiny-runs", type=int, default=20)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--master", default=None, help="a Spark master URL (default local[--cores])")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--policy", type=Path, default=ROOT / "policies" / "demo.toml")
    parser.add_argument("--salt-check", action="store_true", help="also time the salt as a parameter vs a literal")
    parser.add_argument("--variants", action="store_true",
                        help="time the Spark SQL with and without its lean passes instead (wall and JVM CPU)")
    parser.add_argument("--write", action="store_true", help=f"also append the report to {RESULTS}")
    args = parser.parse_args(argv)

    from dpsql.spark import local_session

    policy = bench_policy(args.policy)
    parquet = parquet_data(args.rows, args.units)
    start = time.perf_counter()
    session = local_session(args.master or f"local[{args.cores}]")
    session.sql("SELECT 1").collect()
    startup = time.perf_counter() - start
    if args.variants:
        try:
            print(os.popen("uptime").read().strip())
            print(translation_variants(session, parquet, policy, args.repeat))
            print(os.popen("uptime").read().strip())
        finally:
            session.stop()
        return 0
    try:
        runners = {"duckdb": duckdb_runners(parquet, policy, args.epsilon, args.cores),
                   "spark": spark_runners(session, parquet, policy, args.epsilon)}
        results = interleaved(runners, args.repeat)
        print(f"big-table medians (s): {results}", file=sys.stderr)
        fixed = spark_fixed_costs(session, policy, args.epsilon, args.tiny_runs)
        salts = salt_check(session, policy, args.tiny_runs) if args.salt_check else None
    finally:
        session.stop()
    text = report(args, results, startup, fixed, salts)
    print(text)
    if args.write:
        append_results(RESULTS, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

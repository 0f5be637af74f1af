"""How do dpsql's time and memory grow with the data? 1M, 10M and 100M rows of Parquet (issue 7).

The demo ``visits`` table (the shape of :mod:`dpsql.demo`, columns as in
``policies/demo.toml``) is written as Parquet at each size, once, under
``benchmarks/data/scale/`` (gitignored), in chunks of 4M rows so the generator stays
under about 1.5 GiB whatever the size:

    size   rows          units (privacy units)   rows per unit (mean)
    1M     1,000,000       100,000                10
    10M    10,000,000      200,000                50   (as bench_core.py)
    100M   100,000,000   1,000,000               100

Then, for each size, it times

    SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region

three ways, each (engine, size) in a fresh process of its own so that its peak memory is
its own: ``raw`` (the query on DuckDB), ``floor`` (one ``GROUP BY unit, region`` feeding
the region aggregate, by hand: _shared.FLOOR) and ``dpsql``
(``dpsql.connect(tables={"visits": "....parquet", ...})``: dpsql's own hardened DuckDB
reading the Parquet file with the settings dpsql gives it; epsilon=1.0, in-memory ledger,
``repeats=False`` so that every run is a fresh, charged answer). For raw and floor,
``visits`` and ``regions`` are VIEWs over ``read_parquet(...)`` on an in-memory DuckDB
connection with its default settings (``threads`` = cores, ``memory_limit`` = 80 % of RAM)
unless ``--memory-limit`` says otherwise (it does not reach dpsql's own DuckDB). The three
processes of a size run interleaved: one warm-up round, then each round runs the query
once in each process, the order rotating. Wall and CPU time (user + system, all threads)
are medians over the rounds; peak RSS is the process's maximum resident set (``VmHWM`` in
``/proc/self/status``, read by the process itself at the end), which includes Python,
DuckDB and dpsql themselves (the "RSS before" column).

The goals (issue 16): dpsql within 1.3x the floor (wall and CPU) at 10M and 100M rows,
and at most 1 GiB of peak memory at 100M rows (issue 7's were 2x and 4 GiB).

    python benchmarks/bench_scale.py                     # 1M, 10M, 100M: table on stdout
    python benchmarks/bench_scale.py --write             # ... also appended to RESULTS.md
    python benchmarks/bench_scale.py --quick             # 1M and 10M, 3 runs each
    python benchmarks/bench_scale.py --sizes 100M --repeat 2 --memory-limit 3GB
    python benchmarks/bench_scale.py --replot            # redraw the PNG from the last full run

The full run (default sizes and engines, DuckDB's default memory limit) also draws
``benchmarks/latency_vs_rows.png`` (latency and peak memory against rows, log-log) when
matplotlib is installed (``pip install -e '.[test]'``); other runs draw theirs under
``benchmarks/data/scale/``, next to the measurements (``full.json`` for the full run), so
``--replot`` can redraw without rerunning. Progress goes to stderr, the Markdown report to
stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import FLOOR, QUERY, append_results, cpu_model, ram_gib  # noqa: E402

HERE = Path(__file__).resolve().parent
SCALE_DIR = HERE / "data" / "scale"
RESULTS = HERE / "RESULTS.md"
PNG = HERE / "latency_vs_rows.png"


ENGINES = ("raw", "floor", "dpsql")
#: rows -> units; other sizes get rows // 10 units.
UNITS = {1_000_000: 100_000, 10_000_000: 200_000, 100_000_000: 1_000_000}
DEFAULT_SIZES = "1M,10M,100M"
CHUNK_ROWS = 4_000_000
ROW_GROUP_ROWS = 1 << 20
SEED = 20261121
GOAL_X_FLOOR = 1.3  # issue 16: dpsql / floor, wall and CPU, at 10M and 100M rows
GOAL_PEAK_MIB = 1024  # issue 16: peak RSS of the dpsql process at 100M rows


# ---------------------------------------------------------------- sizes


def parse_size(text: str) -> int:
    """``"10M"`` -> 10_000_000; also ``k`` and ``G`` suffixes, or a plain integer."""
    text = text.strip().upper().replace("_", "")
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    return int(float(number) * scale)


def size_label(rows: int) -> str:
    for suffix, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if rows >= scale and rows % scale == 0:
            return f"{rows // scale}{suffix}"
    return str(rows)


def default_repeat(rows: int) -> int:
    return 3 if rows >= 50_000_000 else 5


# ---------------------------------------------------------------- progress


class Progress:
    """One status line on stderr (redrawn in place on a terminal, one line per update
    otherwise): overall step, what is running, elapsed time."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self._last = ""

    def show(self, what: str, frac: float = 0.0) -> None:
        width = 24
        filled = min(width, int(width * (self.done + frac) / max(self.total, 1)))
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.monotonic() - self.start
        line = f"[{bar}] {self.done}/{self.total} {what} ({elapsed // 60:.0f}:{elapsed % 60:04.1f})"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        elif line.split(" (")[0] != self._last:
            sys.stderr.write(line + "\n")
        self._last = line.split(" (")[0]
        sys.stderr.flush()

    def step(self, what: str) -> None:
        self.done += 1
        self.show(what)

    def note(self, text: str) -> None:
        """A line that stays (the bar is redrawn below it)."""
        if self.tty:
            sys.stderr.write("\r\033[K")
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


# ---------------------------------------------------------------- data


def data_paths(rows: int, units: int) -> tuple[Path, Path]:
    return SCALE_DIR / f"visits_{rows}x{units}_seed{SEED}.parquet", SCALE_DIR / "regions.parquet"


def ensure_data(rows: int, units: int, progress: Progress) -> tuple[Path, Path, str]:
    """The Parquet files for ``rows`` (written now if missing) and a note on how they came."""
    visits, regions = data_paths(rows, units)
    SCALE_DIR.mkdir(parents=True, exist_ok=True)
    if not regions.exists():
        import pyarrow.parquet as pq

        from dpsql import demo

        pq.write_table(demo._regions_table(), regions)
    if visits.exists():
        return visits, regions, f"{visits.name}: cached, {visits.stat().st_size / 2**20:,.0f} MiB"
    started = time.perf_counter()
    write_visits(visits, rows, units, progress)
    took = time.perf_counter() - started
    return visits, regions, (
        f"{visits.name}: generated in {took:.0f} s, {visits.stat().st_size / 2**20:,.0f} MiB,"
        f" generator peak RSS {peak_rss_self_mib():,.0f} MiB"
    )


def write_visits(path: Path, rows: int, units: int, progress: Progress) -> None:
    """Write ``visits`` as one Parquet file, chunk by chunk (see :func:`visits_chunks`).

    Written to ``<path>.part`` and renamed at the end, so an interrupted run leaves no
    truncated file to be mistaken for a cached one.
    """
    import pyarrow.parquet as pq

    part = path.with_name(path.name + ".part")
    chunks = math.ceil(rows / CHUNK_ROWS)
    with pq.ParquetWriter(part, visits_schema(), compression="snappy") as writer:
        for i, table in enumerate(visits_chunks(rows, units, SEED, CHUNK_ROWS)):
            progress.show(f"generating {size_label(rows)} rows: chunk {i + 1}/{chunks}", (i + 1) / chunks)
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    part.rename(path)


def visits_schema():  # noqa: ANN201 - a pyarrow Schema (pyarrow is imported late)
    import pyarrow as pa

    return pa.schema(
        [
            ("user_id", pa.int64()), ("region", pa.string()), ("age", pa.int32()),
            ("income", pa.float64()), ("visits", pa.int32()), ("city", pa.string()),
            ("zip", pa.string()), ("ssn", pa.string()), ("device", pa.string()),
        ]
    )


def visits_chunks(rows: int, units: int, seed: int, chunk_rows: int):  # noqa: ANN201 - Iterator[pa.Table]
    """The demo ``visits`` table, ``chunk_rows`` rows at a time.

    The same law as :func:`dpsql.demo.make_demo_database` (and its private helpers, so the
    shape follows the demo if the demo changes): each user has 1 + a multinomial share of
    the other ``rows - units`` rows with lognormal weights, a home region and a home city
    with the same away and travel shares, the same per-user ages, incomes, zips and ssns,
    and the same junk. The multinomial is drawn here as independent categorical draws, one
    chunk at a time (the same distribution of rows per user); each user's guaranteed row
    is in a chunk chosen at random; rows are shuffled within a chunk. Per chunk, like the
    demo per table, two incomes are NaN and one is +inf. Deterministic for a given seed
    and ``chunk_rows``, not row-for-row equal to the demo's database.
    """
    import numpy as np
    import pyarrow as pa

    from dpsql import demo

    units = min(units, rows)
    rng = np.random.Generator(np.random.PCG64(seed))
    user_ids = 10_000_000 + rng.permutation(units * 7)[:units].astype(np.int64)
    cumulative = np.cumsum(rng.lognormal(0.0, demo._ROWS_PER_UNIT_SIGMA, units))
    per_user = demo._user_attributes(rng, units)
    regions = pa.array(demo.REGIONS, type=pa.string())
    cities = pa.array(per_user["city_names"].tolist(), type=pa.string())
    zips = pa.array(per_user["zip"].tolist(), type=pa.string())
    ssns = pa.array(per_user["ssn"].tolist(), type=pa.string())
    popularity = per_user["city_popularity"]
    guaranteed = rng.permutation(units)  # each user's own row, spread over the chunks
    schema = visits_schema()
    for start in range(0, rows, chunk_rows):
        end = min(rows, start + chunk_rows)
        n = end - start
        mine = guaranteed[units * start // rows : units * end // rows]
        drawn = np.searchsorted(cumulative, rng.random(n - len(mine)) * cumulative[-1], side="right")
        owner = np.concatenate([mine, np.minimum(drawn, units - 1)])
        rng.shuffle(owner)

        region = per_user["home_region"][owner]
        away = rng.random(n) >= demo._HOME_REGION_SHARE
        region[away] = rng.integers(0, len(demo.REGIONS), int(away.sum()))
        city = per_user["city"][owner]
        travel = rng.random(n) >= demo._HOME_CITY_SHARE
        city[travel] = rng.choice(len(popularity), int(travel.sum()), p=popularity)
        owner_idx = pa.array(owner)
        yield pa.table(
            {
                "user_id": user_ids[owner],
                "region": regions.take(pa.array(region)),
                "age": per_user["age"][owner],
                "income": demo._row_incomes(rng, per_user["income"][owner]),
                "visits": np.minimum(rng.geometric(1 / 8, n) - 1, 60).astype(np.int32),
                "city": cities.take(pa.array(city)),
                "zip": zips.take(owner_idx),
                "ssn": ssns.take(owner_idx),
                "device": demo._devices(rng, n).dictionary_decode(),
            },
            schema=schema,
        )


# ---------------------------------------------------------------- the child process


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_rss_self_mib() -> float:
    """This process's peak resident set so far (VmHWM), MiB."""
    try:
        return _status_kib("VmHWM") / 1024
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(args: argparse.Namespace) -> int:
    """Time one engine on one Parquet file, one run per ``run`` line on stdin (the parent
    interleaves the engines' processes round by round); ``end`` prints the summary."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")
    if args.memory_limit:
        con.execute(f"SET memory_limit = '{args.memory_limit}'")
    for name, path in (("visits", args.parquet), ("regions", args.regions)):
        literal = "'" + str(path).replace("'", "''") + "'"
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({literal})")
    prepare, run, settings = _runner(args.engine, con, args)
    rss_before = _status_kib("VmRSS") / 1024
    answer: list = []
    for line in sys.stdin:
        if line.strip() != "run":
            break
        prepare()
        c0, w0 = time.process_time(), time.perf_counter()
        answer = run()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)
    json.dump(
        {
            "rss_before_mib": rss_before,
            "vmhwm_mib": peak_rss_self_mib(),
            "settings": settings(),
            "answer": [[_jsonable(v) for v in row] for row in sorted(answer, key=lambda r: str(r[0]))],
        },
        sys.stdout,
    )
    print(flush=True)
    return 0


def _jsonable(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if isinstance(value, (int, float, str, type(None))) else str(value)


_SETTINGS = ("SELECT name, value FROM duckdb_settings() WHERE name IN"
             " ('memory_limit', 'threads', 'temp_directory', 'preserve_insertion_order')")


def _runner(engine: str, con, args: argparse.Namespace):  # noqa: ANN001, ANN202
    """``(prepare, run, settings)``: ``prepare`` is called untimed before each timed ``run``;
    ``settings()`` is the DuckDB configuration the engine ran with."""
    if engine in ("raw", "floor"):
        sql = QUERY if engine == "raw" else FLOOR
        return (lambda: None), (lambda: con.sql(sql).fetchall()), (lambda: dict(con.sql(_SETTINGS).fetchall()))
    import dpsql

    con.close()  # dpsql reads the Parquet files through its own hardened DuckDB

    def connect():  # noqa: ANN202
        return dpsql.connect(tables={"visits": str(args.parquet), "regions": str(args.regions)},
                             policy=str(args.policy), analyst="bench", ledger=None, repeats=False)

    state = {"conn": connect()}

    def prepare() -> None:
        # The demo budget (epsilon 5) pays for five queries of epsilon 1: when this
        # connection cannot pay for the next, open a fresh one (fresh in-memory ledger).
        if state["conn"].budget().epsilon_remaining < args.epsilon:
            state["conn"].close()
            state["conn"] = connect()

    def settings() -> dict:
        return dict(state["conn"]._engine._con.sql(_SETTINGS).fetchall())

    return prepare, (lambda: state["conn"].execute(QUERY, epsilon=args.epsilon).fetchall()), settings


# ---------------------------------------------------------------- the parent


@dataclass
class Measure:
    rows: int
    units: int
    engine: str
    wall: list[float]
    cpu: list[float]
    peak_rss_mib: float
    rss_before_mib: float
    settings: dict
    answer: list
    load: float = 0.0  # 1-minute load average when the process started

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)


def run_size(engines: list[str], rows: int, units: int, visits: Path, regions: Path, repeat: int,
             args: argparse.Namespace, progress: Progress) -> list[Measure]:
    """Run every engine on one size, each in a fresh process of its own, interleaved: one
    warm-up round, then ``repeat`` rounds in which each process runs the query once (the
    order rotating round by round), so a change in the machine's load hits all alike.

    The peak RSS is each child's own ``VmHWM``. Not ``ru_maxrss`` from ``wait4`` or
    ``RUSAGE_CHILDREN``: Linux carries the parent's peak into it (subprocess starts the
    child with ``vfork``, and ``exec`` folds the old address space's high-water mark into
    ``ru_maxrss``), so every child would report at least the generator's peak.
    """
    procs: dict[str, tuple[subprocess.Popen, object, float]] = {}
    for engine in engines:
        command = [
            sys.executable, str(Path(__file__).resolve()), "--child", engine,
            "--parquet", str(visits), "--regions", str(regions),
            "--epsilon", str(args.epsilon), "--policy", str(args.policy),
        ]
        if args.memory_limit:
            command += ["--memory-limit", args.memory_limit]
        err = tempfile.TemporaryFile("w+")
        load = os.getloadavg()[0]
        procs[engine] = (subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                          text=True), err, load)
    timings: dict[str, list[tuple[float, float]]] = {e: [] for e in engines}

    def ask(engine: str, line: str) -> str:
        proc, err, _ = procs[engine]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        out = proc.stdout.readline()
        if not out:
            err.seek(0)  # type: ignore[attr-defined]
            raise RuntimeError(f"{size_label(rows)} {engine} failed (exit {proc.wait()}):\n{err.read()}")  # type: ignore[attr-defined]
        return out

    try:
        for r in range(repeat + 1):
            order = engines[r % len(engines):] + engines[: r % len(engines)]
            for engine in order:
                label = "warm-up" if r == 0 else f"round {r}/{repeat}"
                progress.show(f"{size_label(rows)} {engine}: {label}", r / (repeat + 1))
                data = json.loads(ask(engine, "run"))
                if r:
                    timings[engine].append((data["wall"], data["cpu"]))
        measures = []
        for engine in engines:
            summary = json.loads(ask(engine, "end"))
            procs[engine][0].wait()
            wall = [w for w, _ in timings[engine]]
            cpu = [c for _, c in timings[engine]]
            peak = summary["vmhwm_mib"]
            progress.step(f"{size_label(rows)} {engine}: median {statistics.median(wall):.3f} s, peak RSS {peak:,.0f} MiB")
            measures.append(Measure(rows, units, engine, wall, cpu, peak, summary["rss_before_mib"],
                                    summary["settings"], summary["answer"], procs[engine][2]))
        return measures
    finally:
        for proc, err, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()  # type: ignore[attr-defined]


def machine() -> dict[str, str]:
    import duckdb

    return {
        "cpu": cpu_model(), "cores": str(os.cpu_count()), "ram_gib": f"{ram_gib():.0f}",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "duckdb": duckdb.__version__,
    }


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def check_answers(measures: list[Measure]) -> list[str]:
    """raw and floor must agree on the exact counts per region (sums hold the demo's
    NaN and +inf incomes, so only counts are compared)."""
    problems = []
    by_key = {(m.rows, m.engine): m for m in measures}
    for rows in sorted({m.rows for m in measures}):
        raw, floor = by_key.get((rows, "raw")), by_key.get((rows, "floor"))
        if raw and floor:
            a = {r[0]: r[1] for r in raw.answer}
            b = {r[0]: r[1] for r in floor.answer}
            if a != b:
                problems.append(f"{size_label(rows)}: raw and floor counts differ: {a} vs {b}")
    return problems


def report(measures: list[Measure], info: dict, notes: list[str]) -> str:
    by_key = {(m.rows, m.engine): m for m in measures}
    m = info["machine"]
    settings = next((x.settings for x in measures if x.engine != "dpsql"), {})
    theirs = next((x.settings for x in measures if x.engine == "dpsql"), {})
    mine = ", ".join(f"{k} {v}" for k, v in sorted(theirs.items())) or "not run"
    runs = sorted({(x.rows, len(x.wall)) for x in measures})
    runs_text = ", ".join(f"{n} at {size_label(r)}" for r, n in runs)
    out = [
        f"## bench_scale: {size_label(min(x.rows for x in measures))} to"
        f" {size_label(max(x.rows for x in measures))} rows from Parquet ({info['when']})",
        "",
        f"{m['cpu']} (`lscpu` model name), {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['kernel']};"
        f" Python {m['python']}, DuckDB {m['duckdb']} (raw and floor: threads {settings.get('threads', '?')},"
        f" memory_limit {settings.get('memory_limit', '?')}"
        f"{', set by --memory-limit' if info.get('memory_limit') else ', its default: 80 % of RAM'};"
        f" dpsql's own DuckDB: {mine})."
        f" Load average (1 / 5 / 15 min) {info['load_before']} before, {info['load_after']} after.",
        "",
        f"`{QUERY}`, `visits` a VIEW over `read_parquet(...)`, epsilon={info['epsilon']};"
        f" median of {runs_text} runs after one warm-up, each (engine, size) in its own process;"
        " peak RSS is the process's `VmHWM`, \"RSS before\" what Python, DuckDB (and dpsql)"
        " held before the first query, \"load\" the 1-minute load average as the process started."
        " On a shared machine wall time wobbles with the load; CPU time (user + system, all"
        " threads) is the steadier number.",
        "",
        "| rows | units | engine | wall s | cpu s | x raw | x floor | cpu x floor | peak RSS MiB | RSS before MiB | load |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in measures:
        raw, floor = by_key.get((x.rows, "raw")), by_key.get((x.rows, "floor"))
        x_raw = f"{x.median / raw.median:.1f}" if raw else ""
        x_floor = f"{x.median / floor.median:.2f}" if floor else ""
        cpu_floor = f"{x.median_cpu / floor.median_cpu:.2f}" if floor else ""
        name = f"**{x.engine}**" if x.engine == "dpsql" else x.engine
        out.append(
            f"| {x.rows:,} | {x.units:,} | {name} | {x.median:.3f} | {x.median_cpu:.2f} | {x_raw} |"
            f" {x_floor} | {cpu_floor} | {x.peak_rss_mib:,.0f} | {x.rss_before_mib:,.0f} | {x.load:.1f} |"
        )
    out += ["", *goals(measures), "", *(f"- {n}" for n in notes)]
    return "\n".join(out).rstrip() + "\n"


def goals(measures: list[Measure]) -> list[str]:
    by_key = {(m.rows, m.engine): m for m in measures}
    lines = []
    ratios = []
    for rows in sorted({m.rows for m in measures}):
        d, f = by_key.get((rows, "dpsql")), by_key.get((rows, "floor"))
        if d and f:
            ratio, cpu_ratio = d.median / f.median, d.median_cpu / f.median_cpu
            mark = "met" if max(ratio, cpu_ratio) <= GOAL_X_FLOOR else "MISSED"
            ratios.append(f"{size_label(rows)} {ratio:.2f}x wall / {cpu_ratio:.2f}x CPU ({mark})")
    if ratios:
        lines.append(f"Goal dpsql <= {GOAL_X_FLOOR:g}x the floor: " + "; ".join(ratios) + ".")
    big = max((m.rows for m in measures), default=0)
    if big >= 100_000_000:
        peaks = ", ".join(
            f"{x.engine} {x.peak_rss_mib:,.0f} MiB" for x in measures if x.rows == big
        )
        d = by_key.get((big, "dpsql"))
        mark = "" if d is None else (" (met)" if d.peak_rss_mib <= GOAL_PEAK_MIB else " (MISSED)")
        lines.append(f"Goal dpsql peak memory <= {GOAL_PEAK_MIB / 1024:g} GiB at {size_label(big)}: {peaks}{mark}.")
    return lines


def plot(measures: list[Measure], path: Path, title: str) -> str:
    """Latency (left: wall, and CPU dashed) and peak RSS (right) against rows, log-log."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no PNG: {exc} (pip install -e '.[test]')"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    styles = {"raw": ("tab:gray", "o"), "floor": ("tab:blue", "s"), "dpsql": ("tab:red", "D")}
    for engine in ENGINES:
        xs = sorted((m for m in measures if m.engine == engine), key=lambda m: m.rows)
        if not xs:
            continue
        color, marker = styles[engine]
        rows = [m.rows for m in xs]
        left.plot(rows, [m.median for m in xs], marker=marker, color=color, label=f"{engine} wall")
        left.fill_between(rows, [min(m.wall) for m in xs], [max(m.wall) for m in xs], color=color, alpha=0.15)
        left.plot(rows, [m.median_cpu for m in xs], "--", marker=marker, color=color, alpha=0.6,
                  markerfacecolor="none", label=f"{engine} CPU")
        right.plot(rows, [m.peak_rss_mib for m in xs], marker=marker, color=color, label=engine)
    sizes = sorted({(m.rows, m.units) for m in measures})
    xlabel = "rows of visits (Parquet); units " + ", ".join(f"{size_label(u)}" for _, u in sizes)
    floors = sorted((m for m in measures if m.engine == "floor"), key=lambda m: m.rows)
    if floors:
        left.plot([m.rows for m in floors], [GOAL_X_FLOOR * m.median for m in floors], ":",
                  color="tab:blue", label=f"{GOAL_X_FLOOR:g}x floor (goal)")
    right.axhline(GOAL_PEAK_MIB, color="black", linestyle=":", label=f"{GOAL_PEAK_MIB / 1024:g} GiB (goal at 100M)")
    for ax, ylabel in ((left, "seconds (median; band: wall min to max)"), (right, "peak RSS (VmHWM), MiB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    left.set_title("latency")
    right.set_title("peak memory of the process")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path.relative_to(ROOT)}"


def outputs(args: argparse.Namespace) -> tuple[Path, Path]:
    """Where the PNG and the measurements go. Only the full run (default sizes, every
    engine, DuckDB's default memory limit) draws ``benchmarks/latency_vs_rows.png``; any
    other run draws its own PNG under ``benchmarks/data/scale/`` (gitignored)."""
    if args.png:
        return args.png, SCALE_DIR / f"{args.png.stem}.json"
    full = (not args.quick and args.sizes in (None, DEFAULT_SIZES) and args.engines == ",".join(ENGINES)
            and not args.memory_limit)
    if full:
        return PNG, SCALE_DIR / "full.json"
    sizes = args.sizes or ("1M,10M" if args.quick else DEFAULT_SIZES)
    tag = "_".join(filter(None, [sizes.replace(",", "-"), args.engines.replace(",", "-"),
                                 args.memory_limit and f"limit{args.memory_limit}"]))
    return SCALE_DIR / f"latency_vs_rows_{tag}.png", SCALE_DIR / f"{tag}.json"


def save(path: Path, measures: list[Measure], info: dict, notes: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"info": info, "notes": notes, "measures": [asdict(m) for m in measures]}, indent=1))


def load(path: Path) -> tuple[list[Measure], dict, list[str]]:
    data = json.loads(path.read_text())
    return [Measure(**m) for m in data["measures"]], data["info"], data["notes"]


def plot_title(info: dict) -> str:
    m = info["machine"]
    return (f"{QUERY}\n{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB; DuckDB {m['duckdb']};"
            f" {info['when']}; load average {info['load_before']} before")


def parent_main(args: argparse.Namespace) -> int:
    png, kept = outputs(args)
    if args.replot:
        measures, info, notes = load(kept)
        print(plot(measures, png, plot_title(info)), file=sys.stderr)
        return 0
    sizes = [parse_size(s) for s in (("1M,10M" if args.quick and not args.sizes else args.sizes or DEFAULT_SIZES)).split(",")]
    repeat_for = {r: args.repeat or (3 if args.quick else default_repeat(r)) for r in sizes}
    info = {
        "when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "load_before": load_average(),
        "epsilon": args.epsilon, "memory_limit": args.memory_limit,
    }
    engines = [e for e in ENGINES if e in args.engines.split(",")]
    progress = Progress(len(sizes) * len(engines))
    measures: list[Measure] = []
    notes: list[str] = []
    try:
        for rows in sizes:
            units = UNITS.get(rows, max(1, rows // 10))
            visits, regions, note = ensure_data(rows, units, progress)
            notes.append(note)
            progress.note(note)
            measures += run_size(engines, rows, units, visits, regions, repeat_for[rows], args, progress)
            save(kept, measures, info, notes)
    finally:
        progress.close()
    info["load_after"] = load_average()
    problems = check_answers(measures)
    compared = {m.rows for m in measures if m.engine == "raw"} & {m.rows for m in measures if m.engine == "floor"}
    if compared and not problems:
        problems_or_ok = ["raw and floor agree on the exact count of every region at every size."]
    else:
        problems_or_ok = problems
    notes += problems_or_ok
    save(kept, measures, info, notes)
    print(plot(measures, png, plot_title(info)), file=sys.stderr)
    text = report(measures, info, notes)
    print(text)
    if args.write:
        append_results(RESULTS, text)
        print(f"appended to {RESULTS.relative_to(ROOT)}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", help=f"comma-separated row counts (default {DEFAULT_SIZES})")
    parser.add_argument("--repeat", type=int, help="timed runs per (engine, size); default 5, 3 from 50M rows")
    parser.add_argument("--quick", action="store_true", help="1M and 10M rows, 3 runs each")
    parser.add_argument("--engines", default=",".join(ENGINES), help="a subset of raw,floor,dpsql")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--memory-limit", help="SET memory_limit on every connection, e.g. 3GB")
    parser.add_argument("--policy", type=Path, default=ROOT / "policies" / "demo.toml")
    parser.add_argument("--write", action="store_true", help=f"also append the report to {RESULTS.name}")
    parser.add_argument("--png", type=Path, help=f"where to draw the PNG (default: {PNG.name} for the full run)")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the PNG from the measurements the same options last produced, run nothing")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--parquet", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--regions", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.engine = args.child
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    raise SystemExit(main())

"""Which SQL shape should dpsql use to bound each unit's contribution? Measure, don't guess.

The query is ``SELECT <key>, COUNT(*), SUM(income) FROM visits GROUP BY <key>`` with the
demo policy's caps: a unit keeps at most ``LINF = 10`` rows per group, chosen by a keyed
row hash, and at most ``L0 = 4`` groups, chosen by a keyed group hash. Incomes are clipped
to ``[0, 250000]`` and summed as fixed-point integers (``2^-20`` steps); NULL and NaN
incomes are skipped, ±inf is clipped. Every bounded strategy below pays for all of that, so
the comparison is fair; ``raw`` and ``floor`` are the two reference points (DESIGN.md §7:
a dpsql query should cost at most 2x the floor).

Run (the 10M-row database is generated once under ``benchmarks/data/``)::

    python benchmarks/bounding_strategies.py                 # 10M rows, 200k units
    python benchmarks/bounding_strategies.py --key city      # L0 binds: 200+ private groups
    python benchmarks/bounding_strategies.py --rows 1000000 --units 100000 --repeat 3

Every strategy is timed on one read-only connection with DuckDB's default thread count:
one warm-up run, then the median of ``--repeat`` runs. Peak RSS is read from
``/proc/self/status`` (``VmHWM``, reset through ``/proc/self/clear_refs`` before each
strategy), so it includes what DuckDB's buffer pool already held. Before timing, the
strategies that share a hash are checked to keep exactly the same rows (the value summed is
then the row id, so any difference in the kept rows shows) against an independent numpy
computation, and every strategy's caps are checked on its per-(unit, group) table.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpsql.demo import REGIONS, demo_database  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
LINF, L0 = 10, 4
LOWER, UPPER, FRACTION_BITS = 0, 250_000, 20
ROW_SALT, GROUP_SALT = "7c1f0a9d", "e25b4d3a"  # the per-query secrets, as literals
ROW_SALT_INT, GROUP_SALT_INT = 0x2D1B_58F0_93A4_C6E7, 0x6A09_E667_F3BC_C908


# --------------------------------------------------------------------------- SQL pieces

FIXED_POINT = (
    "CASE WHEN income IS NULL OR isnan(income) THEN NULL ELSE CAST(ROUND("
    f"LEAST(GREATEST(income, {LOWER}), {UPPER}) * {2**FRACTION_BITS}) AS BIGINT) END"
)
# The hashes the brief names: salt as one more argument of DuckDB's multi-argument hash.
ROW_HASH = f"hash(user_id, rowid, '{ROW_SALT}')"
GROUP_HASH = f"hash({{key}}, user_id, '{GROUP_SALT}')"
# Salt mixed in *before* DuckDB's 64-bit finaliser (see README: the one above is weak).
MIXED_ROW_HASH = f"hash(rowid + {ROW_SALT_INT})"
MIXED_GROUP_HASH = f"hash(xor(hash(user_id, {{key}}), {GROUP_SALT_INT}::UBIGINT))"


@dataclass(frozen=True)
class Shape:
    """The knobs a bounded query is built from."""

    value: str = FIXED_POINT
    row_hash: str = ROW_HASH
    group_hash: str = GROUP_HASH
    key_filter: str = ""  # e.g. "region IN ('north', ...)" for public keys


def _rows(s: Shape, key: str) -> str:
    where = f" WHERE {s.key_filter}" if s.key_filter else ""
    return f"SELECT user_id, {key} AS g, {s.value} AS v, {s.row_hash} AS h FROM visits{where}"


def linf_window(s: Shape, key: str) -> str:
    """Per (unit, group): row_number over the row hash <= LINF, then pre-aggregate."""
    return f"""
    SELECT user_id, g, count(*) AS n, sum(v) AS s FROM (
        {_rows(s, key)}
        QUALIFY row_number() OVER (PARTITION BY user_id, g ORDER BY h) <= {LINF}
    ) GROUP BY user_id, g"""


def linf_min_by(s: Shape, key: str, null_safe: bool = True) -> str:
    """Per (unit, group) in one hash aggregate: capped count, top-LINF sum by min_by.

    ``min_by(v, h, n)`` skips rows whose ``v`` is NULL, so ``null_safe`` sums
    ``coalesce(v, 0)`` over the LINF lowest-hash rows (exactly the rows the window keeps);
    without it the sum keeps the LINF lowest-hash *non-NULL* rows (also within the cap,
    but not the same rows as the count).
    """
    if null_safe:
        top = f"CASE WHEN count(*) <= {LINF} THEN sum(v) ELSE list_sum(min_by(coalesce(v, 0), h, {LINF})) END"
    else:
        top = f"CASE WHEN count(v) <= {LINF} THEN sum(v) ELSE list_sum(min_by(v, h, {LINF})) END"
    return f"""
    SELECT user_id, g, least(count(*), {LINF}) AS n, {top} AS s FROM (
        {_rows(s, key)}
    ) GROUP BY user_id, g"""


def linf_heavy_only(s: Shape, key: str) -> str:
    """Pre-aggregate everything; send only the rows of groups with > LINF rows to a window."""
    return f"""
    SELECT user_id, g, n, s FROM (
        SELECT user_id, g, count(*) AS n, sum(v) AS s FROM ({_rows(s, key)}) GROUP BY user_id, g
    ) WHERE n <= {LINF}
    UNION ALL
    SELECT user_id, g, count(*) AS n, sum(v) AS s FROM (
        SELECT r.user_id, r.g, r.v FROM ({_rows(s, key)}) AS r
        SEMI JOIN (
            SELECT user_id, {key} AS g FROM visits GROUP BY user_id, {key} HAVING count(*) > {LINF}
        ) AS heavy USING (user_id, g)
        QUALIFY row_number() OVER (PARTITION BY r.user_id, r.g ORDER BY r.h) <= {LINF}
    ) GROUP BY user_id, g"""


def l0_window(s: Shape, key: str, per_group: str) -> str:
    """Per unit: row_number over the group hash <= L0 on the per-(unit, group) table."""
    group_hash = s.group_hash.format(key="g")
    return f"""
    SELECT user_id, g, n, s FROM ({per_group})
    QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY {group_hash}) <= {L0}"""


def l0_min_by(s: Shape, key: str, per_group: str) -> str:
    """Per unit: min_by(struct, group hash, L0) in a hash aggregate, then unnest."""
    group_hash = s.group_hash.format(key="g")
    return f"""
    SELECT user_id, k.g, k.n, k.s FROM (
        SELECT user_id, unnest(min_by({{'g': g, 'n': n, 's': s}}, {group_hash}, {L0})) AS k
        FROM ({per_group}) GROUP BY user_id
    )"""


def l0_none(s: Shape, key: str, per_group: str) -> str:
    """No L0 step: valid only when the query has at most L0 possible (public) groups."""
    return per_group


def final(kept: str) -> str:
    return f"SELECT g, sum(n) AS n, sum(s) AS s FROM ({kept}) GROUP BY g"


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    linf: object = None  # (Shape, key) -> per-(unit, group) SQL
    l0: object = None  # (Shape, key, per_group) -> kept per-(unit, group) SQL
    shape: Shape = Shape()
    same_rows_as_reference: bool = True  # uses ROW_HASH/GROUP_HASH and keeps NULL rows

    def kept_sql(self, key: str, shape: Shape | None = None) -> str:
        s = shape or self.shape
        return self.l0(s, key, self.linf(s, key))

    def sql(self, key: str) -> str:
        if self.name == "a":
            return f"SELECT {key}, count(*), sum(income) FROM visits GROUP BY {key}"
        if self.name == "b":
            return (
                f"SELECT {key}, sum(n), sum(s) FROM (SELECT user_id, {key}, count(*) AS n,"
                f" sum(income) AS s FROM visits GROUP BY ALL) GROUP BY {key}"
            )
        return final(self.kept_sql(key))


def strategies(key: str) -> list[Strategy]:
    public = key == "region"
    key_filter = f"region IN ({', '.join(repr(r) for r in REGIONS)})" if public else ""
    base = Shape(key_filter=key_filter)
    mixed = Shape(key_filter=key_filter, row_hash=MIXED_ROW_HASH, group_hash=MIXED_GROUP_HASH)
    out = [
        Strategy("a", "raw GROUP BY"),
        Strategy("b", "floor: GROUP BY unit, group -> GROUP BY group"),
        Strategy("c", "window Linf + window L0", linf_window, l0_window, base),
        Strategy("d", "min_by Linf (count(v) form) + window L0",
                 lambda s, k: linf_min_by(s, k, null_safe=False), l0_window, base,
                 same_rows_as_reference=False),
        Strategy("d2", "min_by Linf (NULL-safe) + window L0", linf_min_by, l0_window, base),
        Strategy("e1", "min_by Linf + min_by L0", linf_min_by, l0_min_by, base),
        Strategy("e2", "heavy-only window Linf + window L0", linf_heavy_only, l0_window, base),
        Strategy("e3", "min_by Linf + window L0, mixed hashes", linf_min_by, l0_window, mixed,
                 same_rows_as_reference=False),
    ]
    if public:  # 4 public regions <= L0 = 4: no unit can exceed L0, the L0 step is a no-op
        out += [
            Strategy("e4", "window Linf, L0 skipped", linf_window, l0_none, base),
            Strategy("e5", "min_by Linf, L0 skipped", linf_min_by, l0_none, base),
            Strategy("e6", "min_by Linf, L0 skipped, mixed hash", linf_min_by, l0_none, mixed,
                     same_rows_as_reference=False),
        ]
    return out


# --------------------------------------------------------------------------- measuring

def _status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class Timing:
    strategy: Strategy
    seconds: float
    runs: list[float]
    peak_rss_mib: float | None
    result: list[tuple]


def time_strategy(con: duckdb.DuckDBPyConnection, st: Strategy, key: str, repeat: int) -> Timing:
    sql = st.sql(key)
    can_reset = _reset_peak_rss()
    result = sorted(con.sql(sql).fetchall())  # warm-up
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        con.sql(sql).fetchall()
        runs.append(time.perf_counter() - start)
    peak = _status_kib("VmHWM") if can_reset else None
    return Timing(st, statistics.median(runs), runs, peak / 1024 if peak else None, result)


# --------------------------------------------------------------------------- verifying

def numpy_reference(con: duckdb.DuckDBPyConnection, key: str, key_filter: str) -> dict:
    """Kept rows computed outside SQL: per group, count and sum of row ids."""
    where = f"WHERE {key_filter}" if key_filter else ""
    t = con.sql(
        f"SELECT user_id, {key} AS g, rowid AS r, {ROW_HASH} AS h,"
        f" {GROUP_HASH.format(key=key)} AS h2 FROM visits {where}"
    ).to_arrow_table()
    user = t["user_id"].to_numpy()
    g_codes, g_names = _codes(t["g"])
    rid = t["r"].to_numpy()
    h = t["h"].to_numpy()
    h2 = t["h2"].to_numpy()
    # Linf: sort by (user, group, h); keep the first LINF of each (user, group) run.
    order = np.lexsort((h, g_codes, user))
    u, g, r, hh2 = user[order], g_codes[order], rid[order], h2[order]
    new_run = np.r_[True, (u[1:] != u[:-1]) | (g[1:] != g[:-1])]
    run_id = np.cumsum(new_run) - 1
    rank = np.arange(len(u)) - np.flatnonzero(new_run)[run_id]
    keep = rank < LINF
    u, g, r, hh2, run_id = u[keep], g[keep], r[keep], hh2[keep], run_id[keep]
    # L0: per user, rank its groups by their group hash; keep the first L0.
    first = np.r_[True, run_id[1:] != run_id[:-1]]
    gu, gg, gh = u[first], g[first], hh2[first]
    gorder = np.lexsort((gh, gu))
    gu_sorted = gu[gorder]
    new_user = np.r_[True, gu_sorted[1:] != gu_sorted[:-1]]
    user_idx = np.cumsum(new_user) - 1
    grank = np.empty(len(gu), dtype=np.int64)
    grank[gorder] = np.arange(len(gu)) - np.flatnonzero(new_user)[user_idx]
    group_kept = grank < L0
    row_kept = group_kept[np.cumsum(first) - 1]
    counts = np.bincount(g[row_kept], minlength=len(g_names))
    sums = np.bincount(g[row_kept], weights=r[row_kept].astype(np.float64), minlength=len(g_names))
    return {g_names[i]: (int(counts[i]), int(sums[i])) for i in range(len(g_names)) if counts[i]}


def _codes(column) -> tuple[np.ndarray, list]:
    encoded = column.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def verify(con: duckdb.DuckDBPyConnection, key: str, strategies_: list[Strategy]) -> list[str]:
    """Check kept-row identity against numpy, and the caps, for every bounded strategy."""
    notes = []
    bounded = [st for st in strategies_ if st.linf is not None]
    key_filter = bounded[0].shape.key_filter
    reference = numpy_reference(con, key, key_filter)
    for st in bounded:
        by_rowid = Shape(value="rowid", row_hash=st.shape.row_hash,
                         group_hash=st.shape.group_hash, key_filter=key_filter)
        kept = st.kept_sql(key, by_rowid)
        got = {g: (int(n), int(s)) for g, n, s in con.sql(final(kept)).fetchall()}
        max_n, max_groups = con.sql(
            f"SELECT max(n), max(groups) FROM (SELECT user_id, max(n) AS n, count(*) AS groups"
            f" FROM ({kept}) GROUP BY user_id)"
        ).fetchall()[0]
        caps_ok = max_n <= LINF and max_groups <= L0
        same = got == reference
        expect = "same rows as numpy" if st.same_rows_as_reference else "other rows (expected)"
        status = "OK" if caps_ok and (same or not st.same_rows_as_reference) else "FAIL"
        notes.append(
            f"{status} {st.name}: max rows/unit/group {max_n}, max groups/unit {max_groups};"
            f" kept rows {'identical to' if same else 'differ from'} numpy reference ({expect})"
        )
    return notes


def compare_real_values(timings: list[Timing]) -> list[str]:
    """On the real (clipped fixed-point income) query, which bounded results coincide?"""
    by_name = {t.strategy.name: t.result for t in timings}
    notes = []
    ref = by_name.get("c")
    for t in timings:
        if t.strategy.linf is None or ref is None or t.strategy.name == "c":
            continue
        notes.append(f"{t.strategy.name} vs c on income: {'identical' if t.result == ref else 'different'}")
    return notes


# --------------------------------------------------------------------------- reporting

def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, duckdb {duckdb.__version__}"


def table(timings: list[Timing]) -> str:
    raw = next(t.seconds for t in timings if t.strategy.name == "a")
    floor = next(t.seconds for t in timings if t.strategy.name == "b")
    lines = [
        "| | strategy | median s | x raw | x floor | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        rss = f"{t.peak_rss_mib:.0f}" if t.peak_rss_mib else "n/a"
        lines.append(
            f"| {t.strategy.name} | {t.strategy.label} | {t.seconds:.3f} |"
            f" {t.seconds / raw:.1f} | {t.seconds / floor:.2f} | {rss} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=200_000)
    parser.add_argument("--key", choices=("region", "city"), default="region")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", help="comma-separated strategy names (a and b always run)")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--show-sql", action="store_true")
    args = parser.parse_args(argv)

    db = demo_database(DATA_DIR / f"visits_{args.rows}x{args.units}.duckdb", rows=args.rows, units=args.units)
    chosen = strategies(args.key)
    if args.only:
        wanted = {"a", "b", *args.only.split(",")}
        chosen = [st for st in chosen if st.name in wanted]
    con = duckdb.connect(str(db), read_only=True)
    con.execute("SET enable_progress_bar = false")
    threads = con.sql("SELECT current_setting('threads')").fetchall()[0][0]
    print(f"# bounding strategies: GROUP BY {args.key}, {args.rows:,} rows, {args.units:,} units")
    print(f"{machine()}, threads={threads}, {time.strftime('%Y-%m-%d')}\n")
    if args.show_sql:
        for st in chosen:
            print(f"-- {st.name}: {st.label}\n{st.sql(args.key)};\n")
    if not args.no_verify and any(st.linf for st in chosen):
        for line in verify(con, args.key, chosen):
            print(line)
        print()
    timings = []
    for st in chosen:
        timings.append(time_strategy(con, st, args.key, args.repeat))
        t = timings[-1]
        print(f"{st.name:>3} {t.seconds:7.3f}s  runs {' '.join(f'{r:.2f}' for r in t.runs)}", file=sys.stderr)
    print(table(timings))
    print()
    for line in compare_real_values(timings):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

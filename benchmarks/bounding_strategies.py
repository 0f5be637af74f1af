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

All strategies are timed on one read-only connection with DuckDB's default thread count:
each is warmed up once, then they run round-robin ``--repeat`` times and the median is
reported, as wall time and as CPU time (user + system over all DuckDB threads; on a shared
machine it is the steadier of the two). Peak RSS is ``VmHWM`` from ``/proc/self/status``,
reset through ``/proc/self/clear_refs`` before each warm-up run, so it includes what
DuckDB's buffer pool already held. Before timing, every bounded strategy is checked: its
caps hold on its per-(unit, group) table (rows <= 10, groups <= 4, unit sum within
10 x the upper bound), and the strategies that share the brief's hash keep exactly the rows
an independent numpy computation keeps (the value summed is then the row id, so any
difference in the kept rows shows).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpsql.demo import REGIONS, demo_database  # noqa: E402

from _shared import cpu_model, ram_gib  # noqa: E402

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


def _rows(s: Shape, key: str, with_hash: bool = True) -> str:
    where = f" WHERE {s.key_filter}" if s.key_filter else ""
    h = f", {s.row_hash} AS h" if with_hash else ""
    return f"SELECT user_id, {key} AS g, {s.value} AS v{h} FROM visits{where}"


def linf_window(s: Shape, key: str) -> str:
    """Per (unit, group): row_number over the row hash <= LINF, then pre-aggregate.

    DuckDB 2.0's optimizer rewrites this QUALIFY into ``arg_min_nulls_last(.., h, LINF)``
    plus an UNNEST (TopN window elimination): physically it is a top-k hash aggregate.
    """
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
        top = (f"CASE WHEN count(*) <= {LINF} THEN sum(v)"
               f" ELSE list_sum(min_by(coalesce(v, 0), h, {LINF})) END")
    else:
        top = f"CASE WHEN count(v) <= {LINF} THEN sum(v) ELSE list_sum(min_by(v, h, {LINF})) END"
    return f"""
    SELECT user_id, g, least(count(*), {LINF}) AS n, {top} AS s FROM (
        {_rows(s, key)}
    ) GROUP BY user_id, g"""


VALUE_BITS = 38  # UPPER * 2^FRACTION_BITS < 2^38: the value fits under 26 hash bits
VALUE_MASK = 2**VALUE_BITS - 1


def linf_packed(s: Shape, key: str) -> str:
    """Top-LINF by ``min(x, LINF)`` over one UBIGINT: 26 high hash bits, 38 value bits.

    The same rows as the window unless two rows of one (unit, group) share their top 26
    hash bits at the cut (then the smaller value wins: still exactly LINF rows). Needs the
    fixed-point value, offset by the lower bound, to fit in VALUE_BITS bits.
    """
    packed = f"((h >> {VALUE_BITS}) << {VALUE_BITS}) | coalesce(v, 0)::UBIGINT"
    return f"""
    SELECT user_id, g, least(count(*), {LINF}) AS n,
        CASE WHEN count(*) <= {LINF} THEN sum(v)
             ELSE list_sum(list_transform(min({packed}, {LINF}), lambda x: x & {VALUE_MASK}::UBIGINT))
        END AS s
    FROM ({_rows(s, key)}) GROUP BY user_id, g"""


def linf_rescale(s: Shape, key: str) -> str:
    """No sampling: a unit's group sum is scaled by min(m, LINF) / m (m = its non-NULL rows).

    That is the expected value of the sum over LINF rows drawn uniformly at random, so it
    has the same range (at most LINF rows' worth: |s| <= LINF * max(|lo|, |hi|)) and so the
    same sensitivity, with less variance and no hash. Exact integer arithmetic: HUGEINT
    sum times an integer, divided (truncating) by an integer, stays inside the range.
    """
    return f"""
    SELECT user_id, g, least(count(*), {LINF}) AS n,
        (sum(v) * least(count(v), {LINF})) // count(v) AS s
    FROM ({_rows(s, key, with_hash=False)}) GROUP BY user_id, g"""


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


def l0_count_first(s: Shape, key: str, per_group: str) -> str:
    """Like :func:`l0_window`, but units with <= L0 groups skip the ranking."""
    group_hash = s.group_hash.format(key="g")
    return f"""
    SELECT user_id, g, n, s FROM (SELECT *, count(*) OVER (PARTITION BY user_id) AS groups FROM ({per_group}))
    QUALIFY groups <= {L0} OR row_number() OVER (PARTITION BY user_id ORDER BY {group_hash}) <= {L0}"""


def l0_none(s: Shape, key: str, per_group: str) -> str:
    """No L0 step: valid only when the query has at most L0 possible (public) groups."""
    return per_group


def final(kept: str) -> str:
    return f"SELECT g, sum(n) AS n, sum(s) AS s FROM ({kept}) GROUP BY g"


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    linf: Callable[..., str] | None = None  # (Shape, key) -> per-(unit, group) SQL
    l0: Callable[..., str] | None = None  # (Shape, key, per_group) -> kept groups SQL
    shape: Shape = Shape()
    same_rows: bool = True  # keeps exactly the rows of the numpy reference (ROW_HASH order)

    def kept_sql(self, key: str, shape: Shape | None = None) -> str:
        assert self.linf is not None and self.l0 is not None
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
    """The candidates. Public keys are not filtered in SQL (see e8): groups outside the
    policy's ``public_values`` are dropped from the few result rows afterwards."""
    base = Shape()
    mixed = Shape(row_hash=MIXED_ROW_HASH, group_hash=MIXED_GROUP_HASH)
    count_v = lambda s, k: linf_min_by(s, k, null_safe=False)  # noqa: E731
    out = [
        Strategy("a", "raw GROUP BY"),
        Strategy("b", "floor: GROUP BY unit, group -> GROUP BY group"),
        Strategy("c", "window (QUALIFY row_number) Linf + window L0", linf_window, l0_window, base),
        Strategy("d", "min_by Linf, count(v) form + window L0", count_v, l0_window, base, same_rows=False),
        Strategy("d2", "min_by Linf, NULL-safe + window L0", linf_min_by, l0_window, base),
        Strategy("e1", "packed UBIGINT min(x, 10) Linf + window L0", linf_packed, l0_window, base),
        Strategy("e2", "heavy groups only through window + window L0", linf_heavy_only, l0_window, base),
        Strategy("e3", "min_by Linf + window L0, salt-mixed hashes", linf_min_by, l0_window, mixed,
                 same_rows=False),
        Strategy("e4", "rescaled Linf (no sampling) + window L0", linf_rescale, l0_window, base,
                 same_rows=False),
    ]
    if key != "region":
        out.append(Strategy("e5", "rescaled Linf + count-first window L0", linf_rescale,
                            l0_count_first, base, same_rows=False))
    if key == "region":  # 4 public regions <= L0 = 4: no unit can exceed L0, skip that step
        in_list = f"region IN ({', '.join(repr(r) for r in REGIONS)})"
        out += [
            Strategy("e5", "min_by Linf, L0 skipped", linf_min_by, l0_none, base),
            Strategy("e6", "packed min(x, 10) Linf, L0 skipped", linf_packed, l0_none, base),
            Strategy("e7", "rescaled Linf, L0 skipped", linf_rescale, l0_none, base, same_rows=False),
            Strategy("e8", "e7 + WHERE region IN (public values)", linf_rescale, l0_none,
                     Shape(key_filter=in_list), same_rows=False),
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
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class Timing:
    strategy: Strategy
    sql: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + system, all DuckDB threads
    peak_rss_mib: float | None = None
    result: list[tuple] = field(default_factory=list)


def run_once(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[float, float, list[tuple]]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rows = con.sql(sql).fetchall()
    return time.perf_counter() - wall0, time.process_time() - cpu0, rows


def time_all(con: duckdb.DuckDBPyConnection, chosen: list[Strategy], key: str, repeat: int) -> list[Timing]:
    """Warm each strategy up once (measuring its peak RSS), then time them round-robin.

    Round-robin, not one strategy after the other, so that a burst of load from other
    processes on the machine spreads over all strategies instead of sinking one.
    """
    timings = [Timing(st, st.sql(key)) for st in chosen]
    for t in timings:
        can_reset = _reset_peak_rss()
        *_, rows = run_once(con, t.sql)
        t.result = sorted(rows)
        peak = _status_kib("VmHWM") if can_reset else None
        t.peak_rss_mib = peak / 1024 if peak else None
    for i in range(repeat):
        for t in timings:
            wall, cpu, _ = run_once(con, t.sql)
            t.wall.append(wall)
            t.cpu.append(cpu)
        print(f"round {i + 1}/{repeat} done", file=sys.stderr)
    return timings


# --------------------------------------------------------------------------- verifying

def numpy_reference(con: duckdb.DuckDBPyConnection, key: str) -> dict:
    """Kept rows computed outside SQL: per group, count and sum of row ids."""
    t = con.sql(
        f"SELECT user_id, {key} AS g, rowid AS r, {ROW_HASH} AS h,"
        f" {GROUP_HASH.format(key=key)} AS h2 FROM visits"
    ).to_arrow_table()
    user = t["user_id"].to_numpy()
    g_codes, g_names = _codes(t["g"])
    rid, h, h2 = t["r"].to_numpy(), t["h"].to_numpy(), t["h2"].to_numpy()
    # Linf: sort by (user, group, h); keep the first LINF rows of each (user, group) run.
    order = np.lexsort((h, g_codes, user))
    u, g, r, gh = user[order], g_codes[order], rid[order], h2[order]
    new_run = np.r_[True, (u[1:] != u[:-1]) | (g[1:] != g[:-1])]
    run_id = np.cumsum(new_run) - 1
    keep = np.arange(len(u)) - np.flatnonzero(new_run)[run_id] < LINF
    u, g, r, gh, run_id = u[keep], g[keep], r[keep], gh[keep], run_id[keep]
    # L0: per user, rank its groups by the group hash; keep the first L0.
    first = np.r_[True, run_id[1:] != run_id[:-1]]
    gu, gg = u[first], gh[first]
    gorder = np.lexsort((gg, gu))
    new_user = np.r_[True, gu[gorder][1:] != gu[gorder][:-1]]
    rank = np.empty(len(gu), dtype=np.int64)
    rank[gorder] = np.arange(len(gu)) - np.flatnonzero(new_user)[np.cumsum(new_user) - 1]
    row_kept = (rank < L0)[np.cumsum(first) - 1]
    counts = np.bincount(g[row_kept], minlength=len(g_names))
    sums = np.bincount(g[row_kept], weights=r[row_kept].astype(np.float64), minlength=len(g_names))
    return {g_names[i]: (int(counts[i]), int(sums[i])) for i in range(len(g_names)) if counts[i]}


def _codes(column) -> tuple[np.ndarray, list]:
    encoded = column.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def verify(con: duckdb.DuckDBPyConnection, key: str, chosen: list[Strategy]) -> list[str]:
    """Caps on the real values for every bounded strategy; kept rows against numpy.

    Row identity is checked by summing the row id instead of the income: two strategies
    that keep different rows then (all but surely) give different sums.
    """
    bounded = [st for st in chosen if st.linf is not None]
    if not bounded:
        return []
    reference = numpy_reference(con, key)
    s_max = LINF * UPPER * 2**FRACTION_BITS
    notes = []
    for st in bounded:
        max_n, min_s, max_s, max_groups = con.sql(
            "SELECT max(n), min(s_lo), max(s_hi), max(groups) FROM (SELECT user_id, max(n) AS n,"
            f" min(s) AS s_lo, max(s) AS s_hi, count(*) AS groups FROM ({st.kept_sql(key)})"
            " GROUP BY user_id)"
        ).fetchall()[0]
        caps_ok = max_n <= LINF and max_groups <= L0 and 0 <= min_s and max_s <= s_max
        by_rowid = Shape("rowid", st.shape.row_hash, st.shape.group_hash, st.shape.key_filter)
        got = {g: (int(n), int(s)) for g, n, s in con.sql(final(st.kept_sql(key, by_rowid))).fetchall()}
        same = got == reference
        ok = caps_ok and (same or not st.same_rows)
        notes.append(
            f"{'OK  ' if ok else 'FAIL'} {st.name:>3}: rows/unit/group <= {max_n},"
            f" groups/unit <= {max_groups}, unit sum in [{min_s}, {max_s}] (cap {s_max});"
            f" kept rows {'identical to' if same else 'differ from'} the numpy reference"
            f"{'' if st.same_rows else ' (not required)'}"
        )
    return notes


def compare_results(timings: list[Timing]) -> list[str]:
    """On the real query: does each bounded strategy return what the window (c) returns?"""
    ref = next((t.result for t in timings if t.strategy.name == "c"), None)
    if ref is None:
        return []
    notes = []
    for t in timings:
        if t.strategy.linf is None or t.strategy.name == "c":
            continue
        if t.result == ref:
            notes.append(f"{t.strategy.name:>3} = c exactly")
            continue
        worst = max(abs(float(a[2]) - float(b[2])) / abs(float(b[2])) for a, b in zip(t.result, ref))
        notes.append(f"{t.strategy.name:>3} != c: largest relative difference of a group sum {worst:.2e}")
    return notes


def hash_uniformity(salts: int = 1000, rows: int = 30) -> list[str]:
    """How many distinct LINF-of-``rows`` choices each keyed-hash form reaches over salts.

    A uniform choice would reach almost ``salts`` distinct subsets, each row kept with
    probability LINF / rows. The salts are the same seeded draws for every form.
    """
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT 42::BIGINT AS user_id, range::BIGINT AS rowid FROM range({rows})")
    rng = np.random.Generator(np.random.PCG64(7))
    draws = [int(x) for x in rng.integers(0, 2**62, salts, dtype=np.int64)]
    forms = {
        "hash(user_id, rowid, 'salt')": lambda k: f"hash(user_id, rowid, 'salt{k}')",
        "hash('salt', user_id, rowid)": lambda k: f"hash('salt{k}', user_id, rowid)",
        "hash(rowid + salt)": lambda k: f"hash(rowid + {k})",
        "hash(xor(hash(user_id, rowid), salt))": lambda k: f"hash(xor(hash(user_id, rowid), {k}::UBIGINT))",
    }
    out = [f"{LINF} of {rows} rows, {salts} salts (uniform: ~{salts} subsets, inclusion {LINF / rows:.2f}):"]
    for name, expr in forms.items():
        subsets: set[tuple[int, ...]] = set()
        kept = np.zeros(rows)
        for k in draws:
            chosen = [r for (r,) in con.sql(
                f"SELECT rowid FROM t QUALIFY row_number() OVER (ORDER BY {expr(k)}) <= {LINF}"
            ).fetchall()]
            subsets.add(tuple(sorted(chosen)))
            kept[chosen] += 1
        out.append(f"  {name:40s} {len(subsets):5d} subsets, inclusion"
                   f" {kept.min() / salts:.2f}-{kept.max() / salts:.2f}")
    return out


# --------------------------------------------------------------------------- reporting

def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB RAM, duckdb {duckdb.__version__}"


def table(timings: list[Timing]) -> str:
    med = {t.strategy.name: (statistics.median(t.wall), statistics.median(t.cpu)) for t in timings}
    raw, floor = med["a"], med["b"]
    lines = [
        "| | strategy | wall s | cpu s | wall x raw | wall x floor | cpu x floor | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        wall, cpu = med[t.strategy.name]
        rss = f"{t.peak_rss_mib:.0f}" if t.peak_rss_mib else "n/a"
        lines.append(
            f"| {t.strategy.name} | {t.strategy.label} | {wall:.3f} | {cpu:.2f} |"
            f" {wall / raw[0]:.1f} | {wall / floor[0]:.2f} | {cpu / floor[1]:.2f} | {rss} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--units", type=int, default=200_000)
    parser.add_argument("--key", choices=("region", "city"), default="region")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", help="comma-separated strategy names (a and b always run)")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--show-sql", action="store_true")
    parser.add_argument("--hash-study", action="store_true",
                        help="only measure how uniformly each keyed-hash form picks rows")
    args = parser.parse_args(argv)
    if args.hash_study:
        print("\n".join(hash_uniformity()))
        return 0

    db = demo_database(DATA_DIR / f"visits_{args.rows}x{args.units}.duckdb", rows=args.rows, units=args.units)
    chosen = strategies(args.key)
    if args.only:
        wanted = {"a", "b", *args.only.split(",")}
        chosen = [st for st in chosen if st.name in wanted]
    con = duckdb.connect(str(db), read_only=True)
    con.execute("SET enable_progress_bar = false")
    threads = con.sql("SELECT current_setting('threads')").fetchall()[0][0]
    print(f"## GROUP BY {args.key}: {args.rows:,} rows, {args.units:,} units\n")
    print(f"{machine()}, threads={threads}, {time.strftime('%Y-%m-%d %H:%M')},"
          f" load average at start {os.getloadavg()[0]:.1f}\n")
    if args.show_sql:
        for st in chosen:
            print(f"-- {st.name}: {st.label}\n{st.sql(args.key)};\n")
    if not args.no_verify:
        print("\n".join(verify(con, args.key, chosen)) + "\n")
    timings = time_all(con, chosen, args.key, args.repeat)
    print(table(timings))
    print(f"\nmedian of {args.repeat} after one warm-up; load average at end {os.getloadavg()[0]:.1f}\n")
    print("\n".join(compare_results(timings)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

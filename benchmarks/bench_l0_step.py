"""The L0 cap's step (each unit's groups of smallest keyed hash) in other forms, timed
interleaved against the floor (issue 16; measurements behind RESULTS.md's h16sql2 section).

The shape is ``GROUP BY region, device`` (12 listed pairs; a unit is in up to 16 groups, the
cap is 4) on the 10M-row demo. Every variant is the bounded query dpsql writes for it
(checked: same exact answer as dpsql's own text with the same salt), with the step written
another way; "no L0 step" drops it (not a valid bounded query: the cost of the rest).

    python benchmarks/bench_l0_step.py --repeat 3
    python benchmarks/bench_l0_step.py --variants "dpsql,threshold join (before),window row_number" --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _shared import process_cpu  # noqa: E402
DATA = Path(__file__).resolve().parent / "data" / "visits_10000000x200000.duckdb"
SALT = 123456789
PARAMS = {"salt2": SALT, "k0": ["north", "south", "east", "west"], "k1": ["mobile", "desktop", "tablet"]}

FLOOR = ("SELECT region, device, sum(n), sum(s), sum(s) / sum(c) FROM (SELECT user_id, region, device, "
         "count(*) AS n, sum(income) AS s, count(income) AS c FROM visits GROUP BY ALL) GROUP BY region, device")
ROWS = ("SELECT user_id AS __u, region AS __g0, device AS __g1, CASE WHEN NOT income IS NULL AND NOT "
        "ISNAN(CAST(income AS DOUBLE)) THEN CAST(ROUND(LEAST(GREATEST(CAST(income AS DOUBLE), CAST(0.0 AS DOUBLE)), "
        "CAST(250000.0 AS DOUBLE)) * CAST(4194304.0 AS DOUBLE)) AS BIGINT) END AS __v0 FROM visits")
_M1 = "CAST(SUM(__v0) AS INT128)"
_M2 = "(CAST(SUM(__v0) AS INT128) * 2 - 1048576000000 * CAST(COUNT(__v0) AS INT128))"
PAIRS = (f"SELECT __u, __g0, __g1, LEAST(COUNT(*), 10) AS __m0, "
         f"CASE WHEN COUNT(__v0) > 10 THEN {_M1} * 10 // COUNT(__v0) ELSE {_M1} END AS __m1, "
         f"CASE WHEN COUNT(__v0) > 10 THEN {_M2} * 10 // COUNT(__v0) ELSE {_M2} END AS __m2, "
         f"LEAST(COUNT(__v0), 10) AS __m3 FROM ({ROWS}) AS __rows GROUP BY __u, __g0, __g1 "
         "HAVING __g0 IN (SELECT UNNEST(CAST($k0 AS TEXT[]))) AND __g1 IN (SELECT UNNEST(CAST($k1 AS TEXT[])))")
H = "HASH(XOR(HASH(__u, __g0, __g1), CAST($salt2 AS UBIGINT)))"
_SAT = "CAST(LEAST(GREATEST({}, -4611686018427387904), 4611686018427387904) AS BIGINT)"
FINAL = ("SELECT __g0, __g1, " + _SAT.format("COALESCE(SUM(__m0), 0)") + " AS __m0, "
         + _SAT.format("CAST(COALESCE(SUM(__m1), 0) AS INT128) >> 31") + " AS __m1, "
         + _SAT.format("CAST(COALESCE(SUM(__m2), 0) AS INT128) >> 31") + " AS __m2, "
         + _SAT.format("COALESCE(SUM(__m3), 0)") + " AS __m3 FROM ({}) AS __src GROUP BY __g0, __g1")
_KEEP = "LEN(__l) <= 4 OR __ph.__h < __l[4] OR (__ph.__h = __l[4] AND __l[5] <> __l[4])"


def _join(pairs: str = PAIRS, top: str = "MIN(__h, 5)", cte: str = "") -> str:
    return (f"WITH __ph AS {cte}(SELECT *, {H} AS __h FROM ({pairs}) AS __pairs) SELECT __ph.* FROM __ph "
            f"JOIN (SELECT __u AS __lu, {top} AS __l FROM __ph GROUP BY __u) AS __thr ON __ph.__u = __thr.__lu "
            f"WHERE {_KEEP}")


_POSITIONS = ("SELECT * FROM (SELECT *, (list_position(CAST($k0 AS TEXT[]), __g0) - 1) * 3 + list_position(CAST($k1 "
              "AS TEXT[]), __g1) - 1 AS __i FROM (" + PAIRS[:PAIRS.index(" HAVING")] + ")) WHERE __i IS NOT NULL")
_PAIRS64 = PAIRS.replace(f"ELSE {_M1} END", f"ELSE {_M1} END::BIGINT").replace(f"ELSE {_M2} END", f"ELSE {_M2} END::BIGINT")
VARIANTS = {
    "floor": FLOOR,
    "threshold join (before)": FINAL.format(_join()),
    "no L0 step": FINAL.format(PAIRS),
    "window row_number": FINAL.format(f"SELECT *, {H} AS __h FROM ({PAIRS}) QUALIFY row_number() OVER "
                                      "(PARTITION BY __u ORDER BY __h) <= 4"),
    "min_by list + unnest": FINAL.format(
        "SELECT (e).__g0 AS __g0, (e).__g1 AS __g1, (e).__m0 AS __m0, (e).__m1 AS __m1, (e).__m2 AS __m2, "
        "(e).__m3 AS __m3 FROM (SELECT UNNEST(list_filter(__l[1:4], lambda x: len(__l) <= 4 OR x.__h < __l[4].__h "
        "OR __l[5].__h <> __l[4].__h)) AS e FROM (SELECT MIN_BY(struct_pack(__g0, __g1, __m0, __m1, __m2, __m3, "
        f"__h), __h, 5) AS __l FROM (SELECT *, {H} AS __h FROM ({PAIRS})) GROUP BY __u))"),
    "join with list_sort(list(h))": FINAL.format(_join(top="list_sort(list(__h))")),
    "join with BIGINT pair sums": FINAL.format(_join(_PAIRS64)),
    "join NOT MATERIALIZED": FINAL.format(_join(cte="NOT MATERIALIZED ")),
    "scalar cut": FINAL.format(
        f"WITH __ph AS (SELECT *, {H} AS __h FROM ({PAIRS}) AS __pairs) SELECT __ph.* FROM __ph "
        "JOIN (SELECT __u AS __lu, MIN(__h, 5)[5] AS __c FROM __ph GROUP BY __u) AS __thr ON __ph.__u = __thr.__lu "
        "WHERE __c IS NULL OR __h < __c"),
    "mask join": FINAL.format(
        f"WITH __ph AS (SELECT *, {H} AS __h, (list_position(CAST($k0 AS TEXT[]), __g0) - 1) * 3 "
        f"+ list_position(CAST($k1 AS TEXT[]), __g1) - 1 AS __i FROM ({PAIRS}) AS __pairs) SELECT __ph.* FROM __ph "
        "JOIN (SELECT __lu, CASE WHEN __n > 4 THEN list_sort(list_transform(list_filter(range(12), "
        "lambda i: (__m >> i) & 1 = 1), lambda i: HASH(XOR(HASH(__lu, CAST($k0 AS TEXT[])[i // 3 + 1], "
        "CAST($k1 AS TEXT[])[i % 3 + 1]), CAST($salt2 AS UBIGINT)))))[5] END AS __c "
        "FROM (SELECT __u AS __lu, bit_or(1::BIGINT << __i) AS __m, count(*) AS __n FROM __ph GROUP BY __u)) AS __thr "
        "ON __ph.__u = __thr.__lu WHERE __c IS NULL OR __h < __c"),
    "mask from rows": FINAL.format(
        f"SELECT __pairs.* FROM ({PAIRS}) AS __pairs JOIN (SELECT __lu, CASE WHEN bit_count(__m) > 4 THEN "
        "list_sort(list_transform(list_filter(range(12), "
        "lambda i: (__m >> i) & 1 = 1), lambda i: HASH(XOR(HASH(__lu, CAST($k0 AS TEXT[])[i // 3 + 1], "
        "CAST($k1 AS TEXT[])[i % 3 + 1]), CAST($salt2 AS UBIGINT)))))[5] END AS __c "
        "FROM (SELECT user_id AS __lu, bit_or(1::BIGINT << ((list_position(CAST($k0 AS TEXT[]), region) - 1) * 3 "
        "+ list_position(CAST($k1 AS TEXT[]), device) - 1)) AS __m FROM visits WHERE region IN (SELECT UNNEST(CAST($k0 AS TEXT[]))) "
        "AND device IN (SELECT UNNEST(CAST($k1 AS TEXT[]))) GROUP BY user_id)) AS __thr "
        f"ON __pairs.__u = __thr.__lu WHERE __c IS NULL OR {H} < __c"),
    "mask join + positions filter": FINAL.format(
        f"WITH __ph AS (SELECT *, {H} AS __h FROM ({_POSITIONS}) AS __pairs) SELECT __ph.* FROM __ph "
        "JOIN (SELECT __lu, CASE WHEN bit_count(__m) > 4 THEN list_sort(list_transform(list_filter(range(12), "
        "lambda i: (__m >> i) & 1 = 1), lambda i: HASH(XOR(HASH(__lu, CAST($k0 AS TEXT[])[i // 3 + 1], "
        "CAST($k1 AS TEXT[])[i % 3 + 1]), CAST($salt2 AS UBIGINT)))))[5] END AS __c "
        "FROM (SELECT __u AS __lu, bit_or(1::BIGINT << __i) AS __m FROM __ph GROUP BY __u)) AS __thr "
        "ON __ph.__u = __thr.__lu WHERE __c IS NULL OR __h < __c"),
    "mask by two windows": FINAL.format(
        "SELECT * FROM (SELECT *, max(__c0) OVER (PARTITION BY __u) AS __c FROM (SELECT *, CASE WHEN __r = 1 AND "
        "bit_count(__m) > 4 THEN list_sort(list_transform(list_filter(range(12), lambda i: (__m >> i) & 1 = 1), "
        "lambda i: HASH(XOR(HASH(__u, CAST($k0 AS TEXT[])[i // 3 + 1], CAST($k1 AS TEXT[])[i % 3 + 1]), "
        "CAST($salt2 AS UBIGINT)))))[5] END AS __c0 FROM (SELECT *, bit_or(1::BIGINT << __i) OVER w AS __m, "
        f"row_number() OVER w AS __r FROM (SELECT *, {H} AS __h FROM ({_POSITIONS}) AS __pairs) WINDOW w AS "
        "(PARTITION BY __u)))) WHERE __c IS NULL OR __h < __c"),
    "mask join unrolled": FINAL.format(
        f"WITH __ph AS (SELECT *, {H} AS __h, (list_position(CAST($k0 AS TEXT[]), __g0) - 1) * 3 "
        f"+ list_position(CAST($k1 AS TEXT[]), __g1) - 1 AS __i FROM ({PAIRS}) AS __pairs) SELECT __ph.* FROM __ph "
        "JOIN (SELECT __lu, CASE WHEN __n > 4 THEN list_sort(list_value("
        + ", ".join(f"CASE WHEN (__m >> {i}) & 1 = 1 THEN HASH(XOR(HASH(__lu, CAST($k0 AS TEXT[])[{i // 3 + 1}], "
                    f"CAST($k1 AS TEXT[])[{i % 3 + 1}]), CAST($salt2 AS UBIGINT))) END" for i in range(12))
        + "))[5] END AS __c "
        "FROM (SELECT __u AS __lu, bit_or(1::BIGINT << __i) AS __m, count(*) AS __n FROM __ph GROUP BY __u)) AS __thr "
        "ON __ph.__u = __thr.__lu WHERE __c IS NULL OR __h < __c"),
    "mask window unrolled": FINAL.format(
        f"SELECT * FROM (SELECT *, bit_or(1::BIGINT << __i) OVER (PARTITION BY __u) AS __m, count(*) OVER "
        f"(PARTITION BY __u) AS __n FROM (SELECT *, {H} AS __h, (list_position(CAST($k0 AS TEXT[]), __g0) - 1) * 3 "
        f"+ list_position(CAST($k1 AS TEXT[]), __g1) - 1 AS __i FROM ({PAIRS}) AS __pairs)) WHERE __n <= 4 OR ("
        + " + ".join(f"CASE WHEN (__m >> {i}) & 1 = 1 AND HASH(XOR(HASH(__u, CAST($k0 AS TEXT[])[{i // 3 + 1}], "
                     f"CAST($k1 AS TEXT[])[{i % 3 + 1}]), CAST($salt2 AS UBIGINT))) <= __h THEN 1 ELSE 0 END" for i in range(12))
        + ") <= 4"),
    "mask window": FINAL.format(
        f"SELECT * FROM (SELECT *, bit_or(1::BIGINT << __i) OVER (PARTITION BY __u) AS __m, count(*) OVER "
        f"(PARTITION BY __u) AS __n FROM (SELECT *, {H} AS __h, (list_position(CAST($k0 AS TEXT[]), __g0) - 1) * 3 "
        f"+ list_position(CAST($k1 AS TEXT[]), __g1) - 1 AS __i FROM ({PAIRS}) AS __pairs)) WHERE __n <= 4 OR "
        "len(list_filter(range(12), lambda i: (__m >> i) & 1 = 1 AND HASH(XOR(HASH(__u, CAST($k0 AS TEXT[])[i // 3 + 1], "
        "CAST($k1 AS TEXT[])[i % 3 + 1]), CAST($salt2 AS UBIGINT))) <= __h)) <= 4"),
    "count window + scalar cut": FINAL.format(
        f"WITH __ph AS (SELECT *, {H} AS __h, count(*) OVER (PARTITION BY __u) AS __n FROM ({PAIRS}) AS __pairs) "
        "SELECT * FROM __ph WHERE __n <= 4 UNION ALL SELECT __ph.* FROM __ph "
        "JOIN (SELECT __u AS __lu, MIN(__h, 5)[5] AS __c FROM __ph WHERE __n > 4 GROUP BY __u) AS __thr "
        "ON __ph.__u = __thr.__lu WHERE __h < __c"),
}



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default=",".join(["dpsql", *VARIANTS]),
                        help='comma-separated; floor is always run; "dpsql": the bounded query dpsql writes now')
    args = parser.parse_args(argv)
    con = duckdb.connect(str(DATA), read_only=True)
    con.execute("SET enable_progress_bar = false")
    text, params = _dpsql(con)
    every = {"floor": (FLOOR, {}), "dpsql": (text, params)}
    every.update({k: (sql, {p: v for p, v in PARAMS.items() if "$" + p in sql}) for k, sql in VARIANTS.items()})
    chosen = {"floor": every["floor"], **{k: every[k] for k in args.variants.split(",") if k != "floor"}}
    _check(con, chosen, con.sql(text, params=params).fetchall())
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in chosen}
    load = [os.getloadavg()[0]]
    for round_ in range(args.repeat + 1):
        for name, (sql, values) in chosen.items():
            w, c = time.perf_counter(), process_cpu()
            con.sql(sql, params=values or None).fetchall()
            if round_:
                times[name].append((time.perf_counter() - w, process_cpu() - c))
        load.append(os.getloadavg()[0])
    base = [statistics.median(x[i] for x in times["floor"]) for i in (0, 1)]
    print(f"| variant (GROUP BY region, device, 10M rows; median of {args.repeat}; load {min(load):.1f}-{max(load):.1f}) "
          "| wall s | / floor | CPU s | / floor |\n|---|---:|---:|---:|---:|")
    for name, xs in times.items():
        w, c = (statistics.median(x[i] for x in xs) for i in (0, 1))
        print(f"| {name} | {w:.3f} | {w / base[0]:.2f}x | {c:.3f} | {c / base[1]:.2f}x |")
    return 0


def _dpsql(con: duckdb.DuckDBPyConnection) -> tuple[str, dict[str, object]]:
    """dpsql's own bounded query for the shape, as the pipeline binds it (salt ``SALT``)."""
    import dpsql  # noqa: PLC0415
    from dpsql.rewrite import bounded_query  # noqa: PLC0415

    with dpsql.connect(str(DATA), policy=str(ROOT / "policies" / "demo.toml"), ledger=None) as conn:
        plan = conn.plan("SELECT region, device, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region, device",
                         epsilon=0.1)
        bounded = bounded_query(plan, salt=None, list_parameters=True)
    return bounded.query.sql(dialect="duckdb").replace('"dpsql_data"."main".', ""), {**bounded.lists, "salt2": SALT}


def _check(con: duckdb.DuckDBPyConnection, chosen: dict[str, tuple[str, dict[str, object]]], answer: list[tuple[object, ...]]) -> None:
    """Every variant but "no L0 step" answers what dpsql's own bounded query answers."""
    want = sorted(answer, key=repr)
    for name, (sql, values) in chosen.items():
        if name in ("floor", "no L0 step", "dpsql"):
            continue
        got = sorted(con.sql(sql, params=values or None).fetchall(), key=repr)
        assert got == want, f"{name} answers differently from dpsql's bounded query"


if __name__ == "__main__":
    raise SystemExit(main())

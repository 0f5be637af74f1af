"""Accuracy on the 1M-row demo data, through SQL (issues 4 and 5).

- GROUP BY region COUNT(*), AVG(income) at epsilon 1: error against the exact bounded
  values (same bounding, no noise) and coverage of the reported 95% half-widths;
- GROUP BY city: how many private keys pass partition selection;
- MEDIAN(age) (delta 1e-7) and a registered trimmed mean of income, 50 runs each.

    python benchmarks/accuracy.py      # builds the demo database with `dpsql demo` first
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
import numpy as np, dpsql, duckdb
from dpsql.rewrite import bounded_query
from dpsql.demo import demo_database

db = str(demo_database(Path(__file__).parent / "data" / "demo-1m.duckdb", rows=1_000_000, units=100_000))
conn = dpsql.connect(db, policy=str(Path(__file__).parents[1] / "policies" / "demo.toml"), analyst="alice", repeats=False)
# Issue 4: grouped query accuracy at eps=1 (Laplace) vs the exact bounded values
sql = "SELECT region, COUNT(*) AS n, AVG(income) AS a FROM visits GROUP BY region"
plan = conn.plan(sql, epsilon=1.0)
exact = conn._engine.run(bounded_query(plan, salt=1).query).to_pylist()
m = {x.kind: x for x in plan.measurements}
truth = {}
for r in exact:
    n = r[m["count_rows"].name]; s = r[m["sum_centred"].name] * m["sum_centred"].lattice; c = r[m["count_values"].name] * (2 ** max(m["count_values"].shift, 0))
    truth[r["__g0"]] = (n, 125000 + s / c)
errs = {"n": [], "a": []}; cover = {"n": 0, "a": 0}; total = 0
for i in range(100):
    conn._ledger.close(); conn._ledger = dpsql.Ledger(None)  # fresh in-memory budget
    res = conn.execute(sql, epsilon=1.0)
    for (region, n, a), hn, ha in zip(res.fetchall(), res.accuracy.cells("n"), res.accuracy.cells("a")):
        tn, ta = truth[region]
        errs["n"].append(abs(n - tn)); errs["a"].append(abs(a - ta)); total += 1
        cover["n"] += abs(n - tn) <= hn; cover["a"] += abs(a - ta) <= ha
print("grouped eps=1: COUNT median abs err %.1f (95%% hw %.0f), coverage %.3f; AVG(income) median abs err %.1f, coverage %.3f" % (np.median(errs["n"]), res.accuracy["n"], cover["n"]/total, np.median(errs["a"]), cover["a"]/total))
print("truth", truth)
# private keys: city selection at eps=1, delta=1e-7
res = conn.execute("SELECT city, COUNT(*) n FROM visits GROUP BY city", epsilon=1.0, delta=1e-7)
exact_cities = duckdb.connect(db, read_only=True).sql("select count(distinct city) from visits").fetchall()[0][0]
print("city groups released", len(res), "of", exact_cities, "; threshold", conn.plan("SELECT city, COUNT(*) n FROM visits GROUP BY city", epsilon=1.0, delta=1e-7).selection.threshold)
# Issue 5: MEDIAN(age) and trimmed mean through SQL, eps = 1
true_median = duckdb.connect(db, read_only=True).sql("select median(age) from (select user_id, any_value(age) age from visits group by 1)").fetchall()[0][0]
def tm(x):
    lo, hi = np.quantile(x, [0.1, 0.9]); y = x[(x >= lo) & (x <= hi)]; return float(y.mean()) if len(y) else float("nan")
conn.register_udf("trimmed_mean", tm, bounds=(0, 250000))
vals = duckdb.connect(db, read_only=True).sql("select least(greatest(income,0),250000) from visits where income is not null and not isnan(income)").fetchnumpy()
true_tm = tm(vals[list(vals)[0]])
med_hits = tm_hits = 0; runs = 50
for i in range(runs):
    conn._ledger.close(); conn._ledger = dpsql.Ledger(None)
    (md,) = conn.execute("SELECT MEDIAN(age) FROM visits", epsilon=1.0, delta=1e-7).fetchall()[0]
    med_hits += abs(md - true_median) <= 3
    (t,) = conn.execute("SELECT trimmed_mean(income) FROM visits", epsilon=1.0).fetchall()[0]
    tm_hits += abs(t - true_tm) <= 0.05 * true_tm
print(f"MEDIAN(age) eps=1 delta=1e-7: within 3 years of {true_median} in {med_hits}/{runs}; trimmed_mean(income) eps=1: within 5% of {true_tm:.0f} (all rows, unbounded) in {tm_hits}/{runs}")
# Issue 15: per-group MEDIAN(age) with delta = 0 (sample-and-aggregate) and delta > 0 (the
# strategy with the smallest modelled error: sample-and-aggregate, PTR or smooth sensitivity)
group_truth = dict(duckdb.connect(db, read_only=True).sql(
    "select region, median(age) from (select user_id, region, any_value(least(greatest(age, 0), 100)) age "
    "from visits where age is not null group by 1, 2) group by 1").fetchall())
for delta in (0.0, 1e-7):
    errors, chosen = [], set()
    for i in range(20):
        conn._ledger.close(); conn._ledger = dpsql.Ledger(None)
        res = conn.execute("SELECT region, MEDIAN(age) AS m FROM visits GROUP BY region", epsilon=1.0, delta=delta)
        errors += [abs(m - group_truth[r]) if m is not None else 50.0 for r, m in res.fetchall()]
        chosen.add(res.privacy.columns["m"].mechanism)
    print(f"MEDIAN(age) GROUP BY region, eps=1, delta={delta:g}: mean abs error {np.mean(errors):.2f}, "
          f"median {np.median(errors):.2f}, max {max(errors):.2f} over {len(errors)} cells ({', '.join(sorted(chosen))})")

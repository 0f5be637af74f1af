"""How accurate are MEDIAN and a registered trimmed mean at epsilon = 1? (issue 5 §6)

On the demo data (1M rows, 100k users; generated once and cached under ``benchmarks/data/``)
it runs the mechanisms of :mod:`dpsql.release.udf` many times on values read with DuckDB directly
and reports how often the answer lands near the exact one:

- ``MEDIAN(age)`` within 3 years, with one value per user (age is per user; junk ages are
  clipped into the policy bounds [0, 100]) and, as a second shape, every row of a user
  capped at 10 rows per user (``rows_per_unit = 10``). Mechanisms: smooth sensitivity
  (what ``choose_strategy`` picks at delta = 1e-6), PTR with the data-independent
  proposal, and sample-and-aggregate (what it picks at delta = 0).
- a 10%-90% trimmed mean of ``income`` (per row, NULL/NaN/inf dropped) by
  sample-and-aggregate within 5% of the exact trimmed mean of the same rows, bounds
  [0, 250000], blocks in forked worker processes; once with at most 10 rows per user
  (the demo policy's ``max_rows_per_unit``, what the SQL side feeds) and once with all
  rows. A short sweep over k (half and twice the rule) shows where the rule sits.
- the cost of running blocks in forked workers rather than inline.

Every run spends epsilon = 1 in total: 0.05 on a noisy count of users (the public size
that ``choose_strategy``, ``propose_bound`` and ``choose_block_count`` need: the exact
count must not steer them) and 0.95 on the answer. delta is 1e-6 where used (the demo
policy's cap). Noise comes from the system CSPRNG.

    python benchmarks/udf_accuracy.py               # 200 runs per line, Markdown on stdout
    python benchmarks/udf_accuracy.py --runs 50
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpsql.demo import demo_database  # noqa: E402
from dpsql.noise import laplace_noise  # noqa: E402
from dpsql.release.udf import (  # noqa: E402
    QuantileSpec,
    UDFRelease,
    assign_blocks,
    choose_block_count,
    choose_strategy,
    propose_bound,
    ptr_quantile,
    sample_and_aggregate,
    smooth_quantile,
    validate_udf,
)
from dpsql.release.udf.ptr import prepare_values, quantile_value  # noqa: E402
from dpsql.release.udf.sample_and_aggregate import evaluate_blocks  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent / "data"
EPSILON, DELTA, EPSILON_COUNT = 1.0, 1e-6, 0.05
AGE_BOUNDS, INCOME_BOUNDS = (0.0, 100.0), (0.0, 250_000.0)
ROW_CAP = 10


def trimmed_mean(block: np.ndarray) -> float:
    """Mean of the values between the block's 10% and 90% quantiles."""
    lo, hi = np.quantile(block, [0.1, 0.9])
    kept = block[(block >= lo) & (block <= hi)]
    return float(kept.mean())


def load(db: Path) -> dict[str, np.ndarray]:
    with duckdb.connect(str(db), read_only=True) as con:
        per_user = con.sql("SELECT any_value(age)::DOUBLE FROM visits GROUP BY user_id").fetchnumpy()
        capped = con.sql(
            f"SELECT age::DOUBLE AS age FROM (SELECT age, row_number() OVER (PARTITION BY user_id "
            f"ORDER BY hash(rowid, 7)) AS i FROM visits) WHERE i <= {ROW_CAP}").fetchnumpy()
        income = con.sql("SELECT user_id, income FROM visits WHERE isfinite(income)").fetchnumpy()
        income_capped = con.sql(
            f"SELECT user_id, income FROM (SELECT user_id, income, row_number() OVER (PARTITION BY "
            f"user_id ORDER BY hash(rowid, 7)) AS i FROM visits WHERE isfinite(income)) "
            f"WHERE i <= {ROW_CAP}").fetchnumpy()
    return {
        "age_per_user": next(iter(per_user.values())).astype(np.float64),
        "age_capped": capped["age"].astype(np.float64),
        "income_units": income["user_id"].astype(np.int64),
        "income": income["income"].astype(np.float64),
        "income_capped_units": income_capped["user_id"].astype(np.int64),
        "income_capped": income_capped["income"].astype(np.float64),
    }


def noisy_units(n: int) -> float:
    """A noisy user count (epsilon 0.05): the public size the mechanisms may be sized by."""
    return float(n + int(laplace_noise(1, EPSILON_COUNT).sample(1)[0]))


def coverage(answers: list[UDFRelease], truth: float, tolerance: float) -> tuple[float, float, float]:
    """(% within tolerance, % refused, median absolute error of the released ones)."""
    released = np.array([a.value for a in answers if a.value is not None], dtype=np.float64)
    refused = sum(a.refused for a in answers)
    within = np.abs(released - truth) <= tolerance
    return (100 * within.sum() / len(answers), 100 * refused / len(answers),
            float(np.median(np.abs(released - truth))) if released.size else float("nan"))


def median_lines(values: np.ndarray, n_units: int, rows_per_unit: int, runs: int, label: str) -> list[str]:
    data = prepare_values(values, AGE_BOUNDS)
    truth = quantile_value(data, 0.5, AGE_BOUNDS)
    eps = EPSILON - EPSILON_COUNT
    choice = choose_strategy(QuantileSpec(0.5, AGE_BOUNDS), noisy_units(n_units), eps, DELTA,
                             rows_per_unit=rows_per_unit)
    runners: dict[str, Callable[[], UDFRelease]] = {
        "smooth sensitivity": lambda: smooth_quantile(values, 0.5, AGE_BOUNDS, eps, DELTA,
                                                      rows_per_unit=rows_per_unit),
        "PTR (proposal from noisy n)": lambda: ptr_quantile(
            values, 0.5, AGE_BOUNDS, eps, DELTA, rows_per_unit=rows_per_unit,
            proposal=propose_bound(AGE_BOUNDS, noisy_units(n_units), eps, DELTA, rows_per_unit)),
    }
    if rows_per_unit == 1:
        def sa() -> UDFRelease:
            k = choose_block_count(noisy_units(n_units), eps)
            ids = np.random.default_rng().permutation(len(values)) % k  # one row per unit
            return sample_and_aggregate(lambda b: float(np.median(b)), np.clip(values, *AGE_BOUNDS),
                                        ids, k, AGE_BOUNDS, eps)
        runners["sample-and-aggregate (delta = 0)"] = sa
    lines = []
    for name, run in runners.items():
        started = time.perf_counter()
        answers = [run() for _ in range(runs)]
        seconds = (time.perf_counter() - started) / runs
        within, refused, mae = coverage(answers, truth, 3.0)
        lines.append(f"| MEDIAN(age), {label} | {name} | {truth:g} | {within:.1f}% | {refused:.1f}% "
                     f"| {mae:.3g} | {seconds * 1000:.0f} ms |")
    lines.append(f"|  | auto choice: {choice.strategy} | | | | | |")
    return lines


def trimmed_lines(units: np.ndarray, income: np.ndarray, n_units: int, runs: int,
                  label: str) -> list[str]:
    udf = validate_udf("trimmed_mean", trimmed_mean, bounds=INCOME_BOUNDS)
    truth = trimmed_mean(income)
    eps = EPSILON - EPSILON_COUNT
    lines = []
    for factor, count in ((1.0, runs), (0.5, max(runs // 4, 10)), (2.0, max(runs // 4, 10))):
        answers, biases = [], []
        started = time.perf_counter()
        for _ in range(count):
            k = max(1, round(factor * choose_block_count(noisy_units(n_units), eps)))
            release = sample_and_aggregate(udf.fn, income, assign_blocks(units, k), k, udf.bounds, eps,
                                           time_limit=udf.time_limit)
            answers.append(release)
            biases.append(release.diagnostics["exact_mean"] - truth)
        seconds = (time.perf_counter() - started) / count
        within, _, mae = coverage(answers, truth, 0.05 * truth)
        k_shown = answers[0].parameters["blocks"]
        lines.append(f"| trimmed_mean(income), {label} | k = {factor:g} x rule (~{k_shown}) | {truth:.0f} "
                     f"| {within:.1f}% of {count} | {mae:.0f} | {np.mean(biases):+.0f} "
                     f"| {answers[0].noise_scale:.0f} | {seconds * 1000:.0f} ms |")
    return lines


def isolation_notes(units: np.ndarray, income: np.ndarray, n_units: int) -> list[str]:
    k = choose_block_count(n_units, EPSILON - EPSILON_COUNT)
    ids = assign_blocks(units, k)
    notes = []
    for fn_name, fn in (("trimmed_mean", trimmed_mean), ("mean", lambda b: float(b.mean()))):
        for isolation in ("inline", "process"):
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                outcome = evaluate_blocks(fn, income, ids, k, default=0.0, isolation=isolation)  # type: ignore[arg-type]
                best = min(best, time.perf_counter() - started)
            notes.append(f"{k} blocks of {fn_name} over {len(income)} rows, {isolation}: "
                         f"{best * 1000:.0f} ms (best of 5; failures: {outcome.failures()})")
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)
    db = demo_database(DATA_DIR / "visits_1000000x100000.duckdb", rows=1_000_000, units=100_000)
    data = load(db)
    n_units = len(data["age_per_user"])
    print(f"# UDF accuracy, epsilon = {EPSILON} (0.05 noisy count + 0.95 answer), delta = {DELTA}\n")
    print(f"{platform.platform()}, Python {platform.python_version()}, {args.runs} runs per line; "
          f"{n_units} users, {len(data['age_capped'])} capped age rows, {len(data['income'])} income rows.\n")
    print("| query | mechanism | truth | within 3 years | refused | median abs error | time/run |")
    print("|---|---|---|---|---|---|---|")
    for line in median_lines(data["age_per_user"], n_units, 1, args.runs, "one value per user"):
        print(line)
    for line in median_lines(data["age_capped"], n_units, ROW_CAP, args.runs, f"<= {ROW_CAP} rows per user"):
        print(line)
    print("\n| query | mechanism | truth | within 5% | median abs error | mean block bias "
          "| noise scale | time/run |")
    print("|---|---|---|---|---|---|---|---|")
    for line in trimmed_lines(data["income_capped_units"], data["income_capped"], n_units, args.runs,
                              f"<= {ROW_CAP} rows per user"):
        print(line)
    for line in trimmed_lines(data["income_units"], data["income"], n_units, args.runs, "all rows"):
        print(line)
    print()
    for note in isolation_notes(data["income_units"], data["income"], n_units):
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

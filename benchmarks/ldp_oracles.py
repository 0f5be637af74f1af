"""dpsql.local's frequency oracle against pure-ldp's, at equal epsilon, on the same counts.

For each epsilon in {0.5, 1, 2, 4} and domain size d in {2, 16, 256}: n clients whose
categories follow a fixed Zipf-like histogram (no randomness in the data), R runs. Error =
mean over runs and categories of (estimated count - true count)^2, shown divided by n
(the per-report variance factor, comparable with the theory column). pure-ldp 1.2.0 runs
in its own venv (``--pure-ldp-python``; it is not a dpsql dependency) through
``_pureldp_worker.py``; its best oracle per setting is compared with dpsql's automatic
choice. The relative standard error of each MSE is about sqrt(2 / (R d)).

    python benchmarks/ldp_oracles.py --pure-ldp-python /tmp/pureldp_venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dpsql.local import CategoryReports, choose_oracle

EPSILONS = (0.5, 1.0, 2.0, 4.0)
DOMAINS = (2, 16, 256)


def counts_for(d: int, n: int) -> list[int]:
    """A fixed Zipf-like histogram of n clients over d categories."""
    weights = 1 / np.arange(1, d + 1)
    counts = np.floor(weights / weights.sum() * n).astype(int)
    counts[0] += n - counts.sum()
    return counts.tolist()


def runs_for(d: int) -> int:
    """Enough runs that R d >= 512 (MSE relative standard error <= 6%), within reason."""
    return max(4, min(256, 512 // d))


def ours(epsilon: float, counts: list[int], runs: int) -> tuple[str, list[list[float]]]:
    d = len(counts)
    oracle = choose_oracle(d, epsilon)
    values = np.repeat(np.arange(d), counts)
    estimates = []
    for _ in range(runs):
        reports: CategoryReports = oracle.perturb(values)
        estimates.append(reports.estimate().counts.tolist())
    return oracle.kind.upper(), estimates


def theirs(python: str, epsilon: float, counts: list[int], runs: int) -> dict[str, list[list[float]]]:
    job = json.dumps({"epsilon": epsilon, "d": len(counts), "counts": counts, "runs": runs, "seed": 7})
    worker = Path(__file__).with_name("_pureldp_worker.py")
    done = subprocess.run([python, str(worker)], input=job, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def mse_per_report(estimates: list[list[float]], counts: list[int]) -> float:
    errors = np.asarray(estimates) - np.asarray(counts)[None, :]
    return float(np.mean(errors**2)) / sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pure-ldp-python", default="/tmp/pureldp_venv/bin/python")
    parser.add_argument("--n", type=int, default=2000, help="clients per run")
    args = parser.parse_args()
    print("| eps | d | dpsql oracle | dpsql MSE/n | theory | best pure-ldp | its MSE/n | dpsql / best | all pure-ldp (MSE/n) | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for epsilon in EPSILONS:
        for d in DOMAINS:
            counts, runs = counts_for(d, args.n), runs_for(d)
            started = time.perf_counter()
            name, mine = ours(epsilon, counts, runs)
            ours_mse = mse_per_report(mine, counts)
            oracle = choose_oracle(d, epsilon)
            theory = float(np.mean(oracle.variance(args.n, np.asarray(counts)))) / args.n
            other = {k: mse_per_report(v, counts) for k, v in theirs(args.pure_ldp_python, epsilon, counts, runs).items()}
            best = min(other, key=other.__getitem__)
            listing = ", ".join(f"{k} {v:.3g}" for k, v in sorted(other.items(), key=lambda kv: kv[1]))
            print(f"| {epsilon:g} | {d} | {name} | {ours_mse:.4g} | {theory:.4g} | {best} | {other[best]:.4g} | "
                  f"{ours_mse / other[best]:.2f} | {listing} | {runs} |", flush=True)
            print(f"  ({time.perf_counter() - started:.1f} s; MSE relative s.e. ~{math.sqrt(2 / (runs * d)):.0%})",
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

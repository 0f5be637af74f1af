"""How many runs does ``dpsql audit`` need to catch an epsilon twice the claim?

Simulates the audit's estimator (:func:`dpsql.audit.stats.lower_bound`, the same code the
audit runs) on the answers of a COUNT with sensitivity 10 (the demo's row cap) under discrete
Laplace noise whose true epsilon is ``ratio`` times the claim, D' shifted by the
sensitivity. For each claimed epsilon and number of runs (on each database), it reports how
often the lower bound exceeds the claim (the power), over ``--trials`` simulated audits. With
``--ratio 1`` it measures the false-alarm rate instead (it must stay under 1 - confidence).

This is the best case for the audit: one output cell, the unit moving it by the full
sensitivity. A grouped query splits epsilon over its aggregates and groups, so a single
cell's share is smaller and more runs are needed (or use ``--query`` with one aggregate).

    python benchmarks/audit_power.py                  # the table in docs/audit.md
    python benchmarks/audit_power.py --ratio 1        # false alarms of a correct mechanism
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpsql.audit.stats import lower_bound  # noqa: E402
from dpsql.noise import SeededRandom, sample_discrete_laplace  # noqa: E402

SENSITIVITY = 10
RUNS = (100, 200, 500, 1000, 2000, 5000, 10000)


def detection_rate(claim: float, ratio: float, runs: int, trials: int, confidence: float, seed: int) -> float:
    """Fraction of simulated audits whose lower bound exceeds ``claim``."""
    source = SeededRandom(seed)  # simulated answers, not a release: a seed is fine here
    t, s = round(SENSITIVITY * 1000 / (claim * ratio)), 1000  # scale = sensitivity / true epsilon
    hits = 0
    for _ in range(trials):
        d = sample_discrete_laplace(source, t, s, runs)
        n = sample_discrete_laplace(source, t, s, runs) + SENSITIVITY
        bound = lower_bound([{(0, "n"): float(v)} for v in d], [{(0, "n"): float(v)} for v in n],
                            confidence=confidence)
        hits += bound.value > claim
    return hits / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    parser.add_argument("--ratio", type=float, default=2.0, help="true epsilon / claimed (default 2)")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args()
    print(f"power: P[lower bound > claim] when the true epsilon is {args.ratio:g}x the claim; "
          f"{args.trials} simulated audits per cell, confidence {args.confidence:g}\n")
    print("| claimed epsilon | " + " | ".join(f"{r:,} runs" for r in RUNS) + " |")
    print("|---:|" + "---:|" * len(RUNS))
    for i, claim in enumerate(args.claims):
        cells = []
        done = False
        for j, runs in enumerate(RUNS):
            if done:
                cells.append("")
                continue
            rate = detection_rate(claim, args.ratio, runs, args.trials, args.confidence, seed=1000 * i + j)
            cells.append(f"{rate:.2f}")
            print(f"  claim {claim:g}, {runs} runs: {rate:.2f}", file=sys.stderr, flush=True)
            done = args.ratio > 1 and rate >= 0.99
        print(f"| {claim:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

"""How many queries does one budget answer, under basic composition and under PLDs?

Each query shape is a :class:`dpsql.privacy.Charge` built exactly as the pipeline builds
it (``dpsql.analyze.calibrate.calibrate`` then ``dpsql.privacy.events.describe``), charged against an
in-memory :class:`dpsql.privacy.Ledger` until the ledger refuses. Shapes:

- ``gaussian count``: ``SELECT COUNT(*)`` at (0.1, 1e-8): one Gaussian measurement;
- ``laplace count``: ``SELECT COUNT(*)`` at epsilon 0.1, delta 0: one Laplace measurement;
- ``gaussian 3-measurement``: a query with three Gaussian measurements at (0.2, 1e-8)
  (say COUNT, SUM and AVG of one group);
- ``mixed``: the laplace count, the gaussian count and the 3-measurement query in turn.

For the Gaussian shapes the exact limit is also shown: the most k for which
``sqrt(k) mu``-GDP is (epsilon, delta)-DP (Gaussian-DP composes exactly); no sound
accountant can grant more.

It then times 1000 charges on one ledger (wall clock and CPU), per accountant and workload:
each charge composes everything the analyst spent before. The pld budgets are ones the
1000 charges fit in (basic gets a budget it cannot exhaust, since it would refuse sooner).

    python benchmarks/bench_accounting.py            # Markdown tables on stdout
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpsql.privacy import Charge, Ledger  # noqa: E402
from dpsql.analyze.calibrate import MeasurementSpec, calibrate  # noqa: E402
from dpsql.errors import BudgetExceeded  # noqa: E402
from dpsql.noise import gdp_delta  # noqa: E402
from dpsql.privacy.events import describe  # noqa: E402


@dataclass(frozen=True)
class Budget:
    epsilon: float
    delta: float


def query_charge(epsilon: float, delta: float, measurements: int = 1) -> Charge:
    """A charge as the pipeline makes it for a query with ``measurements`` counts."""
    specs = [MeasurementSpec(f"__m{i}", "count_rows") for i in range(measurements)]
    planned = calibrate(specs, epsilon=epsilon, delta=delta, l0=1, max_rows=1)
    return Charge(epsilon, delta, "SELECT ...", tuple(describe(m) for m in planned))


GAUSSIAN = query_charge(0.1, 1e-8)
LAPLACE = query_charge(0.1, 0.0)
GAUSSIAN3 = query_charge(0.2, 1e-8, 3)

#: (name, shapes charged in turn, budget)
SCENARIOS = [
    ("gaussian count (0.1, 1e-8)", [GAUSSIAN], Budget(3.0, 1e-6)),
    ("laplace count eps=0.1", [LAPLACE], Budget(3.0, 0.0)),
    ("laplace count eps=0.1", [LAPLACE], Budget(3.0, 1e-6)),
    ("gaussian 3-measurement (0.2, 1e-8)", [GAUSSIAN3], Budget(3.0, 1e-6)),
    ("mixed: laplace 0.1, gaussian (0.1, 1e-8), 3-meas. (0.2, 1e-8)",
     [LAPLACE, GAUSSIAN, GAUSSIAN3], Budget(3.0, 1e-6)),
    ("gaussian count (0.5, 1e-7)", [query_charge(0.5, 1e-7)], Budget(10.0, 1e-5)),
]


def granted(accountant: str, shapes: list[Charge], budget: Budget, limit: int = 100_000) -> int:
    """Charge ``shapes`` in turn until the ledger refuses; return how many it granted."""
    with Ledger(accountant=accountant) as ledger:
        for n in range(limit):
            try:
                ledger.charge("alice", budget, shapes[n % len(shapes)])
            except BudgetExceeded:
                return n
    raise RuntimeError(f"more than {limit} charges granted")


def exact_gdp_limit(shapes: list[Charge], budget: Budget) -> int | None:
    """The exact Gaussian-DP limit, if every shape is Gaussian with one query mu."""
    mus = []
    for shape in shapes:
        if any(m["mechanism"] != "gaussian" for m in shape.mechanisms):
            return None
        mus.append(math.sqrt(sum(m["mu"] ** 2 for m in shape.mechanisms)))
    if len(set(mus)) != 1 or budget.delta == 0:
        return None
    k = 0
    while gdp_delta(math.sqrt(k + 1) * mus[0], budget.epsilon) <= budget.delta:
        k += 1
    return k


def time_charges(accountant: str, shapes: list[Charge], n: int, budget: Budget) -> tuple[float, float]:
    """Wall and CPU seconds for ``n`` charges on one ledger (all must be granted)."""
    with Ledger(accountant=accountant) as ledger:
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            ledger.charge("alice", budget, shapes[i % len(shapes)])
        return time.perf_counter() - wall, time.process_time() - cpu


#: Timed workloads: (name, shapes in turn, a budget that 1000 of them fit under pld).
#: A PLD's cost per charge grows with the spread of the composed privacy loss (cells of
#: 1e-4), not with the number of events; the spread is bounded by what the budget allows.
TIMED = [
    ("gaussian count (0.1, 1e-8)", [GAUSSIAN], Budget(10.0, 1e-5)),
    ("laplace count eps=0.01", [query_charge(0.01, 0.0)], Budget(10.0, 1e-5)),
    ("mixed: laplace 0.01, gaussian (0.1, 1e-8), 3-meas. (0.2, 1e-8)",
     [query_charge(0.01, 0.0), GAUSSIAN, GAUSSIAN3], Budget(10.0, 1e-5)),
    ("laplace count eps=0.1 (1000 of them compose to eps 17.8 at 1e-5)", [LAPLACE], Budget(30.0, 1e-5)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--charges", type=int, default=1000, help="charges to time (default 1000)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}, {platform.system()}\n")
    print("| query shape | budget (eps, delta) | basic | pld | exact GDP limit |")
    print("|---|---|---:|---:|---:|")
    for name, shapes, budget in SCENARIOS:
        basic, pld = granted("basic", shapes, budget), granted("pld", shapes, budget)
        exact = exact_gdp_limit(shapes, budget)
        print(f"| {name} | ({budget.epsilon:g}, {budget.delta:g}) | {basic} | {pld} | "
              f"{exact if exact is not None else '-'} |", flush=True)
    print(f"\n| workload ({args.charges} charges, one ledger) | budget | accountant | wall s | CPU s "
          "| CPU ms per charge |")
    print("|---|---|---|---:|---:|---:|")
    for name, shapes, budget in TIMED:
        for accountant in ("basic", "pld"):
            fits = Budget(1e6, 0.5) if accountant == "basic" else budget  # basic would refuse
            wall, cpu = time_charges(accountant, shapes, args.charges, fits)
            print(f"| {name} | ({fits.epsilon:g}, {fits.delta:g}) | {accountant} | {wall:.2f} | "
                  f"{cpu:.2f} | {1000 * cpu / args.charges:.2f} |", flush=True)


if __name__ == "__main__":
    main()

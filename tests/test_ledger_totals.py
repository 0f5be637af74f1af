"""The ledger's running totals (issue 16): a charge no longer re-sums every stored charge, so
what it keeps must equal, charge after charge, what composing everything stored again gives."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpsql.errors import BudgetExceeded
from dpsql.privacy import BasicAccountant, Charge, Ledger, gaussian_mu
from dpsql.privacy.charges import budget_units, charge_units, units_to_delta, units_to_epsilon
from dpsql.privacy.events import GaussianEvent, LaplaceEvent


@dataclass(frozen=True)
class Budget:
    epsilon: float
    delta: float


def _charge(rng: random.Random, gaussian_only: bool) -> Charge:
    kind = rng.random()
    if gaussian_only or kind < 0.5:
        mus = tuple(GaussianEvent(mu=rng.uniform(0.01, 0.7), description={"mechanism": "gaussian"})
                    for _ in range(rng.randint(1, 4)))
        return Charge(rng.choice([0.1, 0.3, 0.07]), rng.choice([0.0, 1e-9, 3e-10]), "q", mus)
    if kind < 0.9:
        return Charge(rng.choice([0.1, 0.25, 0.001]), 0.0, "q",
                      (LaplaceEvent(epsilon=0.1, description={"mechanism": "laplace"}),))
    return Charge(0.0, 0.0, "q")  # costs nothing, describes nothing


def _recomposed(path: Path, analyst: str) -> tuple[float, float, int, float | None]:
    """Spent epsilon, delta, queries and mu from a fresh ledger's events, composed again."""
    with Ledger(path) as fresh:
        charges = [Charge(r.epsilon, r.delta, r.query, r.events) for r in fresh.events(analyst)]
    units = BasicAccountant().compose_units([charge_units(c) for c in charges])
    return units_to_epsilon(units[0]), units_to_delta(units[1]), len(charges), gaussian_mu(charges)


@pytest.mark.parametrize("gaussian_only", [False, True])
def test_running_totals_equal_composing_again(tmp_path: Path, gaussian_only: bool) -> None:
    """Two ledgers on one file take turns (each reads the other's rows incrementally); after
    every charge both statuses equal a fresh composition of everything stored, mu exactly."""
    path = tmp_path / "ledger.sqlite"
    rng = random.Random(16)
    budget = Budget(1e6, 0.5)
    ledgers = [Ledger(path), Ledger(path)]
    try:
        for i in range(120):
            status = ledgers[i % 2].charge("alice", budget, _charge(rng, gaussian_only))
            expected = _recomposed(path, "alice")
            for got in (status, ledgers[(i + 1) % 2].status("alice", budget)):
                assert (got.epsilon_spent, got.delta_spent, got.queries, got.mu) == expected
            if gaussian_only:
                assert status.mu is not None
    finally:
        for ledger in ledgers:
            ledger.close()


def test_refusal_reports_the_running_total(tmp_path: Path) -> None:
    """At the budget's edge the running sums decide exactly as composing again would: the
    charge that fits is granted, the next refused with the remaining amount, nothing written."""
    path = tmp_path / "ledger.sqlite"
    budget = Budget(1.0, 0.0)
    with Ledger(path) as ledger, Ledger(path) as other:
        for i in range(10):  # ten charges of 0.1 spend 1.0 exactly (decimal units)
            (ledger if i % 2 else other).charge("bob", budget, Charge(0.1, 0.0, "q"))
        assert budget_units(budget)[0] == sum(charge_units(Charge(0.1, 0.0, "q"))[0] for _ in range(10))
        with pytest.raises(BudgetExceeded) as refused:
            ledger.charge("bob", budget, Charge(1e-12, 0.0, "q"))
        assert refused.value.remaining == (0.0, 0.0)
        assert ledger.status("bob", budget).queries == other.status("bob", budget).queries == 10

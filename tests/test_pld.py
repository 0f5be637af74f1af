"""Tests for dpsql.privacy.pld: the queries-per-budget figure, soundness against exact formulas,
the fallback for unknown mechanisms, speed, trade-off curves and ``dpsql budget --plot``."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

import dpsql
from dpsql.analyze.calibrate import MeasurementSpec, calibrate
from dpsql.cli import main
from dpsql.errors import BudgetExceeded, Error
from dpsql.noise import gdp_delta, gdp_mu
from dpsql.privacy import BasicAccountant, Charge, Ledger
from dpsql.privacy.events import describe
from dpsql.privacy.pld import (
    PLDAccountant,
    PrivacyEvent,
    epsilon_for_delta,
    gdp_epsilon,
    privacy_events,
    rr_epsilon,
)
from dpsql.privacy.tradeoff import (
    spent_tradeoff,
    tradeoff_eps_delta,
    tradeoff_gdp,
    tradeoff_pld,
)

ROOT = Path(__file__).resolve().parents[1]
DEMO_POLICY = ROOT / "policies" / "demo.toml"


@dataclass(frozen=True)
class Budget:
    epsilon: float
    delta: float


def query_charge(epsilon: float, delta: float, measurements: int = 1) -> Charge:
    """A charge exactly as the pipeline makes it: calibrate, then dpsql.privacy.events.describe()."""
    specs = [MeasurementSpec(f"__m{i}", "count_rows") for i in range(measurements)]
    planned = calibrate(specs, epsilon=epsilon, delta=delta, l0=1, max_rows=1)
    return Charge(epsilon, delta, "SELECT COUNT(*) FROM t", tuple(describe(m) for m in planned))


def grant_all(ledger: Ledger, budget: Budget, charges: list[Charge], limit: int = 5000) -> int:
    """Charge ``charges`` round-robin until the ledger refuses; return how many it granted."""
    for granted in range(limit):
        try:
            ledger.charge("alice", budget, charges[granted % len(charges)])
        except BudgetExceeded:
            return granted
    raise AssertionError(f"more than {limit} charges granted")


def largest_gdp_count(mu: float, budget: Budget) -> int:
    """The most k for which sqrt(k) mu-GDP is (budget.epsilon, budget.delta)-DP, exactly."""
    k = 1
    while gdp_delta(math.sqrt(k + 1) * mu, budget.epsilon) <= budget.delta:
        k += 1
    return k


def rr_composed_delta(epsilon: float, k: int, target: float) -> float:
    """Exact delta(target) of k composed randomized-response(epsilon) pairs (loss +-epsilon).

    Under the upper distribution the number i of -epsilon losses is Binomial(k, 1/(1+e^eps));
    delta(E) = sum over losses L > E of P(L) (1 - e^(E - L))."""
    q = 1 / (1 + math.exp(epsilon))
    total = 0.0
    for i in range(k + 1):
        loss = epsilon * (k - 2 * i)
        if loss > target:
            log_p = (math.lgamma(k + 1) - math.lgamma(i + 1) - math.lgamma(k - i + 1)
                     + i * math.log(q) + (k - i) * math.log1p(-q))
            total += math.exp(log_p) * -math.expm1(target - loss)
    return total


# ---------------------------------------------------------------------------------------
# The figure: Gaussian COUNTs of (0.1, 1e-8) inside a budget of (3, 1e-6)
# ---------------------------------------------------------------------------------------

FIGURE_BUDGET = Budget(3.0, 1e-6)


def test_a_count_query_is_one_gaussian_measurement_of_the_queries_mu() -> None:
    charge = query_charge(0.1, 1e-8)
    (measurement,) = charge.mechanisms
    assert measurement["mechanism"] == "gaussian"
    assert measurement["mu"] == gdp_mu(0.1, 1e-8)
    assert privacy_events(charge) == (PrivacyEvent("gaussian", mu=gdp_mu(0.1, 1e-8)),)


def test_pld_grants_at_least_700_gaussian_counts_where_basic_grants_30(tmp_path: Path) -> None:
    charge = query_charge(0.1, 1e-8)
    with Ledger(accountant=BasicAccountant()) as ledger:
        assert grant_all(ledger, FIGURE_BUDGET, [charge]) == 30
    path = tmp_path / "ledger.sqlite"
    with Ledger(path, accountant=PLDAccountant()) as ledger:
        granted = grant_all(ledger, FIGURE_BUDGET, [charge])
        status = ledger.status("alice", FIGURE_BUDGET)
        events = ledger.events("alice")
    exact = largest_gdp_count(gdp_mu(0.1, 1e-8), FIGURE_BUDGET)
    assert exact == 885
    assert 700 <= granted <= exact          # never more than the exact GDP composition allows
    assert granted >= exact - 1
    assert status.queries == granted and status.accountant == "pld"
    assert status.epsilon_spent <= 3.0 and status.delta_spent == 1e-6
    assert status.mu == pytest.approx(math.sqrt(granted) * gdp_mu(0.1, 1e-8), rel=1e-12)
    # The ledger still records what each query was charged.
    assert {(e.epsilon, e.delta) for e in events} == {(0.1, 1e-8)}
    # A fresh accountant composing the stored file from scratch agrees.
    with Ledger(path, accountant="pld") as reopened:
        assert reopened.status("alice", FIGURE_BUDGET) == status


def test_pld_is_never_worse_than_basic_and_helps_laplace_only_when_delta_is_allowed() -> None:
    laplace = query_charge(0.1, 0.0)
    assert laplace.mechanisms[0]["mechanism"] == "laplace"
    with Ledger(accountant="pld") as ledger:
        assert grant_all(ledger, Budget(3.0, 0.0), [laplace]) == 30
    with Ledger(accountant="pld") as ledger:
        granted = grant_all(ledger, Budget(3.0, 1e-6), [laplace])
    # Exact optimal composition of 0.1-DP events (randomized response) at delta 1e-6.
    exact = max(k for k in range(1, 100) if rr_composed_delta(0.1, k, 3.0) <= 1e-6)
    assert granted == exact == 46


@pytest.mark.parametrize("epsilon, k", [(0.1, 1), (0.1, 46), (0.0333, 300), (1.0, 5)])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_repeated_laplace_events_compose_exactly(epsilon: float, k: int, delta: float) -> None:
    answer = rr_epsilon(PrivacyEvent("laplace", epsilon=epsilon), k, delta)
    assert rr_composed_delta(epsilon, k, answer) <= delta
    assert answer <= k * epsilon + 1e-9
    assert answer == 0 or rr_composed_delta(epsilon, k, answer * (1 - 1e-6) - 1e-9) > delta
    discretized = PLDAccountant().distribution({PrivacyEvent("laplace", epsilon=epsilon): k})
    assert answer <= epsilon_for_delta(discretized, delta) + 1e-9


def test_repeated_generic_events_compose_exactly() -> None:
    event = PrivacyEvent("dp", epsilon=0.2, delta=1e-8)
    assert rr_epsilon(event, 46, 1e-9) == math.inf           # 46e-8 of it is never private
    answer = rr_epsilon(event, 46, 1e-6)
    discretized = epsilon_for_delta(PLDAccountant().distribution({event: 46}), 1e-6)
    assert discretized - 1e-6 <= answer <= discretized + 1e-9


def test_mixed_laplace_and_gaussian_queries_beat_basic() -> None:
    mixed = [query_charge(0.1, 0.0), query_charge(0.1, 1e-8), query_charge(0.2, 1e-8, 3)]
    with Ledger(accountant=BasicAccountant()) as ledger:
        basic = grant_all(ledger, FIGURE_BUDGET, mixed)
    with Ledger(accountant=PLDAccountant()) as ledger:
        tight = grant_all(ledger, FIGURE_BUDGET, mixed)
    assert basic == 23 and tight >= 100     # 108 measured


# ---------------------------------------------------------------------------------------
# Soundness: never below the exact composition, and close to it
# ---------------------------------------------------------------------------------------


def test_a_single_laplace_query_costs_its_epsilon_at_delta_zero() -> None:
    accountant = PLDAccountant()
    pld = accountant.distribution({PrivacyEvent("laplace", epsilon=0.3): 1})
    assert 0.3 <= epsilon_for_delta(pld, 0.0) <= 0.3 + 1e-4
    assert accountant.compose([query_charge(0.3, 0.0)], target_delta=0.0) == (0.3, 0.0)


@pytest.mark.attack
@pytest.mark.parametrize("k", [1, 7, 100, 885])
def test_composed_gaussian_pld_matches_gdp_and_is_never_optimistic(k: int) -> None:
    mu = gdp_mu(0.1, 1e-8)
    pld = PLDAccountant().distribution({PrivacyEvent("gaussian", mu=mu): k})
    exact_mu = math.sqrt(k) * mu
    for epsilon in (0.0, 0.05, 0.5, 1.0, 2.0, 3.0):
        exact = gdp_delta(exact_mu, epsilon)
        delta = float(pld.get_delta_for_epsilon(epsilon))
        assert delta >= exact * (1 - 1e-6)
        assert delta <= exact + 1e-4 * max(exact, 1e-9) + 1e-12
    for delta in (1e-9, 1e-6, 1e-3):
        exact = gdp_epsilon(exact_mu, delta)
        assert exact * (1 - 1e-6) <= epsilon_for_delta(pld, delta) <= exact + 1e-3


def test_the_gaussian_closed_form_is_tight_and_on_the_safe_side() -> None:
    for mu in (0.02, 0.3, 1.0, 4.0):
        for delta in (1e-10, 1e-6, 1e-2):
            epsilon = gdp_epsilon(mu, delta)
            assert gdp_delta(mu, epsilon) <= delta
            assert epsilon == 0 or gdp_delta(mu, epsilon * (1 - 1e-8)) > delta * (1 - 1e-8)
    assert gdp_epsilon(1.0, 0.0) == math.inf and gdp_epsilon(1.0, 1.0) == 0.0


def test_gaussian_only_compose_uses_the_exact_gdp_of_every_measurement() -> None:
    charges = [query_charge(0.5, 1e-7, 4), query_charge(0.2, 1e-8)]
    mu = math.sqrt(gdp_mu(0.5, 1e-7) ** 2 + gdp_mu(0.2, 1e-8) ** 2)
    epsilon, delta = PLDAccountant().compose(charges, target_delta=1e-6)
    assert delta == 1e-6 and epsilon == gdp_epsilon(mu, 1e-6)


@pytest.mark.attack
@pytest.mark.parametrize("k", [10, 47])
def test_composed_laplace_pld_is_never_below_the_exact_randomized_response(k: int) -> None:
    pld = PLDAccountant().distribution({PrivacyEvent("laplace", epsilon=0.1): k})
    for epsilon in (0.3, 1.0, 2.0, 3.0):
        exact = rr_composed_delta(0.1, k, epsilon)
        delta = float(pld.get_delta_for_epsilon(epsilon))
        assert exact * (1 - 1e-6) <= delta <= exact * 1.01 + 1e-12


def test_incremental_composition_agrees_with_composing_from_scratch() -> None:
    shapes = [query_charge(0.1, 0.0), query_charge(0.1, 1e-8), query_charge(0.05, 0.0)]
    events = [shapes[i % 3] for i in range(120)]
    incremental = PLDAccountant()
    for n in range(1, len(events) + 1):
        stepwise = incremental.compose(events[:n], target_delta=1e-6)
    scratch = PLDAccountant().compose(events, target_delta=1e-6)
    assert stepwise[0] == pytest.approx(scratch[0], rel=1e-6)


def test_vectorized_epsilon_for_delta_agrees_with_dp_accounting() -> None:
    plds = [
        pld_lib.from_gaussian_mechanism(1 / 0.02).self_compose(300),
        pld_lib.from_discrete_laplace_mechanism(0.1).self_compose(40),
        pld_lib.from_discrete_laplace_mechanism(0.5),
        pld_lib.from_gaussian_mechanism(2.0).compose(pld_lib.from_discrete_laplace_mechanism(0.2)),
    ]
    for pld in plds:
        for delta in (0.0, 1e-12, 1e-6, 1e-3, 0.5):
            expected = pld.get_epsilon_for_delta(delta)
            got = epsilon_for_delta(pld, delta)
            assert got == expected or 0 <= got - expected <= 1e-9 * max(1.0, expected)


# ---------------------------------------------------------------------------------------
# Mechanisms the PLD accountant does not know
# ---------------------------------------------------------------------------------------


def test_unknown_mechanisms_fall_back_to_the_charges_own_amounts() -> None:
    threshold = {"mechanism": "threshold", "epsilon": 0.5, "delta": 1e-6}
    charge = Charge(0.5, 1e-6, "SELECT region FROM t GROUP BY region", (threshold,))
    assert privacy_events(charge) == (PrivacyEvent("dp", epsilon=0.5, delta=1e-6),)
    # One unknown measurement makes the whole charge generic, Gaussian parts included.
    gaussian = query_charge(0.5, 1e-6).mechanisms[0]
    mixed = Charge(1.0, 2e-6, "q", (gaussian, threshold))
    assert privacy_events(mixed) == (PrivacyEvent("dp", epsilon=1.0, delta=2e-6),)
    assert privacy_events(Charge(0.5, 0.0, "q")) == (PrivacyEvent("dp", epsilon=0.5),)
    assert privacy_events(Charge(0.0, 0.0, "q")) == ()
    malformed = Charge(0.5, 0.0, "q", ({"mechanism": "laplace", "epsilon": "big"},))
    assert privacy_events(malformed) == (PrivacyEvent("dp", epsilon=0.5),)
    with Ledger(accountant="pld") as ledger:
        assert grant_all(ledger, Budget(1.0, 1e-6), [charge]) == 1   # deltas add up
    with Ledger(accountant="pld") as ledger:
        assert grant_all(ledger, Budget(1.0, 2e-6), [charge]) == 2


# ---------------------------------------------------------------------------------------
# 1000 charges on one ledger (their speed is measured in benchmarks/bench_accounting.py,
# not asserted here: a timed unit test fails on a loaded machine and proves nothing)
# ---------------------------------------------------------------------------------------


def test_a_thousand_mixed_charges_compose_below_basic_composition() -> None:
    shapes = [query_charge(0.1, 1e-8), query_charge(0.01, 0.0), query_charge(0.2, 1e-8, 3)]
    with Ledger(accountant="pld") as ledger:
        for i in range(1000):
            status = ledger.charge("alice", Budget(1000.0, 1e-3), shapes[i % 3])
    basic = sum(shapes[i % 3].epsilon for i in range(1000))
    assert status.queries == 1000
    # PLD composition of 1000 mostly-Gaussian charges is far below their epsilon sum
    # (basic composition: about 103.6), and above the largest single charge.
    assert 0.2 < status.epsilon_spent < basic / 2, (status.epsilon_spent, basic)
    assert status.delta_spent <= 1e-3


# ---------------------------------------------------------------------------------------
# Trade-off curves
# ---------------------------------------------------------------------------------------

ALPHA = np.linspace(0, 1, 201)


def test_tradeoff_curves_of_gdp_and_eps_delta() -> None:
    assert tradeoff_gdp(0.0, ALPHA) == pytest.approx(1 - ALPHA)
    assert tradeoff_gdp(1.0, [0.5])[0] == pytest.approx(0.158655, abs=1e-6)
    curve = tradeoff_eps_delta(1.0, 0.01, ALPHA)
    assert curve[0] == pytest.approx(0.99) and curve[-1] == 0.0
    assert np.all(np.diff(curve) <= 1e-15)      # non-increasing
    # Symmetric: f(f(alpha)) = alpha on the curve's support.
    assert tradeoff_eps_delta(1.0, 0.0, tradeoff_eps_delta(1.0, 0.0, [0.2]))[0] == pytest.approx(0.2)


def test_pld_tradeoff_is_close_to_gdp_and_never_above_it() -> None:
    mu = 0.6
    pld = pld_lib.from_gaussian_mechanism(1 / mu)
    exact = tradeoff_gdp(mu, ALPHA)
    curve = tradeoff_pld(pld, ALPHA)
    assert np.all(curve <= exact + 1e-9)         # pessimistic: a lower curve is less private
    assert np.max(exact - curve) < 0.01


def test_what_the_figure_spent_lies_above_the_budget_curve() -> None:
    charges = [query_charge(0.1, 1e-8)] * 880
    spent, label = spent_tradeoff(charges, ALPHA)
    assert label.startswith("spent: 0.6") and label.endswith("-GDP")
    assert np.all(spent >= tradeoff_eps_delta(3.0, 1e-6, ALPHA) - 1e-9)
    mixed, label = spent_tradeoff([query_charge(0.1, 0.0)] * 40, ALPHA)
    assert "PLD" in label and np.all(mixed >= tradeoff_eps_delta(4.0, 0.0, ALPHA) - 1e-9)


# ---------------------------------------------------------------------------------------
# The connection and the command line
# ---------------------------------------------------------------------------------------


def pld_policy(tmp_path: Path) -> Path:
    text = DEMO_POLICY.read_text(encoding="utf-8")
    assert 'accountant = "basic"' in text
    path = tmp_path / "pld.toml"
    path.write_text(text.replace('accountant = "basic"', 'accountant = "pld"'), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo_db(demo_database: Callable[[int, int], Path]) -> Path:
    return demo_database(2_000, 200)  # built once for the run (conftest)


def test_connect_uses_the_accountant_the_policy_names(demo_db: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    with dpsql.connect(demo_db, pld_policy(tmp_path), "alice", ledger) as conn:
        assert conn.budget().accountant == "pld"
        for age in (30, 40, 50):  # different queries: a repeat would be free
            conn.execute(f"SELECT COUNT(*) AS n FROM visits WHERE age > {age}", epsilon=1.0, delta=1e-6)
        status = conn.budget()
    assert status.queries == 3 and status.mu == pytest.approx(math.sqrt(3) * gdp_mu(1.0, 1e-6))
    assert status.epsilon_spent < 3.0 and status.delta_spent == 1e-5
    with dpsql.connect(demo_db, DEMO_POLICY, "alice", tmp_path / "basic.sqlite") as conn:
        assert conn.budget().accountant == "basic"


def charged_ledger(path: Path, charges: list[Charge]) -> Path:
    with Ledger(path, accountant="pld") as ledger:
        for charge in charges:
            ledger.charge("alice", Budget(10.0, 1e-5), charge)
    return path


def budget_command(policy: Path, ledger: Path, *extra: str) -> int:
    return main(["budget", "--policy", str(policy), "--ledger", str(ledger), "--analyst", "alice", *extra])


def test_budget_command_shows_accountant_mu_and_draws_the_plot(tmp_path: Path,
                                                              capsys: Any) -> None:
    ledger = charged_ledger(tmp_path / "ledger.sqlite", [query_charge(0.1, 1e-8)] * 200)
    png = tmp_path / "spent.png"
    assert budget_command(pld_policy(tmp_path), ledger, "--plot", str(png)) == 0
    out = capsys.readouterr().out
    assert "queries: 200" in out and "accountant: pld (epsilon at the budget's delta)" in out
    assert f"Gaussian-DP: mu={math.sqrt(200) * gdp_mu(0.1, 1e-8):.4g}" in out
    assert f"picture: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_budget_plot_of_laplace_spending_and_of_nothing(tmp_path: Path, capsys: Any) -> None:
    ledger = charged_ledger(tmp_path / "ledger.sqlite", [query_charge(0.1, 0.0)] * 20)
    assert budget_command(DEMO_POLICY, ledger, "--plot", str(tmp_path / "laplace.png")) == 0
    assert "accountant: basic\n" in capsys.readouterr().out
    assert budget_command(DEMO_POLICY, tmp_path / "none.sqlite", "--plot", str(tmp_path / "none.png")) == 0
    assert (tmp_path / "laplace.png").exists() and (tmp_path / "none.png").exists()


def test_budget_plot_without_matplotlib_is_a_clear_error(tmp_path: Path, capsys: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib fails
    ledger = charged_ledger(tmp_path / "ledger.sqlite", [query_charge(0.1, 1e-8)])
    assert budget_command(DEMO_POLICY, ledger, "--plot", str(tmp_path / "x.png")) == 1
    assert "pip install 'dpsql[plot]'" in capsys.readouterr().err
    from dpsql.privacy.tradeoff import plot_tradeoff

    with Ledger(ledger) as book:
        status = book.status("alice", Budget(10.0, 1e-5))
    with pytest.raises(Error, match=r"Plotting needs matplotlib.*pip install 'dpsql\[plot\]'"):
        plot_tradeoff(tmp_path / "y.png", status, [])

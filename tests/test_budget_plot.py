"""Budget pictures (issue 20): one analyst's three panels, the owner's overview, and a
trade-off panel whose axes show a budget of epsilon 10."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql
from dpsql.budget_plot import analyst_figure, owner_figure, spending
from dpsql.cli import main

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory, demo_database: Callable[[int, int], Path]) -> Path:
    where = tmp_path_factory.mktemp("budget_plot")
    db = demo_database(3_000, 300)  # built once for the run (conftest)
    path = where / "budget.sqlite"
    work = [("alice", 0.2, 0.0), ("alice", 0.5, 1e-7), ("bob", 1.0, 0.0), ("alice", 0.3, 0.0)]
    for i, (analyst, epsilon, delta) in enumerate(work):
        with dpsql.connect(db, policy=POLICY, analyst=analyst, ledger=path) as conn:
            conn.execute(f"SELECT COUNT(*) AS n FROM visits WHERE age > {i}", epsilon=epsilon, delta=delta)
    return path


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_spending_composes_in_order(ledger: Path) -> None:
    policy = dpsql.load_policy(POLICY)
    with dpsql.Ledger(ledger, accountant=policy.accountant) as book:
        alice = spending(book, policy, "alice")
        carol = spending(book, policy, "carol")
    assert alice.epsilon == pytest.approx((0.2, 0.7, 1.0)) and alice.queries == 3
    assert alice.epsilon_total == 10 and alice.delta_spent == pytest.approx(1e-7)
    assert list(alice.times) == sorted(alice.times)
    assert carol.queries == 0 and carol.epsilon == () and carol.epsilon_total == 5


def test_tradeoff_panel_shows_a_budget_of_epsilon_10(ledger: Path) -> None:
    policy = dpsql.load_policy(POLICY)
    with dpsql.Ledger(ledger, accountant=policy.accountant) as book:
        alice = spending(book, policy, "alice")
        charges = [r.to_charge() for r in book.events("alice")]
    figure = analyst_figure(alice, charges)
    try:
        assert len(figure.axes) == 3
        tradeoff = figure.axes[2]
        assert tradeoff.get_xscale() == "log" and tradeoff.get_yscale() == "log"
        low, high = tradeoff.get_ylim()
        budget = next(line for line in tradeoff.get_lines() if "budget" in str(line.get_label()))
        inside = [y for y in budget.get_ydata() if low * 1.5 < y < 0.9]
        assert len(inside) > 0.1 * len(budget.get_ydata())  # a visible line, not one on the axes
        texts = " ".join(t.get_text() for ax in figure.axes for t in ax.texts)
        assert "1 of 10 (10%)" in texts  # spent vs total
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
    figure = owner_figure([alice])
    plt.close(figure)


def test_budget_plot_command_for_an_analyst_and_for_the_owner(ledger: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    one, everyone = tmp_path / "alice.png", tmp_path / "all.png"
    assert main(["budget", "--policy", str(POLICY), "--ledger", str(ledger), "--analyst", "alice",
                 "--plot", str(one)]) == 0
    out = capsys.readouterr().out
    assert "epsilon: 1 spent, 9 remaining of 10" in out and f"picture: {one}" in out
    assert _png_size(one)[0] > 1000
    assert main(["budget", "--policy", str(POLICY), "--ledger", str(ledger), "--plot", str(everyone)]) == 0
    out = capsys.readouterr().out
    assert "alice: epsilon 1 of 10 spent, delta 1e-07 of 1e-05 (3 queries)" in out
    assert "bob: epsilon 1 of 5 spent, delta 0 of 1e-05 (1 query)" in out
    assert _png_size(everyone)[0] > 1000
    assert main(["budget", "--policy", str(POLICY), "--ledger", str(ledger)]) == 0  # every analyst, as text
    assert "2 analysts" in capsys.readouterr().out

"""Trade-off curves: beta (type II error) as a function of alpha (type I error) of the
best test telling neighbouring databases apart, for what an analyst has spent and for
their budget (``dpsql budget --plot``)."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from dpsql.errors import Error
from dpsql.privacy.accountants import gaussian_mu
from dpsql.privacy.charges import BudgetStatus, Charge
from dpsql.privacy.pld import PLD, FloatArray, PLDAccountant, privacy_events

__all__ = ["plot_tradeoff", "spent_tradeoff", "tradeoff_eps_delta", "tradeoff_gdp", "tradeoff_pld"]

# ---------------------------------------------------------------------------------------
# Trade-off curves: beta (type II error) as a function of alpha (type I error)
# ---------------------------------------------------------------------------------------


def tradeoff_gdp(mu: float, alpha: npt.ArrayLike) -> FloatArray:
    """The mu-GDP trade-off curve ``beta = Phi(Phi^-1(1 - alpha) - mu)``.

    >>> [round(float(b), 4) for b in tradeoff_gdp(1.0, [0.05, 0.5])]
    [0.7405, 0.1587]
    """
    a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
    normal = NormalDist()
    return np.array([normal.cdf(normal.inv_cdf(1 - x) - mu) if 0 < x < 1 else 1.0 - x
                     for x in a.ravel()]).reshape(a.shape)


def tradeoff_eps_delta(epsilon: float, delta: float, alpha: npt.ArrayLike) -> FloatArray:
    """The (epsilon, delta)-DP trade-off curve
    ``beta = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha))``.

    >>> [round(float(b), 4) for b in tradeoff_eps_delta(1.0, 0.0, [0.0, 0.5, 1.0])]
    [1.0, 0.1839, 0.0]
    """
    a = np.asarray(alpha, dtype=np.float64)
    with np.errstate(over="ignore"):
        first = 1 - delta - math.exp(epsilon) * a if epsilon < 700 else np.where(a > 0, -np.inf, 1 - delta)
    second = math.exp(-epsilon) * (1 - delta - a)
    return np.maximum(0.0, np.maximum(first, second))


def tradeoff_pld(pld: PLD, alpha: npt.ArrayLike, points: int = 2000) -> FloatArray:
    """A PLD's trade-off curve from its delta(epsilon) curve:
    ``beta(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha, e^-eps (1 - delta(eps) - alpha))``,
    over ``points`` epsilons from 0 to where delta(eps) falls below 1e-12 (or 30).
    """
    a = np.asarray(alpha, dtype=np.float64)
    top = float(pld.get_epsilon_for_delta(1e-12))
    if not math.isfinite(top):
        top = min(30.0, 3 * float(pld.get_epsilon_for_delta(1e-9)))
    if not math.isfinite(top):
        top = 30.0
    epsilons = np.linspace(0.0, max(top, 1e-3), points)
    deltas = np.asarray(pld.get_delta_for_epsilon(epsilons), dtype=np.float64)
    beta = np.zeros_like(a)
    for epsilon, delta in zip(epsilons, deltas):
        beta = np.maximum(beta, tradeoff_eps_delta(float(epsilon), float(delta), a))
    return beta


def spent_tradeoff(events: Sequence[Charge], alpha: npt.ArrayLike,
                   accountant: PLDAccountant | None = None) -> tuple[FloatArray, str]:
    """The trade-off curve of what ``events`` spent, and how it was computed.

    mu-GDP exactly when every event is Gaussian; otherwise the composed PLD's curve.
    """
    a = np.asarray(alpha, dtype=np.float64)
    mu = gaussian_mu(events)
    if mu is not None:
        return tradeoff_gdp(mu, a), f"spent: {mu:.4g}-GDP"
    counts = Counter(e for event in events for e in privacy_events(event))
    if not counts:
        return 1.0 - a, "spent: nothing"
    pld = (accountant or PLDAccountant()).distribution(counts)
    return tradeoff_pld(pld, a), f"spent: composed PLD of {len(events)} charges"


def plot_tradeoff(path: str | os.PathLike[str], status: BudgetStatus,
                  events: Sequence[Charge]) -> None:
    """Draw the trade-off curve of what was spent against the budget's, as a PNG.

    Raises:
        Error: If matplotlib is not installed.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise Error("Plotting needs matplotlib, an optional extra: pip install "
                    "'dpsql[plot]' (or pip install matplotlib).") from exc
    alpha = np.concatenate([np.linspace(0, 0.02, 400, endpoint=False), np.linspace(0.02, 1, 600)])
    spent, label = spent_tradeoff(events, alpha)
    budget = tradeoff_eps_delta(status.epsilon_total, status.delta_total, alpha)
    figure, axes = plt.subplots(figsize=(6.4, 6.0), dpi=120)
    axes.plot(alpha, 1 - alpha, color="0.75", lw=1, ls=":", label="no privacy loss (β = 1 − α)")
    axes.fill_between(alpha, spent, 1 - alpha, color="tab:blue", alpha=0.12)
    axes.plot(alpha, spent, color="tab:blue", lw=2, label=label)
    if status.queries:
        point = tradeoff_eps_delta(status.epsilon_spent, status.delta_spent, alpha)
        axes.plot(alpha, point, color="tab:green", lw=1.2, ls="-.",
                  label=f"spent as one (ε, δ) point ({status.accountant}): "
                        f"ε={status.epsilon_spent:.4g}, δ={status.delta_spent:.3g}")
    axes.plot(alpha, budget, color="tab:red", lw=2, ls="--",
              label=f"budget: ε={status.epsilon_total:g}, δ={status.delta_total:g}")
    axes.set(xlim=(0, 1), ylim=(0, 1), aspect="equal",
             xlabel="α: type I error (false positive rate)",
             ylabel="β: type II error (false negative rate)",
             title=f"Privacy spent by {status.analyst!r}: {status.queries} "
                   f"{'query' if status.queries == 1 else 'queries'} ({status.accountant} accountant)")
    axes.title.set_fontsize(10)
    axes.legend(loc="upper right", fontsize=8)
    figure.text(0.5, 0.01, "Every test of 'is this unit in the data?' has (α, β) on or above the "
                "spent curve;\na spent curve above the budget's is within budget.",
                ha="center", va="bottom", fontsize=7.5, color="0.3")
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(os.fspath(path))
    plt.close(figure)

"""Budget pictures: what each analyst has spent of their budget, when, and what it means.

``dpsql budget --plot FILE.png`` draws, from the ledger alone (no data is read):

- **for one analyst** (``--analyst A``), three panels: the budget spent against its total
  (epsilon and delta, as "0.7 of 10"), the composed epsilon after each charge over time,
  and the trade-off curve of everything spent against the budget's curve;
- **for the data owner** (no ``--analyst``): every analyst of the policy and the ledger,
  spent against total, and their spending over time.

The trade-off panel is drawn on log-log axes as the *power* of a membership test (``1 -
beta``: how often it says "this unit is in the data" when it is) against its false-positive
rate ``alpha``. (epsilon, delta)-DP means ``power <= e^epsilon alpha + delta``: a straight
line of slope 1 that sits ``epsilon / ln 10`` decades above the diagonal. On the usual
linear axes the curve of a budget of epsilon 10 hugs the axes within 5e-5 and cannot be
seen; on these axes it is a line 4.3 decades up, and a spent epsilon of 0.7 one 0.3 decades
up. Below the budget's line is within budget.

matplotlib is imported only when a picture is drawn (``pip install 'dpsql[plot]'``).
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsql.errors import Error

__all__ = ["Spending", "analyst_figure", "owner_figure", "plot_analyst", "plot_owner", "spending"]

#: Points of an analyst's spending-over-time line composed at most (then sampled evenly).
MAX_POINTS = 120
#: Analysts drawn in the owner's picture, the biggest spenders first.
MAX_ANALYSTS = 30


@dataclass(frozen=True)
class Spending:
    """One analyst's spending, as the ledger's accountant composes it.

    Attributes:
        analyst: whose.
        times: the time of each charge drawn (seconds since the epoch), oldest first.
        epsilon: the composed epsilon of everything charged up to each of ``times``.
        epsilon_spent, delta_spent: everything charged, composed (the ledger's status).
        epsilon_total, delta_total: the analyst's budget.
        queries: charges recorded.
        accountant: the accountant's name.
    """

    analyst: str
    times: tuple[float, ...]
    epsilon: tuple[float, ...]
    epsilon_spent: float
    delta_spent: float
    epsilon_total: float
    delta_total: float
    queries: int
    accountant: str

    @property
    def share(self) -> float:
        """The larger of the epsilon and delta fractions spent."""
        parts = [self.epsilon_spent / self.epsilon_total if self.epsilon_total else 0.0]
        if self.delta_total:
            parts.append(self.delta_spent / self.delta_total)
        return max(parts)


def spending(ledger: Any, policy: Any, analyst: str) -> Spending:
    """``analyst``'s spending from ``ledger`` (a :class:`~dpsql.privacy.ledger.Ledger`),
    against their budget in ``policy``; reads no data."""
    budget = policy.budget_for(analyst)
    status = ledger.status(analyst, budget)
    records = ledger.events(analyst)
    times = [float(r.time) for r in records]
    if not records:
        cumulative: list[float] = []
    elif getattr(ledger.accountant, "name", "") == "basic":  # epsilons add
        cumulative = [float(x) for x in np.cumsum([r.epsilon for r in records])]
    else:
        charges = [r.to_charge() for r in records]
        picks = sorted({round(i) for i in np.linspace(1, len(records), min(len(records), MAX_POINTS))})
        times = [times[k - 1] for k in picks]
        cumulative = [float(ledger.accountant.compose(charges[:k], target_delta=float(budget.delta))[0])
                      for k in picks]
    if cumulative:
        cumulative[-1] = status.epsilon_spent  # the ledger's own, rounded-up figure
    return Spending(
        analyst, tuple(times), tuple(cumulative), status.epsilon_spent, status.delta_spent,
        status.epsilon_total, status.delta_total, status.queries, status.accountant,
    )


# ---------------------------------------------------------------- drawing


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415 - optional, and slow to import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise Error("Plotting needs matplotlib, an optional extra: pip install "
                    "'dpsql[plot]' (or pip install matplotlib).") from exc
    return plt


def _amount(value: float) -> str:
    """0.7, 10, 1e-05: short, and never rounded to look spent when it is not."""
    return f"{value:.3g}" if value else "0"


def _share_text(spent: float, total: float) -> str:
    percent = 100 * spent / total if total else 0.0
    shown = f"{percent:.2g}" if 0 < percent < 1 else f"{percent:.0f}"
    return f"{_amount(spent)} of {_amount(total)} ({shown}%)"


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _draw_shares(axes: Any, rows: Sequence[tuple[str, float, float, str]], title: str) -> None:
    """Horizontal bars: each row's spent share of its total (label, spent, total, colour)."""
    y = np.arange(len(rows))[::-1]
    axes.barh(y, [1.0] * len(rows), color="0.9", edgecolor="0.6", height=0.6)
    shares = [min(1.0, s / t) if t else 0.0 for _, s, t, _ in rows]
    axes.barh(y, shares, color=[c for *_, c in rows], height=0.6)
    for yi, share, (_, spent, total, _) in zip(y, shares, rows):
        inside = share > 0.55  # on the bar in white, else just right of it
        axes.text(share - 0.015 if inside else share + 0.015, yi, _share_text(spent, total), va="center",
                  ha="right" if inside else "left", fontsize=8.5, color="white" if inside else "black")
    axes.set_yticks(y, [label for label, *_ in rows], fontsize=9)
    axes.set_xlim(0, 1)
    axes.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    axes.set_xlabel("share of the budget spent")
    axes.set_title(title, fontsize=10)


def _draw_over_time(axes: Any, spendings: Sequence[Spending], colours: Sequence[str]) -> None:
    """Composed epsilon after each charge, with each analyst's total as a dotted line."""
    import matplotlib.dates as mdates  # noqa: PLC0415

    drawn = False
    for spent, colour in zip(spendings, colours):
        if not spent.times:
            continue
        when = [datetime.datetime.fromtimestamp(t) for t in spent.times]
        label = f"{spent.analyst}: {_plural(spent.queries, 'query', 'queries')}"
        axes.plot(when, spent.epsilon, drawstyle="steps-post", marker="o", markersize=2.5, lw=1.6,
                  color=colour, label=label)
        drawn = True
    totals: dict[float, list[str]] = {}
    for spent in spendings:
        totals.setdefault(spent.epsilon_total, []).append(spent.analyst)
    for total, names in totals.items():  # one line per distinct budget, named by whose it is
        axes.axhline(total, color="0.45", ls=":", lw=1.2)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        axes.text(0.99, total, f"budget ε={_amount(total)}: {shown}", transform=axes.get_yaxis_transform(),
                  ha="right", va="bottom", fontsize=7.5, color="0.3")
    top = max([s.epsilon_total for s in spendings] + [max(s.epsilon, default=0.0) for s in spendings])
    axes.set_ylim(0, top * 1.12 if top > 0 else 1)
    if not drawn:
        axes.text(0.5, 0.5, "nothing spent yet", transform=axes.transAxes, ha="center", va="center")
    else:
        first = min(t for s in spendings for t in s.times)
        last = max(t for s in spendings for t in s.times)
        if last - first < 3600:  # a burst of queries: show the hour around it
            middle = datetime.datetime.fromtimestamp((first + last) / 2)
            axes.set_xlim(middle - datetime.timedelta(minutes=30), middle + datetime.timedelta(minutes=30))
        locator = mdates.AutoDateLocator(minticks=3, maxticks=7)  # type: ignore[no-untyped-call]  # unannotated in matplotlib
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]  # as above
        axes.legend(fontsize=8, loc="upper left")
    axes.set_ylabel("ε spent (composed)")
    axes.set_title("Spending over time (dotted: the budget)", fontsize=10)


def _draw_tradeoff(axes: Any, spent: Spending, charges: Sequence[Any]) -> None:
    """Log-log: a membership test's power (1 - β) against its false-positive rate α."""
    from dpsql.privacy.tradeoff import spent_tradeoff, tradeoff_eps_delta  # noqa: PLC0415 - dp-accounting is slow

    eps, delta = spent.epsilon_total, spent.delta_total
    low = min(1e-4, 0.1 * math.exp(-eps)) if eps < 700 else 1e-12
    low = 10.0 ** math.floor(math.log10(max(low, 1e-12)))
    alpha = np.logspace(math.log10(low), 0, 600)
    budget_power = 1 - tradeoff_eps_delta(eps, delta, alpha)
    axes.plot(alpha, alpha, color="0.6", lw=1, ls=":", label="no privacy loss (power = α)")
    axes.plot(alpha, budget_power, color="tab:red", lw=2, ls="--", label=f"budget: ε={eps:g}, δ={delta:g}")
    if charges:
        beta, how = spent_tradeoff(charges, alpha)
        if how.startswith("spent: composed PLD"):
            how = f"spent: composed PLD of {_plural(len(charges), 'charge')}"
        power = np.clip(1 - beta, low / 10, 1)
        axes.fill_between(alpha, alpha, power, color="tab:blue", alpha=0.15)
        axes.plot(alpha, power, color="tab:blue", lw=2,
                  label=f"{how} (ledger: ε={spent.epsilon_spent:.3g}, δ={spent.delta_spent:.3g})")
    else:
        axes.text(0.5, 0.08, "nothing spent yet", transform=axes.transAxes, ha="center")
    axes.set(xscale="log", yscale="log", xlim=(low, 1), ylim=(low, 1.5),
             xlabel="α: false-positive rate of a test 'is this unit in the data?'",
             ylabel="1 − β: its power (true-positive rate)")
    axes.set_title("What an attacker can tell (log-log; below the red line = within budget)", fontsize=10)
    axes.legend(fontsize=7.5, loc="lower right")
    axes.grid(True, which="major", color="0.92")


def plot_analyst(path: str | os.PathLike[str], spent: Spending, charges: Sequence[Any]) -> None:
    """One analyst's picture (three panels), as a PNG at ``path``.

    Args:
        spent: from :func:`spending`.
        charges: the analyst's charges (``record.to_charge()`` of each ledger event), for
            the trade-off curve.

    Raises:
        Error: matplotlib is not installed.
    """
    _save(analyst_figure(spent, charges), path)


def analyst_figure(spent: Spending, charges: Sequence[Any]) -> Any:
    """The matplotlib figure :func:`plot_analyst` saves."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(16, 4.8), dpi=110,
                                gridspec_kw={"width_ratios": [0.8, 1.2, 1.1]})
    _draw_shares(axes[0], [("ε", spent.epsilon_spent, spent.epsilon_total, "tab:blue"),
                           ("δ", spent.delta_spent, spent.delta_total, "tab:purple")],
                 f"{spent.analyst}: spent of the budget ({spent.accountant} accountant)")
    _draw_over_time(axes[1], [spent], ["tab:blue"])
    _draw_tradeoff(axes[2], spent, charges)
    figure.suptitle(f"Privacy budget of {spent.analyst!r}: ε {_share_text(spent.epsilon_spent, spent.epsilon_total)}"
                    f" spent in {_plural(spent.queries, 'query', 'queries')}", fontsize=11)
    figure.tight_layout()
    return figure


def _save(figure: Any, path: str | os.PathLike[str]) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - loaded by the figure already

    try:
        figure.savefig(os.fspath(path))
    finally:
        plt.close(figure)


def plot_owner(path: str | os.PathLike[str], spendings: Sequence[Spending]) -> None:
    """The data owner's picture: every analyst's spending (the biggest spenders first,
    at most :data:`MAX_ANALYSTS`), as a PNG at ``path``.

    Raises:
        Error: matplotlib is not installed.
    """
    _save(owner_figure(spendings), path)


def owner_figure(spendings: Sequence[Spending]) -> Any:
    """The matplotlib figure :func:`plot_owner` saves."""
    plt = _pyplot()
    ranked = sorted(spendings, key=lambda s: (-s.share, s.analyst))[:MAX_ANALYSTS]
    palette = plt.get_cmap("tab10")
    colours = [palette(i % 10) for i in range(len(ranked))]
    height = max(4.2, 1.2 + 0.35 * len(ranked))
    figure, axes = plt.subplots(1, 2, figsize=(13, height), dpi=110, gridspec_kw={"width_ratios": [1, 1.3]})
    _draw_shares(axes[0], [(s.analyst, s.epsilon_spent, s.epsilon_total, c) for s, c in zip(ranked, colours)],
                 "ε spent of each analyst's budget")
    _draw_over_time(axes[1], ranked, colours)
    hidden = len(spendings) - len(ranked)
    more = f" (the {MAX_ANALYSTS} biggest spenders shown; {hidden} more)" if hidden > 0 else ""
    total = sum(s.queries for s in spendings)
    figure.suptitle(f"Privacy budgets: {_plural(len(spendings), 'analyst')}, "
                    f"{_plural(total, 'query', 'queries')} charged{more}", fontsize=11)
    figure.tight_layout()
    return figure

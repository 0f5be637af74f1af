"""The audit's picture: the answers on D and on D', and the event that bounds epsilon."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from dpsql.audit import AuditReport
from dpsql.audit.stats import cell_label, numbers_of
from dpsql.errors import Error

__all__ = ["plot_audit"]


def plot_audit(path: str | os.PathLike[str], report: AuditReport,
               samples: Mapping[str, Sequence[Mapping[tuple[Hashable, ...], object]]]) -> None:
    """Histograms of the audited cell's answers on D and D' (all runs), as a PNG.

    Raises:
        Error: matplotlib is not installed.
    """
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise Error("Plotting needs matplotlib, an optional extra: pip install "
                    "'dpsql[plot]' (or pip install matplotlib).") from exc
    event = report.epsilon_bound.event
    figure, axes = plt.subplots(figsize=(7.0, 4.2), dpi=110)
    if event is None:
        axes.text(0.5, 0.5, "no answers to draw", ha="center", va="center")
    else:
        values = {side: [out.get(event.cell) for out in samples[side]] for side in ("D", "D'")}
        numbers = {}
        for side, answers in values.items():
            x = numbers_of(answers)
            numbers[side] = x[~np.isnan(x)]
        finite = np.concatenate([x[np.isfinite(x)] for x in numbers.values()])
        if finite.size:
            bins = np.histogram_bin_edges(finite, bins=40).tolist()
            for side, color in (("D", "tab:blue"), ("D'", "tab:orange")):
                missing = len(values[side]) - numbers[side].size
                label = f"{side}: {len(values[side])} runs" + (f", {missing} missing/NULL" if missing else "")
                axes.hist(numbers[side], bins=bins, alpha=0.5, color=color, label=label)
        if isinstance(event.threshold, float):
            axes.axvline(event.threshold, color="black", ls="--", lw=1,
                         label=f"event: {event.kind.replace('_', ' ')} {event.threshold:.6g}")
        axes.set_xlabel(cell_label(event.cell))
        axes.set_ylabel("runs")
        axes.legend(fontsize=8)
    verdict = "PASS" if report.passed else "FAIL"
    axes.set_title(f"{report.sql[:70]}\nclaimed ε={report.epsilon:g}, "
                   f"ε ≥ {report.epsilon_bound.value:.3f} ({report.confidence * 100:g}%): {verdict}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


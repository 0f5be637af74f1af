"""The statistics of an audit: from two samples of outputs to a lower bound on epsilon.

A mechanism M is (epsilon, delta)-DP when, for neighbouring databases D and D' and every
set S of outputs, ``P[M(D) in S] <= exp(epsilon) P[M(D') in S] + delta`` (and the same with
D and D' swapped). So any event S whose two probabilities we can bound from the runs gives

    epsilon >= ln((p_hi - delta) / p_lo)

where ``p_hi`` is a lower confidence bound on the larger probability and ``p_lo`` an upper
confidence bound on the smaller one. The bound holds at the stated confidence whatever the
mechanism, provided S was chosen without looking at the runs that estimate it: we choose
(S, direction) on the first half of each sample and estimate on the second half
(Clopper-Pearson, one-sided at ``(1 - confidence) / 2`` each, so both hold together at
``confidence``). This is the recipe of Jagielski et al. (2020), "Auditing differentially
private machine learning", and of Ding et al. (2018), "Detecting violations of differential
privacy".

For mu-GDP (Gaussian noise), the trade-off between the two error rates of any test is at
least ``Phi(Phi^-1(1 - alpha) - mu)``; equivalently ``P[M(D) in S] <= Phi(Phi^-1(P[M(D') in
S]) + mu)`` for every S, so the same two bounds give

    mu >= Phi^-1(p_hi) - Phi^-1(p_lo)

(Dong, Roth and Su, "Gaussian differential privacy", 2022; used for auditing by Nasr et al.,
"Tight auditing of differentially private machine learning", 2023).

The events tried, per output cell (a group's value in one column, or a scalar answer):
"the cell is missing or NULL", "present", ``x > t`` and ``x <= t`` for thresholds t at
percentiles of the first half's values, and ``x == v`` for a cell that is not a number.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = ["TOTAL", "Bound", "Event", "cell_label", "clopper_pearson", "lower_bound"]

Cell = tuple[Hashable, ...]
Outputs = Sequence[Mapping[Cell, object]]
#: The key of a pseudo-cell: one column's total over all groups of an answer.
TOTAL = ("all groups",)
_SELECTION_ALPHA = 1e-3  # the bounds events are chosen by (see lower_bound)
_THRESHOLDS = 99  # percentiles of the first half tried as thresholds, per cell


@dataclass(frozen=True)
class Event:
    """A set of outputs: one cell's value missing, present, above, at-or-below or equal to."""

    cell: Cell
    kind: str  # "missing", "present", "above", "at_most", "equals"
    threshold: object = None

    def describe(self) -> str:
        where = cell_label(self.cell)
        if self.kind in ("missing", "present"):
            return f"{where} is {'missing or NULL' if self.kind == 'missing' else 'present'}"
        sign = {"above": ">", "at_most": "<=", "equals": "=="}[self.kind]
        shown = f"{self.threshold:.6g}" if isinstance(self.threshold, float) else repr(self.threshold)
        return f"{where} {sign} {shown}"

    def holds(self, values: npt.NDArray[np.object_]) -> npt.NDArray[np.bool_]:
        """Which of ``values`` (one cell's value per run; None when missing) are in the set."""
        missing = np.array([_missing(v) for v in values], dtype=bool)
        if self.kind == "missing":
            return missing
        if self.kind == "present":
            return ~missing
        if self.kind == "equals":
            return np.array([not m and v == self.threshold for v, m in zip(values, missing)], dtype=bool)
        numbers = np.array([np.nan if m else float(v) for v, m in zip(values, missing)])
        with np.errstate(invalid="ignore"):
            return numbers > self.threshold if self.kind == "above" else numbers <= self.threshold


def cell_label(cell: Cell) -> str:
    """How a cell ``(key values..., occurrence, column)`` is shown.

    >>> cell_label(("east", 0, "AVG(income)")), cell_label((0, "COUNT(*)")), cell_label(("a", 1, "n"))
    ('[east] AVG(income)', 'COUNT(*)', '[a] (2nd) n')
    """
    *keys, occurrence, column = cell
    if keys == [TOTAL]:
        return f"{column}, total over all groups"
    label = f"[{', '.join(map(str, keys))}] " if keys else ""
    if isinstance(occurrence, int) and occurrence:
        label += f"({occurrence + 1}{'nd' if occurrence == 1 else 'th'}) "
    return f"{label}{column}"


@dataclass(frozen=True)
class Bound:
    """A lower confidence bound, and the evidence behind it.

    Attributes:
        value: the lower bound on epsilon (or on mu); 0 when no event shows any loss.
        event: the event tested, chosen on the first half of the runs.
        favoured: which database makes ``event`` likelier: ``"D"`` or ``"D'"``.
        hits: how often the event happened on the second half: (on D, on D').
        runs: the second half's runs on each database: (D, D').
    """

    value: float
    event: Event | None
    favoured: str
    hits: tuple[int, int]
    runs: tuple[int, int]

    def describe(self) -> str:
        if self.event is None:
            return "no event observed"
        return (f"P[{self.event.describe()}]: {self.hits[0]}/{self.runs[0]} on D, "
                f"{self.hits[1]}/{self.runs[1]} on D' (likelier on {self.favoured})")


def clopper_pearson(hits: npt.ArrayLike, runs: npt.ArrayLike, alpha: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """One-sided Clopper-Pearson bounds: ``P[p >= lo] >= 1 - alpha`` and ``P[p <= hi] >= 1 - alpha``.

    >>> lo, hi = clopper_pearson(0, 100, 0.05)
    >>> float(lo), round(float(hi), 4)
    (0.0, 0.0295)
    """
    k = np.asarray(hits, dtype=float)
    n = np.asarray(runs, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k > 0, stats.beta.ppf(alpha, k, n - k + 1), 0.0)
        hi = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, n - k), 1.0)
    return lo, hi


def lower_bound(first: Outputs, second: Outputs, *, delta: float = 0.0, confidence: float = 0.95,
                measure: str = "epsilon") -> Bound:
    """A lower confidence bound on epsilon (or mu) from outputs on D (``first``) and D' (``second``).

    Each output is a mapping from cell to value (a missing cell is absent or None). The
    event is chosen on the first half of each sample, the bound computed on the second.

    Args:
        first: outputs of the mechanism on D, one mapping per run.
        second: outputs on D'.
        delta: the claimed delta (ignored for ``measure="mu"``).
        confidence: the probability that the bound does not exceed the true value.
        measure: ``"epsilon"`` or ``"mu"`` (Gaussian differential privacy).
    """
    if measure not in ("epsilon", "mu"):
        raise ValueError(f"measure must be 'epsilon' or 'mu', got {measure!r}")
    if min(len(first), len(second)) < 4:
        raise ValueError("an audit needs at least 4 runs on each database")
    alpha = (1 - confidence) / 2
    half0, half1 = len(first) // 2, len(second) // 2
    # Choosing by a stricter bound than the final one favours events with many hits over
    # lucky ones in the tails: at 10,000 runs and claim 0.25 it lifts the power against
    # twice the claim from 0.90 to 1.00 (benchmarks/audit_power.py).
    choice = _choose(first[:half0], second[:half1], delta, min(alpha, _SELECTION_ALPHA), measure)
    if choice is None:
        return Bound(0.0, None, "D", (0, 0), (len(first) - half0, len(second) - half1))
    event, favoured = choice
    test0 = _column(first[half0:], event.cell)
    test1 = _column(second[half1:], event.cell)
    k0, k1 = int(event.holds(test0).sum()), int(event.holds(test1).sum())
    n0, n1 = len(test0), len(test1)
    big, n_big, small, n_small = (k0, n0, k1, n1) if favoured == "D" else (k1, n1, k0, n0)
    value = float(_loss(np.array([big]), n_big, np.array([small]), n_small, delta, alpha, measure)[0])
    return Bound(max(0.0, value), event, favoured, (k0, k1), (n0, n1))


def _choose(first: Outputs, second: Outputs, delta: float, alpha: float,
            measure: str) -> tuple[Event, str] | None:
    """The (event, favoured database) with the largest bound on the selection half."""
    best: tuple[float, Event, str] | None = None
    cells = sorted({c for out in (*first, *second) for c in out}, key=repr)
    for cell in cells:
        a0, a1 = _column(first, cell), _column(second, cell)
        events, k0, k1 = _event_counts(cell, a0, a1)
        for favoured, big, n_big, small, n_small in (("D", k0, len(a0), k1, len(a1)),
                                                     ("D'", k1, len(a1), k0, len(a0))):
            scores = _loss(big, n_big, small, n_small, delta, alpha, measure)
            i = int(np.argmax(scores))
            if best is None or scores[i] > best[0]:
                best = (float(scores[i]), events[i], favoured)
    return None if best is None else (best[1], best[2])


def _event_counts(cell: Cell, a0: npt.NDArray[np.object_], a1: npt.NDArray[np.object_]
                  ) -> tuple[list[Event], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The candidate events for one cell, and how often each happened on D and on D'."""
    x0, x1 = numbers_of(a0), numbers_of(a1)
    m0, m1 = np.array([_missing(v) for v in a0]), np.array([_missing(v) for v in a1])
    events = [Event(cell, "missing"), Event(cell, "present")]
    k0 = [int(m0.sum()), int((~m0).sum())]
    k1 = [int(m1.sum()), int((~m1).sum())]
    finite = np.concatenate([x0[np.isfinite(x0)], x1[np.isfinite(x1)]])
    if finite.size:
        cuts = np.unique(np.percentile(finite, np.linspace(0.5, 99.5, _THRESHOLDS)))
        for x, k in ((x0, k0), (x1, k1)):
            ordered = np.sort(x[~np.isnan(x)])
            at_most = np.searchsorted(ordered, cuts, side="right")
            k += [int(v) for pair in zip(ordered.size - at_most, at_most) for v in pair]
        events += [Event(cell, kind, float(t)) for t in cuts for kind in ("above", "at_most")]
    others = sorted({v for v in (*a0, *a1) if not _missing(v) and not is_number(v)}, key=repr)
    for v in others[:_THRESHOLDS]:
        events.append(Event(cell, "equals", v))
        k0.append(sum(1 for u in a0 if u == v))
        k1.append(sum(1 for u in a1 if u == v))
    return events, np.array(k0), np.array(k1)


def numbers_of(values: Iterable[object]) -> npt.NDArray[np.float64]:
    """The values as floats, NaN where one is missing, NULL or not a number."""
    return np.array([float(v) if is_number(v) else np.nan for v in values], dtype=float)  # type: ignore[arg-type]


def _loss(big: npt.NDArray[np.int64], n_big: int, small: npt.NDArray[np.int64], n_small: int,
          delta: float, alpha: float, measure: str) -> npt.NDArray[np.float64]:
    lo, _ = clopper_pearson(big, n_big, alpha)
    _, hi = clopper_pearson(small, n_small, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        if measure == "mu":
            out = stats.norm.ppf(lo) - stats.norm.ppf(hi)
        else:
            out = np.log((lo - delta) / hi)
    return np.nan_to_num(out, nan=-np.inf, neginf=-np.inf)  # type: ignore[no-any-return]


def _column(outputs: Outputs, cell: Cell) -> npt.NDArray[np.object_]:
    column = np.empty(len(outputs), dtype=object)
    column[:] = [out.get(cell) for out in outputs]
    return column


def is_number(value: object) -> bool:
    """An int or float (NaN included), not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _missing(value: object) -> bool:
    return value is None or (is_number(value) and math.isnan(float(value)))  # type: ignore[arg-type]

"""Tight accounting with privacy loss distributions (PLDs), and trade-off curves.

:class:`PLDAccountant` (``accountant = "pld"`` in the policy) composes an analyst's charges
with privacy loss distributions, and answers the question the ledger asks: *the smallest
epsilon at which everything spent is (epsilon, delta)-DP, for delta = the budget's delta*.
The same budget then answers many more queries than basic composition: Gaussian COUNTs
of (0.1, 1e-8) fit 885 times into (3, 1e-6) instead of 30, which is exactly the limit of
Gaussian-DP composition (``benchmarks/bench_accounting.py``).

How a charge becomes events
---------------------------
Each :class:`~dpsql.privacy.Charge` carries the typed privacy event of each measurement
(:mod:`dpsql.privacy.events`; shown below by the description each keeps). Every
measurement was calibrated to a guarantee, and the accountant composes the events it
:func:`supports` by those guarantees:

* **Laplace**, ``{"mechanism": "laplace", "epsilon": e}``: discrete Laplace noise calibrated
  so that the measurement is e-DP. Its event is the PLD of a *discrete Laplace mechanism
  with parameter e and integer sensitivity 1* (``from_discrete_laplace_mechanism``): the
  privacy loss is +e or -e, which is also the randomized-response pair that dominates
  *every* e-DP mechanism (Kairouz, Oh and Viswanath 2015). So it is exact for a discrete
  Laplace of sensitivity one lattice step, and sound whatever the measurement's real
  sensitivity (in lattice units) and its number of groups, which a charge does not record.
  A continuous-Laplace PLD would not be sound for discrete noise (the discrete Laplace
  puts a little more mass on the largest loss), and would not grant more here anyway
  (46 queries of 0.1 in (3, 1e-6) either way).
* **Gaussian**, ``{"mechanism": "gaussian", "mu": m}``: discrete Gaussian noise calibrated
  to be m-GDP (:func:`dpsql.noise.gaussian_noise` adds a variance margin for that). A
  charge's Gaussian measurements are folded into one event of
  ``mu = sqrt(sum m_i^2)`` (GDP composes exactly so), whose PLD is the *continuous*
  Gaussian mechanism with ``sigma = 1 / mu`` and sensitivity 1: exactly the mu-GDP curve.
  We do not use ``from_discrete_gaussian_mechanism``: a charge records neither the
  lattice-unit sigma (it is about 2^12 or more, where the discrete and continuous curves
  differ by a relative O(1/sigma^2) that the variance margin already covers) nor the
  number of groups the L2 sensitivity spreads over; the GDP guarantee is what the
  calibration certifies.
* **Anything else** (a future ``"ptr"`` or partition-selection ``"threshold"``, a
  malformed description, or a charge with no description but a cost): the whole charge
  becomes one generic event with its own (epsilon, delta), whose PLD is the worst case
  for an (epsilon, delta)-DP mechanism (``from_privacy_parameters``: +epsilon,
  -epsilon, and infinity with probability delta). ``dp-accounting``'s ``PLDAccountant``
  does not take an ``EpsilonDelta`` event, which is why PLDs are built directly here;
  the generic PLD composes with the others exactly, with no basic-composition side part.

How they compose
----------------
* Every event Gaussian: ``sqrt(sum mu^2)``-GDP exactly, and epsilon from the closed form
  of the Gaussian's delta(epsilon) (:func:`gdp_epsilon`): no discretization at all.
* Repeats of one Laplace or one generic event: k randomized-response pairs compose to a
  binomial loss with k + 1 atoms; epsilon is computed from it exactly (:func:`rr_epsilon`).
* Anything else: dp-accounting's PLDs on a grid of 1e-4 with its pessimistic rounding (the
  default), tails truncated during composition going to the infinite loss.

Every answer is an upper bound. Basic composition (epsilons add, deltas add, in the
ledger's exact integer units) is always a valid guarantee too; the accountant returns the
basic one whenever it is at least as good at the target delta, so ``pld`` never grants
fewer queries than ``basic`` (with a budget delta of 0, a Gaussian event makes every
epsilon infinite, and a discretized PLD's truncated tail does too: basic answers).

Speed
-----
Composing N events from scratch at every charge would cost O(N) convolutions. Each
charge's events are remembered, events are grouped (most queries repeat one shape), a
group is self-composed by FFT (``self_compose(k)``), and the composed PLDs of the last few
multisets are kept: the next charge composes only what is new onto the largest cached
multiset it contains, one convolution. Its cost grows with the width of the composed
loss distribution in grid cells, which the budget bounds, not with N: 1000 mixed charges
take about 8 ms each (CPU) on a loaded 2-core machine; the closed forms take under 1 ms.
The search for epsilon walks the loss grid with numpy (:func:`epsilon_for_delta`).

Trade-off curves
----------------
:func:`tradeoff_gdp`, :func:`tradeoff_eps_delta` and :func:`tradeoff_pld` give beta (the
type II error of the best test between neighbours) at each alpha (its type I error), and
:func:`plot_tradeoff` draws what was spent against the budget (``dpsql budget --plot``).

Example:
    >>> from dpsql.privacy import Charge
    >>> gaussian = {"mechanism": "gaussian", "mu": 0.1}
    >>> eps, delta = PLDAccountant().compose([Charge(0.5, 1e-6, "q", (gaussian,))] * 4, 1e-6)
    >>> round(eps, 3), delta   # 4 x 0.1-GDP is 0.2-GDP, far below 4 x 0.5
    (0.834, 1e-06)
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.special import gammaln

from dpsql.errors import InternalError
from dpsql.noise.gdp import gdp_delta
from dpsql.privacy.charges import (
    Charge,
    charge_units,
    units_to_delta,
    units_to_epsilon,
)
from dpsql.privacy.events import DpEvent, GaussianEvent, LaplaceEvent

__all__ = [
    "PLDAccountant",
    "PrivacyEvent",
    "epsilon_for_delta",
    "gdp_epsilon",
    "privacy_events",
    "rr_epsilon",
    "supports",
]

#: The grid privacy losses are rounded (pessimistically) onto.
VALUE_DISCRETIZATION_INTERVAL = 1e-4
#: How many composed PLDs (of the most recent event multisets) are kept.
CACHE_SIZE = 8
_MEMO_LIMIT = 200_000  # charges whose events are remembered (then forgotten, all at once)

#: dp_accounting's ``PrivacyLossDistribution`` (the library ships no type information).
PLD: TypeAlias = Any
FloatArray = npt.NDArray[np.float64]


# ---------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PrivacyEvent:
    """One composable guarantee.

    Attributes:
        kind: ``"laplace"`` (pure ``epsilon``-DP, discrete Laplace), ``"gaussian"``
            (``mu``-GDP) or ``"dp"`` (a generic (``epsilon``, ``delta``) guarantee).
    """

    kind: Literal["dp", "gaussian", "laplace"]
    epsilon: float = 0.0
    delta: float = 0.0
    mu: float = 0.0

    def distribution(self, interval: float = VALUE_DISCRETIZATION_INTERVAL) -> PLD:
        """This event's pessimistic PLD (see the module docstring for the choice)."""
        if self.kind == "laplace":
            return pld_lib.from_discrete_laplace_mechanism(
                self.epsilon, sensitivity=1, value_discretization_interval=interval)
        if self.kind == "gaussian":
            return pld_lib.from_gaussian_mechanism(
                1 / self.mu, sensitivity=1, value_discretization_interval=interval)
        parameters = pld_common.DifferentialPrivacyParameters(self.epsilon, self.delta)
        return pld_lib.from_privacy_parameters(parameters, interval)


def _positive(value: object) -> float | None:
    """``value`` as a float if it is a finite number > 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def privacy_events(charge: Charge) -> tuple[PrivacyEvent, ...]:
    """The events one charge composes as.

    Laplace measurements are one event each; the Gaussian ones are folded into one
    ``sqrt(sum mu^2)``-GDP event. If any measurement is of a kind this accountant does not
    know (or is malformed), the whole charge is one generic (epsilon, delta) event. A charge
    that costs nothing and describes nothing is no event.

    >>> privacy_events(Charge(0.2, 0, "q", ({"mechanism": "laplace", "epsilon": 0.1},) * 2))
    (PrivacyEvent(kind='laplace', epsilon=0.1, delta=0.0, mu=0.0), \
PrivacyEvent(kind='laplace', epsilon=0.1, delta=0.0, mu=0.0))
    >>> privacy_events(Charge(1.0, 1e-6, "q", ({"mechanism": "ptr"},)))
    (PrivacyEvent(kind='dp', epsilon=1.0, delta=1e-06, mu=0.0),)
    """
    generic = (PrivacyEvent("dp", epsilon=charge.epsilon, delta=charge.delta),)
    if not charge.events:
        return () if charge.epsilon == 0 and charge.delta == 0 else generic
    laplace: list[PrivacyEvent] = []
    mus: list[float] = []
    for event in charge.events:
        if not supports(event):
            return generic
        if isinstance(event, LaplaceEvent):
            laplace.append(PrivacyEvent("laplace", epsilon=float(event.epsilon)))
        elif isinstance(event, GaussianEvent):
            mus.append(float(event.mu))
    if mus:
        laplace.append(PrivacyEvent("gaussian", mu=math.sqrt(math.fsum(m * m for m in mus))))
    return tuple(laplace)


def supports(event: DpEvent) -> bool:
    """Whether a privacy event has a PLD of its own (else: its charge's amounts).

    >>> from dpsql.privacy.events import UnknownEvent
    >>> supports(GaussianEvent(mu=0.3)), supports(UnknownEvent(description={"mechanism": "ptr"}))
    (True, False)
    """
    if isinstance(event, LaplaceEvent):
        return _positive(event.epsilon) is not None
    if isinstance(event, GaussianEvent):
        return _positive(event.mu) is not None
    return False


# ---------------------------------------------------------------------------------------
# The accountant
# ---------------------------------------------------------------------------------------


class PLDAccountant:
    """Composes charges with privacy loss distributions; answers epsilon at a target delta.

    Args:
        value_discretization_interval: The loss grid (smaller: tighter and slower).
        cache_size: How many composed PLDs to keep.

    The accountant is thread-safe; one instance may serve several ledgers.

    Example:
        >>> from dpsql.privacy import Charge
        >>> laplace = {"mechanism": "laplace", "epsilon": 0.5}
        >>> PLDAccountant().compose([Charge(0.5, 0.0, "q", (laplace,))] * 2, 0.0)
        (1.0, 0.0)
    """

    name = "pld"

    def __init__(self, value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
                 cache_size: int = CACHE_SIZE) -> None:
        self.interval = value_discretization_interval
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._single: dict[PrivacyEvent, PLD] = {}
        self._memo: dict[int, tuple[Charge, int, int, int]] = {}
        self._signatures: dict[tuple[PrivacyEvent, ...], int] = {}
        self._composed: OrderedDict[frozenset[tuple[PrivacyEvent, int]], PLD] = OrderedDict()

    def supports(self, event: DpEvent) -> bool:
        """See :func:`supports`."""
        return supports(event)

    def compose(self, events: Sequence[Charge],
                target_delta: float | None = None) -> tuple[float, float]:
        """The (epsilon, delta) all ``events`` cost, with delta at most ``target_delta``.

        Returns the smallest epsilon at ``target_delta`` (and ``target_delta``), or the
        basic-composition amounts when those are at least as good (or when the PLD cannot
        reach ``target_delta`` at all: then the delta returned may exceed it, and the
        ledger refuses). Without ``target_delta``, the target is the basic delta.

        Two cases have closed forms, exact and far faster than a discretized PLD: every
        event Gaussian (``sqrt(sum mu^2)``-GDP, :func:`gdp_epsilon`), and repeats of one
        Laplace or generic event (randomized response, :func:`rr_epsilon`). Any other mix
        is composed by dp-accounting's PLDs (:meth:`distribution`).
        """
        counts, units = self._tally(events)
        basic = units_to_epsilon(units[0]), units_to_delta(units[1])
        target = basic[1] if target_delta is None else float(target_delta)
        if not counts:
            return basic
        if all(event.kind == "gaussian" for event in counts):
            mu = math.sqrt(math.fsum(n * event.mu**2 for event, n in counts.items()))
            epsilon = gdp_epsilon(mu, target)
        elif len(counts) == 1:
            ((event, k),) = counts.items()
            epsilon = rr_epsilon(event, k, target)
        else:
            epsilon = epsilon_for_delta(self.distribution(counts), target)
        basic_fits = basic[1] <= target
        if math.isfinite(epsilon) and (not basic_fits or epsilon < basic[0]):
            return epsilon, target
        return basic

    def _tally(self, events: Sequence[Charge]) -> tuple[Counter[PrivacyEvent], tuple[int, int]]:
        """Count the events of ``events``, and sum their amounts in units (exactly).

        The ledger passes the same stored charges again at every charge, so each charge's
        events (interned as a signature number) and units are remembered, keyed by
        ``id`` with a reference to the charge (so the ``id`` cannot be reused meanwhile).
        """
        with self._lock:
            if len(self._memo) > _MEMO_LIMIT:
                self._memo.clear()
            rows = []
            for charge in events:
                memo = self._memo.get(id(charge))
                if memo is None or memo[0] is not charge:
                    epsilon_units, delta_units = charge_units(charge)
                    signature = self._signatures.setdefault(
                        privacy_events(charge), len(self._signatures))
                    memo = (charge, signature, epsilon_units, delta_units)
                    self._memo[id(charge)] = memo
                rows.append(memo)
            by_number = {number: sig for sig, number in self._signatures.items()}
        counts: Counter[PrivacyEvent] = Counter()
        for number, n in Counter(row[1] for row in rows).items():
            for event in by_number[number]:
                counts[event] += n
        return counts, (sum(row[2] for row in rows), sum(row[3] for row in rows))

    def distribution(self, counts: Mapping[PrivacyEvent, int]) -> PLD:
        """The composed PLD of ``counts[e]`` copies of each event ``e`` (cached).

        Raises:
            InternalError: If ``counts`` is empty.
        """
        if not counts:
            raise InternalError("no events to compose.")
        key = frozenset((e, n) for e, n in counts.items() if n > 0)
        with self._lock:
            if key in self._composed:
                self._composed.move_to_end(key)
                return self._composed[key]
            base, remaining = self._largest_cached_part(counts)
            for event, n in sorted(remaining.items()):
                part = self._single_pld(event)
                part = part.self_compose(n) if n > 1 else part
                base = part if base is None else base.compose(part)
            assert base is not None  # counts is not empty
            self._composed[key] = base
            while len(self._composed) > self._cache_size:
                self._composed.popitem(last=False)
            return base

    def _largest_cached_part(self, counts: Mapping[PrivacyEvent, int]
                             ) -> tuple[PLD | None, Counter[PrivacyEvent]]:
        """The cached PLD of the largest sub-multiset of ``counts``, and what it lacks."""
        best: tuple[int, frozenset[tuple[PrivacyEvent, int]]] | None = None
        for cached in self._composed:
            if all(counts.get(e, 0) >= n for e, n in cached):
                size = sum(n for _, n in cached)
                if best is None or size > best[0]:
                    best = (size, cached)
        remaining = Counter({e: n for e, n in counts.items() if n > 0})
        if best is None:
            return None, remaining
        remaining.subtract(dict(best[1]))
        return self._composed[best[1]], +remaining

    def _single_pld(self, event: PrivacyEvent) -> PLD:
        if event not in self._single:
            self._single[event] = event.distribution(self.interval)
        return self._single[event]

    def __repr__(self) -> str:
        return f"PLDAccountant(value_discretization_interval={self.interval!r})"


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which mu-GDP is (epsilon, delta)-DP, rounded up.

    Bisection on :func:`dpsql.noise.gdp_delta` (exact for the Gaussian mechanism),
    aiming at ``delta * (1 - 1e-9)`` so floating-point error cannot make it optimistic;
    the upper end is returned. ``inf`` if no epsilon up to 1e6 reaches delta.

    >>> round(gdp_epsilon(1.0, 0.126937), 4)
    1.0
    """
    if delta >= 1:
        return 0.0
    goal = delta * (1 - 1e-9)
    if goal <= 0:
        return math.inf
    if gdp_delta(mu, 0.0) <= goal:
        return 0.0
    low, high = 0.0, max(1.0, mu * mu)
    while gdp_delta(mu, high) > goal:
        low, high = high, 2 * high
        if high > 1e6:
            return math.inf
    while True:
        middle = (low + high) / 2
        if middle in (low, high):
            return high
        if gdp_delta(mu, middle) <= goal:
            high = middle
        else:
            low = middle


def epsilon_for_delta(pld: PLD, delta: float) -> float:
    """The smallest epsilon at which ``pld`` is (epsilon, delta)-DP: the answer of
    ``pld.get_epsilon_for_delta(delta)``, computed with numpy.

    dp-accounting 0.6.0 walks the loss grid in a Python loop (about 10 ms on a composed
    Gaussian PLD, which made it the ledger's bottleneck); this is the same arithmetic as
    cumulative sums over its dense mass function. The two sum in different orders and
    differ by about 1e-12 relative, so the result is raised by a relative 1e-10 to stay
    above either. It falls back to the library's own method if the PLD's internals are not
    what dp-accounting 0.6.0 has.

    >>> pld = pld_lib.from_gaussian_mechanism(2.0)
    >>> exact = pld.get_epsilon_for_delta(1e-6)
    >>> 0 <= epsilon_for_delta(pld, 1e-6) - exact < 1e-9
    True
    """
    try:
        pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
        return max(_dense_epsilon_for_delta(pmf.to_dense_pmf(), delta) for pmf in pmfs)
    except (AttributeError, TypeError, _Unusual):
        return float(pld.get_epsilon_for_delta(delta))


class _Unusual(Exception):
    """A mass function the vectorized path leaves to the library."""


def _dense_epsilon_for_delta(pmf: Any, delta: float) -> float:
    """dp-accounting's ``_get_epsilon_for_delta`` over a ``DensePLDPmf``, vectorized."""
    probs = np.asarray(pmf._probs, dtype=np.float64)[::-1]
    top = pmf._lower_loss + len(probs) - 1
    if len(probs) == 0 or top * pmf._discretization > 700:
        raise _Unusual  # exp(-loss) underflows: the library handles that case
    losses = (top - np.arange(len(probs))) * pmf._discretization
    return _epsilon_from_atoms(losses, probs, float(pmf._infinity_mass), delta)


def _epsilon_from_atoms(losses: FloatArray, probs: FloatArray, infinity: float,
                        delta: float) -> float:
    """The smallest epsilon with delta(epsilon) <= ``delta`` for a privacy loss taking
    ``losses`` (in decreasing order) with ``probs``, and infinity with ``infinity``.

    Walking losses from the largest down, with ``upper`` = infinity mass + the mass of the
    losses above and ``lower`` = the sum of their ``p e^-loss``, the answer is
    ``log((upper - delta) / lower)`` at the first loss it is not below (or 0), as in
    dp-accounting. The walk goes in chunks of doubling size from the top, since the
    answer is usually in the upper tail."""
    if infinity > delta:
        return math.inf
    upper, lower = infinity, 0.0
    begin, size = 0, 4096
    while begin < len(probs):
        end = min(len(probs), begin + size)
        chunk, chunk_losses = probs[begin:end], losses[begin:end]
        uppers = upper + np.concatenate(([0.0], np.cumsum(chunk)))
        lowers = lower + np.concatenate(([0.0], np.cumsum(chunk * np.exp(-chunk_losses))))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            candidates = np.log((uppers[:-1] - delta) / lowers[:-1])
        stop = (uppers[:-1] > delta) & (lowers[:-1] > 0) & (candidates >= chunk_losses)
        if stop.any():
            at = int(np.argmax(stop))
            upper, lower = float(uppers[at]), float(lowers[at])
            break
        upper, lower = float(uppers[-1]), float(lowers[-1])
        begin, size = end, 2 * size
    if upper <= lower + delta:
        return 0.0
    # Raised above the float error of the sums (about 1e-13 relative).
    return math.log((upper - delta) / lower) * (1 + 1e-10) + 1e-12


def rr_epsilon(event: PrivacyEvent, k: int, delta: float) -> float:
    """The smallest epsilon for ``k`` compositions of one Laplace or generic event, exactly.

    Both events' pairs are randomized response: loss +e with probability
    ``(1 - d) / (1 + e^-e)``, -e with ``(1 - d) / (1 + e^e)``, infinity with d (d = 0 for
    Laplace). ``k`` of them lose ``e (k - 2j)`` with the binomial probability of j
    losses of -e, and infinity with ``1 - (1 - d)^k``: a closed form with ``k + 1`` atoms,
    where a discretized PLD of ``k`` such events spans up to millions of grid cells.

    >>> rr_epsilon(PrivacyEvent("laplace", epsilon=0.5), 3, 0.0)
    1.5
    """
    e, d = event.epsilon, event.delta
    j = np.arange(k + 1, dtype=np.float64)
    log_choose = gammaln(k + 1) - gammaln(j + 1) - gammaln(k - j + 1)
    log_keep = math.log1p(-d) if d < 1 else -math.inf
    log_up = log_keep - math.log1p(math.exp(-e))       # P(+e)
    log_down = log_keep - math.log1p(math.exp(e)) if e < 700 else -math.inf  # P(-e)
    with np.errstate(invalid="ignore"):
        probs = np.exp(log_choose + (k - j) * log_up + np.where(j > 0, j * log_down, 0.0))
    infinity = -math.expm1(k * log_keep) if d > 0 else 0.0
    if d == 0 and delta == 0:
        return k * e        # the largest loss; basic composition is exact at delta 0
    return _epsilon_from_atoms(e * (k - 2 * j), probs, infinity, delta)



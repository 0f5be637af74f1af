"""Frequency oracles: how many clients hold each category, from eps-LDP reports.

Three oracles, after Wang, Blocki, Li and Jha, "Locally Differentially Private Protocols
for Frequency Estimation" (USENIX Security 2017). Each report *supports* some categories;
with ``p`` the chance a report supports its client's own category and ``q`` the chance it
supports any given other one, the count of category ``v`` among ``n`` reports is estimated
without bias by ``(S_v - n q) / (p - q)`` (``S_v`` the reports supporting ``v``), with
variance ``(c_v p(1 - p) + (n - c_v) q(1 - q)) / (p - q)^2`` for a true count ``c_v``.

- **GRR** (generalized randomized response): keep the category with probability
  ``p = e^eps / (e^eps + d - 1)``, else send one of the other ``d - 1`` uniformly.
- **OUE** (optimized unary encoding): send ``d`` bits, the own one set with probability
  1/2 and each other with ``q = 1 / (e^eps + 1)``.
- **OLH** (optimized local hashing): hash the category into ``g = e^eps + 1`` (rounded to
  the better integer) buckets with a hash drawn afresh per report, then GRR over the
  buckets; a report supports every category that hashes to its bucket (``q = 1 / g``).
  The hash is ``((a x + b) mod P) mod g`` with ``P = 2**31 - 1`` and random ``a``, ``b``:
  pairwise independent over ``Z_P``, so ``q`` is ``1/g`` within ``g / P`` (below 3e-8
  for ``g <= 64``); that is the estimator's only bias.

:func:`choose_oracle` takes the smallest variance at ``c_v = 0``, ``n q(1 - q) / (p - q)^2``:
GRR's ``(e^eps + d - 2) / (e^eps - 1)^2`` per report wins for small domains
(``d < 3 e^eps + 2``); OUE's ``4 e^eps / (e^eps - 1)^2`` otherwise. OLH's variance equals
OUE's when ``e^eps + 1`` is a whole number and is slightly larger otherwise (its ``g`` must
be an integer); it wins only ties, because its report is two integers instead of ``d`` bits.
Pass ``oracle="olh"`` to trade that small variance for short reports on large domains.

Probabilities are drawn exactly as integers out of ``2**53`` (see :mod:`dpsql.local._common`),
rounded so that the likelihood ratio stays at most ``e^eps``; the estimators use the
probabilities actually drawn, so the rounding adds no bias.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsql.local._common import ONE, ReportError, bernoulli, check_epsilon, exact_threshold, source_or_default
from dpsql.noise import RandomSource, uniform_below

__all__ = ["CategoryReports", "CountEstimate", "FrequencyOracle", "choose_oracle", "perturb_category"]

ORACLES = ("grr", "oue", "olh")
#: The OLH hash works modulo this prime (a Mersenne prime, so ``a x + b`` fits int64).
HASH_PRIME = (1 << 31) - 1
#: OUE reports are drawn this many bits at a time, to bound memory.
_CHUNK_BITS = 1 << 22

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
OracleName = Literal["auto", "grr", "oue", "olh"]


@dataclass(frozen=True)
class FrequencyOracle:
    """One oracle for a domain of ``domain`` categories at ``epsilon``.

    Attributes:
        kind: ``"grr"``, ``"oue"`` or ``"olh"``.
        domain: ``d``, the number of categories (at least 2).
        epsilon: The local privacy parameter of one report.

    >>> o = FrequencyOracle("grr", 2, math.log(3))
    >>> round(o.p, 6), round(o.q, 6)
    (0.75, 0.25)
    >>> round(float(o.variance(100)), 6)   # n q(1-q) / (p-q)^2 = 100 * 0.1875 / 0.25
    75.0
    """

    kind: str
    domain: int
    epsilon: float

    def __post_init__(self) -> None:
        if self.kind not in ORACLES:
            raise ReportError(f"unknown frequency oracle {self.kind!r}; use one of {', '.join(ORACLES)} or auto")
        if isinstance(self.domain, bool) or not isinstance(self.domain, int) or self.domain < 2:
            raise ReportError(f"a categorical column needs at least 2 categories, got {self.domain!r}")
        if self.domain >= HASH_PRIME:
            raise ReportError(f"at most {HASH_PRIME - 1} categories are supported, got {self.domain}")
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    @property
    def buckets(self) -> int:
        """``g``: the range reports are drawn from (``d`` for GRR, the hash range for OLH, 2 for OUE)."""
        if self.kind == "grr":
            return self.domain
        if self.kind == "oue":
            return 2
        return _best_hash_range(self.epsilon)

    @property
    def keep_threshold(self) -> int:
        """GRR/OLH: the chance of keeping the true value, times ``2**53`` (rounded down)."""
        e, g = Fraction(math.exp(self.epsilon)), self.buckets
        return exact_threshold(e / (e + g - 1), up=False)

    @property
    def flip_threshold(self) -> int:
        """OUE: the chance an unset bit is sent as 1, times ``2**53`` (rounded up)."""
        return exact_threshold(1 / (Fraction(math.exp(self.epsilon)) + 1), up=True)

    @property
    def p(self) -> float:
        """The chance a report supports its own category (as actually drawn)."""
        return 0.5 if self.kind == "oue" else self.keep_threshold / ONE

    @property
    def q(self) -> float:
        """The chance a report supports one given other category (as actually drawn)."""
        if self.kind == "oue":
            return self.flip_threshold / ONE
        if self.kind == "grr":
            return (1 - self.p) / (self.domain - 1)
        return 1 / self.buckets

    def variance(self, n: int, count: npt.ArrayLike = 0) -> FloatArray:
        """Variance of the estimated count of a category held by ``count`` of ``n`` reports."""
        p, q = self.p, self.q
        c = np.asarray(count, dtype=np.float64)
        return (c * p * (1 - p) + (n - c) * q * (1 - q)) / (p - q) ** 2

    def describe(self) -> str:
        """A canonical text naming the oracle and its parameters (stored with each report)."""
        return f"{self.kind};d={self.domain};g={self.buckets};epsilon={self.epsilon!r}"

    def perturb(self, indices: IntArray, source: RandomSource | None = None) -> CategoryReports:
        """Report category indices (``0 <= index < domain``); see :func:`perturb_category`."""
        rng = source_or_default(source)
        x = np.asarray(indices, dtype=np.int64).reshape(-1)
        if self.kind == "oue":
            return CategoryReports(self, bits=_oue_bits(self, x, rng))
        if self.kind == "grr":
            return CategoryReports(self, items=_randomize(x, self.domain, self.keep_threshold, rng))
        a = 1 + uniform_below(rng, HASH_PRIME - 1, x.size)
        b = uniform_below(rng, HASH_PRIME, x.size)
        hashed = _hash(a, b, x, self.buckets)
        items = _randomize(hashed, self.buckets, self.keep_threshold, rng)
        return CategoryReports(self, items=items, keys=a * HASH_PRIME + b)


@dataclass(frozen=True, eq=False)
class CategoryReports:
    """Perturbed reports of one categorical column, as an oracle made them.

    Attributes:
        oracle: The oracle that made them.
        items: GRR: the reported category index; OLH: the reported hash bucket.
        keys: OLH: each report's hash key ``a * P + b``.
        bits: OUE: one row of ``ceil(d / 8)`` bytes per report (``numpy.packbits`` order).
    """

    oracle: FrequencyOracle
    items: IntArray | None = None
    keys: IntArray | None = None
    bits: npt.NDArray[np.uint8] | None = None

    def __len__(self) -> int:
        data = self.bits if self.oracle.kind == "oue" else self.items
        return 0 if data is None else int(data.shape[0])

    def support(self) -> IntArray:
        """``S_v``: how many reports support each category."""
        d, kind = self.oracle.domain, self.oracle.kind
        if kind == "grr":
            return np.bincount(self.items, minlength=d).astype(np.int64)  # type: ignore[arg-type]
        if kind == "oue":
            total = np.zeros(d, dtype=np.int64)
            rows = max(1, _CHUNK_BITS // d)
            for start in range(0, len(self), rows):
                chunk = np.unpackbits(self.bits[start:start + rows], axis=1, count=d)  # type: ignore[index]
                total += chunk.sum(axis=0, dtype=np.int64)
            return total
        assert self.keys is not None, "OLH reports carry their hash keys"
        a, b = np.divmod(self.keys, HASH_PRIME)
        return np.array([int(np.count_nonzero(_hash(a, b, v, self.oracle.buckets) == self.items))
                         for v in range(d)], dtype=np.int64)

    def estimate(self) -> CountEstimate:
        """Unbiased counts per category, with their variances (true counts plugged in as
        the estimates, clipped into ``[0, n]``)."""
        n, o = len(self), self.oracle
        counts = np.asarray((self.support() - n * o.q) / (o.p - o.q), dtype=np.float64)
        return CountEstimate(counts, o.variance(n, np.clip(counts, 0, n)), n)


@dataclass(frozen=True, eq=False)
class CountEstimate:
    """Estimated counts per category (in category order), their variances, and ``n``."""

    counts: FloatArray
    variances: FloatArray
    n: int

    def half_widths(self, z: float = 1.959963984540054) -> FloatArray:
        """Normal-approximation half-widths, 95% by default."""
        return z * np.sqrt(np.maximum(self.variances, 0.0))


def choose_oracle(domain: int, epsilon: float) -> FrequencyOracle:
    """The oracle with the smallest variance for ``domain`` categories at ``epsilon``.

    Ties (within 1e-9) go to the shorter report: GRR, then OLH, then OUE.

    >>> choose_oracle(2, 1.0).kind, choose_oracle(256, 1.0).kind, choose_oracle(16, 4.0).kind
    ('grr', 'oue', 'grr')
    """
    candidates = [FrequencyOracle(kind, domain, epsilon) for kind in ("grr", "olh", "oue")]
    factors = [float(c.variance(1)) for c in candidates]
    best = min(factors)
    return next(c for c, f in zip(candidates, factors) if f <= best * (1 + 1e-9))


def perturb_category(values: Sequence[object] | npt.ArrayLike, categories: Sequence[object],
                     epsilon: float, *, oracle: OracleName = "auto",
                     source: RandomSource | None = None) -> CategoryReports:
    """Perturb categorical values with a frequency oracle: each report is ``epsilon``-LDP.

    Args:
        values: One category per client; each must be one of ``categories``.
        categories: The domain, in the order estimates are returned; no duplicates.
        epsilon: The privacy parameter of each report.
        oracle: ``"auto"`` (smallest variance, :func:`choose_oracle`), ``"grr"``,
            ``"oue"`` or ``"olh"``.
        source: A seeded source, for unit tests only; by default the OS CSPRNG.

    Returns:
        The reports; ``.estimate()`` gives unbiased counts per category and variances.

    Raises:
        ReportError: a value not among ``categories``, duplicate or too few categories,
            a bad epsilon or oracle name.

    >>> reports = perturb_category(["a", "b", "a"], ["a", "b", "c"], 2.0)
    >>> len(reports), reports.oracle.kind, len(reports.estimate().counts)
    (3, 'grr', 3)
    """
    domain = list(categories)
    index = {value: i for i, value in enumerate(domain)}
    if len(index) != len(domain):
        raise ReportError("categories lists a value twice; list each category once")
    chosen = choose_oracle(len(domain), epsilon) if oracle == "auto" else FrequencyOracle(oracle, len(domain), epsilon)
    raw = values.tolist() if isinstance(values, np.ndarray) else list(values)  # type: ignore[arg-type]
    try:
        indices = np.fromiter((index[v] for v in raw), dtype=np.int64, count=len(raw))
    except (KeyError, TypeError):
        unknown = sorted({repr(v) for v in raw if _missing(index, v)})[:5]
        raise ReportError(f"value(s) {', '.join(unknown)} are not among the column's categories "
                          f"{domain[:8]!r}{'...' if len(domain) > 8 else ''}; map them to a listed "
                          'category (add one such as "other" to the policy)') from None
    return chosen.perturb(indices, source)


def categories_digest(categories: Sequence[object]) -> str:
    """A short fingerprint of a category list (so reports made for another list are told apart)."""
    text = json.dumps([repr(c) for c in categories], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _missing(index: dict[object, int], value: object) -> bool:
    try:
        return value not in index
    except TypeError:
        return True


def _best_hash_range(epsilon: float) -> int:
    """The integer ``g >= 2`` minimising OLH's variance ``(e^eps + g - 1)^2 / (g - 1)``."""
    e = math.exp(epsilon)
    candidates = {max(2, math.floor(e) + 1), max(2, math.ceil(e) + 1)}
    return min(sorted(candidates), key=lambda g: (e + g - 1) ** 2 / (g - 1))


def _hash(a: IntArray, b: IntArray, x: IntArray | int, g: int) -> IntArray:
    """``((a x + b) mod P) mod g``, elementwise (``a, b < P`` and ``x < P``, so no overflow)."""
    return ((a * x + b) % HASH_PRIME) % g


def _randomize(x: IntArray, size: int, keep: int, source: RandomSource) -> IntArray:
    """GRR over ``range(size)``: keep ``x`` with probability ``keep / 2**53``, else any other value."""
    kept = bernoulli(source, np.full(x.size, keep, dtype=np.int64))
    other = (x + 1 + uniform_below(source, size - 1, x.size)) % size
    return np.where(kept, x, other)


def _oue_bits(oracle: FrequencyOracle, x: IntArray, source: RandomSource) -> npt.NDArray[np.uint8]:
    """OUE reports, packed: own bit 1 with probability 1/2, others with ``q``."""
    d = oracle.domain
    flip, half = oracle.flip_threshold, ONE // 2
    rows = max(1, _CHUNK_BITS // d)
    packed = np.zeros((x.size, -(-d // 8)), dtype=np.uint8)
    for start in range(0, x.size, rows):
        own = x[start:start + rows]
        limits = np.full((own.size, d), flip, dtype=np.int64)
        limits[np.arange(own.size), own] = half
        packed[start:start + rows] = np.packbits(bernoulli(source, limits), axis=1)
    return packed

"""Exact, vectorised discrete noise from a cryptographically secure source.

Released numbers are integers on the output lattice plus integer noise, so no low-order
bits of a float can give the true value away (DESIGN §5). The samplers follow Canonne,
Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (CKS 2020):

- ``bernoulli_exp``: Bernoulli(exp(-gamma)) for rational gamma (CKS Algorithm 1);
- ``sample_discrete_laplace``: P(z) proportional to exp(-|z| s / t) (CKS Algorithm 2);
- ``sample_discrete_gaussian``: P(z) proportional to exp(-z^2 / (2 t m)) (CKS Algorithm 3).

Every step is integer arithmetic on uniform integers drawn by rejection, so the output
distributions are exactly the ones named, not float approximations. Each sampler works on
whole numpy arrays; rejection loops only revisit the elements still undecided, so a
million cells cost a few dozen vector passes, not a million Python iterations.

Calibration, in exact or rounded-up arithmetic:

- ``laplace_noise(D1, epsilon)``: scale ``t / s >= D1 / epsilon``, epsilon-DP;
- ``gaussian_noise(D2, mu)``: ``sigma^2 = t * m >= (D2 / mu)^2 + 1/6``, mu-GDP (the 1/6
  covers the discrete Gaussian's small excess over the continuous privacy curve);
- ``gdp_delta`` / ``gdp_mu``: the exact (epsilon, delta) curve of mu-GDP, and its inverse.

Randomness comes from a :class:`RandomSource`: :class:`SystemRandom` (``os.urandom``) in
production, :class:`SeededRandom` in unit tests only.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError

__all__ = [
    "DISCRETE_VARIANCE_MARGIN",
    "DiscreteGaussian",
    "DiscreteLaplace",
    "RandomSource",
    "SeededRandom",
    "SystemRandom",
    "bernoulli_exp",
    "default_source",
    "gaussian_noise",
    "gaussian_sigma",
    "gdp_delta",
    "gdp_mu",
    "laplace_noise",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "uniform_below",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
UIntArray = npt.NDArray[np.unsignedinteger]

_INT64_MAX = 2**63 - 1
#: Integer parameters (t, s, m) stay below this, so ``t - 1 + t`` and friends fit int64.
_PARAM_LIMIT = 2**62
#: Largest d with d * d <= _INT64_MAX.
_SQRT_INT64_MAX = math.isqrt(_INT64_MAX)
#: The integer part of a Bernoulli(exp(-gamma)) exponent is capped here. Changing gamma
#: from a larger value to this one changes the success probability by less than
#: exp(-2**62): the sampler would have to see 2**62 successes of Bernoulli(exp(-1)) in a row.
_WHOLE_CAP = 2**62
#: A discrete Laplace scale t / s at most this keeps every sample inside int64 except with
#: probability below exp(-127) (|Z| >= 2**63 needs 127 successes of Bernoulli(exp(-1))).
_MAX_LAPLACE_SCALE = 2**56
_UINT_DTYPES: dict[int, type[np.unsignedinteger]] = {16: np.uint16, 32: np.uint32, 64: np.uint64}


# ---------------------------------------------------------------------------- randomness


class RandomSource(Protocol):
    """Where noise gets its randomness: independent uniform 64-bit words."""

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` iid uniform uint64 words (callers must not write to the array)."""
        ...


class SystemRandom:
    """The production source: the operating system's CSPRNG (``os.urandom``).

    Small requests are served from a buffer refilled by one large ``os.urandom`` call;
    large requests read the kernel directly in one call. The buffer is per process: a
    forked child drops what it inherited, so parent and child never share noise.

    >>> SystemRandom().uint64(3).dtype
    dtype('uint64')
    """

    def __init__(self, chunk_bytes: int = 1 << 20) -> None:
        if chunk_bytes < 8 or chunk_bytes % 8:
            raise InternalError(f"SystemRandom chunk_bytes must be a positive multiple of 8, "
                                f"got {chunk_bytes}. This is probably a bug in dpsql.")
        self._chunk = chunk_bytes
        self._lock = threading.Lock()
        self._buffer = b""
        self._position = 0
        self._pid = os.getpid()

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` uniform words from ``os.urandom``."""
        _check_count(n)
        size = 8 * n
        if size >= self._chunk:
            return np.frombuffer(os.urandom(size), dtype=np.uint64)
        with self._lock:
            if self._pid != os.getpid() or self._position + size > len(self._buffer):
                self._buffer, self._position, self._pid = os.urandom(self._chunk), 0, os.getpid()
            start, buffer = self._position, self._buffer
            self._position += size
        return np.frombuffer(buffer, dtype=np.uint64, count=n, offset=start)


class SeededRandom:
    """A reproducible source FOR UNIT TESTS ONLY: PCG64 is not cryptographically secure.

    Noise drawn from a known seed can be subtracted from a release; never use this class
    to answer queries.

    >>> bool((SeededRandom(7).uint64(4) == SeededRandom(7).uint64(4)).all())
    True
    """

    def __init__(self, seed: int) -> None:
        self._generator = np.random.Generator(np.random.PCG64(seed))

    def uint64(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` words from the seeded generator."""
        _check_count(n)
        words: npt.NDArray[np.uint64] = self._generator.bit_generator.random_raw(n)
        return words


#: The source used when a caller does not pass one.
default_source: RandomSource = SystemRandom()


def _random_uints(source: RandomSource, n: int, width: int) -> UIntArray:
    """``n`` uniform unsigned integers of ``width`` bits (16, 32 or 64), from packed words."""
    per_word = 64 // width
    count = -(-n // per_word)
    words = source.uint64(count)
    if words.dtype != np.uint64 or words.shape != (count,):
        raise InternalError(f"random source returned {words.dtype} {words.shape}, expected "
                            f"uint64 ({count},). This is probably a bug in dpsql.")
    return words.view(_UINT_DTYPES[width])[:n]


def _random_bits(source: RandomSource, n: int) -> BoolArray:
    """``n`` fair coin flips, 64 per word."""
    words = _random_uints(source, -(-n // 64), 64)
    return np.unpackbits(words.view(np.uint8))[:n].view(np.bool_)


# ---------------------------------------------------------------------- exact primitives


def uniform_below(source: RandomSource, bound: int | IntArray, n: int) -> IntArray:
    """Exactly uniform integers in ``[0, bound)``, by rejection (no modulo bias).

    A draw ``u`` of w bits is kept only when ``u < 2**w - (2**w mod bound)``, a multiple
    of ``bound``; then ``u mod bound`` is exactly uniform. Bounds below ``2**12`` (``2**28``)
    use 16-bit (32-bit) draws, so at most 1/16 of draws are rejected and few bytes are read.

    Args:
        source: Where the random words come from.
        bound: One bound for all, or an int64 array of ``n`` bounds; ``1 <= bound < 2**63``.
        n: How many integers.

    Returns:
        An int64 array of ``n`` integers, element ``i`` uniform in ``[0, bound[i])``.

    >>> uniform_below(SeededRandom(1), 1, 3).tolist()
    [0, 0, 0]
    """
    _check_count(n)
    if isinstance(bound, np.ndarray):
        if bound.shape != (n,) or bound.dtype.kind not in "iu":
            raise InternalError(f"uniform_below needs {n} integer bounds, got {bound.dtype} "
                                f"{bound.shape}. This is probably a bug in dpsql.")
        if n and (bound.min() < 1 or bound.max() > _INT64_MAX):
            raise InternalError("uniform_below bounds must be in [1, 2**63). "
                                "This is probably a bug in dpsql.")
        return _uniform_below_array(source, bound.astype(np.int64)).astype(np.int64)
    _check_int("bound", bound, 1, _INT64_MAX)
    return _uniform_below_scalar(source, int(bound), n).astype(np.int64)


def _width_for(bound: int) -> int:
    """The draw width (bits) used for bounds up to ``bound``: rejection stays below 1/16."""
    if bound <= 1 << 12:
        return 16
    return 32 if bound <= 1 << 28 else 64


def _small_ints(draws: UIntArray) -> npt.NDArray[np.integer]:
    """Reduced draws as a type that compares exactly with int64: uint16/uint32 as they are,
    uint64 (always below 2**63 here) reinterpreted as int64 for free."""
    return draws.view(np.int64) if draws.dtype == np.uint64 else draws


def _uniform_below_scalar(source: RandomSource, bound: int, n: int) -> npt.NDArray[np.integer]:
    """``uniform_below`` with one bound for every element, as uint16, uint32 or int64."""
    width = _width_for(bound)
    dtype = _UINT_DTYPES[width]
    modulus = dtype(bound)
    draws = _random_uints(source, n, width)
    out = draws % modulus
    limit = (1 << width) - (1 << width) % bound  # accept draws below this
    if limit < 1 << width:
        cap = dtype(limit - 1)
        redo = np.flatnonzero(draws > cap)
        while redo.size:
            draws = _random_uints(source, redo.size, width)
            ok = draws <= cap
            out[redo[ok]] = draws[ok] % modulus
            redo = redo[~ok]
    return _small_ints(out)


def _uniform_below_array(source: RandomSource, bounds: IntArray) -> npt.NDArray[np.integer]:
    """``uniform_below`` with one bound per element (``1 <= bounds < 2**63``)."""
    if bounds.size == 0:
        return np.zeros(0, dtype=np.int64)
    width = _width_for(int(bounds.max()))
    moduli = bounds.astype(_UINT_DTYPES[width])
    caps = ~(((~moduli) + 1) % moduli)  # 2**w - 1 - (2**w mod bound): accept draws <= cap
    draws = _random_uints(source, bounds.size, width)
    out = draws % moduli
    redo = np.flatnonzero(draws > caps)
    while redo.size:
        draws = _random_uints(source, redo.size, width)
        ok = draws <= caps[redo]
        kept = redo[ok]
        out[kept] = draws[ok] % moduli[kept]
        redo = redo[~ok]
    return _small_ints(out)


def _bernoulli_scaled(source: RandomSource, num: IntArray, den: IntArray | int,
                      k: int) -> BoolArray:
    """Exact Bernoulli(num / (den * k)) for ``0 <= num <= den``, without overflow.

    When ``den * k`` fits int64 one uniform draw below it decides; otherwise the
    probability is the product of two independent events, ``U(den) < num`` and ``U(k) == 0``.
    """
    n = num.size
    if isinstance(den, int):
        if den <= _INT64_MAX // k:
            return _uniform_below_scalar(source, den * k, n) < num
        first = _uniform_below_scalar(source, den, n) < num
        return first & (_uniform_below_scalar(source, k, n) == 0)
    fits = den <= _INT64_MAX // k
    if fits.all():
        return _uniform_below_array(source, den * k) < num
    out = np.empty(n, dtype=np.bool_)
    small, large = np.flatnonzero(fits), np.flatnonzero(~fits)
    out[small] = _uniform_below_array(source, den[small] * k) < num[small]
    first = _uniform_below_array(source, den[large]) < num[large]
    out[large] = first & (_uniform_below_scalar(source, k, large.size) == 0)
    return out


def _bernoulli_exp_unit(source: RandomSource, num: IntArray, den: IntArray | int) -> BoolArray:
    """Bernoulli(exp(-num/den)) for ``0 <= num <= den`` (CKS Algorithm 1, gamma in [0, 1]).

    K = 1; while Bernoulli(gamma / K) succeeds, K += 1; succeed when K ends odd
    (P[K > k] = gamma^k / k!, so P[K odd] = exp(-gamma)). Every element still looping in a
    round has the same K, so K is one Python int per round.
    """
    result = np.ones(num.size, dtype=np.bool_)  # gamma = 0 stops at K = 1: success
    if isinstance(den, int) and den <= _TWO_ROUND_DEN_LIMIT:
        active, k = _first_two_rounds(source, num, den, result), 3
    else:
        active, k = np.flatnonzero(num > 0), 1
    while active.size:
        den_active = den if isinstance(den, int) else den[active]
        going_on = _bernoulli_scaled(source, num[active], den_active, k)
        result[active[~going_on]] = k % 2 == 1
        active = active[going_on]
        k += 1
    return result


#: ``2 * den**2`` fits int64 up to this denominator.
_TWO_ROUND_DEN_LIMIT = math.isqrt(_INT64_MAX // 2)


def _first_two_rounds(source: RandomSource, num: IntArray, den: int,
                      result: BoolArray) -> IntArray:
    """Rounds K = 1 and K = 2 of CKS Algorithm 1 from one uniform U in [0, 2 den^2).

    The two Bernoullis both succeed with probability gamma * gamma / 2, the first with
    probability gamma: so K > 1 iff U < 2 den num and K > 2 iff U < num^2 (nested events,
    num <= den). Writes the outcome of elements that stop (K = 1 odd, K = 2 even) into
    ``result`` and returns the indices of those that go on with K = 3.
    """
    u = _uniform_below_scalar(source, 2 * den * den, num.size)
    past_one = u < num * (2 * den)
    past_two = u < num * num
    result[:] = ~past_one | past_two  # K = 1: success; K = 2: failure; K > 2: decided later
    return np.flatnonzero(past_two)


_FACTORIAL_N = 10
#: 10!/k! for k = 10, 9, ..., 1 (ascending): Bernoulli(exp(-1)) has K > k iff U < 10!/k!.
_FACTORIAL_STEPS = np.array([math.factorial(_FACTORIAL_N) // math.factorial(k)
                             for k in range(_FACTORIAL_N, 0, -1)], dtype=np.int64)


def _bernoulli_exp_minus_one(source: RandomSource, n: int) -> BoolArray:
    """``n`` draws of Bernoulli(exp(-1)): CKS Algorithm 1 with gamma = 1.

    With gamma = 1, P[K > k] = 1/k!. One U uniform in [0, 10!) gives the first ten
    rounds at once: K > k iff U < 10!/k! (nested events of probability 1/k!), so
    K = 1 + #{k <= 10 : U < 10!/k!}. Only U = 0 (K > 10, probability 2.8e-7) goes on
    with one Bernoulli(1/K) per round.
    """
    u = _uniform_below_scalar(source, math.factorial(_FACTORIAL_N), n)
    passed = _FACTORIAL_N - np.searchsorted(_FACTORIAL_STEPS, u, side="right")  # = K - 1
    result = passed % 2 == 0  # K odd
    active = np.flatnonzero(passed == _FACTORIAL_N)
    k = _FACTORIAL_N + 1
    while active.size:
        going_on = _uniform_below_scalar(source, k, active.size) == 0
        result[active[~going_on]] = k % 2 == 1
        active = active[going_on]
        k += 1
    return result


def _successes_before_failure(source: RandomSource, n: int) -> IntArray:
    """For each of ``n`` elements, how many Bernoulli(exp(-1)) succeed before one fails."""
    counts = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        active = active[_bernoulli_exp_minus_one(source, active.size)]
        counts[active] += 1
    return counts


def _bernoulli_exp_parts(source: RandomSource, whole: IntArray, rem: IntArray,
                         den: IntArray | int) -> BoolArray:
    """Bernoulli(exp(-(whole + rem/den))) for ``whole >= 0``, ``0 <= rem < den``.

    exp(-gamma) = exp(-1)^floor(gamma) * exp(-frac(gamma)): ``whole`` independent
    Bernoulli(exp(-1)) must all succeed (an element stops at its first failure), then one
    Bernoulli(exp(-rem/den)).
    """
    alive = np.ones(whole.size, dtype=np.bool_)
    active = np.flatnonzero(whole > 0)
    left = whole[active]
    while active.size:
        ok = _bernoulli_exp_minus_one(source, active.size)
        alive[active[~ok]] = False
        active, left = active[ok], left[ok] - 1
        more = left > 0
        active, left = active[more], left[more]
    out = np.zeros(whole.size, dtype=np.bool_)
    idx = np.flatnonzero(alive)
    out[idx] = _bernoulli_exp_unit(source, rem[idx], den if isinstance(den, int) else den[idx])
    return out


def bernoulli_exp(source: RandomSource, num: npt.ArrayLike, den: npt.ArrayLike) -> BoolArray:
    """Exact Bernoulli(exp(-num/den)) draws, elementwise (CKS 2020, Algorithm 1).

    Args:
        source: Where the random words come from.
        num: Integer numerators, ``0 <= num < 2**63``.
        den: Integer denominators, ``1 <= den < 2**63``; broadcast against ``num``.

    Returns:
        A boolean array of the broadcast shape: True with probability exp(-num/den).

    >>> bernoulli_exp(SeededRandom(0), [0, 0], 5).tolist()
    [True, True]
    """
    nums, dens = np.broadcast_arrays(_int_array(num), _int_array(den))
    if nums.dtype.kind not in "iu" or dens.dtype.kind not in "iu":
        raise InternalError(f"bernoulli_exp needs integers, got {nums.dtype} / {dens.dtype}. "
                            "This is probably a bug in dpsql.")
    nums, dens = nums.astype(np.int64).ravel(), dens.astype(np.int64).ravel()
    if nums.size and (nums.min() < 0 or dens.min() < 1):
        raise InternalError("bernoulli_exp needs num >= 0 and den >= 1. "
                            "This is probably a bug in dpsql.")
    whole, rem = np.divmod(nums, dens)
    same = dens.size > 0 and bool((dens == dens[0]).all())
    out = _bernoulli_exp_parts(source, whole, rem, int(dens[0]) if same else dens)
    return out.reshape(np.broadcast_shapes(np.shape(num), np.shape(den)))


def _int_array(values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """``values`` as an array; an empty one (``[]`` is float64 to numpy) as int64."""
    array = np.asarray(values)
    return array.astype(np.int64) if array.size == 0 else array


# -------------------------------------------------------------------------- samplers


def sample_discrete_laplace(source: RandomSource, t: int, s: int, n: int) -> IntArray:
    """Exact discrete Laplace draws, P(z) proportional to exp(-|z| s / t) (CKS Algorithm 2).

    Repeat until accepted: U uniform in [0, t), kept with probability exp(-U/t);
    V = successes of Bernoulli(exp(-1)) before the first failure; Y = (U + t V) // s;
    a fair sign B; (B = 1, Y = 0) is rejected; otherwise Z = (1 - 2B) Y.

    Args:
        source: Where the random words come from.
        t: Scale numerator, ``1 <= t < 2**62``.
        s: Scale denominator, ``1 <= s < 2**62``.
        n: How many draws.

    Returns:
        An int64 array of ``n`` independent draws.

    Raises:
        InternalError: for bad parameters, or if a draw does not fit int64 (possible only
            for scales above 2**56, which :class:`DiscreteLaplace` refuses).

    >>> sample_discrete_laplace(SeededRandom(0), 1, 1, 4).dtype
    dtype('int64')
    """
    _check_int("t", t, 1, _PARAM_LIMIT - 1)
    _check_int("s", s, 1, _PARAM_LIMIT - 1)
    _check_count(n)
    t, s = int(t), int(s)
    return _sample_by_rejection(lambda tries: _laplace_attempt(source, t, s, tries), n, 0.6)


def _sample_by_rejection(attempt: Callable[[int], IntArray], n: int, rate: float) -> IntArray:
    """``n`` draws from ``attempt(tries)``, which returns the accepted values of ``tries``
    independent proposals, in proposal order.

    Each round proposes a little more than the expected need (from the acceptance rate
    seen so far) and keeps the first accepted values. Which values are kept depends only
    on their positions, never on their values, so the result is iid from the target.
    """
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = n - filled
        tries = min(math.ceil(want / rate * 1.05) + 16, 20 * want + 64)
        values = attempt(tries)
        take = min(values.size, want)
        out[filled:filled + take] = values[:take]
        filled += take
        rate = max(values.size / tries, 0.05)
    return out


def _laplace_attempt(source: RandomSource, t: int, s: int, n: int) -> IntArray:
    """``n`` proposals of CKS Algorithm 2; returns the accepted values in order."""
    u = _uniform_below_scalar(source, t, n).astype(np.int64)
    keep = np.flatnonzero(_bernoulli_exp_unit(source, u, t))
    v = _successes_before_failure(source, keep.size)
    y = _laplace_magnitude(u[keep], v, t, s)
    negative = _random_bits(source, keep.size)
    ok = ~(negative & (y == 0))
    return np.where(negative, -y, y)[ok]


def _laplace_magnitude(u: IntArray, v: IntArray, t: int, s: int) -> IntArray:
    """``(u + t * v) // s`` exactly; Python ints for the (astronomically rare) large ``v``.

    With ``u <= t - 1`` and ``v <= (2**63 - 1 - (t - 1)) // t`` the sum fits int64. A larger
    v has probability exp(-v); for t below 2**40 that is exp(-8 million).
    """
    v_safe = (_INT64_MAX - (t - 1)) // t
    if v.size == 0 or int(v.max()) <= v_safe:
        return (u + t * v) // s
    safe = v <= v_safe
    out = np.empty(u.size, dtype=np.int64)
    out[safe] = (u[safe] + t * v[safe]) // s
    for i in np.flatnonzero(~safe):  # rare path: exact Python integers
        magnitude = (int(u[i]) + t * int(v[i])) // s
        if magnitude > _INT64_MAX:
            raise InternalError(f"discrete Laplace draw {magnitude} does not fit int64 (scale "
                                f"{t}/{s}). Use a coarser lattice. This is probably a bug.")
        out[i] = magnitude
    return out


def sample_discrete_gaussian(source: RandomSource, t: int, m: int, n: int) -> IntArray:
    """Exact discrete Gaussian draws, P(z) proportional to exp(-z^2 / (2 t m)) (CKS Alg. 3).

    sigma^2 = t m. Repeat until accepted: Y ~ discrete Laplace of scale t, kept with
    probability exp(-(|Y| - m)^2 / (2 t m)) (sigma^2 / t = m). Correct for any t; about
    1.3 Laplace draws per output when t is near sigma.

    Args:
        source: Where the random words come from.
        t: Laplace scale, ideally about sigma; ``t >= 1``.
        m: ``sigma^2 / t``; ``m >= 1`` and ``2 t m < 2**63``.
        n: How many draws.

    Returns:
        An int64 array of ``n`` independent draws.

    >>> sample_discrete_gaussian(SeededRandom(0), 3, 3, 5).shape
    (5,)
    """
    _check_int("t", t, 1, _PARAM_LIMIT - 1)
    _check_int("m", m, 1, _PARAM_LIMIT - 1)
    _check_count(n)
    t, m = int(t), int(m)
    _check_gaussian_params(t, m)
    return _sample_by_rejection(lambda tries: _gaussian_attempt(source, t, m, tries), n, 0.7)


def _gaussian_attempt(source: RandomSource, t: int, m: int, n: int) -> IntArray:
    """``n`` proposals of CKS Algorithm 3; returns the accepted values in order."""
    y = sample_discrete_laplace(source, t, 1, n)
    den = 2 * t * m
    whole, rem = _gaussian_exponent(y, m, den)
    return y[_bernoulli_exp_parts(source, whole, rem, den)]


def _check_gaussian_params(t: int, m: int) -> None:
    """2 t m must fit int64, and t must lie in [sigma/2, 2 sigma + 1]: further out, CKS
    Algorithm 3 accepts so few proposals that sampling would effectively hang."""
    if 2 * t * m > _INT64_MAX:
        raise InternalError(f"discrete Gaussian sigma^2 = {t}*{m} is too large (2 sigma^2 "
                            "must fit int64). This is probably a bug in dpsql.")
    if m > 4 * t or (t - 1) ** 2 > 4 * t * m:
        raise InternalError(f"discrete Gaussian t={t} is too far from sigma={math.sqrt(t * m):.4g}"
                            " (need sigma/2 <= t <= 2 sigma + 1). This is probably a bug.")


def _gaussian_exponent(y: IntArray, m: int, den: int) -> tuple[IntArray, IntArray]:
    """``divmod((|y| - m)^2, den)`` exactly; Python ints where the square overflows int64.

    |y| - m lies in (-2**62, 2**63), so its absolute value fits. The square overflows only
    for | |y| - m | > 3.04e9, i.e. more than 45 Laplace scales out when sigma <= 2**26.
    """
    distance = np.abs(np.abs(y) - m)
    safe = distance <= _SQRT_INT64_MAX
    if safe.all():
        return np.divmod(distance * distance, den)
    whole, rem = np.empty(y.size, dtype=np.int64), np.empty(y.size, dtype=np.int64)
    whole[safe], rem[safe] = np.divmod(distance[safe] ** 2, den)
    for i in np.flatnonzero(~safe):  # rare path: exact Python integers
        q, r = divmod(int(distance[i]) ** 2, den)
        whole[i], rem[i] = min(q, _WHOLE_CAP), r
    return whole, rem


# ----------------------------------------------------------------------- noise objects


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace noise on the integers: P(z) = (1-p)/(1+p) p^|z|, p = exp(-s/t).

    Its scale is ``t / s``; with scale >= D1 / epsilon it makes an integer query of L1
    sensitivity D1 epsilon-DP (the same privacy loss bound as the continuous Laplace).

    >>> noise = DiscreteLaplace(1, 1)
    >>> round(noise.std, 4), noise.quantile_abs(0.95)
    (1.357, 3.0)
    """

    t: int
    s: int
    name: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        _check_int("t", self.t, 1, _PARAM_LIMIT - 1)
        _check_int("s", self.s, 1, _PARAM_LIMIT - 1)
        object.__setattr__(self, "t", int(self.t))  # numpy integers become Python ints
        object.__setattr__(self, "s", int(self.s))
        if self.t > _MAX_LAPLACE_SCALE * self.s:
            raise InternalError(f"discrete Laplace scale {self.t}/{self.s} exceeds 2**56 "
                                "lattice steps; use a coarser lattice. This is probably a bug.")

    @property
    def scale(self) -> float:
        """``t / s``: P(z) is proportional to exp(-|z| / scale)."""
        return self.t / self.s

    @property
    def std(self) -> float:
        """The exact standard deviation, sqrt(2p) / (1 - p)."""
        ratio = self.s / self.t
        return math.sqrt(2 * math.exp(-ratio)) / -math.expm1(-ratio)

    def sample(self, n: int, source: RandomSource | None = None) -> IntArray:
        """``n`` independent draws (int64), from ``source`` or the system CSPRNG."""
        chosen = default_source if source is None else source
        return sample_discrete_laplace(chosen, self.t, self.s, n)

    def quantile_abs(self, confidence: float = 0.95) -> float:
        """The smallest integer q with P(|Z| <= q) >= confidence, from the exact cdf."""
        _check_confidence(confidence)
        ratio = self.s / self.t
        p = math.exp(-ratio)

        def tail(q: int) -> float:  # P(|Z| > q) = 2 p^(q+1) / (1+p)
            return 2 * math.exp(-ratio * (q + 1)) / (1 + p)

        target = 1 - confidence
        q = max(0, math.ceil(math.log(target * (1 + p) / 2) / -ratio) - 1)
        while q > 0 and tail(q - 1) <= target:
            q -= 1
        while tail(q) > target:
            q += 1
        return float(q)


@dataclass(frozen=True)
class DiscreteGaussian:
    """Discrete Gaussian noise on the integers: P(z) proportional to exp(-z^2 / (2 sigma^2)).

    ``sigma^2 = t * m`` (t is the Laplace scale the sampler proposes from, near sigma).
    With sigma >= D2 / mu it makes a query of L2 sensitivity D2 about mu-GDP; for one
    integer-valued query the exact (epsilon, delta) profile is CKS Theorem 7.

    >>> noise = DiscreteGaussian(3, 6)
    >>> round(noise.sigma, 4), noise.quantile_abs(0.95)
    (4.2426, 8.0)
    """

    t: int
    m: int
    name: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        _check_int("t", self.t, 1, _PARAM_LIMIT - 1)
        _check_int("m", self.m, 1, _PARAM_LIMIT - 1)
        object.__setattr__(self, "t", int(self.t))  # numpy integers become Python ints
        object.__setattr__(self, "m", int(self.m))
        _check_gaussian_params(self.t, self.m)

    @property
    def sigma(self) -> float:
        """The sigma parameter, sqrt(t * m)."""
        return math.sqrt(self.t * self.m)

    @property
    def std(self) -> float:
        """The exact standard deviation (summed for sigma < 64, else sigma).

        By Poisson summation the discrete variance differs from sigma^2 by a factor
        1 - O(sigma^2 exp(-2 pi^2 sigma^2)), below 1e-30 once sigma >= 2.
        """
        if self.sigma >= 64:
            return self.sigma
        z, weights = _gaussian_half_weights(self.t * self.m)
        return math.sqrt(2 * math.fsum(z * z * weights) / (2 * math.fsum(weights) - 1))

    def sample(self, n: int, source: RandomSource | None = None) -> IntArray:
        """``n`` independent draws (int64), from ``source`` or the system CSPRNG."""
        chosen = default_source if source is None else source
        return sample_discrete_gaussian(chosen, self.t, self.m, n)

    def quantile_abs(self, confidence: float = 0.95) -> float:
        """The smallest integer q with P(|Z| <= q) >= confidence.

        Exact from the summed pmf for sigma <= 2**16. Beyond, the continuous quantile:
        P(|Z| <= q) = P(|X| <= q + 1/2) up to a relative error of order 1/sigma^2 < 1e-9,
        so q = ceil(sigma * Phi^-1((1 + confidence) / 2) - 1/2), which can differ from
        the exact answer only when that value is within about 1e-9 of an integer.
        """
        _check_confidence(confidence)
        if self.sigma > 2**16:
            z = NormalDist().inv_cdf((1 + confidence) / 2)
            return float(max(0, math.ceil(self.sigma * z - 0.5)))
        _, weights = _gaussian_half_weights(self.t * self.m)
        total = 2 * weights.sum() - 1  # weights[0] = 1 counts once
        tails = 2 * np.cumsum(weights[::-1])[::-1] / total  # tails[q] = P(|Z| >= q)
        beyond = np.append(tails[1:], 0.0)  # P(|Z| > q)
        return float(np.argmax(beyond <= 1 - confidence))


def _gaussian_half_weights(variance: int) -> tuple[npt.NDArray[np.float64],
                                                   npt.NDArray[np.float64]]:
    """``z = 0, 1, ..., 12 sigma + 2`` and exp(-z^2 / (2 sigma^2)); the rest is < 1e-31."""
    z = np.arange(0, math.ceil(12 * math.sqrt(variance)) + 3, dtype=np.float64)
    return z, np.exp(-z * z / (2 * variance))


# ------------------------------------------------------------------------- calibration


def laplace_noise(sensitivity: int, epsilon: float, denominator_bits: int = 10) -> DiscreteLaplace:
    """Discrete Laplace noise of scale at least ``sensitivity / epsilon``, exactly.

    ``s = 2**denominator_bits`` and ``t = ceil(sensitivity * s / epsilon)`` in exact rational
    arithmetic (epsilon taken as the exact value of the float), so ``t / s`` never falls
    below the scale epsilon-DP needs. Sensitivity 0 gives the smallest noise, scale 1/s.

    Args:
        sensitivity: The L1 sensitivity, an integer number of lattice steps, ``>= 0``.
        epsilon: The privacy parameter, finite and ``> 0``.
        denominator_bits: How finely the scale is rounded up (relative error ``<= 2**-bits``
            of the scale for scales of at least one step).

    >>> laplace_noise(1, 1.0)
    DiscreteLaplace(t=1024, s=1024)
    >>> laplace_noise(3, 0.5, denominator_bits=0)
    DiscreteLaplace(t=6, s=1)
    """
    _check_int("sensitivity", sensitivity, 0, _PARAM_LIMIT - 1)
    _check_int("denominator_bits", denominator_bits, 0, 60)
    _check_positive("epsilon", epsilon)
    s = 1 << denominator_bits
    t = max(1, math.ceil(Fraction(int(sensitivity) * s) / _exact(epsilon)))
    if t >= _PARAM_LIMIT:
        raise InternalError(f"Laplace scale {sensitivity}/{epsilon} is too large for the "
                            "lattice. This is probably a bug in dpsql.")
    return DiscreteLaplace(t, s)


def gaussian_noise(sensitivity_l2: float, mu: float) -> DiscreteGaussian:
    """Discrete Gaussian noise that is mu-GDP for the given L2 sensitivity.

    A continuous Gaussian needs sigma_req = sensitivity_l2 / mu. The discrete Gaussian
    is not exactly that private: its exact (epsilon, delta) profile (CKS Theorem 7) can
    exceed the mu-GDP curve, by a factor up to 34 at sigma < 1 and about 1 + 1/(12 sigma^2)
    for larger sigma (a Sheppard-like correction: it behaves like a continuous Gaussian of
    variance sigma^2 - 1/12). So the variance gets an additive margin
    :data:`DISCRETE_VARIANCE_MARGIN` (1/6) on top of sigma_req^2; with it the exact
    discrete profile stayed below the mu-GDP curve for every integer sensitivity, sigma
    and epsilon we checked (sigma 0.25 to 200, sensitivity 1 to 20, dense epsilon grids),
    where 0.1 was already enough. This is a numerical check, not a proof. Per-coordinate
    GDP then composes exactly across the coordinates of a vector query.

    sigma_req gets a relative margin of 1e-9 for float error; then ``t * m >= sigma_req^2
    + 1/6`` in exact rational arithmetic. For sigma below 1024, t is the value in
    [0.75 sigma, 1.5 sigma] that makes ``t * m`` smallest (the sampler still accepts two
    thirds of its proposals there); otherwise ``t = ceil(sigma)`` (inflation below 1/sigma).

    Args:
        sensitivity_l2: The L2 sensitivity in lattice steps, finite and ``>= 0``.
        mu: The Gaussian-DP parameter, finite and ``> 0``.

    >>> gaussian_noise(1, 1.0)
    DiscreteGaussian(t=1, m=2)
    >>> gaussian_noise(10, 1.0)
    DiscreteGaussian(t=8, m=13)
    """
    _check_nonnegative("sensitivity_l2", sensitivity_l2)
    _check_positive("mu", mu)
    sigma = _exact(sensitivity_l2) / _exact(mu) * (1 + Fraction(1, 10**9))
    t, m = _factor_variance(sigma * sigma + DISCRETE_VARIANCE_MARGIN)
    if 2 * t * m > _INT64_MAX:
        raise InternalError(f"Gaussian sigma {float(sigma):.4g} is too large for the lattice. "
                            "This is probably a bug in dpsql.")
    return DiscreteGaussian(t, m)


#: Added to sigma^2 by :func:`gaussian_noise` so the discrete Gaussian stays mu-GDP.
DISCRETE_VARIANCE_MARGIN = Fraction(1, 6)


def _factor_variance(variance: Fraction) -> tuple[int, int]:
    """Integers (t, m) with t * m >= variance, t near sigma, t * m as small as we can."""
    sigma = math.sqrt(variance)
    if sigma >= 1024:
        t = math.ceil(sigma)
        return t, max(1, math.ceil(variance / t))
    best: tuple[int, float, int, int] | None = None
    for t in range(max(1, math.ceil(0.75 * sigma)), math.ceil(1.5 * sigma) + 1):
        m = max(1, math.ceil(variance / t))
        key = (t * m, abs(t - sigma), t, m)
        best = key if best is None or key < best else best
    if best is None:
        raise InternalError(f"no factorisation for variance {variance}. This is a bug.")
    return best[2], best[3]


def _normal_cdf(x: float) -> float:
    """Phi(x), accurate in both tails (erfc)."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


def gdp_delta(mu: float, epsilon: float) -> float:
    """The smallest delta for which mu-GDP is (epsilon, delta)-DP.

    delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2) (Dong, Roth and
    Su 2019, Corollary 2.13).

    >>> round(gdp_delta(1.0, 1.0), 6)
    0.126937
    """
    _check_positive("mu", mu)
    _check_nonnegative("epsilon", epsilon)
    first = _normal_cdf(-epsilon / mu + mu / 2)
    lower = _normal_cdf(-epsilon / mu - mu / 2)
    if lower == 0.0:
        return max(0.0, first)
    second = math.exp(epsilon + math.log(lower)) if epsilon > 700 else math.exp(epsilon) * lower
    return max(0.0, first - second)


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu whose mu-GDP guarantee implies (epsilon, delta)-DP.

    Bisection on log(mu) to a relative width of 1e-12; the lower end is returned, so
    ``gdp_delta(gdp_mu(e, d), e) <= d``.

    >>> round(1 / gdp_mu(1.0, 1e-6), 4)
    4.2247
    """
    _check_nonnegative("epsilon", epsilon)
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise InternalError(f"delta must be in (0, 1), got {delta!r}. "
                            "This is probably a bug in dpsql.")
    lo, hi = _bracket_mu(epsilon, delta)
    while hi / lo > 1 + 1e-12:
        mid = math.sqrt(lo * hi)
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def _bracket_mu(epsilon: float, delta: float) -> tuple[float, float]:
    """(lo, hi = 2 lo) with gdp_delta(lo) <= delta < gdp_delta(hi)."""
    mu = 1.0
    if gdp_delta(mu, epsilon) <= delta:
        for _ in range(2000):
            if gdp_delta(2 * mu, epsilon) > delta:
                return mu, 2 * mu
            mu *= 2
    else:
        for _ in range(2000):
            mu /= 2
            if gdp_delta(mu, epsilon) <= delta:
                return mu, 2 * mu
    raise InternalError(f"cannot calibrate GDP for epsilon={epsilon}, delta={delta}. "
                        "This is probably a bug in dpsql.")


def gaussian_sigma(sensitivity_l2: float, epsilon: float, delta: float) -> float:
    """The smallest Gaussian sigma that makes L2 sensitivity (epsilon, delta)-DP.

    >>> round(gaussian_sigma(1, 1.0, 1e-6), 4)
    4.2247
    """
    _check_nonnegative("sensitivity_l2", sensitivity_l2)
    return sensitivity_l2 / gdp_mu(epsilon, delta)


# -------------------------------------------------------------------------- validation


def _check_int(name: str, value: object, low: int, high: int) -> None:
    """Raise unless ``value`` is an integer (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InternalError(f"{name} must be an integer, got {value!r}. "
                            "This is probably a bug in dpsql.")
    if not low <= int(value) <= high:
        raise InternalError(f"{name} must be in [{low}, {high}], got {value}. "
                            "This is probably a bug in dpsql.")


def _exact(value: float) -> Fraction:
    """The exact rational value of an int or float (ints never pass through a float)."""
    if isinstance(value, (int, np.integer)):
        return Fraction(int(value))
    return Fraction(float(value))


def _check_count(n: object) -> None:
    _check_int("n", n, 0, _INT64_MAX)


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InternalError(f"{name} must be a number, got {value!r}. "
                            "This is probably a bug in dpsql.")
    number = float(value)
    if not math.isfinite(number):
        raise InternalError(f"{name} must be finite, got {value!r}. "
                            "This is probably a bug in dpsql.")
    return number


def _check_positive(name: str, value: object) -> None:
    if _check_real(name, value) <= 0:
        raise InternalError(f"{name} must be > 0, got {value!r}. "
                            "This is probably a bug in dpsql.")


def _check_nonnegative(name: str, value: object) -> None:
    if _check_real(name, value) < 0:
        raise InternalError(f"{name} must be >= 0, got {value!r}. "
                            "This is probably a bug in dpsql.")


def _check_confidence(confidence: float) -> None:
    if not 0 < _check_real("confidence", confidence) < 1:
        raise InternalError(f"confidence must be in (0, 1), got {confidence!r}. "
                            "This is probably a bug in dpsql.")

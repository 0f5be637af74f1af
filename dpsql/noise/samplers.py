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

The noise objects built on them are in :mod:`dpsql.noise.discrete`; randomness comes from
a :class:`~dpsql.noise.source.RandomSource`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError
from dpsql.noise._checks import _INT64_MAX, _PARAM_LIMIT, _check_count, _check_int
from dpsql.noise.source import (
    BoolArray,
    IntArray,
    RandomSource,
    _random_bits,
    _uniform_below_array,
    _uniform_below_scalar,
)

__all__ = ["bernoulli_exp", "sample_discrete_gaussian", "sample_discrete_laplace", "sample_discrete_laplace_batch"]

#: Largest d with d * d <= _INT64_MAX.
_SQRT_INT64_MAX = math.isqrt(_INT64_MAX)
#: The integer part of a Bernoulli(exp(-gamma)) exponent is capped here. Changing gamma
#: from a larger value to this one changes the success probability by less than
#: exp(-2**62): the sampler would have to see 2**62 successes of Bernoulli(exp(-1)) in a row.
_WHOLE_CAP = 2**62
#: A discrete Laplace scale t / s at most this keeps every sample inside int64 except with
#: probability below exp(-127) (|Z| >= 2**63 needs 127 successes of Bernoulli(exp(-1))).
_MAX_LAPLACE_SCALE = 2**56


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
        both: BoolArray = first & (_uniform_below_scalar(source, k, n) == 0)
        return both
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
    round has the same K, so K is one Python int per round. Rounds go :data:`_ROUND_BLOCK`
    at a time (:func:`_rounds_passed`) when ``den * K`` fits int64, one at a time otherwise.
    """
    result = np.ones(num.size, dtype=np.bool_)  # gamma = 0 stops at K = 1: success
    if isinstance(den, int) and den <= _TWO_ROUND_DEN_LIMIT:
        active, k = _first_two_rounds(source, num, den, result), 3
    else:
        active, k = np.flatnonzero(num > 0), 1
    while active.size:
        den_active = den if isinstance(den, int) else den[active]
        largest = den_active if isinstance(den_active, int) else int(den_active.max())
        if active.size <= _BLOCK_BELOW and largest <= _INT64_MAX // (k + _ROUND_BLOCK - 1):
            passed = _rounds_passed(source, num[active], den_active, k)
            stop = passed < _ROUND_BLOCK
            result[active[stop]] = (k + passed[stop]) % 2 == 1
            active, k = active[~stop], k + _ROUND_BLOCK
            continue
        going_on = _bernoulli_scaled(source, num[active], den_active, k)
        result[active[~going_on]] = k % 2 == 1
        active = active[going_on]
        k += 1
    return result


#: Rounds of CKS Algorithm 1 (and Bernoulli(exp(-1)) trials of a geometric count) drawn at
#: once per element: the draws past an element's first failure are never looked at, so the
#: outcome is that of the rounds drawn one by one, in a third as many vector passes.
_ROUND_BLOCK = 3
#: ... while at most this many elements are still going: a small query's noise is all
#: per-call overhead, but a large draw would read about twice the random words (most
#: elements stop in their first round), 1.7x the time at 400,000 draws.
_BLOCK_BELOW = 4096


def _rounds_passed(source: RandomSource, num: IntArray, den: IntArray | int, k: int) -> IntArray:
    """How many of rounds ``k .. k + _ROUND_BLOCK - 1`` (Bernoulli(num / (den k')) each,
    independent) each element passes before its first failure (``_ROUND_BLOCK``: all).
    ``den * (k + _ROUND_BLOCK - 1)`` must fit int64."""
    steps = np.arange(k, k + _ROUND_BLOCK, dtype=np.int64)
    dens = np.broadcast_to(np.asarray(den, dtype=np.int64).reshape(-1, 1) if not isinstance(den, int) else den,
                           (num.size, _ROUND_BLOCK))
    u = _uniform_below_array(source, (dens * steps).ravel()).reshape(num.size, _ROUND_BLOCK)
    return _leading_true(u < num.reshape(-1, 1))


def _leading_true(success: BoolArray) -> IntArray:
    """Per row, how many entries are True before the first False (the row's length: all)."""
    passed: IntArray = np.where(success.all(axis=1), success.shape[1], success.argmin(axis=1))
    return passed


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
    result: BoolArray = passed % 2 == 0  # K odd
    active = np.flatnonzero(passed == _FACTORIAL_N)
    k = _FACTORIAL_N + 1
    while active.size:
        going_on = _uniform_below_scalar(source, k, active.size) == 0
        result[active[~going_on]] = k % 2 == 1
        active = active[going_on]
        k += 1
    return result


def _successes_before_failure(source: RandomSource, n: int) -> IntArray:
    """For each of ``n`` elements, how many Bernoulli(exp(-1)) succeed before one fails
    (trials drawn :data:`_ROUND_BLOCK` at a time per element while few are still going)."""
    counts = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        if active.size > _BLOCK_BELOW:  # one trial each
            active = active[_bernoulli_exp_minus_one(source, active.size)]
            counts[active] += 1
            continue
        trials = _bernoulli_exp_minus_one(source, active.size * _ROUND_BLOCK)
        passed = _leading_true(trials.reshape(active.size, _ROUND_BLOCK))
        counts[active] += passed
        active = active[passed == _ROUND_BLOCK]
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

    >>> from dpsql.noise.source import SeededRandom
    >>> bernoulli_exp(SeededRandom(0), [0, 0], 5).tolist()
    [True, True]
    """
    nums, dens = np.broadcast_arrays(_int_array(num), _int_array(den))
    if nums.dtype.kind not in "iu" or dens.dtype.kind not in "iu":
        raise InternalError(f"bernoulli_exp needs integers, got {nums.dtype} / {dens.dtype}.")
    nums, dens = nums.astype(np.int64).ravel(), dens.astype(np.int64).ravel()
    if nums.size and (nums.min() < 0 or dens.min() < 1):
        raise InternalError("bernoulli_exp needs num >= 0 and den >= 1.")
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

    >>> from dpsql.noise.source import SeededRandom
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
    signed: IntArray = np.where(negative, -y, y)[ok]
    return signed


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
                                f"{t}/{s}). Use a coarser lattice.")
        out[i] = magnitude
    return out


def sample_discrete_laplace_batch(source: RandomSource, scales: Sequence[tuple[int, int]],
                                  counts: Sequence[int]) -> list[IntArray]:
    """``counts[i]`` exact discrete Laplace draws of scale ``scales[i] = (t, s)`` for each
    i, as :func:`sample_discrete_laplace` draws them, but every scale's proposals made in
    one vectorised pass (one parameter per element): a query's noises of several scales
    cost one sampler's rounds of small numpy calls, not one per scale.

    Each round proposes, per scale still short, what :func:`_sample_by_rejection` would;
    a scale keeps its first accepted proposals in proposal order, so its draws are iid from
    its own distribution, independent of the other scales'.

    >>> from dpsql.noise.source import SeededRandom
    >>> [a.size for a in sample_discrete_laplace_batch(SeededRandom(0), [(3, 1), (5, 2)], [4, 0])]
    [4, 0]
    """
    if len(scales) != len(counts):
        raise InternalError(f"{len(scales)} scales for {len(counts)} counts.")
    for (scale_t, scale_s), n in zip(scales, counts):
        _check_int("t", scale_t, 1, _PARAM_LIMIT - 1)
        _check_int("s", scale_s, 1, _PARAM_LIMIT - 1)
        _check_count(n)
    outs = [np.empty(n, dtype=np.int64) for n in counts]
    filled, rates = [0] * len(counts), [0.6] * len(counts)
    while True:
        pending = [g for g, n in enumerate(counts) if filled[g] < n]
        if not pending:
            return outs
        tries = [min(math.ceil((counts[g] - filled[g]) / rates[g] * 1.05) + 16, 20 * (counts[g] - filled[g]) + 64)
                 for g in pending]
        t = np.repeat(np.array([int(scales[g][0]) for g in pending], dtype=np.int64), tries)
        s = np.repeat(np.array([int(scales[g][1]) for g in pending], dtype=np.int64), tries)
        distinct = list(dict.fromkeys((int(scales[g][0]), int(scales[g][1])) for g in pending))
        accepted, values = _laplace_attempt_each(source, t, s, distinct)
        start = 0
        for g, n_tries in zip(pending, tries):
            got = values[start:start + n_tries][accepted[start:start + n_tries]]
            start += n_tries
            take = min(got.size, counts[g] - filled[g])
            outs[g][filled[g]:filled[g] + take] = got[:take]
            filled[g] += take
            rates[g] = max(got.size / n_tries, 0.05)


def _laplace_attempt_each(source: RandomSource, t: IntArray, s: IntArray,
                          distinct: Sequence[tuple[int, int]]) -> tuple[BoolArray, IntArray]:
    """One proposal of CKS Algorithm 2 per element, element i of scale ``t[i] / s[i]``
    (``distinct``: every (t, s) pair that occurs): whether each was accepted, and its value."""
    u = _uniform_below_array(source, t).astype(np.int64)
    keep = np.flatnonzero(_bernoulli_exp_unit(source, u, t))
    v = _successes_before_failure(source, keep.size)
    y = np.empty(keep.size, dtype=np.int64)
    t_kept, s_kept, u_kept = t[keep], s[keep], u[keep]
    for scale_t, scale_s in distinct:  # exact, scale by scale
        at = np.flatnonzero((t_kept == scale_t) & (s_kept == scale_s))
        y[at] = _laplace_magnitude(u_kept[at], v[at], scale_t, scale_s)
    negative = _random_bits(source, keep.size)
    accepted = np.zeros(t.size, dtype=np.bool_)
    accepted[keep[~(negative & (y == 0))]] = True
    values = np.zeros(t.size, dtype=np.int64)
    values[keep] = np.where(negative, -y, y)
    return accepted, values


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

    >>> from dpsql.noise.source import SeededRandom
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
                            "must fit int64).")
    if m > 4 * t or (t - 1) ** 2 > 4 * t * m:
        raise InternalError(f"discrete Gaussian t={t} is too far from sigma={math.sqrt(t * m):.4g}"
                            " (need sigma/2 <= t <= 2 sigma + 1).")


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



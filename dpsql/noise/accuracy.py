"""From a plan's plain noise parameters (:class:`~dpsql.plan.LaplaceParams`,
:class:`~dpsql.plan.GaussianParams`) to the sampler that draws the noise and the accuracy
figures reports show.

The plan holds only the exact integers; :func:`sampler` builds the
:class:`~dpsql.noise.DiscreteLaplace` or :class:`~dpsql.noise.DiscreteGaussian` from them
(validated there, remembered per parameters), and :func:`params_of` goes back. Standard
deviations and quantiles are remembered per parameters too: the exact discrete Gaussian
quantile sums up to 12 sigma of weights (about 20 ms at sigma = 5e4).

>>> from dpsql.plan import LaplaceParams
>>> noise = LaplaceParams(1, 1)
>>> round(std(noise), 4), quantile_abs(noise, 0.95), scale(noise)
(1.357, 3.0, 1.0)
>>> params_of(sampler(noise)) == noise
True
"""

from __future__ import annotations

import functools

from dpsql.errors import InternalError
from dpsql.noise.discrete import DiscreteGaussian, DiscreteLaplace
from dpsql.noise.source import IntArray, RandomSource
from dpsql.plan import GaussianParams, LaplaceParams, Measurement, NoiseParams

__all__ = ["half_width", "noise_std", "params_of", "quantile_abs", "sample", "sampler", "scale", "std"]


@functools.lru_cache(maxsize=4096)
def sampler(params: NoiseParams) -> DiscreteLaplace | DiscreteGaussian:
    """The exact sampler of ``params`` (its integer parameters checked)."""
    if isinstance(params, LaplaceParams):
        return DiscreteLaplace(params.t, params.s)
    if isinstance(params, GaussianParams):
        return DiscreteGaussian(params.t, params.m)
    raise InternalError(f"not a noise's parameters: {params!r}")


def params_of(noise: DiscreteLaplace | DiscreteGaussian) -> NoiseParams:
    """The plain parameters of a calibrated noise (:func:`~dpsql.noise.laplace_noise`,
    :func:`~dpsql.noise.gaussian_noise`), as a plan carries them."""
    if isinstance(noise, DiscreteLaplace):
        return LaplaceParams(noise.t, noise.s)
    return GaussianParams(noise.t, noise.m)


def sample(params: NoiseParams, n: int, source: RandomSource | None = None) -> IntArray:
    """``n`` independent draws (int64) from ``source``, or the system CSPRNG."""
    return sampler(params).sample(n, source)


@functools.lru_cache(maxsize=4096)
def std(params: NoiseParams) -> float:
    """The exact standard deviation, in lattice steps."""
    return sampler(params).std


@functools.lru_cache(maxsize=4096)
def quantile_abs(params: NoiseParams, confidence: float = 0.95) -> float:
    """The smallest integer q with ``P(|Z| <= q) >= confidence``, in lattice steps."""
    return sampler(params).quantile_abs(confidence)


def scale(params: LaplaceParams) -> float:
    """A discrete Laplace noise's scale ``t / s``: P(z) is proportional to exp(-|z| / scale)."""
    return params.t / params.s


def noise_std(m: Measurement) -> float:
    """The standard deviation of a measurement's noise, in the column's own units."""
    return std(m.noise) * m.lattice


def half_width(m: Measurement, confidence: float = 0.95) -> float:
    """Half-width of the ``confidence`` interval of a measurement's noise, in the column's
    units."""
    return quantile_abs(m.noise, confidence) * m.lattice

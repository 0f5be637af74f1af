"""Noise: exact, vectorised discrete samplers from a cryptographically secure source, and
their calibration.

Released numbers are integers on the output lattice plus integer noise, so no low-order
bits of a float can give the true value away (DESIGN §5).

- :mod:`~dpsql.noise.source`: where randomness comes from (:class:`SystemRandom` in
  production, :class:`SeededRandom` in unit tests only) and exact uniform integers;
- :mod:`~dpsql.noise.samplers`: Bernoulli(exp(-gamma)), discrete Laplace and discrete
  Gaussian (Canonne, Kamath and Steinke 2020, Algorithms 1-3), integer arithmetic only;
- :mod:`~dpsql.noise.discrete`: the noise objects (frozen integer parameters, exact std and
  quantiles, sampling), calibrated in exact or rounded-up arithmetic (``laplace_noise``,
  ``gaussian_noise``);
- :mod:`~dpsql.noise.accuracy`: a plan's plain noise parameters -> the sampler
  (``sampler(params)``) and the accuracy figures reports show (``noise_std``, ``half_width``);
- :mod:`~dpsql.noise.gdp`: the exact (epsilon, delta) curve of mu-GDP and its inverse.
"""

from __future__ import annotations

from dpsql.noise.accuracy import (
    half_width,
    noise_std,
    params_of,
    quantile_abs,
    sample,
    sampler,
    scale,
    std,
)
from dpsql.noise.discrete import (
    DISCRETE_VARIANCE_MARGIN,
    DiscreteGaussian,
    DiscreteLaplace,
    gaussian_noise,
    laplace_noise,
)
from dpsql.noise.gdp import gaussian_sigma, gdp_delta, gdp_mu
from dpsql.noise.samplers import (
    bernoulli_exp,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from dpsql.noise.source import (
    RandomSource,
    SeededRandom,
    SystemRandom,
    default_source,
    uniform_below,
)

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
    "half_width",
    "laplace_noise",
    "noise_std",
    "params_of",
    "quantile_abs",
    "sample",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "sampler",
    "scale",
    "std",
    "uniform_below",
]

"""Parameter shuffling: reports travel without identity and are mixed before they are stored.

A :class:`Shuffler` sits between the clients and the collector (in LDP-FL, between the
clients and the cloud). It takes per-column report bundles (:class:`~dpsql.local.reports.Reports`),
drops whatever the transport knew about them (sender, arrival time: accepted by
:meth:`Shuffler.submit` and never stored), pools reports of the same column and mechanism,
and releases a column's pool only when it holds at least ``k`` reports, in an order drawn
uniformly at random from the OS CSPRNG. Below ``k`` a pool waits for more reports; it is
never released early.

What shuffling buys, exactly:

- **Unlinkability.** The collector sees, per column, a multiset of reports. It cannot tell
  which reports of different columns (or different parameters of one model update) came
  from the same client, nor which client sent which report, beyond what the report values
  themselves say. That is why a local table cannot answer a filter or a GROUP BY across
  two columns: the pairs were destroyed on purpose.
- **Optionally, amplified central privacy.** If ``n`` clients each put one
  ``eps0``-LDP report into a column's pool, the shuffled pool is ``(eps, delta)``-DP with
  respect to any one client's value, for the ``eps`` of Feldman, McMillan and Talwar,
  "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of Privacy Amplification
  by Shuffling" (FOCS 2021, arXiv:2012.12803), Theorem 3.1; see :func:`amplified_epsilon`.
  It holds against a collector who sees only the shuffled pool; the shuffler itself (and
  anyone who sees the traffic before it) still sees each report with its sender, so
  against them each report is only ``eps0``-LDP.

What each client spends: every report is ``eps0``-LDP on its own. A record of ``m``
columns sends ``m`` reports, so against anyone who can link them (the shuffler, the network)
the record is ``m * eps0``-LDP by basic composition; each later record or training round
adds as much again. Shuffling does not reduce that local total; it only stops the
collector from linking the reports, and gives the amplified guarantee per column pool.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from dpsql.local._common import ReportError, permutation, source_or_default
from dpsql.local.reports import Reports
from dpsql.noise import RandomSource

__all__ = ["Batch", "Shuffler", "amplified_epsilon"]


def amplified_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """The central epsilon of ``n`` shuffled ``epsilon0``-LDP reports (FMT21, Theorem 3.1).

    With ``a = 8 sqrt(e^eps0 log(4/delta) / n)``, ``b = 8 e^eps0 / n`` and
    ``eps' = log(1 + a + b)``, the shuffled reports are ``(eps, delta)``-DP for::

        eps = log(1 + (1 - e^-eps0) / (1 + e^-(eps0 + eps')) * (a + b))

    whenever ``eps0 <= log(n / (16 log(4/delta)))``. This is the form of the authors'
    reference implementation; it is slightly larger than the printed ``(e^eps0 - 1) /
    (e^eps0 + 1)`` factor, and its regime condition uses ``log(4/delta)`` instead of
    ``log(2/delta)``, so it is the more conservative of the two. Outside that regime no
    amplification is claimed and ``epsilon0`` is returned. Never more than ``epsilon0``.

    Args:
        epsilon0: Each report's local epsilon.
        n: How many clients each put one report into the shuffled pool.
        delta: The delta of the central guarantee, in (0, 1).

    >>> round(amplified_epsilon(1.0, 100_000, 1e-6), 4)
    0.0753
    >>> amplified_epsilon(1.0, 50, 1e-6)   # too few reports: no amplification claimed
    1.0
    """
    if not (isinstance(n, int) and n >= 1):
        raise ReportError(f"n must be a whole number of reports >= 1, got {n!r}")
    if not 0 < delta < 1:
        raise ReportError(f"delta must be in (0, 1), got {delta!r}")
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise ReportError(f"epsilon0 must be finite and > 0, got {epsilon0!r}")
    if epsilon0 > math.log(n / (16 * math.log(4 / delta))):
        return float(epsilon0)
    a = 8 * math.sqrt(math.exp(epsilon0) * math.log(4 / delta) / n)
    b = 8 * math.exp(epsilon0) / n
    inner = math.log1p(a + b)
    factor = -math.expm1(-epsilon0) / (1 + math.exp(-epsilon0 - inner))
    return min(float(epsilon0), math.log1p(factor * (a + b)))


@dataclass(frozen=True, eq=False)
class Batch:
    """Shuffled pools released together: each holds at least ``k`` reports of one column.

    Attributes:
        pools: One bundle per (table, column, mechanism), its reports in random order.
        k: The shuffler's threshold; every pool has at least ``k`` reports.
    """

    pools: tuple[Reports, ...]
    k: int

    def __len__(self) -> int:
        return sum(len(p) for p in self.pools)

    def amplified_epsilon(self, epsilon0: float, delta: float) -> float:
        """The central epsilon of the smallest pool (see :func:`amplified_epsilon`),
        assuming each client put at most one report into each pool."""
        return amplified_epsilon(epsilon0, min(len(p) for p in self.pools), delta)


class Shuffler:
    """Batches reports, forgets who sent them and when, and releases them mixed.

    Args:
        k: The smallest pool released (per column and mechanism); at least 2.
        source: A seeded source for unit tests only; by default the OS CSPRNG.

    >>> import numpy as np
    >>> s = Shuffler(k=3)
    >>> s.submit(Reports("t", "x", "p", values=np.array([1.0, 2.0])), sender="10.0.0.7")
    >>> s.release() is None            # 2 < k: nothing leaves
    True
    >>> s.submit(Reports("t", "x", "p", values=np.array([3.0])))
    >>> sorted(s.release().pools[0].values.tolist())
    [1.0, 2.0, 3.0]
    """

    def __init__(self, k: int, *, source: RandomSource | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ReportError(f"k must be a whole number >= 2 (a batch of one report hides "
                              f"nothing), got {k!r}")
        self._k = k
        self._source = source
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], list[Reports]] = {}

    @property
    def k(self) -> int:
        return self._k

    def submit(self, reports: Reports | Iterable[Reports], *, sender: object = None,
               received_at: float | None = None) -> None:
        """Take reports in; ``sender`` and ``received_at`` are accepted from the transport
        and dropped here, never stored or released."""
        del sender, received_at  # what the transport knew stays here
        bundles = [reports] if isinstance(reports, Reports) else list(reports)
        for bundle in bundles:
            if not isinstance(bundle, Reports):
                raise ReportError(f"a shuffler takes Reports bundles (from Reporter.report), "
                                  f"got {type(bundle).__name__}")
        with self._lock:
            for bundle in bundles:
                if len(bundle):
                    self._pending.setdefault(bundle.key, []).append(bundle)

    def pending(self) -> dict[tuple[str, str], int]:
        """How many reports wait, per (table, column)."""
        with self._lock:
            counts: dict[tuple[str, str], int] = {}
            for (table, column, _), bundles in self._pending.items():
                counts[(table, column)] = counts.get((table, column), 0) + sum(map(len, bundles))
            return counts

    def release(self) -> Batch | None:
        """Every pool holding at least ``k`` reports, shuffled; ``None`` if there is none."""
        with self._lock:
            ready = [key for key, bundles in self._pending.items() if sum(map(len, bundles)) >= self._k]
            pools = [Reports.concat(self._pending.pop(key)) for key in ready]
        if not pools:
            return None
        rng = source_or_default(self._source)
        return Batch(tuple(pool.take(permutation(rng, len(pool))) for pool in pools), self._k)

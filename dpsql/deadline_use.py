"""How much of their deadlines a server's answers used (:mod:`dpsql.timing`): the owner's
evidence for ``[server] deadline_slack`` and ``deadline_margin_ms``, logged when the server
stops."""

from __future__ import annotations

import threading

__all__ = ["DeadlineUsage"]


class DeadlineUsage:
    """How much of their deadlines answers used: the owner's evidence for the slack.

    For each answer held by a :class:`ReleaseTiming`: the share of its deadline gone when
    the worker's answer came back (its wait for a worker and its run; above 1 is an
    overrun), and the worker's run time over the modelled run time
    (:meth:`TimingModel.run_time`). Kept for the last ``keep`` queries; :meth:`summary`
    gives their quantiles (logged when the server stops).

    >>> usage = DeadlineUsage()
    >>> for i in range(100):
    ...     usage.record(i / 200, i / 100)
    >>> usage.record(None, None)  # an overrun
    >>> usage.summary()
    'deadline use over 101 answers (1 overruns): share of the deadline used p50 0.25 / p99 0.49 / p99.9 0.49 / max 0.49; worker run / modelled run p50 0.50 / p99 0.99 / p99.9 0.99 / max 0.99'
    """

    def __init__(self, keep: int = 100_000) -> None:
        self._keep = keep
        self._used: list[float] = []
        self._ran: list[float] = []
        self._count = 0
        self._overruns = 0
        self._lock = threading.Lock()

    def record(self, used: float | None, ran: float | None) -> None:
        """One answer: ``used`` share of its deadline (``None``: an overrun), ``ran``
        the worker's run over the modelled run time (``None``: unknown)."""
        with self._lock:
            self._count += 1
            if used is None:
                self._overruns += 1
                return
            if len(self._used) < self._keep:
                self._used.append(used)
                if ran is not None:
                    self._ran.append(ran)

    def summary(self) -> str:
        with self._lock:
            used, ran = sorted(self._used), sorted(self._ran)
            count, overruns = self._count, self._overruns
        return (f"deadline use over {count} answers ({overruns} overruns): share of the deadline used "
                f"{_quantiles(used)}; worker run / modelled run {_quantiles(ran)}")


def _quantiles(values: list[float]) -> str:
    if not values:
        return "none"
    at = [values[min(len(values) - 1, int(q * len(values)))] for q in (0.5, 0.99, 0.999)] + [values[-1]]
    return "p50 {:.2f} / p99 {:.2f} / p99.9 {:.2f} / max {:.2f}".format(*at)

"""Accountants: compose a sequence of charges into one (epsilon, delta) guarantee.

:class:`BasicAccountant` adds (exactly, in integer units); the PLD accountant
(:mod:`dpsql.privacy.pld`) composes privacy loss distributions and is imported only when
a policy names it (dp-accounting loads slowly).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from dpsql.errors import Error
from dpsql.privacy.charges import Charge, charge_units, units_to_delta, units_to_epsilon
from dpsql.privacy.events import DpEvent, GaussianEvent

__all__ = ["ACCOUNTANT_NAMES", "Accountant", "BasicAccountant", "UnitAccountant", "accountant_named", "gaussian_mu"]

# ---------------------------------------------------------------------------------------
# Accountants
# ---------------------------------------------------------------------------------------


class Accountant(Protocol):
    """Composes a sequence of charges into one (epsilon, delta) guarantee.

    Each charge carries typed privacy events (:mod:`dpsql.privacy.events`); an accountant
    composes the events it ``supports`` by their own guarantees, and a charge holding any
    other event by the charge's (epsilon, delta)."""

    name: str

    def supports(self, event: DpEvent) -> bool:
        """Whether this accountant composes ``event`` by its own guarantee."""
        ...

    def compose(self, events: Sequence[Charge],
                target_delta: float | None = None) -> tuple[float, float]:
        """Return an (epsilon, delta) guarantee for all ``events`` together.

        With ``target_delta``, the smallest epsilon the accountant can certify with a
        delta of at most ``target_delta``; an accountant that cannot meet the target (basic
        composition ignores it) returns its own guarantee, and the ledger then checks
        both amounts against the budget.
        """
        ...


@runtime_checkable
class UnitAccountant(Protocol):
    """An accountant that can also compose exactly in integer units.

    The ledger prefers :meth:`compose_units` when an accountant has it, so the budget check
    involves no floating point at all.
    """

    name: str

    def compose(self, events: Sequence[Charge],
                target_delta: float | None = None) -> tuple[float, float]:
        """Return the (epsilon, delta) that all ``events`` together cost."""
        ...

    def compose_units(self, amounts: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """Return the composed (epsilon_units, delta_units) of integer-unit amounts."""
        ...


class BasicAccountant:
    """Basic composition: epsilons add and deltas add.

    Example:
        >>> BasicAccountant().compose([Charge(0.1, 0.0, "q")] * 10)
        (1.0, 0.0)
    """

    name = "basic"

    def supports(self, event: DpEvent) -> bool:
        """No event has a guarantee of its own here: charges' amounts add."""
        return False

    def compose(self, events: Sequence[Charge],
                target_delta: float | None = None) -> tuple[float, float]:
        """Return the sums of the epsilons and deltas, each rounded up to whole units.

        ``target_delta`` is ignored: basic composition has one answer.
        """
        amounts = [charge_units(event) for event in events]
        epsilon_units, delta_units = self.compose_units(amounts)
        return units_to_epsilon(epsilon_units), units_to_delta(delta_units)

    def compose_units(self, amounts: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """Return the exact sums of integer-unit amounts."""
        return sum(a[0] for a in amounts), sum(a[1] for a in amounts)


#: The accountants a policy may name (``[privacy] accountant = ...``).
ACCOUNTANT_NAMES = ("basic", "pld")


def accountant_named(name: str) -> Accountant:
    """A new accountant by its policy name: ``"basic"`` or ``"pld"``.

    ``"pld"`` imports :mod:`dpsql.privacy.pld` (and the dp-accounting package) only when asked.

    Raises:
        Error: If the name is unknown.

    >>> accountant_named("basic").name, accountant_named("pld").name
    ('basic', 'pld')
    """
    if name == "basic":
        return BasicAccountant()
    if name == "pld":
        from dpsql.privacy.pld import PLDAccountant  # noqa: PLC0415 - dp-accounting loads slowly

        return PLDAccountant()
    raise Error(f"Unknown accountant {name!r}; use one of "
                f"{', '.join(repr(n) for n in ACCOUNTANT_NAMES)}.")


def gaussian_mu(events: Sequence[Charge]) -> float | None:
    """The Gaussian-DP mu of ``events`` if every measurement is Gaussian, else None.

    GDP composes exactly: the result is ``sqrt(sum mu_i^2)`` over every measurement of
    every charge. Charges that cost nothing and describe nothing are skipped; with nothing
    left, the result is None.

    >>> g = GaussianEvent(mu=0.3)
    >>> round(gaussian_mu([Charge(1.0, 1e-6, "q", (g,)), Charge(1.0, 1e-6, "q", (g, g))]), 4)
    0.5196
    >>> gaussian_mu([Charge(1.0, 0.0, "q", ({"mechanism": "laplace", "epsilon": 1.0},))])
    """
    return _combine_mu_parts([_mu_part(event) for event in events])


def _mu_part(charge: Charge) -> tuple[float, int] | None:
    """A charge's (sum of mu^2, number of measurements), or None if one is not Gaussian.

    A charge that costs nothing and describes nothing is ``(0.0, 0)``."""
    if not charge.events:
        return (0.0, 0) if charge.epsilon == 0 and charge.delta == 0 else None
    squares = []
    for event in charge.events:
        if not isinstance(event, GaussianEvent) or not 0 < event.mu < math.inf:
            return None
        squares.append(float(event.mu) ** 2)
    return math.fsum(squares), len(squares)


def _combine_mu_parts(parts: Sequence[tuple[float, int] | None]) -> float | None:
    """``sqrt`` of all the squares, or None if a part is None or there are no measurements."""
    if any(part is None for part in parts):
        return None
    known = [part for part in parts if part is not None]
    if not any(count for _, count in known):
        return None
    return math.sqrt(math.fsum(squares for squares, _ in known))

"""What a query costs and what an analyst has left: :class:`Charge`, :class:`ChargeRecord`,
:class:`BudgetStatus`, and the exact integer units the ledger keeps them in (epsilon in
units of 1e-12 and delta in units of 1e-18, charges rounded up and budgets rounded down,
so repeated spending never drifts)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from dpsql.errors import BudgetExceeded, InternalError
from dpsql.privacy.events import DpEvent, encode, event_from_description

__all__ = [
    "DELTA_UNITS_PER_ONE",
    "EPSILON_UNITS_PER_ONE",
    "BudgetLike",
    "BudgetStatus",
    "Charge",
    "ChargeRecord",
    "GroupPrivacy",
    "budget_units",
    "charge_units",
    "delta_to_units_up",
    "epsilon_to_units_up",
    "units_to_delta",
    "units_to_epsilon",
]
from dpsql.errors import Error

EPSILON_UNITS_PER_ONE = 10**12
DELTA_UNITS_PER_ONE = 10**18


_MAX_SQLITE_INTEGER = 2**63 - 1


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------


class BudgetLike(Protocol):
    """Anything with a total ``epsilon`` and ``delta``, such as ``dpsql.policy.Budget``."""

    @property
    def epsilon(self) -> float: ...

    @property
    def delta(self) -> float: ...


@dataclass(frozen=True)
class Charge:
    """What one query costs: its (epsilon, delta), its SQL and the mechanisms it released.

    Attributes:
        epsilon: The epsilon the query spends; finite and at least 0.
        delta: The delta the query spends; between 0 and 1.
        query: The analyst's SQL text.
        events: The typed privacy event of each measurement
            (:mod:`dpsql.privacy.events`); accountants compose these. Given as
            ``mechanisms``: events, or (as ledgers of version 1 stored them) JSON-able
            description dicts such as ``{"mechanism": "laplace", "epsilon": 0.5}``, each
            read as the event it describes.
        mechanisms: Each event's description dict (what reports and the ledger show).

    Raises:
        InternalError: If an amount is negative, NaN, infinite or not a number, or a
            mechanism is not a JSON-able dict. The pipeline never asks for such a charge.

    Example:
        >>> Charge(0.5, 0.0, "SELECT COUNT(*) FROM t").epsilon
        0.5
    """

    epsilon: float
    delta: float
    query: str
    mechanisms: tuple[dict[str, Any] | DpEvent, ...] = field(default=())
    events: tuple[DpEvent, ...] = field(default=(), init=False, compare=False)

    def __post_init__(self) -> None:
        _check_amount("epsilon", self.epsilon)
        _check_amount("delta", self.delta, upper=1.0)
        if not isinstance(self.query, str):
            raise InternalError(f"Charge query must be str, got {type(self.query).__name__}.")
        given = tuple(self.mechanisms)
        if not all(isinstance(m, dict | DpEvent) for m in given):
            raise InternalError(f"Charge mechanisms must be dicts or privacy events, got {given!r}.")
        events = tuple(m if isinstance(m, DpEvent) else event_from_description(m)
                       for m in given)
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "mechanisms", tuple(e.describe() for e in events))
        _events_json(events)


@dataclass(frozen=True)
class ChargeRecord:
    """A charge as stored in the ledger.

    ``epsilon`` and ``delta`` are the amounts actually charged: the requested ones rounded
    up to whole units (see the module docstring).
    """

    id: int
    analyst: str
    time: float
    query: str
    epsilon: float
    delta: float
    events: tuple[DpEvent, ...]

    @property
    def mechanisms(self) -> tuple[dict[str, Any], ...]:
        """Each event's description dict."""
        return tuple(e.describe() for e in self.events)

    def to_charge(self) -> Charge:
        """Return the record as a :class:`Charge`, for an accountant to compose."""
        return Charge(self.epsilon, self.delta, self.query, self.events)


@dataclass(frozen=True)
class GroupPrivacy:
    """The guarantee for a group of ``units`` privacy units (see :meth:`BudgetStatus.group_privacy`).

    Attributes:
        units: The group size k.
        epsilon: ``k * epsilon``.
        delta: ``k * exp((k - 1) * epsilon) * delta``.
        mu: ``k * mu`` when the spending is mu-GDP, else None.
    """

    units: int
    epsilon: float
    delta: float
    mu: float | None = None


@dataclass(frozen=True)
class BudgetStatus:
    """How much of an analyst's budget is spent and how much remains.

    ``epsilon_spent`` and ``delta_spent`` are the accountant's composition of every charge
    (for ``pld``: the smallest epsilon at the budget's delta, with that delta, unless basic
    composition is as good). Remaining amounts are ``max(0, total - spent)``, computed in
    whole units.

    Attributes:
        accountant: The name of the accountant that composed the spending.
        mu: The Gaussian-DP mu of everything spent, ``sqrt(sum mu_i^2)`` over every
            measurement, when every measurement was Gaussian; None otherwise (or when
            nothing was spent).
    """

    analyst: str
    epsilon_spent: float
    delta_spent: float
    epsilon_total: float
    delta_total: float
    epsilon_remaining: float
    delta_remaining: float
    queries: int
    accountant: str = "basic"
    mu: float | None = None

    def group_privacy(self, units: int) -> GroupPrivacy:
        """The guarantee the spending gives a group of ``units`` privacy units.

        From the spent (epsilon, delta): ``(k epsilon, k e^((k-1) epsilon) delta)`` (group
        privacy of approximate DP, e.g. Vadhan 2017, Lemma 2.2; for pure DP this is
        ``k epsilon``); and, when the spending is mu-GDP, ``k mu``-GDP (Dong, Roth and Su
        2019, Theorem 2.14).

        Raises:
            Error: If ``units`` is not a positive integer.

        >>> status = BudgetStatus("a", 0.5, 1e-7, 1.0, 1e-6, 0.5, 9e-7, 3, mu=0.2)
        >>> group = status.group_privacy(2)   # delta: 2 e^0.5 1e-7
        >>> group.epsilon, f"{group.delta:.3g}", group.mu
        (1.0, '3.3e-07', 0.4)
        """
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise Error(f"group_privacy needs a positive whole number of units, got {units!r}.")
        epsilon = units * self.epsilon_spent
        delta = 0.0
        if self.delta_spent > 0:
            exponent = (units - 1) * self.epsilon_spent
            delta = 1.0 if exponent > 700 else min(1.0, units * math.exp(exponent) * self.delta_spent)
        mu = None if self.mu is None else units * self.mu
        return GroupPrivacy(units, epsilon, delta, mu)


# ---------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------


def _check_amount(name: str, value: object, upper: float | None = None) -> None:
    """Raise InternalError unless ``value`` is a finite real in ``[0, upper]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InternalError(f"{name} must be a number, got {value!r}.")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (upper is not None and number > upper):
        bound = f"between 0 and {upper:g}" if upper is not None else "finite and at least 0"
        raise InternalError(f"{name} must be {bound}, got {value!r}.")


def _decimal(value: float) -> Fraction:
    """Return the shortest decimal that rounds to ``value``, as an exact fraction."""
    return Fraction(repr(float(value)))


def epsilon_to_units_up(epsilon: float) -> int:
    """Convert an epsilon to whole units of 1e-12, rounding up.

    >>> epsilon_to_units_up(0.1), epsilon_to_units_up(1e-13)
    (100000000000, 1)
    """
    return math.ceil(_decimal(epsilon) * EPSILON_UNITS_PER_ONE)


def delta_to_units_up(delta: float) -> int:
    """Convert a delta to whole units of 1e-18, rounding up.

    >>> delta_to_units_up(1e-5)
    10000000000000
    """
    return math.ceil(_decimal(delta) * DELTA_UNITS_PER_ONE)


def units_to_epsilon(units: int) -> float:
    """Convert epsilon units back to the nearest float."""
    return float(Fraction(units, EPSILON_UNITS_PER_ONE))


def units_to_delta(units: int) -> float:
    """Convert delta units back to the nearest float."""
    return float(Fraction(units, DELTA_UNITS_PER_ONE))


def charge_units(charge: Charge) -> tuple[int, int]:
    """Return a charge's (epsilon_units, delta_units), each rounded up.

    Raises:
        InternalError: If the epsilon is too large to store (above about 9.2 million).
    """
    units = epsilon_to_units_up(charge.epsilon), delta_to_units_up(charge.delta)
    if units[0] > _MAX_SQLITE_INTEGER:
        raise InternalError(f"epsilon={charge.epsilon!r} is too large to record.")
    return units


def budget_units(budget: BudgetLike) -> tuple[int, int]:
    """Return a budget's total (epsilon_units, delta_units), each rounded down.

    Raises:
        InternalError: If a total is negative, NaN, infinite or not a number.
    """
    _check_amount("budget epsilon", budget.epsilon)
    _check_amount("budget delta", budget.delta, upper=1.0)
    epsilon = math.floor(_decimal(budget.epsilon) * EPSILON_UNITS_PER_ONE)
    delta = math.floor(_decimal(budget.delta) * DELTA_UNITS_PER_ONE)
    return epsilon, delta


def _events_json(events: tuple[DpEvent, ...]) -> str:
    """The events' stored form, raising InternalError if they are not JSON-able."""
    try:
        return encode(events)
    except (TypeError, ValueError) as exc:
        raise InternalError(f"Charge mechanisms are not JSON-able ({exc}).") from exc


def _format_amount(value: float) -> str:
    """Format an amount for a message: ``0``, ``0.3``, ``1e-05``."""
    return "0" if value == 0 else repr(value)


def _budget_exceeded(analyst: str, new: tuple[int, int], spent: tuple[int, int],
                     after: tuple[int, int], total: tuple[int, int],
                     accountant: str = "basic") -> BudgetExceeded:
    """Build the error for a refused charge: requested, remaining, and the shortfall.

    Under an accountant other than ``basic`` the shortfall is that of the composition, so
    the message also says what everything spent plus this query would compose to."""
    requested = units_to_epsilon(new[0]), units_to_delta(new[1])
    remaining = (units_to_epsilon(max(0, total[0] - spent[0])),
                 units_to_delta(max(0, total[1] - spent[1])))
    short = []
    if after[0] > total[0]:
        short.append(("epsilon", units_to_epsilon(after[0] - total[0])))
    if after[1] > total[1]:
        short.append(("delta", units_to_delta(after[1] - total[1])))
    shortfall = ", ".join(f"{name}={_format_amount(value)}" for name, value in short)
    smaller = " and ".join(name for name, _ in short)
    composed = ""
    if accountant != "basic":
        composed = (
            f" Composed by the {accountant} accountant at the budget's "
            f"delta={_format_amount(units_to_delta(total[1]))}, everything spent plus this "
            f"query is epsilon={_format_amount(units_to_epsilon(after[0]))}, "
            f"delta={_format_amount(units_to_delta(after[1]))}.")
    message = (
        f"Budget exceeded for analyst {analyst!r}: this query needs "
        f"epsilon={_format_amount(requested[0])}, delta={_format_amount(requested[1])} "
        f"but only epsilon={_format_amount(remaining[0])}, "
        f"delta={_format_amount(remaining[1])} remain (short by {shortfall}).{composed} "
        f"Ask for a smaller {smaller} or a larger budget.")
    return BudgetExceeded(message, requested=requested, remaining=remaining)

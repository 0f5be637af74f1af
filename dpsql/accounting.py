"""The privacy budget ledger: every released measurement is a charge, recorded before release.

A :class:`Ledger` is a SQLite file (or an in-memory database) holding one row per charge:
analyst, time, query text, the mechanisms used and their parameters, and the (epsilon, delta)
charged. :meth:`Ledger.charge` is one write transaction — ``BEGIN IMMEDIATE``, read what the
analyst has spent, compose it with the new charge, check the budget, insert, ``COMMIT`` — so
any number of threads and processes sharing one file can never spend more than the budget,
and a crash between the charge and the release loses budget, never privacy. A refused charge
writes nothing and raises :class:`~dpsql.errors.BudgetExceeded`.

Units and rounding
------------------
Amounts are stored as integers of small units, never as floats:

* epsilon in units of ``1e-12`` (``EPSILON_UNITS_PER_ONE = 10**12``);
* delta in units of ``1e-18`` (``DELTA_UNITS_PER_ONE = 10**18``).

A float is read as the decimal it stands for: the shortest decimal that rounds to it (what
``repr`` shows, and what the policy file or the analyst typed), converted exactly with
:class:`fractions.Fraction`. A **charge is rounded up** to the next unit and a **budget total
is rounded down**, so rounding can never under-charge against that decimal. Reading ``0.1``
as the decimal 0.1 (and not as the binary float 0.1000000000000000055...) is what lets ten
charges of 0.1 spend a budget of 1.0 exactly; against the binary float it differs by at most
half a unit in the last place (about 1e-16 relative), far below the floating-point error of
the noise calibration itself.

Accountants
-----------
The ledger asks its :class:`Accountant` to compose all of an analyst's stored charges plus
the new one *at the budget's delta* (``compose(events, target_delta=budget.delta)``), and
grants the charge if the composed epsilon is at most the budget's epsilon and the composed
delta at most its delta. :class:`BasicAccountant` (epsilons add, deltas add) composes in
integer units, exactly, and ignores the target. :class:`dpsql.pld.PLDAccountant` (``"pld"``,
see :func:`accountant_named`) composes privacy loss distributions built from each
:class:`Charge`'s ``mechanisms`` and answers the smallest epsilon at the target delta; its
float result is rounded up to units. The ledger records every charge's own (epsilon,
delta) either way; only the budget check and :class:`BudgetStatus` use the composition.

What a status shows
-------------------
:class:`BudgetStatus` gives the composed (epsilon, delta) spent and what remains, the
accountant's name, the Gaussian-DP ``mu`` when every measurement spent was Gaussian, and
:meth:`BudgetStatus.group_privacy` for groups of units.

Example:
    >>> from dpsql.accounting import Charge, Ledger
    >>> from types import SimpleNamespace
    >>> budget = SimpleNamespace(epsilon=1.0, delta=1e-6)
    >>> with Ledger() as ledger:
    ...     status = ledger.charge("alice", budget, Charge(0.25, 0.0, "SELECT COUNT(*) FROM t"))
    >>> status.epsilon_remaining, status.queries
    (0.75, 1)
"""

from __future__ import annotations

import json
import math
import numbers
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from types import TracebackType
from typing import Any, NamedTuple, Protocol, runtime_checkable

from dpsql.errors import BudgetExceeded, Error, InternalError

__all__ = [
    "DELTA_UNITS_PER_ONE",
    "EPSILON_UNITS_PER_ONE",
    "Accountant",
    "BasicAccountant",
    "BudgetLike",
    "BudgetStatus",
    "Charge",
    "ChargeRecord",
    "GroupPrivacy",
    "Ledger",
    "UnitAccountant",
    "accountant_named",
    "gaussian_mu",
]

EPSILON_UNITS_PER_ONE = 10**12
DELTA_UNITS_PER_ONE = 10**18
SCHEMA_VERSION = 1
LEDGER_FORMAT = "dpsql-ledger"
BUSY_TIMEOUT_MS = 30_000
_MAX_SQLITE_INTEGER = 2**63 - 1

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        analyst TEXT NOT NULL,
        time REAL NOT NULL,
        query TEXT NOT NULL,
        epsilon_units INTEGER NOT NULL CHECK (epsilon_units >= 0),
        delta_units INTEGER NOT NULL CHECK (delta_units >= 0),
        mechanisms TEXT NOT NULL
    )""",
    "CREATE INDEX events_by_analyst ON events (analyst, id)",
)


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
        mechanisms: A JSON-able description of each measurement, for example
            ``{"mechanism": "laplace", "epsilon": 0.5, "delta": 0.0, "scale": 2.0,
            "sensitivity": 1.0}``. A tight accountant composes from these.

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
    mechanisms: tuple[dict[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        _check_amount("epsilon", self.epsilon)
        _check_amount("delta", self.delta, upper=1.0)
        if not isinstance(self.query, str):
            raise InternalError(f"Charge query must be str, got {type(self.query).__name__}. "
                                "This is probably a bug in dpsql.")
        object.__setattr__(self, "mechanisms", tuple(self.mechanisms))
        _mechanisms_json(self.mechanisms)


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
    mechanisms: tuple[dict[str, Any], ...]

    def to_charge(self) -> Charge:
        """Return the record as a :class:`Charge`, for an accountant to compose."""
        return Charge(self.epsilon, self.delta, self.query, self.mechanisms)


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
# Accountants
# ---------------------------------------------------------------------------------------


class Accountant(Protocol):
    """Composes a sequence of charges into one (epsilon, delta) guarantee."""

    name: str

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

    ``"pld"`` imports :mod:`dpsql.pld` (and the dp-accounting package) only when asked.

    Raises:
        Error: If the name is unknown.

    >>> accountant_named("basic").name, accountant_named("pld").name
    ('basic', 'pld')
    """
    if name == "basic":
        return BasicAccountant()
    if name == "pld":
        from dpsql.pld import PLDAccountant  # noqa: PLC0415 - dp-accounting loads slowly

        return PLDAccountant()
    raise Error(f"Unknown accountant {name!r}; use one of "
                f"{', '.join(repr(n) for n in ACCOUNTANT_NAMES)}.")


def gaussian_mu(events: Sequence[Charge]) -> float | None:
    """The Gaussian-DP mu of ``events`` if every measurement is Gaussian, else None.

    GDP composes exactly: the result is ``sqrt(sum mu_i^2)`` over every measurement of
    every charge. Charges that cost nothing and describe nothing are skipped; with nothing
    left, the result is None.

    >>> g = {"mechanism": "gaussian", "mu": 0.3}
    >>> round(gaussian_mu([Charge(1.0, 1e-6, "q", (g,)), Charge(1.0, 1e-6, "q", (g, g))]), 4)
    0.5196
    >>> gaussian_mu([Charge(1.0, 0.0, "q", ({"mechanism": "laplace", "epsilon": 1.0},))])
    """
    return _combine_mu_parts([_mu_part(event) for event in events])


def _mu_part(charge: Charge) -> tuple[float, int] | None:
    """A charge's (sum of mu^2, number of measurements), or None if one is not Gaussian.

    A charge that costs nothing and describes nothing is ``(0.0, 0)``."""
    if not charge.mechanisms:
        return (0.0, 0) if charge.epsilon == 0 and charge.delta == 0 else None
    squares = []
    for mechanism in charge.mechanisms:
        mu = mechanism.get("mu") if mechanism.get("mechanism") == "gaussian" else None
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu < math.inf:
            return None
        squares.append(float(mu) ** 2)
    return math.fsum(squares), len(squares)


def _combine_mu_parts(parts: Sequence[tuple[float, int] | None]) -> float | None:
    """``sqrt`` of all the squares, or None if a part is None or there are no measurements."""
    if any(part is None for part in parts):
        return None
    known = [part for part in parts if part is not None]
    if not any(count for _, count in known):
        return None
    return math.sqrt(math.fsum(squares for squares, _ in known))


# ---------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------


def _check_amount(name: str, value: object, upper: float | None = None) -> None:
    """Raise InternalError unless ``value`` is a finite real in ``[0, upper]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InternalError(f"{name} must be a number, got {value!r}. "
                            "This is probably a bug in dpsql.")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (upper is not None and number > upper):
        bound = f"between 0 and {upper:g}" if upper is not None else "finite and at least 0"
        raise InternalError(f"{name} must be {bound}, got {value!r}. "
                            "This is probably a bug in dpsql.")


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
        raise InternalError(f"epsilon={charge.epsilon!r} is too large to record. "
                            "This is probably a bug in dpsql.")
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


def _mechanisms_json(mechanisms: tuple[dict[str, Any], ...]) -> str:
    """Serialize mechanism descriptions, raising InternalError if they are not JSON-able."""
    if not all(isinstance(m, dict) for m in mechanisms):
        raise InternalError(f"Charge mechanisms must be dicts, got {mechanisms!r}. "
                            "This is probably a bug in dpsql.")
    try:
        return json.dumps(list(mechanisms), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InternalError(f"Charge mechanisms are not JSON-able ({exc}). "
                            "This is probably a bug in dpsql.") from exc


def _format_amount(value: float) -> str:
    """Format an amount for a message: ``0``, ``0.3``, ``1e-05``."""
    return "0" if value == 0 else repr(value)


# ---------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------


class Ledger:
    """A persistent, concurrency-safe record of every charge against analysts' budgets.

    Args:
        path: The SQLite file to use, created if missing; ``None`` keeps the ledger in
            memory for as long as this object lives.
        accountant: How charges compose: an :class:`Accountant`, or a policy's name for
            one (``"basic"``, ``"pld"``; see :func:`accountant_named`);
            :class:`BasicAccountant` by default.

    Raises:
        Error: If the file's directory does not exist, or the file is not a dpsql ledger,
            or the accountant's name is unknown.

    Example:
        >>> from types import SimpleNamespace
        >>> ledger = Ledger()
        >>> ledger.status("bob", SimpleNamespace(epsilon=2.0, delta=0.0)).epsilon_remaining
        2.0
        >>> ledger.close()
    """

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 accountant: Accountant | str | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        if isinstance(accountant, str):
            accountant = accountant_named(accountant)
        self.accountant: Accountant = accountant if accountant is not None else BasicAccountant()
        self._lock = threading.Lock()
        self._conn = _open(self.path)
        self._seen: dict[str, list[_Stored]] = {}

    # -- public -------------------------------------------------------------------------

    def charge(self, analyst: str, budget: BudgetLike, charge: Charge) -> BudgetStatus:
        """Record ``charge`` against ``analyst`` if the budget can pay for it.

        Reading what is spent, composing, checking and recording happen in one write
        transaction, so concurrent charges from any number of processes serialize. The
        check: the accountant's composition of every stored charge plus this one, at the
        budget's delta, must be within the budget's epsilon and delta.

        Args:
            analyst: Who pays.
            budget: The analyst's total budget (``.epsilon``, ``.delta``).
            charge: What the query costs.

        Returns:
            The analyst's status after the charge.

        Raises:
            BudgetExceeded: If the charge would overspend; nothing is written then.
            InternalError: If an amount is invalid.
        """
        total = budget_units(budget)
        new = charge_units(charge)
        with self._locked(), self._write_transaction():
            status = self._check(analyst, total, charge, new)
            self._insert(analyst, charge, new)
            return status

    def check(self, analyst: str, budget: BudgetLike, charge: Charge) -> BudgetStatus:
        """A dry run of :meth:`charge`: the same composition and check, nothing written.

        Use it to refuse a query before doing its work; only :meth:`charge` reserves the
        budget (another process may spend it in between).

        Returns:
            What the analyst's status would be after the charge.

        Raises:
            BudgetExceeded: If the charge would overspend.
        """
        total = budget_units(budget)
        new = charge_units(charge)
        with self._locked():
            return self._check(analyst, total, charge, new)

    def status(self, analyst: str, budget: BudgetLike) -> BudgetStatus:
        """Return what ``analyst`` has spent and has left of ``budget``."""
        total = budget_units(budget)
        with self._locked():
            stored = self._charges(analyst)
            spent = self._compose(stored, total)
            return self._status(analyst, spent, total, stored)

    def events(self, analyst: str) -> list[ChargeRecord]:
        """Return ``analyst``'s charges, oldest first."""
        with self._locked():
            rows = self._records(analyst)
        return [_record(row) for row in rows]

    def close(self) -> None:
        """Close the database connection. Closing twice is harmless."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.path if self.path is not None else ":memory:"
        return f"Ledger({where!r}, accountant={self.accountant.name!r})"

    # -- private ------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the lock; turn a database failure into a :class:`~dpsql.errors.Error`."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise Error(f"The budget ledger {self!r} failed: {exc}. If the "
                            "ledger is closed, open a new one; otherwise check "
                            "that its file is readable and writable.") from exc

    @contextmanager
    def _write_transaction(self) -> Iterator[None]:
        """Run the body in ``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any error."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def _records(self, analyst: str) -> list[sqlite3.Row]:
        cursor = self._conn.execute(
            "SELECT id, analyst, time, query, epsilon_units, delta_units, mechanisms "
            "FROM events WHERE analyst = ? ORDER BY id", (analyst,))
        return cursor.fetchall()

    def _charges(self, analyst: str) -> list[_Stored]:
        """``analyst``'s stored charges, oldest first, each parsed only once.

        Events are append-only and ids grow in commit order (each insert is its own
        ``BEGIN IMMEDIATE`` transaction), so only rows past the last id seen are read."""
        seen = self._seen.setdefault(analyst, [])
        last_id = seen[-1].id if seen else 0
        rows = self._conn.execute(
            "SELECT id, query, epsilon_units, delta_units, mechanisms "
            "FROM events WHERE analyst = ? AND id > ? ORDER BY id", (analyst, last_id))
        for row in rows:
            charge = Charge(units_to_epsilon(row[2]), units_to_delta(row[3]), row[1],
                            tuple(json.loads(row[4])))
            seen.append(_Stored(row[0], charge, (row[2], row[3]), _mu_part(charge)))
        return seen

    def _check(self, analyst: str, total: tuple[int, int], charge: Charge,
               new: tuple[int, int]) -> BudgetStatus:
        """Compose stored charges with ``charge``; raise BudgetExceeded if over ``total``."""
        stored = self._charges(analyst)
        adding = _Stored(0, charge, new, _mu_part(charge))
        after = self._compose([*stored, adding], total)
        if after[0] > total[0] or after[1] > total[1]:
            spent = self._compose(stored, total)
            raise _budget_exceeded(analyst, new, spent, after, total, self.accountant.name)
        return self._status(analyst, after, total, [*stored, adding])

    def _status(self, analyst: str, spent: tuple[int, int], total: tuple[int, int],
                stored: Sequence[_Stored]) -> BudgetStatus:
        return BudgetStatus(
            analyst=analyst,
            epsilon_spent=units_to_epsilon(spent[0]), delta_spent=units_to_delta(spent[1]),
            epsilon_total=units_to_epsilon(total[0]), delta_total=units_to_delta(total[1]),
            epsilon_remaining=units_to_epsilon(max(0, total[0] - spent[0])),
            delta_remaining=units_to_delta(max(0, total[1] - spent[1])),
            queries=len(stored), accountant=self.accountant.name,
            mu=_combine_mu_parts([s.mu_part for s in stored]))

    def _insert(self, analyst: str, charge: Charge, units: tuple[int, int]) -> None:
        self._conn.execute(
            "INSERT INTO events (analyst, time, query, epsilon_units, delta_units, mechanisms)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (analyst, time.time(), charge.query, units[0], units[1],
             _mechanisms_json(charge.mechanisms)))

    def _compose(self, stored: Sequence[_Stored], total: tuple[int, int]) -> tuple[int, int]:
        """Compose charges into (epsilon, delta) units, at the budget's delta.

        A :class:`UnitAccountant` composes the exact unit amounts; any other accountant
        composes the charges at ``target_delta`` = the budget's delta, and its float
        result is rounded up to units."""
        if isinstance(self.accountant, UnitAccountant):
            return self.accountant.compose_units([s.units for s in stored])
        epsilon, delta = self.accountant.compose(
            [s.charge for s in stored], target_delta=units_to_delta(total[1]))
        _check_amount(f"epsilon composed by the {self.accountant.name} accountant", epsilon)
        _check_amount(f"delta composed by the {self.accountant.name} accountant", delta,
                      upper=1.0)
        return epsilon_to_units_up(epsilon), delta_to_units_up(delta)


# ---------------------------------------------------------------------------------------
# Helpers of the ledger
# ---------------------------------------------------------------------------------------


class _Stored(NamedTuple):
    """A stored charge as the ledger composes it (``id`` 0: the charge being checked)."""

    id: int
    charge: Charge
    units: tuple[int, int]
    mu_part: tuple[float, int] | None


def _record(row: sqlite3.Row) -> ChargeRecord:
    return ChargeRecord(
        id=row["id"], analyst=row["analyst"], time=row["time"], query=row["query"],
        epsilon=units_to_epsilon(row["epsilon_units"]),
        delta=units_to_delta(row["delta_units"]),
        mechanisms=tuple(json.loads(row["mechanisms"])))


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


def _open(path: str | None) -> sqlite3.Connection:
    """Open (creating if needed) a ledger database and check that it is one."""
    if path is not None:
        _check_directory(path)
    try:
        conn = sqlite3.connect(path if path is not None else ":memory:",
                               isolation_level=None, check_same_thread=False,
                               timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    try:
        _prepare_patiently(conn, path)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise _open_error(path, exc) from exc
        raise
    return conn


def _check_directory(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise Error(f"Cannot open the budget ledger {path!r}: the directory {directory!r} "
                    "does not exist. Create it first, or choose a path in an existing "
                    "directory.")


def _open_error(path: str | None, exc: sqlite3.Error) -> Error:
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
        return _not_a_ledger(path, "it is not a SQLite database")
    return Error(f"Cannot open the budget ledger {path!r}: {exc}. Check that the file and "
                 "its directory are readable and writable.")


def _not_a_ledger(path: str | None, why: str) -> Error:
    return Error(f"The file {path!r} is not a dpsql budget ledger ({why}). Point the ledger "
                 "at a file dpsql created, or at a new file name; dpsql will not touch "
                 "this one.")


def _prepare_patiently(conn: sqlite3.Connection, path: str | None) -> None:
    """Run :func:`_prepare`, retrying while another process holds the database.

    Switching a new file to WAL can fail with "database is locked" at once, without waiting
    on the busy timeout, when several processes create the same ledger together. Preparing
    is idempotent, so retry it with a jittered back-off for up to the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            _prepare(conn, path)
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            time.sleep(random.uniform(0.001, 0.02))


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    message = str(exc)
    return "locked" in message or "busy" in message


def _prepare(conn: sqlite3.Connection, path: str | None) -> None:
    """Set the pragmas, then create the schema or check the existing one."""
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # Read first: a foreign database is refused before any pragma changes its file.
    _check_schema(conn, path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not _check_schema(conn, path):
            _create_schema(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _check_schema(conn: sqlite3.Connection, path: str | None) -> bool:
    """Return True if the database is a ledger, False if it is empty; raise otherwise."""
    tables = {row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return False
    if not {"meta", "events"} <= tables:
        raise _not_a_ledger(path, "it has no dpsql ledger tables")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("format") != LEDGER_FORMAT:
        raise _not_a_ledger(path, "its metadata does not name a dpsql ledger")
    version = meta.get("schema_version", "")
    if not version.isdigit() or int(version) > SCHEMA_VERSION:
        raise Error(f"The budget ledger {path!r} has schema version {version!r}, but this "
                    f"dpsql reads version {SCHEMA_VERSION}. Upgrade dpsql to use it.")
    return True


def _create_schema(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
        ("format", LEDGER_FORMAT),
        ("schema_version", str(SCHEMA_VERSION)),
        ("epsilon_units_per_one", str(EPSILON_UNITS_PER_ONE)),
        ("delta_units_per_one", str(DELTA_UNITS_PER_ONE)),
    ])

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
integer units, exactly, and ignores the target. :class:`dpsql.privacy.pld.PLDAccountant` (``"pld"``,
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
    >>> from dpsql.privacy import Charge, Ledger
    >>> from types import SimpleNamespace
    >>> budget = SimpleNamespace(epsilon=1.0, delta=1e-6)
    >>> with Ledger() as ledger:
    ...     status = ledger.charge("alice", budget, Charge(0.25, 0.0, "SELECT COUNT(*) FROM t"))
    >>> status.epsilon_remaining, status.queries
    (0.75, 1)
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from fractions import Fraction
from types import TracebackType
from typing import NamedTuple

from dpsql.errors import Error, InternalError
from dpsql.privacy.accountants import (
    Accountant,
    BasicAccountant,
    UnitAccountant,
    _mu_part,
    accountant_named,
)
from dpsql.privacy.charges import (
    DELTA_UNITS_PER_ONE,
    EPSILON_UNITS_PER_ONE,
    BudgetLike,
    BudgetStatus,
    Charge,
    ChargeRecord,
    _budget_exceeded,
    _check_amount,
    _events_json,
    budget_units,
    charge_units,
    delta_to_units_up,
    epsilon_to_units_up,
    units_to_delta,
    units_to_epsilon,
)
from dpsql.privacy.events import decode
from dpsql.privacy.reservation import Reservation, Syncer
from dpsql.sqlitefile import guarded, make_durable, open_database, open_writer_queue, WalSync, write_transaction

__all__ = ["Ledger"]
#: The file's schema. Each row's ``mechanisms`` carries its own version: typed privacy events
#: (``{"version": 2, "events": [...]}``, :mod:`dpsql.privacy.events`) since issue 13, a bare
#: list of descriptions before; both are read.
SCHEMA_VERSION = 1
LEDGER_FORMAT = "dpsql-ledger"

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
# The ledger
# ---------------------------------------------------------------------------------------


class Ledger:
    """A persistent, concurrency-safe record of every charge against analysts' budgets.

    Args:
        path: The SQLite file to use, created if missing; ``None`` (or SQLite's
            ``":memory:"``) keeps the ledger in memory for as long as this object lives.
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
        self.path = None if path is None or os.fspath(path) == ":memory:" else os.fspath(path)
        if isinstance(accountant, str):
            accountant = accountant_named(accountant)
        self.accountant: Accountant = accountant if accountant is not None else BasicAccountant()
        self._lock = threading.Lock()
        self._syncer = Syncer()  # reserve()'s fsyncs
        self._wal = WalSync(self.path) if self.path is not None else None
        self._conn = _open(self.path)
        self._lock_file = open_writer_queue(self.path)
        self._seen: dict[str, _Spent] = {}
        # basic composition (sums of units): composed from running totals, not re-summed
        self._additive = getattr(type(self.accountant), "compose_units", None) is BasicAccountant.compose_units

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
        status = self._charge(analyst, budget, charge)
        self._sync()
        return status

    def reserve(self, analyst: str, budget: BudgetLike, charge: Charge) -> Reservation[BudgetStatus]:
        """:meth:`charge`, returning once the charge is committed (written to the WAL, seen by
        every process, kept through a crash of this one) with its fsync under way on the
        ledger's sync thread: the caller may read the data meanwhile and calls ``wait()``
        before releasing anything (:mod:`dpsql.privacy.reservation`).

        Raises:
            BudgetExceeded: As :meth:`charge`; nothing is written.
        """
        status = self._charge(analyst, budget, charge)
        return Reservation(status, self._syncer.submit(self._sync) if self._wal is not None else None)

    def _charge(self, analyst: str, budget: BudgetLike, charge: Charge) -> BudgetStatus:
        """The transaction: check and insert, then ``COMMIT`` (no fsync: :meth:`_sync`)."""
        total = budget_units(budget)
        new = charge_units(charge)
        with self._locked(), self._write_transaction():
            status = self._check(analyst, total, charge, new)
            self._insert(analyst, charge, new)
            return status

    def _sync(self) -> None:
        """The WAL on disk: every commit so far durable (:class:`dpsql.sqlitefile.WalSync`)."""
        if self._wal is None:
            return
        try:
            self._wal()
        except OSError as exc:
            raise Error(f"The budget ledger {self!r} could not be written to disk: {exc}. Check the disk "
                        "holding the ledger; nothing was released.") from exc

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
            spent = self._charges(analyst)
            return self._status(analyst, self._spent(spent, total), total, spent)

    def events(self, analyst: str) -> list[ChargeRecord]:
        """Return ``analyst``'s charges, oldest first."""
        with self._locked():
            rows = self._records(analyst)
        return [_record(row) for row in rows]

    def analysts(self) -> list[str]:
        """Every analyst with a charge in the ledger, sorted."""
        with self._locked():
            rows = self._conn.execute("SELECT DISTINCT analyst FROM events ORDER BY analyst").fetchall()
        return [row[0] for row in rows]

    def close(self) -> None:
        """Close the database connection. Closing twice is harmless."""
        self._syncer.close()
        with self._lock:
            if self._wal is not None:
                self._wal.close()
            self._conn.close()
            if self._lock_file is not None and not self._lock_file.closed:
                self._lock_file.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.path if self.path is not None else ":memory:"
        return f"Ledger({where!r}, accountant={self.accountant.name!r})"

    # -- private ------------------------------------------------------------------------

    def _locked(self) -> AbstractContextManager[None]:
        """Hold the lock; turn a database failure into a :class:`~dpsql.errors.Error`."""
        return guarded(self._lock, lambda exc: Error(
            f"The budget ledger {self!r} failed: {exc}. If the ledger is closed, open a new "
            "one; otherwise check that its file is readable and writable."))

    def _write_transaction(self) -> AbstractContextManager[None]:
        """Run the body in ``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any error.

        Writers from several processes (the server's workers) first queue on the flock of
        ``<ledger>.lock`` (:func:`dpsql.sqlitefile.open_writer_queue`): the kernel wakes the
        next one the moment it is released, where SQLite's busy handler would poll in sleeps
        of up to 100 ms; the transaction still decides. A commit writes the WAL
        (``synchronous=NORMAL``); one fdatasync of it (:meth:`_sync`, outside the lock) makes
        the charge durable before its answer leaves (:mod:`dpsql.privacy.reservation`).
        """
        return write_transaction(self._conn, self._lock_file)

    def _records(self, analyst: str) -> list[sqlite3.Row]:
        cursor = self._conn.execute(
            "SELECT id, analyst, time, query, epsilon_units, delta_units, mechanisms "
            "FROM events WHERE analyst = ? ORDER BY id", (analyst,))
        return cursor.fetchall()

    def _charges(self, analyst: str) -> _Spent:
        """``analyst``'s stored charges, oldest first, each parsed only once.

        Events are append-only and ids grow in commit order (each insert is its own
        ``BEGIN IMMEDIATE`` transaction), so only rows past the last id seen are read."""
        spent = self._seen.get(analyst) or self._seen.setdefault(analyst, _Spent(keep=not self._additive))
        rows = self._conn.execute(
            "SELECT id, query, epsilon_units, delta_units, mechanisms "
            "FROM events WHERE analyst = ? AND id > ? ORDER BY id", (analyst, spent.last_id))
        for row in rows:
            charge = Charge(units_to_epsilon(row[2]), units_to_delta(row[3]), row[1], decode(row[4]))
            spent.add(_Stored(row[0], charge, (row[2], row[3]), _mu_part(charge)))
        return spent

    def _check(self, analyst: str, total: tuple[int, int], charge: Charge,
               new: tuple[int, int]) -> BudgetStatus:
        """Compose stored charges with ``charge``; raise BudgetExceeded if over ``total``."""
        spent = self._charges(analyst)
        adding = _Stored(0, charge, new, _mu_part(charge))
        if self._additive:  # the running sums plus this one: exactly what re-summing gives
            after = (spent.units[0] + new[0], spent.units[1] + new[1])
        else:
            after = self._compose([*self._kept(spent), adding], total)
        if after[0] > total[0] or after[1] > total[1]:
            raise _budget_exceeded(analyst, new, self._spent(spent, total), after, total, self.accountant.name)
        return self._status(analyst, after, total, spent, adding)

    def _spent(self, spent: _Spent, total: tuple[int, int]) -> tuple[int, int]:
        """What the stored charges compose to (running sums under basic composition)."""
        return spent.units if self._additive else self._compose(self._kept(spent), total)

    def _status(self, analyst: str, spent: tuple[int, int], total: tuple[int, int],
                stored: _Spent, adding: _Stored | None = None) -> BudgetStatus:
        return BudgetStatus(
            analyst=analyst,
            epsilon_spent=units_to_epsilon(spent[0]), delta_spent=units_to_delta(spent[1]),
            epsilon_total=units_to_epsilon(total[0]), delta_total=units_to_delta(total[1]),
            epsilon_remaining=units_to_epsilon(max(0, total[0] - spent[0])),
            delta_remaining=units_to_delta(max(0, total[1] - spent[1])),
            queries=stored.count + (adding is not None), accountant=self.accountant.name,
            mu=stored.mu(adding.mu_part if adding is not None else (0.0, 0)))

    def _insert(self, analyst: str, charge: Charge, units: tuple[int, int]) -> None:
        self._conn.execute(
            "INSERT INTO events (analyst, time, query, epsilon_units, delta_units, mechanisms)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (analyst, time.time(), charge.query, units[0], units[1],
             _events_json(charge.events)))

    @staticmethod
    def _kept(spent: _Spent) -> list[_Stored]:
        if spent.stored is None:
            raise InternalError("the ledger composes charges it did not keep")
        return spent.stored

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


class _Spent:
    """An analyst's stored charges, oldest first, with running totals kept as each is
    added, so a charge does not re-sum them all (1.5 ms at 10,000 charges): the exact
    integer sums of their units (what basic composition returns), and their Gaussian-DP
    parts, summed exactly (a :class:`~fractions.Fraction` of the float squares: rounded
    once at the end, it is ``math.fsum`` of them, which is correctly rounded too).

    ``keep``: keep the charges, for an accountant that composes them; under basic composition
    the totals are all (each charge kept slowed every full garbage collection: issue 16)."""

    __slots__ = ("count", "last_id", "mu_count", "mu_squares", "mu_unknown", "stored", "units")

    def __init__(self, keep: bool = True) -> None:
        self.stored: list[_Stored] | None = [] if keep else None
        self.count = self.last_id = self.mu_count = 0
        self.units, self.mu_squares, self.mu_unknown = (0, 0), Fraction(0), False

    def add(self, stored: _Stored) -> None:
        if self.stored is not None:
            self.stored.append(stored)
        self.count += 1
        self.last_id = stored.id
        self.units = (self.units[0] + stored.units[0], self.units[1] + stored.units[1])
        if stored.mu_part is None:
            self.mu_unknown = True
        else:
            self.mu_squares += Fraction(stored.mu_part[0])
            self.mu_count += stored.mu_part[1]

    def mu(self, adding: tuple[float, int] | None) -> float | None:
        """:func:`~dpsql.privacy.accountants._combine_mu_parts` of the stored parts and
        ``adding``: None if any part is None or there are no measurements."""
        if self.mu_unknown or adding is None or not self.mu_count + adding[1]:
            return None
        return math.sqrt(float(self.mu_squares + Fraction(adding[0])))


def _record(row: sqlite3.Row) -> ChargeRecord:
    return ChargeRecord(
        id=row["id"], analyst=row["analyst"], time=row["time"], query=row["query"],
        epsilon=units_to_epsilon(row["epsilon_units"]),
        delta=units_to_delta(row["delta_units"]),
        events=decode(row["mechanisms"]))


def _open(path: str | None) -> sqlite3.Connection:
    """Open (creating if needed) a ledger database and check that it is one."""
    if path is not None:
        _check_directory(path)
    try:
        return open_database(path, lambda conn: _prepare(conn, path), )
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc


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


def _prepare(conn: sqlite3.Connection, path: str | None) -> None:
    """Set the pragmas, then create the schema or check the existing one."""
    conn.row_factory = sqlite3.Row
    # Read first: a foreign database is refused before any pragma changes its file.
    _check_schema(conn, path)
    make_durable(conn, sync=False)  # each commit's fsync: Ledger._sync
    with write_transaction(conn):
        if not _check_schema(conn, path):
            _create_schema(conn)


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

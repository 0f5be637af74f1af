"""DB-API 2.0 (PEP 249) over a dpsql connection: cursors, parameters, the exception names.

A :class:`~dpsql.connection.Connection` is a DB-API connection: ``conn.cursor()`` gives a
:class:`Cursor`, ``commit()`` and ``rollback()`` do nothing (dpsql only reads; a charge is
final and is never rolled back), ``close()`` closes it. So code written for sqlite3,
DuckDB or psycopg, and ``pandas.read_sql``, work unchanged::

    >>> import dpsql
    >>> conn = dpsql.connect(DEMO_DB, policy=DEMO_POLICY, analyst="alice")   # doctest: +SKIP
    >>> cur = conn.cursor(epsilon=0.5)                                      # doctest: +SKIP
    >>> cur.execute("SELECT COUNT(*) AS n FROM visits WHERE age > ?", (30,))  # doctest: +SKIP
    >>> cur.description[0][0], cur.fetchone()                               # doctest: +SKIP
    ('n', (70012,))
    >>> cur.result.accuracy["n"]                                            # doctest: +SKIP
    719.0

- **Parameters** (``paramstyle = "qmark"``; ``$1``, ``$2`` work too, as in DuckDB) are
  bound as literal nodes on the parsed SQL before analysis (:mod:`dpsql.params`), never
  pasted into its text.
- **Epsilon and delta**: each ``execute`` spends the cursor's ``epsilon``/``delta``
  (given to ``conn.cursor(epsilon=..., delta=...)``, settable, and by default the policy's
  ``default_epsilon`` and 0), or the ``epsilon=``/``delta=`` passed to that ``execute``.
  Every execute is charged like :meth:`~dpsql.connection.Connection.execute` (a repeat of a
  released query is free).
- ``cursor.result`` is the last :class:`~dpsql.result.Result`: its ``privacy`` and
  ``accuracy`` are what a DB-API row cannot carry.
- ``description`` gives each column's name and type code (an Arrow type name that compares
  equal to :data:`NUMBER`, :data:`STRING`, :data:`DATETIME`, :data:`BINARY` or :data:`ROWID`
  as PEP 249 asks); ``rowcount`` is the number of rows of the answer (-1 before any).

Errors are the PEP 249 names, all under :class:`dpsql.Error` (see :mod:`dpsql.errors`):
a refused query is a :class:`ProgrammingError`, an exceeded budget or a failed run an
:class:`OperationalError`, a misused cursor an :class:`InterfaceError`.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dpsql import errors
from dpsql.errors import Error
from dpsql.params import bind_values

if TYPE_CHECKING:
    from dpsql.connection import Connection
    from dpsql.result import Result

__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "Binary",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Date",
    "DateFromTicks",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "Warning",
    "apilevel",
    "connect",
    "paramstyle",
    "threadsafety",
]

#: PEP 249 module attributes.
apilevel = "2.0"
#: Threads may share the module, not connections (one query at a time per connection).
threadsafety = 1
paramstyle = "qmark"

# The PEP 249 exception names, from the one tree in dpsql.errors (dpsql.Error is the root).
Warning = errors.Warning  # noqa: A001 - the name PEP 249 asks for
InterfaceError = errors.InterfaceError
DatabaseError = errors.DatabaseError
DataError = errors.DataError
OperationalError = errors.OperationalError
IntegrityError = errors.IntegrityError
InternalError = errors.InternalError
ProgrammingError = errors.ProgrammingError
NotSupportedError = errors.NotSupportedError


def connect(*args: Any, **kwargs: Any) -> Connection:
    """The module's connection constructor: :func:`dpsql.connect`."""
    from dpsql.connection import connect as open_connection  # noqa: PLC0415 - no cycle at import

    return open_connection(*args, **kwargs)


# ---------------------------------------------------------------- types


class _TypeObject:
    """A PEP 249 type object: equal to every type code of its kind."""

    def __init__(self, name: str, *prefixes: str) -> None:
        self.name = name
        self._prefixes = prefixes

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _TypeObject):
            return other is self
        return isinstance(other, str) and other.startswith(self._prefixes)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"dpsql.dbapi.{self.name}"


STRING = _TypeObject("STRING", "string", "large_string", "string_view")
BINARY = _TypeObject("BINARY", "binary", "large_binary", "fixed_size_binary", "binary_view")
NUMBER = _TypeObject("NUMBER", "int", "uint", "float", "double", "halffloat", "decimal", "bool")
DATETIME = _TypeObject("DATETIME", "date", "time", "timestamp", "duration")
ROWID = _TypeObject("ROWID", "\0rowid")  # dpsql never releases row ids

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime


def DateFromTicks(ticks: float) -> datetime.date:  # noqa: N802 - PEP 249's name
    return Date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> datetime.time:  # noqa: N802 - PEP 249's name
    return Time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> datetime.datetime:  # noqa: N802 - PEP 249's name
    return Timestamp(*time.localtime(ticks)[:6])


def Binary(value: bytes | bytearray | memoryview) -> bytes:  # noqa: N802 - PEP 249's name
    return bytes(value)


# ---------------------------------------------------------------- the cursor

Description = tuple[str, str, None, None, None, None, bool]


class Cursor:
    """A PEP 249 cursor over a dpsql :class:`~dpsql.connection.Connection`.

    Attributes:
        epsilon, delta: what each ``execute`` spends unless it names its own (``None``:
            the policy's ``default_epsilon``, and 0).
        arraysize: rows ``fetchmany()`` returns by default (1, as PEP 249 says).
        result: the last answer as a :class:`~dpsql.result.Result` (privacy, accuracy),
            ``None`` before the first.
    """

    def __init__(self, connection: Connection, *, epsilon: float | None = None, delta: float | None = None) -> None:
        self.connection = connection
        self.epsilon = epsilon
        self.delta = delta
        self.arraysize = 1
        self.result: Result | None = None
        self._rows: list[tuple[Any, ...]] = []
        self._position = 0
        self._closed = False

    # -- executing ----------------------------------------------------------------------

    def execute(
        self,
        operation: str,
        parameters: Sequence[object] | None = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> Cursor:
        """Answer one SELECT with differential privacy, charging (epsilon, delta).

        ``parameters`` fill the ``?`` (or ``$1``...) placeholders, bound as literals.
        Returns the cursor (so ``cur.execute(...).fetchall()`` works, as in sqlite3).

        Raises:
            ProgrammingError: the query is refused (nothing charged) or a parameter cannot
                be bound; :class:`dpsql.QueryRejected` and :class:`dpsql.PolicyViolation`
                are ProgrammingErrors.
            OperationalError: the budget cannot pay (:class:`dpsql.BudgetExceeded`), or
                the run failed after the charge (:class:`dpsql.QueryFailed`).
        """
        self._check_open()
        sql = bind_values(operation, parameters)
        result = self.connection.execute(
            sql,
            epsilon=self.epsilon if epsilon is None else epsilon,
            delta=self.delta if delta is None else delta,
        )
        self.result = result
        self._rows = result.fetchall()
        self._position = 0
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Sequence[object]]) -> Cursor:
        """Execute ``operation`` once per parameter sequence; each run is charged.

        The cursor then holds the last run's answer.
        """
        self._check_open()
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
        return self

    # -- results ------------------------------------------------------------------------

    @property
    def description(self) -> list[Description] | None:
        """Per column (name, type_code, None, None, None, None, null_ok); ``None`` before
        any query."""
        if self.result is None:
            return None
        schema = self.result.arrow().schema
        return [(f.name, str(f.type), None, None, None, None, f.nullable) for f in schema]

    @property
    def rowcount(self) -> int:
        """Rows in the last answer; -1 before any."""
        return -1 if self.result is None else len(self._rows)

    @property
    def rownumber(self) -> int | None:
        """The index of the next row ``fetchone`` returns (PEP 249 extension)."""
        return None if self.result is None else self._position

    lastrowid = None

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or ``None`` when there is none left."""
        rows = self._remaining(1)
        return rows[0] if rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        """Up to ``size`` (default ``arraysize``) further rows; an empty list at the end."""
        size = self.arraysize if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProgrammingError(f"fetchmany needs a row count >= 0, got {size!r}.")
        return self._remaining(size)

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every remaining row."""
        return self._remaining(None)

    def _remaining(self, size: int | None) -> list[tuple[Any, ...]]:
        self._check_open()
        if self.result is None:
            raise ProgrammingError("no results to fetch: call execute() first.")
        end = len(self._rows) if size is None else min(len(self._rows), self._position + size)
        rows = self._rows[self._position:end]
        self._position = end
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    # -- what PEP 249 asks for and dpsql does not need ----------------------------------

    def setinputsizes(self, sizes: object) -> None:
        """Does nothing (PEP 249 allows it)."""

    def setoutputsize(self, size: object, column: object = None) -> None:
        """Does nothing (PEP 249 allows it)."""

    def close(self) -> None:
        """Close the cursor; the connection stays open. Closing twice is harmless."""
        self._closed = True
        self._rows = []

    def __enter__(self) -> Cursor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("this cursor is closed; open a new one with conn.cursor().")
        closed = getattr(self.connection, "closed", False)
        if closed:
            raise InterfaceError("this dpsql connection is closed; open a new one with dpsql.connect().")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.rowcount} rows" if self.result is not None else "no query yet"
        return f"<dpsql Cursor: {state}>"


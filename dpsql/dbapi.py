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
from typing import Any

from dpsql import errors
from dpsql.connection import Connection
from dpsql.opener import connect as _connect
from dpsql.cursor import Cursor
from dpsql.errors import Error

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
    return _connect(*args, **kwargs)


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

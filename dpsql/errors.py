"""The exception hierarchy.

Every error dpsql raises on purpose is a :class:`Error`. Under it sit the categories of
DB-API 2.0 (PEP 249), so code written for any database driver catches dpsql's errors by
the names it knows, and dpsql's own classes say exactly what happened::

    Error
    ├── InterfaceError            a closed cursor or connection used (PEP 249)
    └── DatabaseError             (PEP 249)
        ├── ProgrammingError      (PEP 249)
        │   ├── QueryRejected     the SQL cannot be answered privately (shape, function, syntax)
        │   └── PolicyViolation   the SQL touches what the policy forbids (column, table, access)
        ├── OperationalError      (PEP 249)
        │   ├── BudgetExceeded    the analyst's budget cannot pay for the query
        │   ├── QueryFailed       the engine failed after the charge: one fixed, message-free error
        │   ├── RateLimited       an analyst sent more queries than the server's rate limit allows
        │   └── AuthenticationError  a network client's token is wrong or revoked
        ├── PolicyError           the policy file is malformed or does not match the data
        ├── InternalError         a broken internal assumption: probably a bug in dpsql (PEP 249's name)
        ├── DataError, IntegrityError, NotSupportedError   (PEP 249; not raised by dpsql)
    Warning                       (PEP 249: an Exception, not an Error; not raised by dpsql)

Messages say what was wrong and how to fix it. A refused query charges nothing.
:class:`QueryFailed` is the exception: it is raised only after the charge (its budget is
spent) and says nothing of why, because why could depend on the private data (DESIGN §7).
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BudgetExceeded",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "PolicyError",
    "PolicyViolation",
    "ProgrammingError",
    "QueryFailed",
    "QueryRejected",
    "RateLimited",
    "Warning",
]


class Error(Exception):
    """Root of every error dpsql raises on purpose."""


class Warning(Exception):  # noqa: A001 - PEP 249's name
    """PEP 249's warning category (dpsql raises none)."""


class InterfaceError(Error):
    """The interface was misused: a closed cursor or connection (PEP 249)."""


class DatabaseError(Error):
    """An error of the database proper (PEP 249); every dpsql error but InterfaceError."""


class DataError(DatabaseError):
    """PEP 249's category for bad data values (dpsql raises none)."""


class OperationalError(DatabaseError):
    """The query could not be run as things stand: budget, rate, a failed run, a token."""


class IntegrityError(DatabaseError):
    """PEP 249's category for integrity violations (dpsql only reads: it raises none)."""


class ProgrammingError(DatabaseError):
    """The query or its parameters cannot be answered as written."""


class NotSupportedError(DatabaseError):
    """PEP 249's category for unsupported API use (dpsql raises none)."""


class PolicyError(DatabaseError):
    """The policy file is malformed, or does not match the database."""


class QueryRejected(ProgrammingError):
    """The SQL cannot be answered with differential privacy as written."""


class PolicyViolation(ProgrammingError):
    """The SQL uses a table or column in a way the policy forbids."""


class BudgetExceeded(OperationalError):
    """The analyst's remaining budget cannot pay for the query; nothing was charged."""

    def __init__(
        self,
        message: str,
        *,
        requested: tuple[float, float] = (0.0, 0.0),
        remaining: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.remaining = remaining


class AuthenticationError(OperationalError):
    """A network client's token is unknown, wrong or revoked."""


class InternalError(DatabaseError):
    """An internal assumption broke. This is probably a bug in dpsql: please report it.

    The message says what broke; the class adds that it is probably a bug, so callers
    do not repeat it:

    >>> str(InternalError("k must be in [1, 64], got 0"))
    'k must be in [1, 64], got 0. This is probably a bug in dpsql: please report it.'
    """

    NOTE = "This is probably a bug in dpsql: please report it."

    def __init__(self, message: str = "an internal assumption broke") -> None:
        text = message.strip()
        if not text.endswith(self.NOTE):  # idempotent: unpickling passes the full text again
            text = f"{text if text.endswith(('.', '!', '?')) else text + '.'} {self.NOTE}"
        super().__init__(text)


class QueryFailed(OperationalError):
    """The query was charged, then failed while reading the data (or ran past its deadline).

    The message is one fixed text, whatever happened: an engine's own message, the time it
    took, or which row tripped it could all tell something about one person's data. The
    charge stands (DESIGN §7: an outcome that may depend on the data is a release).
    """

    MESSAGE = (
        "the query was charged but could not be answered (its run failed or passed its "
        "deadline); no details are given because they could depend on the private data. "
        "Simplify the query, or ask the data owner to check the server's log."
    )

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.MESSAGE)


class RateLimited(OperationalError):
    """Too many queries from one analyst in a short time; nothing was charged."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (an engine's message runs on with
    context lines), or the exception's class name when it has no message.

    >>> first_line(ValueError("Conversion Error: bad value\\nLINE 1: SELECT ..."))
    'Conversion Error: bad value'
    >>> first_line(KeyError())
    'KeyError'
    """
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

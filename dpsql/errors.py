"""The exception hierarchy.

Every error dpsql raises on purpose is a :class:`Error`; the tree is flat::

    Error
    ├── PolicyError           the policy file is malformed or does not match the data
    ├── QueryRejected         the SQL cannot be answered privately (shape, function, syntax)
    ├── PolicyViolation       the SQL touches what the policy forbids (column, table, access)
    ├── BudgetExceeded        the analyst's budget cannot pay for the query
    ├── QueryFailed           the engine failed after the charge: one fixed, message-free error
    ├── RateLimited           an analyst sent more queries than the server's rate limit allows
    ├── AuthenticationError   a network client's token is wrong or revoked
    └── InternalError         a broken internal assumption: probably a bug in dpsql

Messages say what was wrong and how to fix it. A refused query charges nothing.
:class:`QueryFailed` is the exception: it is raised only after the charge (its budget is
spent) and says nothing of why, because why could depend on the private data (DESIGN §7).
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BudgetExceeded",
    "Error",
    "InternalError",
    "PolicyError",
    "PolicyViolation",
    "QueryFailed",
    "QueryRejected",
    "RateLimited",
]


class Error(Exception):
    """Root of every error dpsql raises on purpose."""


class PolicyError(Error):
    """The policy file is malformed, or does not match the database."""


class QueryRejected(Error):
    """The SQL cannot be answered with differential privacy as written."""


class PolicyViolation(Error):
    """The SQL uses a table or column in a way the policy forbids."""


class BudgetExceeded(Error):
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


class AuthenticationError(Error):
    """A network client's token is unknown, wrong or revoked."""


class InternalError(Error):
    """An internal assumption broke. This is probably a bug in dpsql: please report it."""


class QueryFailed(Error):
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


class RateLimited(Error):
    """Too many queries from one analyst in a short time; nothing was charged."""

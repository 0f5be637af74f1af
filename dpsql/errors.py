"""The exception hierarchy.

Every error dpsql raises on purpose is a :class:`Error`; the tree is flat::

    Error
    ├── PolicyError           the policy file is malformed or does not match the data
    ├── QueryRejected         the SQL cannot be answered privately (shape, function, syntax)
    ├── PolicyViolation       the SQL touches what the policy forbids (column, table, access)
    ├── BudgetExceeded        the analyst's budget cannot pay for the query
    ├── AuthenticationError   a network client's token is wrong or revoked
    └── InternalError         a broken internal assumption: probably a bug in dpsql

Messages say what was wrong and how to fix it. A refused query charges nothing.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BudgetExceeded",
    "Error",
    "InternalError",
    "PolicyError",
    "PolicyViolation",
    "QueryRejected",
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

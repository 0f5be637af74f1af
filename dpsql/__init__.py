"""dpsql: a differentially private SQL query proxy over DuckDB.

>>> import dpsql
>>> sorted(dpsql.__all__)[:3]
['AuthenticationError', 'BudgetExceeded', 'BudgetStatus']
"""

from __future__ import annotations

from dpsql.privacy import BudgetStatus, Ledger
from dpsql.client import Client
from dpsql.connection import Connection, connect
from dpsql.errors import (
    AuthenticationError,
    BudgetExceeded,
    Error,
    InternalError,
    PolicyError,
    PolicyViolation,
    QueryFailed,
    QueryRejected,
    RateLimited,
)
from dpsql.policy import Policy, load_policy
from dpsql import local  # dpsql.local: local differential privacy, its own namespace
from dpsql.result import Result
from dpsql.version import __version__


__all__ = [
    "AuthenticationError",
    "BudgetExceeded",
    "BudgetStatus",
    "Client",
    "Connection",
    "Error",
    "InternalError",
    "Ledger",
    "Policy",
    "PolicyError",
    "PolicyViolation",
    "QueryFailed",
    "QueryRejected",
    "RateLimited",
    "Result",
    "__version__",
    "connect",
    "load_policy",
]

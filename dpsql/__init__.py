"""dpsql: a differentially private SQL query proxy over DuckDB.

The public names are imported on first use (PEP 562), so ``import dpsql`` and the
``dpsql`` command start quickly: DuckDB, Arrow and the accountants load when a connection,
a client or a ledger is first asked for.

>>> import dpsql
>>> sorted(dpsql.__all__)[:3]
['AuthenticationError', 'BudgetExceeded', 'BudgetStatus']
>>> dpsql.apilevel, dpsql.paramstyle
('2.0', 'qmark')
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpsql.errors import (
    AuthenticationError,
    BudgetExceeded,
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    PolicyError,
    PolicyViolation,
    ProgrammingError,
    QueryFailed,
    QueryRejected,
    RateLimited,
    Warning,  # noqa: A004 - PEP 249's name
)
from dpsql.version import __version__

if TYPE_CHECKING:
    from dpsql import local as local  # dpsql.local, imported on first use (__getattr__)
    from dpsql.client import Client
    from dpsql.connection import Connection
    from dpsql.opener import connect
    from dpsql.policy import Policy, load_policy
    from dpsql.privacy import BudgetStatus, Ledger
    from dpsql.result import Result

#: DB-API 2.0 (PEP 249) module globals; see :mod:`dpsql.dbapi`.
apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"

#: Where each lazily imported public name lives.
_LAZY = {
    "BudgetStatus": "dpsql.privacy",
    "Client": "dpsql.client",
    "Connection": "dpsql.connection",
    "Ledger": "dpsql.privacy",
    "Policy": "dpsql.policy",
    "Result": "dpsql.result",
    "connect": "dpsql.opener",
    "load_policy": "dpsql.policy",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "local":  # dpsql.local: local differential privacy, its own namespace
        return importlib.import_module("dpsql.local")
    raise AttributeError(f"module 'dpsql' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "local"})


__all__ = [
    "AuthenticationError",
    "BudgetExceeded",
    "BudgetStatus",
    "Client",
    "Connection",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "Ledger",
    "NotSupportedError",
    "OperationalError",
    "Policy",
    "PolicyError",
    "PolicyViolation",
    "ProgrammingError",
    "QueryFailed",
    "QueryRejected",
    "RateLimited",
    "Result",
    "Warning",
    "__version__",
    "apilevel",
    "connect",
    "load_policy",
    "paramstyle",
    "threadsafety",
]

"""Privacy policies: which tables and columns may be queried, and with how much budget.

A policy is a TOML file (DESIGN.md §3) read with :mod:`tomllib` and checked strictly
when it loads (:mod:`~dpsql.policy.parse`). An unknown key, a wrong type or an impossible
value raises :class:`~dpsql.errors.PolicyError` with a message that names the file, the
table, the column and the fix. The policy fails closed: a column it does not list is denied.

The result is a tree of frozen records (:mod:`~dpsql.policy.model`), and
:func:`check_against_schema` (:mod:`~dpsql.policy.schema`) checks it against the database.
"""

from __future__ import annotations

from dpsql.policy.model import Budget, ColumnPolicy, Policy, ServerLimits, TablePolicy
from dpsql.policy.parse import load_policy, parse_policy
from dpsql.policy.schema import check_against_schema

__all__ = [
    "Budget",
    "ColumnPolicy",
    "Policy",
    "ServerLimits",
    "TablePolicy",
    "check_against_schema",
    "load_policy",
    "parse_policy",
]

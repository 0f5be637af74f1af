"""Helpers shared by the engine-conformance tests (a module name of its own: tests/ has
another conftest.py)."""

from __future__ import annotations

from typing import Any

import dpsql
from dpsql.policy import Policy, parse_policy

#: Every engine the contract runs on.
ENGINES = ("duckdb", "spark")


def connection(engine: Any, policy: str | Policy, *, noise_source: Any = None) -> dpsql.Connection:
    """A pipeline over ``engine`` for analyst "t", in-memory ledger, every execute charged
    and freshly noised (no repeats)."""
    loaded = policy if isinstance(policy, Policy) else parse_policy(policy)
    ledger = dpsql.Ledger(None, accountant=loaded.accountant)
    return dpsql.Connection(engine, loaded, "t", ledger, noise_source=noise_source, repeats=False)


def sorted_rows(table: Any) -> list[tuple[Any, ...]]:
    """An Arrow table's rows as tuples, in a fixed order (engines return groups in any order)."""
    rows = [tuple(r.values()) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: tuple((v is None, str(type(v)), v if v is not None else 0) for v in r))

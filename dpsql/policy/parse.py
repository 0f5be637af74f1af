"""Privacy policies: which tables and columns may be queried, and with how much budget.

A policy is a TOML file (DESIGN.md §3) read with :mod:`tomllib` and checked strictly
when it loads. An unknown key, a wrong type or an impossible value raises
:class:`~dpsql.errors.PolicyError` with a message that names the file, the table, the
column and the fix. The policy fails closed: a column it does not list is denied.

The result is a tree of frozen records: :class:`Policy` holds :class:`TablePolicy`
records, which hold :class:`ColumnPolicy` records. Table and column names are looked up
case-insensitively with :meth:`str.casefold`, the way SQL identifiers are, and exactly
otherwise: no Unicode normalisation, so a look-alike name (a Cyrillic ``а`` in
``visits``) never matches. Analyst names are matched exactly.

:func:`check_against_schema` then checks the policy against the database: every table,
privacy unit and listed column must exist, and bounded columns must be numeric.

This module reads the file and its ``[privacy]``, ``[budget]`` and ``[server]`` sections;
:mod:`dpsql.policy.tables` the ``[tables.NAME]`` sections, :mod:`dpsql.policy.columns`
their columns.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from typing import Any

from dpsql.errors import PolicyError
from dpsql.policy.fields import (
    _as_table,
    _check_keys,
    _delta,
    _epsilon,
    _finite_number,
    _positive_int,
    _show,
    _Where,
)
from dpsql.policy.tables import parse_tables
from dpsql.policy.model import DEFAULT_MIN_EPSILON, Budget, Policy, ServerLimits

__all__ = ["load_policy", "parse_policy"]

_ACCOUNTANTS = ("basic", "pld")
_TOP_KEYS = ("budget", "privacy", "server", "tables")
_PRIVACY_KEYS = (
    "accountant", "default_epsilon", "max_delta_per_query", "max_epsilon_per_query", "min_epsilon_per_query",
)
_SERVER_KEYS = ("deadline_base_ms", "deadline_margin_ms", "deadline_ms", "deadline_ms_per_million_rows", "deadline_slack",
                "queries_per_minute")
_BUDGET_KEYS = ("analysts", "default")
_BUDGET_VALUE_KEYS = ("delta", "epsilon")


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and check a policy file.

    Args:
        path: The TOML policy file.

    Returns:
        The checked policy, with ``source`` set to ``path``.

    Raises:
        PolicyError: The file is missing, unreadable, not UTF-8, not TOML, or not a
            valid policy.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise PolicyError(f"{source}: policy file not found; check the path") from None
    except OSError as exc:
        raise PolicyError(f"{source}: cannot read the policy file: {exc.strerror}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{source}: the policy file is not UTF-8 text; save it as UTF-8") from exc
    return parse_policy(text, source=source)


def parse_policy(text: str, source: str = "<string>") -> Policy:
    """Parse and check a policy written in TOML.

    Args:
        text: The policy, in the format of DESIGN.md §3.
        source: Where the text came from, used in error messages.

    Returns:
        The checked policy.

    Raises:
        PolicyError: The text is not TOML or not a valid policy.

    >>> policy = parse_policy('''
    ... [privacy]
    ... max_epsilon_per_query = 1.0
    ... max_delta_per_query = 1e-6
    ... default_epsilon = 0.5
    ... [budget]
    ... default = { epsilon = 5.0, delta = 1e-5 }
    ... [tables.visits]
    ... privacy_unit = "user_id"
    ... max_groups_per_unit = 4
    ... max_rows_per_unit = 10
    ... [tables.visits.columns]
    ... age = { bounds = [0, 100] }
    ... ''')
    >>> policy.table("VISITS").column("Age")
    ColumnPolicy(name='age', access='aggregate', bounds=(0, 100), public_values=None, categories=None)
    >>> policy.table("visits").column("ssn") is None
    True
    """
    where = _Where(source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise where.error(f"invalid TOML: {exc}; fix the syntax there") from exc
    _check_keys(where, raw, _TOP_KEYS)
    max_epsilon, max_delta, default_epsilon, accountant = _parse_privacy(where, raw.get("privacy"))
    min_epsilon = _parse_min_epsilon(where, raw["privacy"], max_epsilon, default_epsilon)
    default_budget, analysts = _parse_budgets(where, raw.get("budget"))
    return Policy(
        source=source,
        max_epsilon_per_query=max_epsilon,
        max_delta_per_query=max_delta,
        default_epsilon=default_epsilon,
        accountant=accountant,
        default_budget=default_budget,
        analysts=analysts,
        tables=parse_tables(where, raw.get("tables")),
        min_epsilon_per_query=min_epsilon,
        server=_parse_server(where, raw.get("server")),
    )


# ---------------------------------------------------------------- sections


def _parse_privacy(where: _Where, raw: object) -> tuple[float, float, float, str]:
    """Check the [privacy] section: per-query limits, default epsilon, accountant."""
    if raw is None:
        raise where.error(
            "missing [privacy] section; add one with max_epsilon_per_query, "
            "max_delta_per_query and default_epsilon"
        )
    where = where.at("[privacy]")
    body = _as_table(where, raw, "a [privacy] section")
    _check_keys(where, body, _PRIVACY_KEYS)
    max_epsilon = _epsilon(where, body, "max_epsilon_per_query")
    max_delta = _delta(where, body, "max_delta_per_query")
    default_epsilon = _epsilon(where, body, "default_epsilon")
    if default_epsilon > max_epsilon:
        raise where.error(
            f"default_epsilon = {default_epsilon} is more than max_epsilon_per_query = "
            f"{max_epsilon}; lower default_epsilon or raise max_epsilon_per_query"
        )
    accountant = body.get("accountant", "basic")
    if accountant not in _ACCOUNTANTS:
        allowed = ", ".join(f'"{name}"' for name in _ACCOUNTANTS)
        raise where.error(f"unknown accountant {_show(accountant)}; use one of {allowed}")
    return max_epsilon, max_delta, default_epsilon, accountant


def _parse_min_epsilon(where: _Where, raw: Mapping[str, Any], max_epsilon: float, default_epsilon: float) -> float:
    """``min_epsilon_per_query``: positive, at most the default and the maximum."""
    where = where.at("[privacy]")
    if "min_epsilon_per_query" not in raw:
        return min(DEFAULT_MIN_EPSILON, default_epsilon)
    floor = _epsilon(where, raw, "min_epsilon_per_query")
    if floor > default_epsilon:
        raise where.error(
            f"min_epsilon_per_query = {floor} is more than default_epsilon = {default_epsilon}; "
            "lower min_epsilon_per_query or raise default_epsilon"
        )
    return min(floor, max_epsilon)


def _parse_server(where: _Where, raw: object) -> ServerLimits:
    """The optional [server] section."""
    if raw is None:
        return ServerLimits()
    where = where.at("[server]")
    body = _as_table(where, raw, "a [server] section")
    _check_keys(where, body, _SERVER_KEYS)
    limits = ServerLimits()
    rate = _positive_int(where, body, "queries_per_minute") if "queries_per_minute" in body else limits.queries_per_minute
    slack = limits.deadline_slack
    if "deadline_slack" in body:
        slack = _finite_number(where, "deadline_slack", body["deadline_slack"])
        if slack < 1:
            raise where.error(f"deadline_slack must be at least 1 (1 = no room over the measured speed), got {slack}")
    margin = limits.deadline_margin_ms
    if "deadline_margin_ms" in body:
        margin = float(_finite_number(where, "deadline_margin_ms", body["deadline_margin_ms"]))
        if margin < 0:
            raise where.error(f"deadline_margin_ms must be a number of milliseconds >= 0, got {margin}")
    times: dict[str, float | None] = {}
    for key in ("deadline_ms", "deadline_base_ms", "deadline_ms_per_million_rows"):
        value = None
        if key in body:
            value = float(_finite_number(where, key, body[key]))
            if value <= 0:
                raise where.error(f"{key} must be a positive number of milliseconds, got {value}")
        times[key] = value
    if (times["deadline_base_ms"] is None) != (times["deadline_ms_per_million_rows"] is None):
        raise where.error("give both deadline_base_ms and deadline_ms_per_million_rows (the speed model), or neither "
                          "(the server then measures this machine when it starts)")
    return ServerLimits(queries_per_minute=rate, deadline_slack=float(slack), deadline_margin_ms=margin, **times)


def _parse_budgets(where: _Where, raw: object) -> tuple[Budget, dict[str, Budget]]:
    """Check the [budget] section: the default budget and per-analyst budgets."""
    example = "default = { epsilon = 5.0, delta = 1e-5 }"
    if raw is None:
        raise where.error(f"missing [budget] section; add one with {example}")
    section = where.at("[budget]")
    body = _as_table(section, raw, "a [budget] section")
    _check_keys(section, body, _BUDGET_KEYS)
    if "default" not in body:
        raise section.error(f"missing the default budget; add {example}")
    default = _parse_budget(where.at("[budget] default"), body["default"])
    listed = _as_table(
        where.at("[budget.analysts]"), body.get("analysts", {}), "a table of analyst budgets"
    )
    analysts = {
        str(name): _parse_budget(where.at(f"[budget.analysts] analyst {name!r}"), value)
        for name, value in listed.items()
    }
    return default, analysts


def _parse_budget(where: _Where, raw: object) -> Budget:
    """Check one ``{ epsilon = ..., delta = ... }`` budget."""
    body = _as_table(where, raw, "a budget such as { epsilon = 5.0, delta = 1e-5 }")
    _check_keys(where, body, _BUDGET_VALUE_KEYS)
    return Budget(epsilon=_epsilon(where, body, "epsilon"), delta=_delta(where, body, "delta"))

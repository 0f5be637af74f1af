"""The text passes of :mod:`dpsql.normalize`, run on the SQL before it is parsed:
BigQuery's ``WITH DIFFERENTIAL_PRIVACY OPTIONS``, ``contribution_bounds_per_group`` /
``_per_row`` arguments, T-SQL's ``TOP n``; and the dialect and budget helpers the
connection uses before the analyzer."""

from __future__ import annotations

import re

from dpsql.errors import QueryRejected

#: sqlglot readers an analyst may name.
DIALECTS = ("duckdb", "postgres", "bigquery", "tsql", "spark", "databricks", "mysql", "snowflake", "sqlite",
            "trino", "presto", "redshift", "hive", "clickhouse", "oracle")

_DP_CLAUSE = re.compile(r"(?is)\bSELECT(\s+WITH\s+DIFFERENTIAL_PRIVACY\s+OPTIONS\s*\(([^()]*)\))")
_BOUNDS_ARG = re.compile(
    r"(?is),\s*contribution_bounds_per_(group|row)\s*=>\s*\(\s*([-+]?[\d.]+(?:e[-+]?\d+)?)\s*,\s*([-+]?[\d.]+(?:e[-+]?\d+)?)\s*\)"
)
_TOP = re.compile(r"(?is)^(\s*SELECT(?:\s+(?:DISTINCT|ALL))?)(\s+TOP\s*(?:\(\s*(\d+)\s*\)|(\d+)))(?=\s)")
_OPTION = re.compile(r"(?is)^\s*([a-z_]+)\s*=\s*([^\s,]+)\s*$")


def _blank(text: str, start: int, end: int) -> str:
    """``text`` with ``[start, end)`` replaced by spaces: positions after it stay valid for
    the caret under an error."""
    return text[:start] + " " * (end - start) + text[end:]


def _dp_options(sql: str) -> tuple[str, dict[str, str]]:
    match = _DP_CLAUSE.search(sql)
    if match is None:
        return sql, {}
    options: dict[str, str] = {}
    for part in filter(str.strip, match.group(2).split(",")):
        item = _OPTION.match(part)
        if item is None:
            raise QueryRejected(f"cannot read the differential privacy option {part.strip()!r}; write name = value.")
        options[item.group(1).lower()] = item.group(2)
    return _blank(sql, match.start(1), match.end(1)), options


def check_dialect(dialect: str | None) -> str | None:
    """``dialect`` lower-cased, or a refusal naming the dialects dpsql reads."""
    if dialect is None:
        return None
    if not isinstance(dialect, str) or dialect.lower() not in DIALECTS:
        raise QueryRejected(f"unknown SQL dialect {dialect!r}; use one of {', '.join(DIALECTS)}.")
    return dialect.lower()


def without_options(sql: str) -> str:
    """``sql`` without its BigQuery ``WITH DIFFERENTIAL_PRIVACY OPTIONS`` clause (blanked)."""
    return _dp_options(sql)[0] if isinstance(sql, str) else sql


def query_budget(sql: object, epsilon: float | None, delta: float | None) -> tuple[float | None, float | None]:
    """The (epsilon, delta) a query asks for: the arguments, or a BigQuery ``WITH
    DIFFERENTIAL_PRIVACY OPTIONS`` clause's; both, if they differ, is refused."""
    if not isinstance(sql, str):
        return epsilon, delta
    _, options = _dp_options(sql)
    out = []
    for name, given in (("epsilon", epsilon), ("delta", delta)):
        written = _number(name, options[name]) if name in options else None
        if written is not None and given is not None and written != given:
            raise QueryRejected(
                f"the query's OPTIONS set {name} = {options[name]} and the call passes {name}={given}; give it once."
            )
        out.append(written if written is not None else given)
    return out[0], out[1]


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise QueryRejected(f"the option {name} must be a number, got {text!r}.") from None


def _contribution_bounds(sql: str) -> tuple[str, list[tuple[str, float, float]]]:
    """``AGG(arg, contribution_bounds_per_group => (lo, hi))`` -> ``AGG(__dp_bounds(arg, lo, hi))``."""
    found: list[tuple[str, float, float]] = []
    while True:
        match = _BOUNDS_ARG.search(sql)
        if match is None:
            return sql, found
        depth, start = 0, match.start()
        while start > 0:
            start -= 1
            if sql[start] == ")":
                depth += 1
            elif sql[start] == "(":
                if depth == 0:
                    break
                depth -= 1
        arg = sql[start + 1 : match.start()]
        lo, hi = float(match.group(2)), float(match.group(3))
        if not lo < hi:
            raise QueryRejected(f"contribution bounds ({match.group(2)}, {match.group(3)}) need lower < upper.")
        found.append((arg.strip(), lo, hi))
        sql = f"{sql[:start + 1]}__dp_bounds({arg}, {match.group(2)}, {match.group(3)}){sql[match.end():]}"


def _top(sql: str) -> tuple[str, int | None]:
    match = _TOP.match(sql)
    if match is None:
        return sql, None
    return _blank(sql, match.start(2), match.end(2)), int(match.group(3) or match.group(4))

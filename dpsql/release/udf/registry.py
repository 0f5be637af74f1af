"""Registered functions, and which mechanism answers them.

A :class:`UDF` is what ``conn.register_udf(name, fn, bounds=...)`` records once
:func:`validate_udf` has checked it. A :class:`QuantileSpec` describes the built-in order
statistics (``MEDIAN(col)``, ``QUANTILE_CONT(col, q)``). :func:`choose_strategy` picks the
mechanism for either, from public quantities only (a public or noisy unit count, the
bounds, epsilon and delta), and says why in words the analyst can read.

Strategy rule (DESIGN §5):

- an explicit ``strategy`` given at registration is honoured (and rejected if it cannot
  run: PTR and smooth sensitivity need a local sensitivity and ``delta > 0``);
- no computable local sensitivity: sample-and-aggregate, which works for any function;
- ``delta == 0``: sample-and-aggregate (pure epsilon-DP; PTR and smooth sensitivity need
  a delta);
- otherwise sample-and-aggregate, PTR or smooth sensitivity, whichever has the smallest
  modelled mean absolute error at the aggregate's epsilon and delta on evenly spread data
  of the estimated size (a noisy unit count the release pays for anyway; see
  ``expected_error`` in each module). Smooth sensitivity needs about ``1/beta = 2 ln(2/delta)
  / epsilon`` units before its noise falls below the whole range, so on small groups or a
  small epsilon share sample-and-aggregate wins (issue 15: per-region MEDIAN(age) on the
  demo at epsilon 1 erred by 1.19 on average with smooth sensitivity against 0.56 with
  sample-and-aggregate, as the models predicted, 2.07 against 0.98). Without an analyst's
  proposal PTR
  must hedge against refusal and spends half its budget on the test, so on that model
  smooth sensitivity always wins (its error is about ``ln(2/delta) / (e ln(1/delta))``,
  some 0.4, of PTR's). An analyst's proposal is taken at its word (noise ``2 b / eps``),
  so a tight one makes PTR the choice; if the data is less stable than claimed, the
  answer is refused, and the refusal is charged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from dpsql.errors import QueryRejected
from dpsql.release.udf import ptr, sample_and_aggregate, smooth
from dpsql.release.udf._release import check_bounds
from dpsql.plan import QuantileSpec, Strategy, UDFSpec
from dpsql.release.udf.sample_and_aggregate import DEFAULT_TIME_LIMIT

__all__ = [
    "DPSQL_AGGREGATES",
    "STRATEGIES",
    "QuantileSpec",
    "StrategyChoice",
    "UDF",
    "UDFSpec",
    "choose_strategy",
    "reserved_names",
    "validate_udf",
]

#: Strategies a registration may ask for.
STRATEGIES: tuple[str, ...] = ("auto", "ptr", "smooth", "sample_and_aggregate")
#: Aggregates dpsql itself answers (or refuses by name): a UDF may not shadow them.
DPSQL_AGGREGATES: frozenset[str] = frozenset({
    "count", "sum", "avg", "mean", "median", "quantile", "quantile_cont", "quantile_disc",
    "percentile_cont", "percentile_disc", "var", "variance", "var_pop", "var_samp", "stddev",
    "stddev_pop", "stddev_samp", "min", "max", "list", "string_agg", "approx_count_distinct",
    "approx_quantile", "mode", "first", "last", "any_value", "arg_min", "arg_max",
})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class UDF:
    """A registered function (frozen; build it with :func:`validate_udf`). The connection
    keeps it by name; a plan holds only its :attr:`spec` (plain data), and the release
    looks the code up by name.

    Attributes:
        name: the SQL name, lower case.
        fn: takes one block's values (a read-only float64 numpy array), returns a float.
        bounds: ``(lo, hi)``: answers are clipped into it; a failed block gives the midpoint.
        local_sensitivity: ``(values, k) -> float``, or None (see :mod:`dpsql.release.udf.ptr`).
        strategy: "auto", "ptr", "smooth" or "sample_and_aggregate".
        time_limit: seconds one sample-and-aggregate block may run.
    """

    name: str
    fn: Callable[[Any], object]
    bounds: tuple[float, float]
    local_sensitivity: Callable[[Any, int], float] | None = None
    strategy: Strategy = "auto"
    time_limit: float = DEFAULT_TIME_LIMIT

    @property
    def has_local_sensitivity(self) -> bool:
        return self.local_sensitivity is not None

    @property
    def spec(self) -> UDFSpec:
        """What a plan carries of it."""
        return UDFSpec(self.name, self.bounds, self.has_local_sensitivity, self.strategy, self.time_limit)
_MAX_NAME = 63


def _function_names() -> set[str]:
    import sqlglot.expressions as exp
    from sqlglot.dialects.duckdb import DuckDB
    from sqlglot.parser import Parser

    names = set(Parser.FUNCTIONS) | set(DuckDB.Parser.FUNCTIONS)
    for func in exp.ALL_FUNCTIONS:
        names.update(func.sql_names())
    return {n.lower() for n in names}


def _keywords() -> set[str]:
    from sqlglot.dialects.duckdb import DuckDB
    from sqlglot.tokens import Tokenizer

    words = set(Tokenizer.KEYWORDS) | set(DuckDB.Tokenizer.KEYWORDS)
    return {w.lower() for w in words if _IDENTIFIER.match(w)}


def _duckdb_functions() -> set[str]:
    try:
        from dpsql.hardened import scratch_rows

        rows = scratch_rows("SELECT DISTINCT function_name FROM duckdb_functions()")
    except Exception:  # noqa: BLE001 - sqlglot's list still applies
        return set()
    return {str(name).lower() for (name,) in rows}


@lru_cache(maxsize=1)
def reserved_names() -> frozenset[str]:
    """Names a UDF may not take: dpsql's aggregates, every function sqlglot or DuckDB
    knows, and SQL keywords (computed once, about 60 ms).

    >>> {"median", "sum", "abs", "select"} <= reserved_names()
    True
    """
    return frozenset(DPSQL_AGGREGATES | _function_names() | _keywords() | _duckdb_functions())


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or len(name) > _MAX_NAME:
        raise QueryRejected(f"UDF name {name!r} is not a plain SQL identifier: use letters, "
                            f"digits and underscores, starting with a letter or underscore, "
                            f"at most {_MAX_NAME} characters (e.g. 'trimmed_mean').")
    lowered = name.lower()
    if lowered.startswith("__"):
        raise QueryRejected(f"UDF name {name!r} starts with '__', which dpsql reserves for "
                            "its own columns; choose another name.")
    if lowered in DPSQL_AGGREGATES:
        raise QueryRejected(f"UDF name {name!r} clashes with the aggregate {lowered.upper()} "
                            "that dpsql answers itself; choose another name, e.g. "
                            f"'my_{lowered}'.")
    if lowered in reserved_names():
        raise QueryRejected(f"UDF name {name!r} clashes with a SQL function or keyword "
                            "known to DuckDB or sqlglot; choose another name, e.g. "
                            f"'my_{lowered}'.")
    return lowered


def validate_udf(name: str, fn: object, bounds: object = None,
                 local_sensitivity: object = None, strategy: object = "auto", *,
                 time_limit: float = DEFAULT_TIME_LIMIT) -> UDF:
    """Check a registration and return its frozen record, or raise QueryRejected.

    >>> validate_udf("Trimmed_Mean", lambda b: float(b.mean()), bounds=(0, 250000)).name
    'trimmed_mean'
    """
    lowered = _check_name(name)
    if not callable(fn):
        raise QueryRejected(f"UDF {lowered!r}: fn must be callable (a function of one numpy "
                            f"array returning a float), got {type(fn).__name__}.")
    lo, hi = check_bounds(bounds, what=f"UDF {lowered!r}")
    if local_sensitivity is not None and not callable(local_sensitivity):
        raise QueryRejected(f"UDF {lowered!r}: local_sensitivity must be callable as "
                            f"local_sensitivity(values, k) -> float, or None; got "
                            f"{type(local_sensitivity).__name__}.")
    if strategy not in STRATEGIES:
        raise QueryRejected(f"UDF {lowered!r}: unknown strategy {strategy!r}; use one of "
                            f"{', '.join(STRATEGIES)}.")
    if strategy in ("ptr", "smooth") and local_sensitivity is None:
        raise QueryRejected(f"UDF {lowered!r}: strategy {strategy!r} needs local_sensitivity"
                            "(values, k); pass one, or use strategy='sample_and_aggregate' "
                            "or 'auto'.")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
            or not math.isfinite(time_limit) or time_limit <= 0:
        raise QueryRejected(f"UDF {lowered!r}: time_limit must be a number of seconds > 0, "
                            f"got {time_limit!r}.")
    return UDF(lowered, fn, (lo, hi), local_sensitivity,
               strategy, float(time_limit))  # type: ignore[arg-type]


class StrategyChoice(NamedTuple):
    """The mechanism chosen, and why (unpacks as ``strategy, reason``)."""

    strategy: Literal["ptr", "smooth", "sample_and_aggregate"]
    reason: str


def choose_strategy(target: UDFSpec | QuantileSpec, n: float, epsilon: float, delta: float, *,
                    rows_per_unit: int = 1, proposal: float | None = None) -> StrategyChoice:
    """Pick PTR, smooth sensitivity or sample-and-aggregate for ``target``.

    Args:
        target: a registered UDF or a built-in quantile.
        n: the number of units, public or differentially private (never the exact count).
        epsilon, delta: what this aggregate may spend.
        rows_per_unit: the row cap r of the values PTR / smooth sensitivity would see.
        proposal: an analyst's public PTR bound, if any.

    >>> choose_strategy(QuantileSpec(0.5, (0, 100)), 100_000, 1.0, 0.0).strategy
    'sample_and_aggregate'
    >>> choose_strategy(QuantileSpec(0.5, (0, 100)), 100_000, 1.0, 1e-6).strategy
    'smooth'
    """
    label = target.name
    if target.strategy != "auto":
        return _requested(target, delta)
    if not target.has_local_sensitivity:
        return StrategyChoice("sample_and_aggregate", (
            f"{label}: sample-and-aggregate, because the function has no local sensitivity "
            "(register one to allow PTR or smooth sensitivity); it works for any function."))
    if delta <= 0:
        return StrategyChoice("sample_and_aggregate", (
            f"{label}: sample-and-aggregate, because delta = 0 and PTR and smooth "
            "sensitivity need delta > 0; pass a delta (e.g. 1e-7) to allow them."))
    bounds = target.bounds
    errors = {
        "sample_and_aggregate": sample_and_aggregate.expected_error(bounds, n, epsilon),
        "ptr": ptr.expected_error(bounds, n, epsilon, delta, rows_per_unit=rows_per_unit, proposal=proposal),
        "smooth": smooth.expected_error(bounds, n, epsilon, delta, rows_per_unit=rows_per_unit),
    }
    best = min(errors, key=errors.__getitem__)  # ties: the order above (pure epsilon first)
    model = (f"modelled mean absolute error on evenly spread data of about {n:.0f} units at "
             f"epsilon {epsilon:.3g}: sample-and-aggregate {errors['sample_and_aggregate']:.3g}, "
             f"PTR {errors['ptr']:.3g}, smooth sensitivity {errors['smooth']:.3g}; the smallest wins")
    return StrategyChoice(best, f"{label}: {_NAMES[best]} ({model}).")  # type: ignore[arg-type]


_NAMES = {"ptr": "propose-test-release", "smooth": "smooth sensitivity",
          "sample_and_aggregate": "sample-and-aggregate"}


def check_strategy(target: UDFSpec | QuantileSpec, delta: float) -> None:
    """Refuse, at planning time, a strategy the query's delta cannot pay for.

    Raises:
        QueryRejected: the function is registered to use PTR or smooth sensitivity and the
            query has no delta.
    """
    strategy = target.strategy
    if strategy in ("ptr", "smooth") and delta <= 0:
        mechanism = "PTR" if strategy == "ptr" else "smooth sensitivity"
        raise QueryRejected(f"{target.name} is registered to use {mechanism}, which needs "
                            "delta > 0; pass a delta (e.g. delta=1e-7).")


def _requested(target: UDFSpec | QuantileSpec, delta: float) -> StrategyChoice:
    strategy = target.strategy
    check_strategy(target, delta)
    names = {"ptr": "propose-test-release", "smooth": "smooth sensitivity",
             "sample_and_aggregate": "sample-and-aggregate"}
    return StrategyChoice(strategy, f"{target.name}: {names[strategy]}, as requested at "  # type: ignore[arg-type]
                                    "registration.")

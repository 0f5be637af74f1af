"""User-defined functions and order statistics, answered privately.

The mechanism layer of issue 5: pure functions from numpy arrays to a frozen
:class:`UDFRelease`; the SQL side fetches the values and charges the budget.

- :mod:`~dpsql.release.udf.registry`: :class:`UDF`, :func:`validate_udf`, :func:`choose_strategy`;
- :mod:`~dpsql.release.udf.sample_and_aggregate`: any function, pure epsilon-DP, fault-isolated
  blocks;
- :mod:`~dpsql.release.udf.ptr`: propose-test-release (MEDIAN, QUANTILE_CONT, UDFs with a local
  sensitivity), (epsilon, delta)-DP, may refuse;
- :mod:`~dpsql.release.udf.smooth`: smooth sensitivity for the same, (epsilon, delta)-DP.
"""

from __future__ import annotations

from dpsql.release.udf._release import UDFRelease
from dpsql.release.udf.ptr import propose_bound, ptr_quantile, ptr_udf
from dpsql.release.udf.registry import QuantileSpec, StrategyChoice, UDF, choose_strategy, validate_udf
from dpsql.release.udf.sample_and_aggregate import (
    assign_blocks,
    choose_block_count,
    evaluate_blocks,
    sample_and_aggregate,
)
from dpsql.release.udf.smooth import smooth_quantile, smooth_udf

__all__ = [
    "QuantileSpec",
    "StrategyChoice",
    "UDF",
    "UDFRelease",
    "assign_blocks",
    "choose_block_count",
    "choose_strategy",
    "evaluate_blocks",
    "propose_bound",
    "ptr_quantile",
    "ptr_udf",
    "sample_and_aggregate",
    "smooth_quantile",
    "smooth_udf",
    "validate_udf",
]

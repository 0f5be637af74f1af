"""Release: noise on the exact bounded aggregates, and the values-based mechanisms.

- :mod:`~dpsql.release.aggregates`: partition selection, noisy counts and sums on the
  release lattice, averages and spreads from them, confidence half-widths;
- :mod:`~dpsql.release.values`: order statistics and registered UDFs, answered per group;
- :mod:`~dpsql.release.udf`: their strategies (PTR, smooth sensitivity,
  sample-and-aggregate) and the registry that picks one.
"""

from __future__ import annotations

from dpsql.release.aggregates import noisy_schema, noisy_table, select_partitions

__all__ = ["noisy_schema", "noisy_table", "select_partitions"]

"""The report bundle: what travels from clients through the shuffler to the store.

A :class:`Reports` holds perturbed reports of *one column* of one local table, one row per
report. It has no field for who sent a report or when: a client splits its record into one
bundle per column (a model update into one per parameter), so nothing in a bundle links it
to the client's other columns. The ``params`` text names the mechanism and its parameters;
reports made under different parameters are never mixed by the shuffler, the store or the
estimators.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError

__all__ = ["Reports"]

_FIELDS = ("values", "items", "keys", "bits")


@dataclass(frozen=True, eq=False)
class Reports:
    """Perturbed reports of one column, one row per report, and nothing about their senders.

    Attributes:
        table: The local table (casefolded).
        column: The column (casefolded).
        params: The mechanism and parameters the reports were made with.
        values: Adaptive range: the reported numbers (``c - A`` or ``c + A``).
        items: GRR: the reported category index; OLH: the reported hash bucket.
        keys: OLH: each report's hash key.
        bits: OUE: one row of packed bits per report.

    >>> r = Reports("t", "x", "range", values=np.array([1.0, -1.0]))
    >>> len(r), len(r.take(np.array([1])))
    (2, 1)
    """

    table: str
    column: str
    params: str
    values: npt.NDArray[np.float64] | None = None
    items: npt.NDArray[np.int64] | None = None
    keys: npt.NDArray[np.int64] | None = None
    bits: npt.NDArray[np.uint8] | None = None

    def __post_init__(self) -> None:
        sizes = {len(a) for a in self._arrays().values()}
        if len(sizes) != 1:
            raise InternalError(f"a report bundle needs equally long arrays, got {sizes}.")

    def _arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in _FIELDS if getattr(self, name) is not None}

    @property
    def key(self) -> tuple[str, str, str]:
        """``(table, column, params)``: bundles with equal keys may be pooled."""
        return self.table, self.column, self.params

    def __len__(self) -> int:
        return len(next(iter(self._arrays().values())))

    def take(self, rows: npt.NDArray[np.int64]) -> Reports:
        """The reports at ``rows``, in that order."""
        return Reports(self.table, self.column, self.params,
                       **{name: array[rows] for name, array in self._arrays().items()})

    @staticmethod
    def concat(bundles: Sequence[Reports]) -> Reports:
        """One bundle of every report of ``bundles`` (which must share their key)."""
        first = bundles[0]
        if any(b.key != first.key or b._arrays().keys() != first._arrays().keys() for b in bundles):
            raise InternalError("only bundles of one column and one mechanism can be pooled.")
        arrays = {name: np.concatenate([getattr(b, name) for b in bundles])
                  for name in first._arrays()}
        return Reports(first.table, first.column, first.params, **arrays)

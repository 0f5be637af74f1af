"""Result: the noisy Arrow table, what it cost, and how accurate it is."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from dpsql.release.bias import BiasEstimate

__all__ = ["Accuracy", "ColumnPrivacy", "PrivacyReport", "Result"]


@dataclass(frozen=True)
class ColumnPrivacy:
    """How one output column was protected.

    Attributes:
        mechanism: "laplace", "gaussian", "public" (a key the policy lists) or several
            joined by "+" for an expression over aggregates of different mechanisms.
        noise_std: standard deviation of the noise in the column's units, for a bare
            COUNT or SUM; ``None`` where it varies by row or is not defined.
        measurements: the noisy quantities behind the column (JSON-able dicts).
    """

    mechanism: str
    noise_std: float | None = None
    measurements: tuple[dict[str, object], ...] = ()


@dataclass(frozen=True)
class PrivacyReport:
    """What the query was charged, and per output column how it was protected."""

    epsilon: float
    delta: float
    columns: Mapping[str, ColumnPrivacy] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def format(self, header: str | None = None) -> str:
        """The report as text: ``header`` (by default the cost), then a line per column and
        per note (what ``repr`` and ``dpsql query`` show)."""
        lines = [header or f"PrivacyReport(epsilon={self.epsilon:g}, delta={self.delta:g})"]
        for name, col in self.columns.items():
            std = f", noise std {col.noise_std:.4g}" if col.noise_std is not None else ""
            lines.append(f"  {name}: {col.mechanism}{std}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.format()


class Accuracy(Mapping[str, float]):
    """95% confidence half-widths of the noise.

    ``accuracy[column]`` is the column's largest half-width over its rows (NaN when not
    defined, e.g. for an expression over several aggregates); ``accuracy.cells(column)``
    gives one per row.
    """

    confidence = 0.95

    def __init__(self, cells: Mapping[str, list[float | None]]) -> None:
        self._cells = dict(cells)

    def cells(self, column: str) -> list[float | None]:
        return list(self._cells[column])

    def __getitem__(self, column: str) -> float:
        known = [c for c in self._cells[column] if c is not None]
        if len(known) < len(self._cells[column]) or not known:
            return math.nan
        return max(known)

    def __iter__(self) -> Iterator[str]:
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def __repr__(self) -> str:
        return "Accuracy(" + ", ".join(f"{k}=±{self[k]:.4g}" for k in self) + ")"


class Result:
    """A query's noisy answer, DB-API and Arrow flavoured.

    ``bias`` is ``None`` unless the query asked for the bias estimates (``bias=True``,
    :mod:`dpsql.release.bias`): then their totals and, per cell, ``bias.cells``.
    """

    def __init__(self, table: pa.Table, privacy: PrivacyReport, accuracy: Accuracy, sql: str = "") -> None:
        self._table = table
        self.privacy = privacy
        self.accuracy = accuracy
        self.sql = sql
        self.cached = False  # True for a repeat answered from the repeat store, charged nothing
        self.bias: BiasEstimate | None = None

    @property
    def columns(self) -> list[str]:
        return list(self._table.column_names)

    def arrow(self) -> pa.Table:
        """The noisy answer as a ``pyarrow.Table``, columns named as in the SELECT."""
        return self._table

    def df(self, accuracy: bool = False) -> Any:
        """The noisy answer as a pandas DataFrame (needs pandas).

        With ``accuracy=True``, a ``<column>_ci95`` column (the cell's 95% half-width) follows
        each noisy column, as the Postgres front's ``SET dpsql.accuracy = on`` gives.
        """
        if accuracy:
            from dpsql.display import with_intervals  # noqa: PLC0415 - display imports Result's module

            return with_intervals(self).to_pandas()
        return self._table.to_pandas()

    def fetchall(self) -> list[tuple[Any, ...]]:
        """All rows as tuples, like DB-API ``fetchall``."""
        columns = [c.to_pylist() for c in self._table.columns]
        return list(zip(*columns)) if columns else []

    def __len__(self) -> int:
        return int(self._table.num_rows)

    def __repr__(self) -> str:
        """The rows with their ± half-widths, the charge, each column's mechanism, notes."""
        from dpsql.display import result_repr  # noqa: PLC0415

        return result_repr(self)

    def _repr_html_(self) -> str:
        """How Jupyter shows a result: an HTML table with ±, the charge, mechanisms, notes."""
        from dpsql.display import html_table  # noqa: PLC0415

        return html_table(self)

    def format(self) -> str:
        """A plain-text table with ± half-widths, as the CLI prints it (see :mod:`dpsql.display`)."""
        from dpsql.display import text_table  # noqa: PLC0415

        return text_table(self)

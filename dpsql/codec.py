"""The one JSON codec of a released answer's report: its privacy report (epsilon, delta, per
column the mechanism, noise and measurements, notes) and its accuracy cells.

The repeat store (:mod:`dpsql.repeats`) keeps answers in this form and the wire
(:mod:`dpsql.wire`) sends them in it, so an answer reads back the same either way.

>>> from dpsql.result import ColumnPrivacy, PrivacyReport
>>> report = PrivacyReport(0.5, 0.0, {"n": ColumnPrivacy("laplace", 2.0, ({"bounds": [0, 1]},))}, ("a note",))
>>> report_from_payload(loads(dumps(report_payload(report)))) == report
True
>>> cells_from_payload(loads(dumps(cells_payload({"n": [1.5, None, float("inf")]}))))
{'n': [1.5, None, inf]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dpsql.result import ColumnPrivacy, PrivacyReport

__all__ = ["cells_from_payload", "cells_payload", "dumps", "jsonable", "loads", "report_from_payload", "report_payload"]


def jsonable(value: Any) -> Any:
    """``value`` as JSON reads it back: tuples (at any depth) as lists. Reports hold their
    measurement descriptions in this form, so that an answer served again from the repeat
    store or sent over the wire equals the one first released."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def report_payload(privacy: PrivacyReport) -> dict[str, Any]:
    """A privacy report as JSON-able data (shares the report's measurement dicts: callers
    serialize it, never edit it; ``dataclasses.asdict``'s deep copy was a fifth of a served
    repeat's Python)."""
    return {
        "epsilon": privacy.epsilon,
        "delta": privacy.delta,
        "columns": {name: _column_payload(column) for name, column in privacy.columns.items()},
        "notes": list(privacy.notes),
    }


def _column_payload(column: ColumnPrivacy) -> dict[str, Any]:
    """``dataclasses.asdict(column)`` without the copy: the same JSON once dumped."""
    return {"mechanism": column.mechanism, "noise_std": column.noise_std, "measurements": list(column.measurements)}


def report_from_payload(payload: Mapping[str, Any]) -> PrivacyReport:
    """Undo :func:`report_payload`."""
    columns = {name: _column(c) for name, c in payload["columns"].items()}
    return PrivacyReport(payload["epsilon"], payload["delta"], columns, tuple(payload.get("notes", ())))


def _column(stored: Mapping[str, Any]) -> ColumnPrivacy:
    return ColumnPrivacy(stored["mechanism"], stored.get("noise_std"), tuple(stored.get("measurements", ())))


def cells_payload(cells: Mapping[str, list[float | None]]) -> dict[str, list[float | None]]:
    """Accuracy cells (per column, each row's 95% half-width) as JSON-able data; NaN and
    infinity stay numbers (Python's JSON writes and reads them)."""
    return {name: list(values) for name, values in cells.items()}


def cells_from_payload(payload: Mapping[str, list[Any]]) -> dict[str, list[float | None]]:
    """Undo :func:`cells_payload`; also reads NaN and infinity written as strings (answers
    stored before this codec)."""
    return {name: [v if v is None else float(v) for v in values] for name, values in payload.items()}


def dumps(payload: object) -> str:
    """JSON text of a payload; numpy scalars and other number-likes become numbers, tuples
    and sets lists, anything else its ``repr``."""
    return json.dumps(payload, default=_default)


def loads(text: str | bytes) -> Any:
    """Read :func:`dumps`' text."""
    return json.loads(text)


def _default(value: object) -> object:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return repr(value)

"""The wire format of report bundles: how one client's reports travel to ``dpsql serve``.

A ``report`` request (a Flight action, :mod:`dpsql.server`) carries the reports of whole
records of one local table, as UTF-8 JSON::

    {"format": "dpsql-reports", "version": 1, "table": "telemetry",
     "columns": [
       {"column": "temp", "params": "range;lower=-10;...", "values": [-62.4, 102.4]},
       {"column": "os",   "params": "grr;d=3;...",        "items": [2, 0]},
       {"column": "app",  "params": "oue;d=40;...",       "width": 5, "bits": "<base64>"},
       {"column": "city", "params": "olh;d=900;...",      "items": [1, 3], "keys": [...]}
     ]}

- ``values``: adaptive range, one number per report (``c - A`` or ``c + A``, written as
  Python writes a float64, so it reads back bit for bit);
- ``items``: GRR the reported category index, OLH the reported bucket; ``keys``: OLH each
  report's hash key ``a * P + b``;
- ``bits``: OUE, ``width`` bytes per report (``numpy.packbits`` order), all reports'
  rows concatenated and base64-encoded.

Nothing in it names the sender or the time: the transport knows those, and the server
drops them (:mod:`dpsql.local.ingest`). A request holds at most :data:`MAX_RECORDS`
records and :data:`MAX_BODY_BYTES` bytes. This module checks only the shape;
:func:`dpsql.local.ingest.check_reports` checks the reports against the policy.

>>> import numpy as np
>>> body = encode_reports([Reports("t", "x", "p", values=np.array([1.5, -1.5]))])
>>> [(r.column, r.values.tolist()) for r in decode_reports(body)]
[('x', [1.5, -1.5])]
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from dpsql.local._common import ReportError
from dpsql.local.reports import Reports

__all__ = ["FORMAT", "MAX_BODY_BYTES", "MAX_RECORDS", "VERSION", "decode_reports", "encode_reports"]

FORMAT = "dpsql-reports"
VERSION = 1
#: The largest report request the server reads.
MAX_BODY_BYTES = 1_000_000
#: The most records (reports per column) one request may carry.
MAX_RECORDS = 1_000
#: The most columns one request may carry (a policy's local table has far fewer).
MAX_COLUMNS = 1_000
_INT64 = (-(1 << 63), 1 << 63)
_HOW = "send reports with dpsql.Client(location, token=...).report(...) or dpsql.local.RemoteReporter"
_BUNDLE_KEYS = {"column", "params", "values", "items", "keys", "bits", "width"}


def encode_reports(bundles: Iterable[Reports]) -> bytes:
    """The request body for ``bundles``: reports of one table (e.g. ``Reporter.report(record)``).

    Raises:
        ReportError: no bundle, something that is not a :class:`Reports`, bundles of
            several tables, more than :data:`MAX_RECORDS` records or :data:`MAX_BODY_BYTES` bytes.
    """
    bundles = list(bundles)
    if not bundles:
        raise ReportError("there are no reports to send; pass Reporter.report(record)")
    for bundle in bundles:
        if not isinstance(bundle, Reports):
            raise ReportError(f"only Reports bundles (from dpsql.local.Reporter.report) can be sent, "
                              f"got {type(bundle).__name__}")
    tables = sorted({b.table for b in bundles})
    if len(tables) != 1:
        raise ReportError(f"one request carries reports of one table, got {tables}; send each table's apart")
    if max(len(b) for b in bundles) > MAX_RECORDS:
        raise ReportError(f"one request carries at most {MAX_RECORDS:,} records; send them in several calls")
    payload = {"format": FORMAT, "version": VERSION, "table": tables[0],
               "columns": [_encode_bundle(b) for b in bundles]}
    try:
        body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        raise ReportError("a report is NaN or infinite, which no mechanism outputs; perturb the values "
                          "with dpsql.local.Reporter") from None
    if len(body) > MAX_BODY_BYTES:
        raise ReportError(f"the request would be {len(body):,} bytes; the server takes at most "
                          f"{MAX_BODY_BYTES:,}: send fewer records per call")
    return body


def _encode_bundle(bundle: Reports) -> dict[str, Any]:
    out: dict[str, Any] = {"column": bundle.column, "params": bundle.params}
    if bundle.values is not None:
        out["values"] = [float(v) for v in bundle.values.tolist()]
    if bundle.items is not None:
        out["items"] = [int(v) for v in bundle.items.tolist()]
    if bundle.keys is not None:
        out["keys"] = [int(v) for v in bundle.keys.tolist()]
    if bundle.bits is not None:
        rows = np.ascontiguousarray(bundle.bits, dtype=np.uint8)
        out["width"] = int(rows.shape[1])
        out["bits"] = base64.b64encode(rows.tobytes()).decode("ascii")
    return out


def decode_reports(body: bytes) -> tuple[Reports, ...]:
    """The bundles a request body carries, checked for shape (not yet against the policy).

    Raises:
        ReportError: the body is too large, not this format or version, or malformed; the
            message says what and how to send reports instead.
    """
    if len(body) > MAX_BODY_BYTES:
        raise ReportError(f"the report request is {len(body):,} bytes; the server takes at most "
                          f"{MAX_BODY_BYTES:,}: send fewer records per call")
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError, UnicodeDecodeError):  # also _refuse_constant's ValueError
        raise _malformed("the body is not JSON (or holds NaN or Infinity)") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise _malformed(f'expected a JSON object with "format": "{FORMAT}"')
    if set(payload) != {"format", "version", "table", "columns"}:
        raise _malformed('expected exactly the keys "format", "version", "table", "columns"')
    if payload["version"] != VERSION or isinstance(payload["version"], bool):
        raise ReportError(f"report format version {payload['version']!r} is not supported: this server takes "
                          f"version {VERSION}; use a dpsql client of the server's version")
    table, columns = payload["table"], payload["columns"]
    if not isinstance(table, str) or not table:
        raise _malformed('"table" must be the local table\'s name')
    if not isinstance(columns, list) or not 0 < len(columns) <= MAX_COLUMNS:
        raise _malformed(f'"columns" must be a list of 1 to {MAX_COLUMNS} report bundles')
    return tuple(_decode_bundle(table.casefold(), entry) for entry in columns)


def _decode_bundle(table: str, entry: object) -> Reports:
    if not isinstance(entry, dict) or not set(entry) <= _BUNDLE_KEYS:
        raise _malformed(f"a bundle must be an object with keys among {sorted(_BUNDLE_KEYS)}")
    column, params = entry.get("column"), entry.get("params")
    if not isinstance(column, str) or not column or not isinstance(params, str):
        raise _malformed('a bundle needs "column" and "params" (strings)')
    arrays: dict[str, np.ndarray] = {}
    if "values" in entry:
        arrays["values"] = _floats(entry["values"], column)
    for name in ("items", "keys"):
        if name in entry:
            arrays[name] = _ints(entry[name], column, name)
    if "bits" in entry or "width" in entry:
        arrays["bits"] = _bits(entry.get("bits"), entry.get("width"), column)
    if not arrays:
        raise _malformed(f"the bundle of {column!r} holds no reports (values, items, keys or bits)")
    sizes = {len(a) for a in arrays.values()}
    if len(sizes) != 1:
        raise _malformed(f"the bundle of {column!r} has arrays of different lengths {sorted(sizes)}")
    n = sizes.pop()
    if not 0 < n <= MAX_RECORDS:
        raise _malformed(f"the bundle of {column!r} must hold 1 to {MAX_RECORDS:,} reports, not {n:,}")
    return Reports(table, column.casefold(), params, **arrays)


def _floats(raw: object, column: str) -> np.ndarray:
    if not isinstance(raw, list) or not all(type(v) in (int, float) for v in raw):
        raise _malformed(f'"values" of {column!r} must be a list of numbers')
    values = np.array([float(v) for v in raw], dtype=np.float64) if raw else np.zeros(0)
    if not np.all(np.isfinite(values)):
        raise _malformed(f'"values" of {column!r} must be finite numbers')
    return values


def _ints(raw: object, column: str, name: str) -> np.ndarray:
    if not isinstance(raw, list) or not all(type(v) is int and _INT64[0] <= v < _INT64[1] for v in raw):
        raise _malformed(f'"{name}" of {column!r} must be a list of whole numbers (64-bit)')
    return np.array(raw, dtype=np.int64) if raw else np.zeros(0, dtype=np.int64)


def _bits(raw: object, width: object, column: str) -> np.ndarray:
    if not isinstance(raw, str) or type(width) is not int or not 0 < width <= MAX_BODY_BYTES:
        raise _malformed(f'"bits" of {column!r} must be base64 text with "width" (bytes per report, > 0)')
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise _malformed(f'"bits" of {column!r} is not valid base64') from None
    if len(data) % width:
        raise _malformed(f'"bits" of {column!r} is {len(data)} bytes, not a whole number of rows of {width}')
    return np.frombuffer(data, dtype=np.uint8).reshape(-1, width)


def _refuse_constant(name: str) -> float:
    raise ValueError(name)


def _malformed(what: str) -> ReportError:
    return ReportError(f"malformed report request: {what}. {_HOW[0].upper()}{_HOW[1:]}.")

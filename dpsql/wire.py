"""The Flight wire format shared by the server and the client: request bodies, results as
Arrow tables with their privacy report in the schema metadata, explanations and errors as
JSON payloads (one codec, both directions)."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.flight as flight

from dpsql import errors
from dpsql.codec import cells_from_payload, cells_payload, dumps, loads, report_from_payload, report_payload
from dpsql.errors import AuthenticationError, BudgetExceeded, Error
from dpsql.local._common import ReportError
from dpsql.release.bias import BiasEstimate
from dpsql.result import Accuracy, Result

METADATA_KEY = b"dpsql"
WIRE_VERSION = 1
ACTIONS = {
    "budget": "what the analyst has spent and has left (JSON BudgetStatus)",
    "explain": "cost, mechanisms, bounded SQL and expected accuracy of a query; reads no data, charges nothing",
    "health": "whether the server is up, and its version",
    "report": "a reporting client's perturbed reports of one local table (dpsql.local.codec); needs a reporting token",
}
_ERRORS: dict[str, type[Error]] = {name: getattr(errors, name) for name in errors.__all__}
_ERRORS["ReportError"] = ReportError  # dpsql.local's error, raised by the report action


def request_body(sql: str, epsilon: float | None, delta: float | None, bias: bool = False,
                 dialect: str | None = None) -> bytes:
    """The JSON body of a query or explain request (``"bias": true`` only when asked;
    ``dialect`` only when given: the SQL dialect ``sql`` is written in, read by the server as
    :meth:`dpsql.Connection.execute` does)."""
    if not isinstance(sql, str):
        raise Error(f"sql must be a string, got {type(sql).__name__}.")
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise Error(f"{name} must be a number or None, got {value!r}.")
    if not isinstance(bias, bool):
        raise Error(f"bias must be True or False, got {bias!r}.")
    if dialect is not None and not isinstance(dialect, str):
        raise Error(f"dialect must be a string (a sqlglot dialect name such as 'postgres') or None, got {dialect!r}.")
    body: dict[str, object] = {"sql": sql, "epsilon": epsilon, "delta": delta}
    if bias:
        body["bias"] = True
    if dialect is not None:
        body["dialect"] = dialect
    return json.dumps(body).encode()


def encode_result(result: Result) -> pa.Table:
    """The result's table with its privacy and accuracy in the schema metadata."""
    payload = {
        "version": WIRE_VERSION,
        **report_payload(result.privacy),
        "cached": bool(getattr(result, "cached", False)),
        "accuracy": cells_payload({name: result.accuracy.cells(name) for name in result.accuracy}),
    }
    if result.bias is not None:
        payload["bias"] = asdict(result.bias)
    table = result.arrow()
    metadata = dict(table.schema.metadata or {})
    metadata[METADATA_KEY] = dumps(payload).encode()
    return table.replace_schema_metadata(metadata)


def decode_result(table: pa.Table, sql: str = "") -> Result:
    """The :class:`Result` an :func:`encode_result` table stands for."""
    metadata = dict(table.schema.metadata or {})
    raw = metadata.pop(METADATA_KEY, None)
    if raw is None:
        raise Error("the server's answer has no privacy metadata; is it a dpsql server?")
    payload = loads(raw)
    report = report_from_payload(payload)
    cells = cells_from_payload(payload["accuracy"])
    result = Result(table.replace_schema_metadata(metadata or None), report, Accuracy(cells), sql)
    result.cached = bool(payload.get("cached", False))
    if payload.get("bias") is not None:
        result.bias = BiasEstimate.from_json(payload["bias"])
    return result


def explanation_payload(explanation: Any) -> dict[str, Any]:
    """The JSON-able fields of a :class:`~dpsql.connection.Explanation`."""
    columns = getattr(explanation, "columns", {}) or {}
    composition = getattr(explanation, "composition", None)
    return {
        "epsilon": explanation.epsilon,
        "delta": explanation.delta,
        "mechanism": getattr(explanation, "mechanism", None) or explanation.plan.mechanism,
        "bounded_sql": explanation.bounded_sql,
        "mechanisms": explanation.mechanisms,
        "accuracy": explanation.accuracy,
        "columns": {name: _plain(column) for name, column in columns.items()},
        "composition": None if composition is None else _plain(composition),
        "bias": list(explanation.bias_text()) if hasattr(explanation, "bias_text") else [],
    }


def _plain(value: Any) -> Any:
    """A dataclass (or anything else) as JSON-able data."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def error_payload(exc: Error) -> bytes:
    """The ``extra_info`` of the Flight error that carries ``exc`` to the client."""
    payload: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, BudgetExceeded):
        payload["requested"] = list(exc.requested)
        payload["remaining"] = list(exc.remaining)
    return dumps(payload).encode()


def raise_remote(exc: flight.FlightError, location: str) -> NoReturn:
    """Raise the :class:`dpsql.Error` a Flight error stands for."""
    payload = _payload(exc)
    if payload is not None:
        kind = _ERRORS.get(str(payload.get("error")), Error)
        message = str(payload.get("message", ""))
        if kind is BudgetExceeded:
            raise BudgetExceeded(
                message,
                requested=_pair(payload.get("requested")),
                remaining=_pair(payload.get("remaining")),
            ) from None
        raise kind(message) from None
    if isinstance(exc, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)):
        raise AuthenticationError(
            f"the dpsql server at {location} refused the token: {_first_line(exc)}. "
            "Check the token, or ask the data owner for a new one."
        ) from None
    if isinstance(exc, flight.FlightUnavailableError):
        raise Error(
            f"cannot reach the dpsql server at {location}: {_first_line(exc)}. Check that "
            "`dpsql serve` is running there, and the host, port and TLS (grpc+tls://) settings."
        ) from None
    if isinstance(exc, flight.FlightTimedOutError):
        raise Error(f"the dpsql server at {location} did not answer in time; try again, or raise timeout=.") from None
    raise Error(f"the dpsql server at {location} failed: {_first_line(exc)}") from None


def _pair(value: object) -> tuple[float, float]:
    if isinstance(value, list) and len(value) == 2:
        return float(value[0]), float(value[1])
    return 0.0, 0.0


def _payload(exc: flight.FlightError) -> dict[str, Any] | None:
    extra = getattr(exc, "extra_info", b"") or b""
    try:
        payload = json.loads(extra)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and "error" in payload else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).split(". Detail:")[0].split(". gRPC client debug context")[0]
    return text.splitlines()[0] if text else type(exc).__name__


"""The network client: the embedded API's face, over Arrow Flight (DESIGN §4).

>>> import dpsql
>>> client = dpsql.Client("grpc://127.0.0.1:8815", token="...")    # doctest: +SKIP
>>> res = client.execute("SELECT COUNT(*) AS n FROM visits", epsilon=0.5)  # doctest: +SKIP
>>> res.arrow(), res.privacy, res.accuracy["n"]                    # doctest: +SKIP

The wire protocol, shared with :mod:`dpsql.server`:

- every call carries ``authorization: Bearer <token>``;
- a query is a ``DoGet`` whose ticket is JSON ``{"sql": ..., "epsilon": ..., "delta": ...}``
  (``null`` for the policy's default). The answer is the noisy Arrow table; its schema
  metadata key ``dpsql`` holds JSON with what was charged, each column's mechanism, noise
  standard deviation and measurements, the per-cell 95% half-widths, and whether the answer
  is a free repeat of one released before (``cached``);
- ``budget``, ``explain`` (same JSON body as a query) and ``health`` are Flight actions
  whose one result is a JSON object;
- a refusal is a Flight error whose ``extra_info`` is JSON ``{"error": "QueryRejected",
  "message": ...}``: the client raises the same :class:`dpsql.Error` subclass with the same
  message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from dpsql import errors
from dpsql.accounting import BudgetStatus
from dpsql.errors import AuthenticationError, BudgetExceeded, Error
from dpsql.result import Accuracy, ColumnPrivacy, PrivacyReport, Result

__all__ = ["Client", "RemoteExplanation"]

#: Schema metadata key of a query's answer.
METADATA_KEY = b"dpsql"
WIRE_VERSION = 1
ACTIONS = {
    "budget": "what the analyst has spent and has left (JSON BudgetStatus)",
    "explain": "cost, mechanisms, bounded SQL and expected accuracy of a query; reads no data, charges nothing",
    "health": "whether the server is up, and its version",
}
_ERRORS: dict[str, type[Error]] = {name: getattr(errors, name) for name in errors.__all__}
_T = TypeVar("_T")


@dataclass(frozen=True)
class RemoteExplanation:
    """What a query would cost and use: the server's :class:`~dpsql.connection.Explanation`
    as plain data (no plan: that stays on the server).

    Attributes:
        epsilon, delta: the query's own charge.
        mechanism: "laplace" or "gaussian".
        bounded_sql: the rewritten SQL, with a placeholder salt.
        mechanisms: per measurement, its mechanism, sensitivity and noise.
        accuracy: per aggregate call of the SQL, the expected 95% half-width known before
            reading data.
        columns: per output column, its mechanism, noise and expected accuracy (dicts).
        composition: how the ledger's accountant would compose the charge (a dict with
            ``accountant``, ``before``, ``after``, ``budget``), or ``None``.
    """

    epsilon: float
    delta: float
    mechanism: str
    bounded_sql: str
    mechanisms: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    accuracy: Mapping[str, float] = field(default_factory=dict)
    columns: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    composition: Mapping[str, Any] | None = None

    def __repr__(self) -> str:
        lines = [f"Explanation(epsilon={self.epsilon:g}, delta={self.delta:g}, mechanism={self.mechanism})"]
        lines += [f"  {sql}: ±{hw:.4g} (95%)" for sql, hw in self.accuracy.items()]
        return "\n".join(lines)


class Client:
    """A connection to a ``dpsql serve`` proxy, with the embedded API's methods.

    Args:
        location: ``grpc://host:port``, or ``grpc+tls://host:port`` for TLS.
        token: the analyst's token from ``dpsql token create``.
        tls_root_certs: PEM bytes (or a path to a PEM file) of the CA that signed the
            server's certificate, when it is not in the system store.
        timeout: seconds before a call gives up.

    Raises (from each call):
        AuthenticationError: the token is wrong or revoked.
        Error: the server cannot be reached; or the same :class:`dpsql.Error` subclass,
            with the same message, as the embedded API would raise.
    """

    def __init__(
        self,
        location: str,
        token: str | None = None,
        *,
        tls_root_certs: bytes | str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        if not isinstance(location, str) or not location.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
            raise Error(f"location must look like grpc://HOST:PORT or grpc+tls://HOST:PORT, got {location!r}.")
        self.location = location
        kwargs: dict[str, Any] = {}
        if tls_root_certs is not None:
            kwargs["tls_root_certs"] = _read_pem(tls_root_certs)
        try:
            self._flight = flight.FlightClient(location, **kwargs)
        except (pa.ArrowException, ValueError) as exc:
            raise Error(f"cannot connect to {location!r}: {_first_line(exc)}") from None
        headers = [(b"authorization", b"Bearer " + token.encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers, timeout=timeout)
        self._closed = False

    def execute(self, sql: str, *, epsilon: float | None = None, delta: float | None = None) -> Result:
        """Answer ``sql`` with differential privacy on the server, charging (epsilon, delta)."""
        ticket = flight.Ticket(request_body(sql, epsilon, delta))
        table = self._call(lambda: self._flight.do_get(ticket, self._options).read_all())
        return decode_result(table, sql)

    def explain(self, sql: str, *, epsilon: float | None = None, delta: float | None = None) -> RemoteExplanation:
        """What ``sql`` would be charged, its mechanisms, bounded SQL and expected accuracy."""
        answer = self._action("explain", request_body(sql, epsilon, delta))
        known = {f.name for f in fields(RemoteExplanation)}
        return RemoteExplanation(**{k: v for k, v in answer.items() if k in known})

    def budget(self) -> BudgetStatus:
        """What this analyst has spent and has left."""
        answer = self._action("budget")
        known = {f.name for f in fields(BudgetStatus)}  # a newer server may say more
        return BudgetStatus(**{k: v for k, v in answer.items() if k in known})

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "version": ...}`` when the server is up (checks the token if one is set)."""
        return self._action("health")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._flight.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.location!r})"

    def _action(self, name: str, body: bytes = b"") -> dict[str, Any]:
        def run() -> list[flight.Result]:
            return list(self._flight.do_action(flight.Action(name, body), self._options))

        results = self._call(run)
        if len(results) != 1:
            raise Error(f"the server answered {name!r} with {len(results)} results instead of one; is it a dpsql server?")
        answer: dict[str, Any] = json.loads(results[0].body.to_pybytes())
        return answer

    def _call(self, run: Callable[[], _T]) -> _T:
        if self._closed:
            raise Error("this dpsql client is closed; open a new one with dpsql.Client().")
        try:
            return run()
        except flight.FlightError as exc:
            raise_remote(exc, self.location)


# ---------------------------------------------------------------- the wire format


def request_body(sql: str, epsilon: float | None, delta: float | None) -> bytes:
    """The JSON body of a query or explain request."""
    if not isinstance(sql, str):
        raise Error(f"sql must be a string, got {type(sql).__name__}.")
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise Error(f"{name} must be a number or None, got {value!r}.")
    return json.dumps({"sql": sql, "epsilon": epsilon, "delta": delta}).encode()


def encode_result(result: Result) -> pa.Table:
    """The result's table with its privacy and accuracy in the schema metadata."""
    privacy = result.privacy
    payload = {
        "version": WIRE_VERSION,
        "epsilon": privacy.epsilon,
        "delta": privacy.delta,
        "columns": {name: asdict(column) for name, column in privacy.columns.items()},
        "notes": list(privacy.notes),
        "cached": bool(getattr(result, "cached", False)),
        "accuracy": {name: result.accuracy.cells(name) for name in result.accuracy},
    }
    table = result.arrow()
    metadata = dict(table.schema.metadata or {})
    metadata[METADATA_KEY] = json.dumps(payload, default=_json_default).encode()
    return table.replace_schema_metadata(metadata)


def decode_result(table: pa.Table, sql: str = "") -> Result:
    """The :class:`Result` an :func:`encode_result` table stands for."""
    metadata = dict(table.schema.metadata or {})
    raw = metadata.pop(METADATA_KEY, None)
    if raw is None:
        raise Error("the server's answer has no privacy metadata; is it a dpsql server?")
    payload = json.loads(raw)
    columns = {
        name: ColumnPrivacy(c["mechanism"], c.get("noise_std"), tuple(c.get("measurements", ())))
        for name, c in payload["columns"].items()
    }
    report = PrivacyReport(payload["epsilon"], payload["delta"], columns, tuple(payload.get("notes", ())))
    cells = {name: list(values) for name, values in payload["accuracy"].items()}
    result = Result(table.replace_schema_metadata(metadata or None), report, Accuracy(cells), sql)
    result.cached = bool(payload.get("cached", False))  # type: ignore[attr-defined]
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
    return json.dumps(payload, default=_json_default).encode()


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


def _json_default(value: object) -> object:
    """numpy scalars and other number-likes: as Python floats/ints."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-able")


def _read_pem(source: bytes | str | os.PathLike[str]) -> bytes:
    if isinstance(source, bytes):
        return source
    with open(source, "rb") as f:
        return f.read()


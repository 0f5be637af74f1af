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
- ``report`` is the action of a reporting client (its token from the server's
  ``--report-auth`` file): its body is one request of perturbed reports
  (:mod:`dpsql.local.codec`), its result ``{"accepted": N}``;
- a refusal is a Flight error whose ``extra_info`` is JSON ``{"error": "QueryRejected",
  "message": ...}``: the client raises the same :class:`dpsql.Error` subclass with the same
  message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from dpsql.privacy import BudgetStatus
from dpsql.errors import Error
from dpsql.result import Result
from dpsql.wire import _first_line, decode_result, raise_remote, request_body

if TYPE_CHECKING:
    from dpsql.local.reports import Reports

__all__ = ["Client", "RemoteExplanation"]

#: Schema metadata key of a query's answer.
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
        bias: what ``execute(sql, bias=True)`` would add, as text lines.
    """

    epsilon: float
    delta: float
    mechanism: str
    bounded_sql: str
    mechanisms: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    accuracy: Mapping[str, float] = field(default_factory=dict)
    columns: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    composition: Mapping[str, Any] | None = None
    bias: tuple[str, ...] = ()

    def describe(self) -> str:
        """The same text as the embedded :meth:`dpsql.explain.Explanation.describe`."""
        from dpsql.display import explanation_text  # noqa: PLC0415

        text = explanation_text(self.epsilon, self.delta, self.mechanism, self.columns, self.composition,
                                self.mechanisms)
        return "\n".join([text, *self.bias])

    def __repr__(self) -> str:
        return self.describe()


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

    def execute(self, sql: str, *, epsilon: float | None = None, delta: float | None = None,
                bias: bool = False) -> Result:
        """Answer ``sql`` with differential privacy on the server, charging (epsilon, delta);
        ``bias=True`` as for :meth:`dpsql.Connection.execute` (10% of epsilon buys ``res.bias``)."""
        ticket = flight.Ticket(request_body(sql, epsilon, delta, bias))
        table = self._call(lambda: self._flight.do_get(ticket, self._options).read_all())
        return decode_result(table, sql)

    def explain(self, sql: str, *, epsilon: float | None = None, delta: float | None = None) -> RemoteExplanation:
        """What ``sql`` would be charged, its mechanisms, bounded SQL and expected accuracy."""
        answer = self._action("explain", request_body(sql, epsilon, delta))
        known = {f.name for f in fields(RemoteExplanation)}
        given = {k: v for k, v in answer.items() if k in known}
        given["bias"] = tuple(given.get("bias") or ())
        return RemoteExplanation(**given)

    def budget(self) -> BudgetStatus:
        """What this analyst has spent and has left."""
        answer = self._action("budget")
        known = {f.name for f in fields(BudgetStatus)}  # a newer server may say more
        return BudgetStatus(**{k: v for k, v in answer.items() if k in known})

    def report(self, reports: Reports | Iterable[Reports]) -> int:
        """Send perturbed reports of one local table (``Reporter.report(record)``) to the
        server's report store; returns how many reports it accepted.

        Needs a reporting token (the server's ``--report-auth`` file). The reports must
        already be perturbed: the server refuses anything that is not a possible output of
        the policy's mechanism. :class:`dpsql.local.RemoteReporter` perturbs and sends.

        Raises:
            ReportError: the reports are malformed or do not match the server's policy.
            AuthenticationError: the token is not a reporting token.
        """
        from dpsql.local.codec import encode_reports
        from dpsql.local.reports import Reports

        body = encode_reports([reports] if isinstance(reports, Reports) else reports)
        return int(self._action("report", body)["accepted"])

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


def _read_pem(source: bytes | str | os.PathLike[str]) -> bytes:
    if isinstance(source, bytes):
        return source
    with open(source, "rb") as f:
        return f.read()


"""The Arrow Flight front of ``dpsql serve`` (:mod:`dpsql.server` runs it): requests,
the bearer-token check of every call, and the handlers of ``DoGet`` (a query) and the
actions ``budget``, ``explain``, ``health`` and ``report``, each a call on the
:class:`~dpsql.service.Service` (the pipeline, deadlines and rate limit live there).

A handler's failure reaches the client as the Flight error that carries its
:class:`~dpsql.errors.Error` (:mod:`dpsql.wire`); anything else is logged by its stack only
and answered with an incident number, never its message (an engine's message could quote a
value from the data). Logs (logger ``dpsql.server``) say who asked what and what was charged
or why it was refused; never a token, a raw value or a noisy value.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow.flight as flight

from dpsql.auth import TokenVerifier
from dpsql.errors import AuthenticationError, Error, InternalError, QueryFailed, QueryRejected
from dpsql.service import Service
from dpsql.version import __version__
from dpsql.wire import ACTIONS, encode_result, error_payload, explanation_payload

if TYPE_CHECKING:
    from dpsql.local.ingest import Collector

__all__ = ["DpsqlFlightServer", "Request"]

log = logging.getLogger("dpsql.server")

_MAX_REQUEST_BYTES = 1_000_000
_LOGGED_SQL_CHARS = 300
_MIDDLEWARE = "dpsql-auth"
_T = TypeVar("_T")


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """A query or explain request: the ticket or action body, checked."""

    sql: str
    epsilon: float | None
    delta: float | None
    bias: bool = False
    dialect: str | None = None

    @classmethod
    def parse(cls, body: bytes) -> Request:
        if len(body) > _MAX_REQUEST_BYTES:
            raise QueryRejected(f"the request is {len(body):,} bytes; the server takes at most {_MAX_REQUEST_BYTES:,}.")
        try:
            fields = json.loads(body)
        except ValueError:
            fields = None
        if not isinstance(fields, dict) or not isinstance(fields.get("sql"), str):
            raise Error('malformed request: expected JSON {"sql": ..., "epsilon": ..., "delta": ...}. Use dpsql.Client.')
        values = {}
        for name in ("epsilon", "delta"):
            value = fields.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise Error(f"malformed request: {name} must be a number or null, got {value!r}.")
            values[name] = None if value is None else float(value)
        bias = fields.get("bias", False)
        if not isinstance(bias, bool):
            raise Error(f"malformed request: bias must be true or false, got {bias!r}.")
        dialect = fields.get("dialect")
        if dialect is not None and not isinstance(dialect, str):
            raise Error(f"malformed request: dialect must be a string or null, got {dialect!r}.")
        return cls(fields["sql"], values["epsilon"], values["delta"], bias, dialect)

    def describe(self) -> str:
        text = " ".join(self.sql.split())
        if len(text) > _LOGGED_SQL_CHARS:
            text = text[:_LOGGED_SQL_CHARS] + "..."
        bias = " bias=on" if self.bias else ""
        dialect = "" if self.dialect is None else f" dialect={self.dialect!r}"
        return f"sql={text!r} epsilon={_amount(self.epsilon)} delta={_amount(self.delta)}{bias}{dialect}"


def _amount(value: float | None) -> str:
    return "default" if value is None else f"{value:g}"


# ---------------------------------------------------------------- authentication


class _AuthMiddleware(flight.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, analyst: str | None, reporter: str | None = None) -> None:
        self.analyst = analyst
        self.reporter = reporter  # a reporting client's token (--report-auth): it may only report


class _AuthMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Checks the bearer token of every call; a call without one may only ask for health.

    A token is an analyst's (``--auth``) or a reporting client's (``--report-auth``): the
    file whose record its id names decides (one hash either way), and the role goes with it.
    """

    def __init__(self, verifier: TokenVerifier, reporters: TokenVerifier | None = None) -> None:
        self._verifier = verifier
        self._reporters = reporters

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> _AuthMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            return _AuthMiddleware(None)
        value = values[0].decode() if isinstance(values[0], bytes) else str(values[0])
        scheme, _, token = value.partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise AuthenticationError("the authorization header must be 'Bearer <token>'.")
            token = token.strip()
            if self._reporters is not None and self._reporters.holds(token):
                return _AuthMiddleware(None, self._reporters.analyst_for(token))
            return _AuthMiddleware(self._verifier.analyst_for(token))
        except AuthenticationError as exc:
            log.warning("authentication failed (%s): %s", _method_name(info), exc)
            raise flight.FlightUnauthenticatedError(str(exc), extra_info=error_payload(exc)) from None


def _method_name(info: flight.CallInfo) -> str:
    return str(info.method).rsplit(".", 1)[-1]


# ---------------------------------------------------------------- the Flight server


class DpsqlFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Flight endpoints: ``DoGet`` answers a query; actions ``budget``, ``explain``, ``health``."""

    def __init__(
        self,
        location: str | flight.Location,
        service: Service,
        verifier: TokenVerifier,
        *,
        tls_certificates: list[flight.CertKeyPair] | None = None,
        reporters: TokenVerifier | None = None,
        collector: Collector | None = None,
    ) -> None:
        self._service = service
        self._collector = collector
        super().__init__(
            location,
            tls_certificates=tls_certificates or [],
            middleware={_MIDDLEWARE: _AuthMiddlewareFactory(verifier, reporters)},
        )

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.RecordBatchStream:
        def answer() -> flight.RecordBatchStream:
            analyst = _analyst(context)
            request = Request.parse(ticket.ticket)
            return self._query(analyst, request)

        return _answering("query", context, answer)

    def _query(self, analyst: str, request: Request) -> flight.RecordBatchStream:
        start = time.perf_counter()
        try:
            result = self._service.execute(analyst, request.sql, request.epsilon, request.delta, bias=request.bias,
                                           dialect=request.dialect)
        except Error as exc:
            log.info("query analyst=%r %s %s: %s", analyst, request.describe(), *_outcome(exc))
            raise
        elapsed = 1e3 * (time.perf_counter() - start)
        if getattr(result, "cached", False):
            log.info("query analyst=%r %s repeat of a released answer, charged nothing, rows=%d in %.1f ms",
                     analyst, request.describe(), len(result), elapsed)
        else:
            log.info("query analyst=%r %s charged epsilon=%g delta=%g rows=%d in %.1f ms",
                     analyst, request.describe(), result.privacy.epsilon, result.privacy.delta, len(result), elapsed)
        return flight.RecordBatchStream(encode_result(result))

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[flight.Result]:
        def answer() -> list[flight.Result]:
            body = action.body.to_pybytes() if action.body is not None else b""
            payload = self._action(context, action.type, body)
            return [flight.Result(json.dumps(payload).encode())]

        return iter(_answering(action.type, context, answer))

    def _action(self, context: flight.ServerCallContext, name: str, body: bytes) -> dict[str, Any]:
        if name == "health":
            return {"status": "ok", "version": __version__}
        if name not in ACTIONS:
            raise Error(f"unknown action {name!r}; this server knows {', '.join(sorted(ACTIONS))}.")
        if name == "report":
            return self._report(context, body)
        analyst = _analyst(context)
        if name == "budget":
            status = self._service.budget(analyst)
            log.info("budget analyst=%r: epsilon %g of %g spent", analyst, status.epsilon_spent, status.epsilon_total)
            return asdict(status)
        request = Request.parse(body)
        try:
            explanation = self._service.explain(analyst, request.sql, request.epsilon, request.delta,
                                                dialect=request.dialect)
        except Error as exc:
            log.info("explain analyst=%r %s refused: %s", analyst, request.describe(), type(exc).__name__)
            raise
        log.info("explain analyst=%r %s (nothing charged)", analyst, request.describe())
        return explanation_payload(explanation)

    def _report(self, context: flight.ServerCallContext, body: bytes) -> dict[str, Any]:
        """A reporting client's reports (:mod:`dpsql.local.ingest`). Logged as counts only:
        nothing of the sender goes with the reports."""
        if self._collector is None:
            raise Error("this server takes no reports: start it with dpsql serve ... --reports FILE "
                        "--report-auth FILE.")
        reporter = _reporter(context)
        try:
            accepted = self._collector.submit(reporter, body)
        except Error as exc:
            log.info("report refused: %s (nothing stored)", type(exc).__name__)
            raise
        return {"accepted": accepted}

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(name, about) for name, about in ACTIONS.items() if name != "report" or self._collector is not None]

    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        """Nothing to list (a query is a ``DoGet`` ticket), after the same token check as every
        call: without one, a clean ``AuthenticationError`` rather than pyarrow's traceback."""
        _answering("list_flights", context, lambda: _analyst(context))
        return iter(())

    def get_flight_info(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        def refuse() -> flight.FlightInfo:
            _analyst(context)
            raise QueryRejected("dpsql has no flights to describe: send a query as a DoGet ticket "
                                '{"sql": ..., "epsilon": ..., "delta": ...} (dpsql.Client does this).')
        return _answering("get_flight_info", context, refuse)


def _analyst(context: flight.ServerCallContext) -> str:
    middleware = context.get_middleware(_MIDDLEWARE)
    analyst = getattr(middleware, "analyst", None)
    if getattr(middleware, "reporter", None):
        raise AuthenticationError(
            "this is a reporting token (from the --report-auth file): it may only send reports. "
            "Queries, explain and budget need an analyst's token from the --auth file."
        )
    if not analyst:
        raise AuthenticationError(
            "no token: connect with dpsql.Client(location, token=...) using the token from "
            "dpsql token create ANALYST --auth FILE."
        )
    return str(analyst)


def _reporter(context: flight.ServerCallContext) -> str:
    middleware = context.get_middleware(_MIDDLEWARE)
    reporter = getattr(middleware, "reporter", None)
    if reporter:
        return str(reporter)
    if getattr(middleware, "analyst", None):
        raise AuthenticationError(
            "an analyst's token cannot send reports: reports need a reporting token, made with "
            "dpsql token create NAME --auth REPORT_AUTH_FILE for the file the server was given "
            "with --report-auth."
        )
    raise AuthenticationError(
        "no token: send reports with dpsql.Client(location, token=...) using a reporting token "
        "(dpsql token create NAME --auth REPORT_AUTH_FILE)."
    )


def _answering(what: str, context: flight.ServerCallContext, answer: Callable[[], _T]) -> _T:
    """Run a handler; turn a dpsql.Error into the Flight error that carries it, log a bug."""
    try:
        return answer()
    except AuthenticationError as exc:
        raise flight.FlightUnauthenticatedError(str(exc), extra_info=error_payload(exc)) from None
    except Error as exc:
        kind = flight.FlightInternalError if isinstance(exc, InternalError) else flight.FlightServerError
        raise kind(f"{type(exc).__name__}: {exc}", extra_info=error_payload(exc)) from None
    except flight.FlightError:
        raise
    except Exception as exc:  # noqa: BLE001 - the last net: an incident number, never the message
        incident = secrets.token_hex(4)
        # The stack only: an engine's message could quote a value from the data.
        log.error("%s failed with an unexpected %s (incident %s) from %s; stack:\n%s", what,
                  type(exc).__name__, incident, context.peer(), "".join(traceback.format_tb(exc.__traceback__)))
        error = InternalError(
            f"the dpsql server failed unexpectedly (incident {incident}, logged on the server)."
        )
        raise flight.FlightInternalError(str(error), extra_info=error_payload(error)) from None


def _outcome(exc: Error) -> tuple[str, str]:
    """How the owner's log names a failed query: a QueryFailed came after the charge."""
    if isinstance(exc, QueryFailed):
        return "failed after the charge", type(exc).__name__
    return "refused", f"{type(exc).__name__} (nothing charged)"

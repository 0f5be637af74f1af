"""The proxy: an Arrow Flight server in front of the embedded pipeline (DESIGN §4).

``dpsql serve`` runs :func:`serve`. One process holds one hardened engine, one ledger and
the policy; each analyst gets a :class:`~dpsql.connection.Connection` over them, made on
first use, so a request runs exactly the pipeline of ``dpsql.connect`` under its analyst's
budget. Flight's thread pool answers many clients at once: the engine serializes its
queries, and the ledger's charge is one write transaction, so no number of concurrent
requests (or other processes sharing the ledger file) can overspend.

Who is asking. Every call carries ``authorization: Bearer <token>``; a middleware checks it
with :class:`~dpsql.auth.TokenVerifier` (one scrypt per token, then an in-memory keyed
digest; re-read when the auth file changes, so a revoked token fails at its next request)
and refuses a wrong one before any handler runs. ``health`` also answers without a token.

Cores. With ``--workers N`` (the CLI's default: one per core) queries run in N worker
processes, each with its own engine and one deadline slot, sharing the ledger and the
repeat store (:mod:`dpsql.workers`); this process keeps the fronts, the token checks, the
rate limit, explain and budget.

Side channels (DESIGN §7). Every answer that reads private data is released at a deadline
computed from public facts, and queries that read data take turns on the engine slots
(one per worker), each for exactly its deadline (:mod:`dpsql.timing`); a run that overruns is interrupted and answered
with the fixed, charged :class:`~dpsql.errors.QueryFailed`. Each analyst may send at most
``[server] queries_per_minute`` queries (:class:`RateLimiter`); a wrong token costs the same
time whether or not its id exists (:mod:`dpsql.auth`).

Logs (logger ``dpsql.server``) say who asked what and what was charged or why it was
refused; they never contain a token, a raw value or a noisy value.

Reports (local DP). With ``--reports FILE`` the analysts' Connections read that report
store (queries over ``model = "local"`` tables, free of central budget). With
``--report-auth FILE`` too, the ``report`` action takes reporting clients' perturbed
reports: a token from that file may only report, an analyst's token may not report, and
each report is checked against the policy, shuffled without its sender and stored in
batches of ``--report-batch`` (:mod:`dpsql.local.ingest`). Report logs say only counts.

SIGTERM or SIGINT stops accepting calls, lets the calls in flight finish (their charges are
committed before their answers leave), closes the ledger and exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow.flight as flight

from dpsql.version import __version__
from dpsql.auth import TokenVerifier
from dpsql.wire import ACTIONS, encode_result, error_payload, explanation_payload
from dpsql.errors import AuthenticationError, Error, InternalError, QueryFailed, QueryRejected
from dpsql.service import Service

if TYPE_CHECKING:
    from dpsql.local.ingest import Collector

__all__ = ["DpsqlFlightServer", "Service", "serve"]

log = logging.getLogger("dpsql.server")

_MAX_REQUEST_BYTES = 1_000_000
_SHUTDOWN_GRACE_SECONDS = 30.0
_LOGGED_SQL_CHARS = 300
_MIDDLEWARE = "dpsql-auth"
_T = TypeVar("_T")


# ---------------------------------------------------------------- the pipeline, per analyst



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


# ---------------------------------------------------------------- dpsql serve


@dataclass(frozen=True)
class ServeOptions:
    database: object  # a DuckDB file's path, None (the policy's sources) or a Spark session
    policy: str
    ledger: str
    auth: str
    host: str = "127.0.0.1"
    port: int = 8815
    tls_cert: str | None = None
    tls_key: str | None = None
    pg_port: int | None = None  # the Postgres wire protocol front (dpsql.pgwire), off when None
    pg_host: str = "127.0.0.1"
    reports: str | None = None  # the local tables' report store, read by analysts' queries
    report_auth: str | None = None  # reporting clients' tokens: turns the report action on
    report_batch: int = 100  # the shuffler's k
    report_rate: int = 600  # report requests per reporting token per minute
    workers: int = 1  # worker processes answering queries (dpsql.workers); 1: in this process


def serve(
    options: ServeOptions,
    *,
    stop: threading.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
    on_pg_ready: Callable[[str], None] | None = None,
) -> int:
    """Run the server until SIGTERM/SIGINT (or ``stop`` is set); return the exit code (0).

    Args:
        options: what ``dpsql serve`` was given.
        stop: set it to stop the server (for running it in a thread).
        on_ready: called with the location once the server accepts calls.
        on_pg_ready: called with the Postgres front's address once it accepts connections.

    Raises:
        Error: a bad database, policy, ledger, auth file or TLS setting, before listening.
    """
    if (options.tls_cert is None) != (options.tls_key is None):
        raise Error("pass both --tls-cert and --tls-key (PEM files), or neither.")
    verifier = TokenVerifier(options.auth)
    if not verifier.analysts:
        log.warning("auth file %s holds no token: every query will be refused until one is created", options.auth)
    _warn_if_readable(options.auth)
    reporters = _reporters(options)
    tls = _tls_certificates(options)
    if tls is None and not _is_loopback(options.host):
        log.warning("serving on %s without TLS: tokens and answers cross the network in clear text; "
                    "pass --tls-cert and --tls-key", options.host)
    service = Service.open(options.database, options.policy, options.ledger, reports=options.reports,
                           workers=options.workers)
    collector = _collector(options, service) if reporters is not None else None
    try:
        location = (flight.Location.for_grpc_tls if tls else flight.Location.for_grpc_tcp)(options.host, options.port)
        try:
            server = DpsqlFlightServer(location, service, verifier, tls_certificates=tls,
                                       reporters=reporters, collector=collector)
        except Exception as exc:  # noqa: BLE001 - ArrowException: the port is taken, a bad TLS certificate
            raise Error(
                f"cannot serve on {options.host}:{options.port}: {str(exc).splitlines()[0]}. "
                "Is another server using that port? Pick another with --port."
            ) from None
        scheme = "grpc+tls" if tls else "grpc"
        address = f"{scheme}://{_host_for_uri(options.host)}:{server.port}"
        stop = stop if stop is not None else threading.Event()
        restore = _install_signal_handlers(stop)
        pg = None
        try:
            if options.pg_port is not None:
                pg = _start_pg(options, service, verifier)
            log.info(
                "dpsql %s serving %s on %s (policy %s, ledger %s, auth %s: %d analysts with a token)",
                __version__, options.database, address, options.policy, options.ledger,
                options.auth, len(verifier.analysts),
            )
            if on_ready is not None:
                on_ready(address)
            if pg is not None and on_pg_ready is not None:
                on_pg_ready(pg.address)
            while not stop.wait(0.5):
                pass
            log.info("shutting down: finishing the calls in flight")
            if pg is not None:
                pg.stop()
            _shutdown(server)
        finally:
            restore()
    finally:
        if collector is not None:
            collector.close()
        service.close()
    log.info("stopped; the ledger is closed")
    return 0


def _reporters(options: ServeOptions) -> TokenVerifier | None:
    """The reporting clients' tokens (``--report-auth``): a file apart from the analysts'."""
    if options.report_auth is None:
        return None
    if options.reports is None:
        raise Error("--report-auth needs --reports FILE: the report store the reports go to.")
    if os.path.abspath(options.report_auth) == os.path.abspath(options.auth) or (
        os.path.exists(options.report_auth) and os.path.samefile(options.report_auth, options.auth)
    ):
        raise Error("--report-auth must be a file apart from --auth: a reporting token may only report "
                    "and an analyst's token only query. Create reporting tokens with "
                    "dpsql token create NAME --auth reporters.toml.")
    if isinstance(options.report_batch, bool) or not isinstance(options.report_batch, int) or options.report_batch < 2:
        raise Error(f"--report-batch must be a whole number >= 2 (a batch of one report hides nothing), "
                    f"got {options.report_batch!r}.")
    reporters = TokenVerifier(options.report_auth)
    _warn_if_readable(options.report_auth)
    return reporters


def _collector(options: ServeOptions, service: Service) -> Collector:
    from dpsql.local.ingest import Collector

    local = [t.name for t in service.policy.tables.values() if t.model == "local"]
    if not local:
        log.warning("the policy has no model = \"local\" table: every report will be refused")
    assert service.reports is not None
    log.info("taking reports for %s into %s, in shuffled batches of k = %d", ", ".join(local) or "no table",
             options.reports, options.report_batch)
    return Collector(service.policy, service.reports, k=options.report_batch, per_minute=options.report_rate)


def _start_pg(options: ServeOptions, service: Service, verifier: TokenVerifier) -> Any:
    """Start the Postgres wire protocol front (``--pg-port``) over the same service."""
    from dpsql.pgwire import PgServer

    pg = PgServer(service, verifier, options.auth, options.pg_host, options.pg_port or 0,
                  tls_cert=options.tls_cert, tls_key=options.tls_key)
    if pg.tls is None and not _is_loopback(options.pg_host):
        log.warning("Postgres front on %s without TLS: answers cross the network in clear text (SCRAM keeps "
                    "the token itself off the wire); pass --tls-cert and --tls-key", options.pg_host)
    pg.start()
    log.info("Postgres wire protocol on %s", pg.address)
    return pg


def _shutdown(server: DpsqlFlightServer) -> None:
    """Stop accepting calls and wait (bounded) for the ones in flight."""
    done = threading.Thread(target=server.shutdown, name="dpsql-shutdown", daemon=True)
    done.start()
    done.join(_SHUTDOWN_GRACE_SECONDS)
    if done.is_alive():
        log.error("calls still running after %.0f s; exiting anyway (their charges, if any, are "
                  "committed)", _SHUTDOWN_GRACE_SECONDS)
        logging.shutdown()
        os._exit(1)


def _install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM and SIGINT set ``stop``; return a function that restores the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    signals = [signal.SIGTERM, signal.SIGINT]

    def handler(signum: int, frame: object) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in signals}

    def restore() -> None:
        for s, old in previous.items():
            signal.signal(s, old)

    return restore


def _tls_certificates(options: ServeOptions) -> list[flight.CertKeyPair] | None:
    if options.tls_cert is None or options.tls_key is None:
        return None
    try:
        with open(options.tls_cert, "rb") as f:
            cert = f.read()
        with open(options.tls_key, "rb") as f:
            key = f.read()
    except OSError as exc:
        raise Error(f"cannot read the TLS certificate or key: {exc}") from None
    return [flight.CertKeyPair(cert=cert, key=key)]


def _warn_if_readable(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & 0o077:
        log.warning("auth file %s is readable by other users (mode %o); chmod 600 it", path, mode & 0o777)


def _is_loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")


def _host_for_uri(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def configure_logging(level: int = logging.INFO) -> None:
    """Log lines on stderr: time, level, what happened."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def _outcome(exc: Error) -> tuple[str, str]:
    """How the owner's log names a failed query: a QueryFailed came after the charge."""
    if isinstance(exc, QueryFailed):
        return "failed after the charge", type(exc).__name__
    return "refused", f"{type(exc).__name__} (nothing charged)"

"""The proxy: an Arrow Flight server in front of the embedded pipeline (DESIGN §4).

``dpsql serve`` runs :func:`serve`. One process holds one hardened engine, one ledger and
the policy; each analyst gets a :class:`~dpsql.connection.Connection` over them, made on
first use, so a request runs exactly the pipeline of ``dpsql.connect`` under its analyst's
budget. Flight's thread pool answers many clients at once: the engine serializes its
queries, and the ledger's charge is one write transaction, so no number of concurrent
requests (or other processes sharing the ledger file) can overspend.

Who is asking. Every call carries ``authorization: Bearer <token>``; a middleware checks it
with :class:`~dpsql.auth.TokenVerifier` (one scrypt per token, in one thread at a lower
CPU priority, :class:`~dpsql.auth.BackgroundHasher`, so that token checks do not slow the
queries' runs; then an in-memory keyed digest per request; re-read when the auth file
changes, so a revoked token fails at its next request)
and refuses a wrong one before any handler runs. ``health`` also answers without a token.
The Flight handlers and the token check are in :mod:`dpsql.flightfront`; this module
starts and stops the server.

Cores. With ``--workers N`` (the CLI's default: one per core) the engine work of fresh
queries runs in N worker processes, each with its own engine, sharing the ledger and the
repeat store (:mod:`dpsql.workers`); this process keeps the fronts, the token checks, the
rate limit, planning, repeats, explain and budget.

Side channels (DESIGN §7). Every answer that reads private data is released at a deadline
computed from public facts (:mod:`dpsql.timing`): with workers, the answer waits for its
deadline in this process while its worker goes on to the next query (the release-only
hold); a query whose wait and run do not fit in its deadline is answered at the deadline
with the fixed, charged :class:`~dpsql.errors.QueryFailed`. Each analyst may send at most
``[server] queries_per_minute`` queries (:class:`~dpsql.service.RateLimiter`); a wrong token
costs the same time whether or not its id exists (:mod:`dpsql.auth`).

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

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight

from dpsql.auth import BackgroundHasher, TokenVerifier
from dpsql.errors import Error
from dpsql.flightfront import DpsqlFlightServer, Request
from dpsql.service import Service
from dpsql.timing import settle, unsettle
from dpsql.version import __version__
from dpsql.wire import ACTIONS

if TYPE_CHECKING:
    from dpsql.local.ingest import Collector

__all__ = ["ACTIONS", "DpsqlFlightServer", "Request", "ServeOptions", "Service", "configure_logging", "serve"]

log = logging.getLogger("dpsql.server")

_SHUTDOWN_GRACE_SECONDS = 30.0


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
    hasher = BackgroundHasher()  # token checks at a lower CPU priority, one at a time
    verifier = TokenVerifier(options.auth, hashing=hasher)
    if not verifier.analysts:
        log.warning("auth file %s holds no token: every query will be refused until one is created", options.auth)
    _warn_if_readable(options.auth)
    reporters = _reporters(options, hasher)
    tls = _tls_certificates(options)
    if tls is None and not _is_loopback(options.host):
        log.warning("serving on %s without TLS: tokens and answers cross the network in clear text; "
                    "pass --tls-cert and --tls-key", options.host)
    service = Service.open(options.database, options.policy, options.ledger, reports=options.reports,
                           workers=options.workers, analysts=tuple(verifier.analysts))
    collector = _collector(options, service) if reporters is not None else None
    settle()  # what the process holds once ready is out of the garbage collector's scans
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
        unsettle()
        if collector is not None:
            collector.close()
        service.close()
        hasher.close()
    log.info("stopped; the ledger is closed")
    return 0


def _reporters(options: ServeOptions, hasher: BackgroundHasher) -> TokenVerifier | None:
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
    reporters = TokenVerifier(options.report_auth, hashing=hasher)
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

"""The Postgres listener: accepts connections and runs one :class:`Session` thread each.

At most :data:`MAX_CONNECTIONS` sessions run at once; one more is told so (SQLSTATE 53300)
and closed. :meth:`PgServer.stop` stops accepting, lets a statement in flight finish (its
charge is committed before its answer leaves), then closes every connection.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time

from dpsql.auth import TokenVerifier
from dpsql.errors import Error
from dpsql.pgwire import messages as m
from dpsql.pgwire.catalog import Catalog
from dpsql.pgwire.describe import Describer
from dpsql.pgwire.scram import VerifierStore
from dpsql.pgwire.session import Session

__all__ = ["MAX_CONNECTIONS", "PgServer"]

log = logging.getLogger("dpsql.server.pg")

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_SECONDS = 3600.0
AUTH_FLOOR_SECONDS = 0.25
GRACE_SECONDS = 30.0


class PgServer:
    """A Postgres wire-protocol front over a :class:`dpsql.server.Service`."""

    def __init__(self, service: object, verifier: TokenVerifier, auth: str, host: str, port: int,
                 *, tls_cert: str | None = None, tls_key: str | None = None) -> None:
        self.service = service  # dpsql.server.Service; typed loosely to avoid an import cycle
        self.verifier = verifier
        self.scram = VerifierStore(auth)
        self.catalog = Catalog(service.policy)  # type: ignore[attr-defined]
        self.describer = Describer()
        self.tls = _tls_context(tls_cert, tls_key)
        self.idle_timeout = IDLE_TIMEOUT_SECONDS
        self.auth_floor_seconds = AUTH_FLOOR_SECONDS
        self.stopping = threading.Event()
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()
        try:
            self._listener = socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            self.catalog.close()
            self.describer.close()
            raise Error(f"cannot serve Postgres on {host}:{port}: {exc.strerror or exc}. "
                        "Is another server using that port? Pick another with --pg-port.") from None
        self._listener.settimeout(0.5)
        self.host, self.port = host, self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="dpsql-pg-accept", daemon=True)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{host}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    return
                time.sleep(0.1)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = f"{address[0]}:{address[1]}"
            session = Session(sock, self, peer)
            with self._lock:
                full = len(self._sessions) >= MAX_CONNECTIONS
                if not full:
                    self._sessions.add(session)
            if full:
                log.warning("pg connection from %s refused: %d sessions already open", peer, MAX_CONNECTIONS)
                _refuse(sock, "53300", f"sorry, too many clients already (dpsql takes {MAX_CONNECTIONS})")
                continue
            threading.Thread(target=self._run, args=(session,), name=f"dpsql-pg-{peer}", daemon=True).start()

    def _run(self, session: Session) -> None:
        try:
            session.run()
        finally:
            with self._lock:
                self._sessions.discard(session)

    def stop(self) -> None:
        """Stop accepting; wait (bounded) for statements in flight; close every connection."""
        self.stopping.set()
        self._listener.close()
        if self._thread.is_alive():
            self._thread.join(5)
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline:
            with self._lock:
                busy = [s for s in self._sessions if s.busy]
            if not busy:
                break
            time.sleep(0.05)
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            try:
                session.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.catalog.close()
        self.describer.close()


def _refuse(sock: socket.socket, sqlstate: str, text: str) -> None:
    try:
        sock.settimeout(2)
        sock.sendall(m.error_response(sqlstate, text, severity="FATAL"))
    except OSError:
        pass
    finally:
        sock.close()


def _tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if cert is None or key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise Error(f"cannot load the TLS certificate or key for the Postgres front: {exc}") from None
    return context

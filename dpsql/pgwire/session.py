"""One client connection: startup, authentication, then the simple and extended protocols.

Runs in its own thread (the listener starts it). Each statement is answered by
:class:`~dpsql.pgwire.answer.Answering` (every query through :class:`dpsql.server.Service`,
exactly as a Flight request does); the session keeps only what Postgres keeps per
connection: settings (``SET dpsql.epsilon`` ...), prepared statements and portals, and the
transaction status byte drivers expect.
"""

from __future__ import annotations

import logging
import secrets
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any

from dpsql.errors import AuthenticationError, QueryFailed
from dpsql.pgwire import describe
from dpsql.pgwire import messages as m
from dpsql.pgwire import statements as st
from dpsql.pgwire.answer import (
    _REPORTED,
    _REPORTED_NAMES,
    Answering,
    Host,
    Outcome,
    Refusal,
)
from dpsql.pgwire.scram import FAILED, ScramExchange

log = logging.getLogger("dpsql.server.pg")

AUTH_TIMEOUT_SECONDS = 30.0
_MAX_STATEMENTS = 1000  # prepared statements or portals per connection

__all__ = ["AUTH_TIMEOUT_SECONDS", "Host", "Outcome", "Refusal", "Session"]


@dataclass
class Prepared:
    statement: st.Statement
    oids: list[int]
    columns: list[m.Column] | None = None
    described: bool = False  # its RowDescription went to the client: every execution keeps it
    shape: tuple[str, str] = ("", "")  # dpsql.accuracy and dpsql.bias when it was described


@dataclass
class Portal:
    prepared: Prepared
    sql: str
    formats: list[int]
    outcome: Outcome | None = None
    columns: list[m.Column] | None = None
    described: bool = False


class Session(Answering):
    """The protocol state machine of one client."""

    def __init__(self, sock: socket.socket, server: Host, peer: str) -> None:
        self.sock = sock
        self.server = server
        self.peer = peer
        self.user = ""
        self.busy = False
        self.settings: dict[str, str] = {}
        self.status = b"I"
        self._out: list[bytes] = []
        self._prepared: dict[str, Prepared] = {}
        self._portals: dict[str, Portal] = {}
        self._skipping = False

    # ------------------------------------------------------------ the connection's life

    def run(self) -> None:
        try:
            self.sock.settimeout(AUTH_TIMEOUT_SECONDS)
            if not self._startup():
                return
            self.sock.settimeout(self.server.idle_timeout)
            self._loop()
        except m.ProtocolViolation as exc:
            log.info("pg client %s broke the protocol: %s", self.peer, exc)
            self._fatal("08P01", f"protocol violation: {exc}")
        except (ConnectionError, TimeoutError, ssl.SSLError, OSError):
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass

    def _fatal(self, sqlstate: str, text: str) -> None:
        try:
            self.sock.sendall(m.error_response(sqlstate, text, severity="FATAL"))
        except OSError:
            pass

    def _flush(self) -> None:
        if self._out:
            data, self._out = b"".join(self._out), []
            self.sock.sendall(data)

    # ------------------------------------------------------------ startup and authentication

    def _startup(self) -> bool:
        reader = m.Reader(self.sock)
        for _ in range(3):  # SSLRequest / GSSENCRequest, then the startup message
            code, body = reader.startup()
            if code == m.SSL_REQUEST:
                if self.server.tls is None or isinstance(self.sock, ssl.SSLSocket):
                    self.sock.sendall(b"N")
                    continue
                self.sock.sendall(b"S")
                self.sock = self.server.tls.wrap_socket(self.sock, server_side=True)
                reader = m.Reader(self.sock)
                continue
            if code == m.GSSENC_REQUEST:
                self.sock.sendall(b"N")
                continue
            if code == m.CANCEL_REQUEST:
                log.info("pg cancel request from %s ignored: a dpsql query is charged before it runs, so it "
                         "always finishes", self.peer)
                return False
            if code >> 16 != 3:
                self._fatal("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: dpsql speaks 3.0")
                return False
            return self._authenticate(reader, _startup_parameters(body))
        raise m.ProtocolViolation("too many SSL or GSS requests")

    def _authenticate(self, reader: m.Reader, params: dict[str, str]) -> bool:
        self.user = params.get("user", "")
        if not self.user:
            self._fatal("28000", "no user name: connect with user=ANALYST password=TOKEN")
            return False
        if self.server.tls is not None and not isinstance(self.sock, ssl.SSLSocket):
            self._fatal("28000", "this dpsql server requires TLS: connect with sslmode=require")
            return False
        started = time.monotonic()
        try:
            if isinstance(self.sock, ssl.SSLSocket):
                self._cleartext(reader)
            else:
                self._scram(reader)
        except AuthenticationError as exc:
            log.warning("pg authentication failed for user %r from %s: %s", self.user, self.peer, exc)
            _wait_until(started + self.server.auth_floor_seconds)
            self._fatal("28P01", f'password authentication failed for user "{self.user}"')
            return False
        self.settings["application_name"] = params.get("application_name", "")[:64]
        log.info("pg connection analyst=%r from %s (%s)", self.user, self.peer,
                 "TLS, password" if isinstance(self.sock, ssl.SSLSocket) else "SCRAM-SHA-256")
        out = [m.message(b"R", struct.pack("!i", 0))]
        out += [m.parameter_status(_REPORTED_NAMES.get(n, n), self._setting(n)) for n in _REPORTED]
        out.append(m.message(b"K", struct.pack("!ii", secrets.randbits(31), secrets.randbits(31))))
        out.append(m.ready_for_query(self.status))
        self.sock.sendall(b"".join(out))
        return True

    def _cleartext(self, reader: m.Reader) -> None:
        self.sock.sendall(m.message(b"R", struct.pack("!i", 3)))
        kind, body = reader.message()
        if kind != b"p":
            raise m.ProtocolViolation("expected a password message")
        token = body.rstrip(b"\0").decode("utf-8", "replace")
        analyst = self.server.verifier.analyst_for(token)
        if analyst != self.user:
            raise AuthenticationError("the token belongs to another analyst")

    def _scram(self, reader: m.Reader) -> None:
        verifier, genuine = self.server.scram.verifier_for(self.user)
        self.sock.sendall(m.message(b"R", struct.pack("!i", 10) + b"SCRAM-SHA-256\0\0"))
        kind, body = reader.message()
        if kind != b"p":
            raise m.ProtocolViolation("expected a SASLInitialResponse")
        fields = m.Fields(body)
        mechanism = fields.cstring()
        length = fields.int32()
        if mechanism != "SCRAM-SHA-256" or length < 0:
            raise AuthenticationError(f"unsupported SASL mechanism {mechanism[:40]!r}")
        exchange = ScramExchange(verifier)
        server_first = exchange.first(fields.raw(length).decode("utf-8", "replace"))
        self.sock.sendall(m.message(b"R", struct.pack("!i", 11) + server_first.encode()))
        kind, body = reader.message()
        if kind != b"p":
            raise m.ProtocolViolation("expected a SASLResponse")
        server_final = exchange.final(body.decode("utf-8", "replace"), genuine=genuine)
        if not genuine:  # unreachable: final() refuses a decoy; kept as a second lock
            raise AuthenticationError(FAILED)
        self.sock.sendall(m.message(b"R", struct.pack("!i", 12) + server_final.encode()))

    # ------------------------------------------------------------ the message loop

    def _loop(self) -> None:
        reader = m.Reader(self.sock)
        while not self.server.stopping.is_set():
            kind, body = reader.message()
            if kind == b"X":
                return
            self.busy = True
            try:
                self._dispatch(kind, body)
            finally:
                self.busy = False

    def _dispatch(self, kind: bytes, body: bytes) -> None:
        if kind == b"S":
            self._skipping = False
            self._out.append(m.ready_for_query(self.status))
            self._flush()
            return
        if kind == b"H":
            self._flush()
            return
        if kind == b"Q":
            self._skipping = False
            self._simple(m.Fields(body).cstring())
            self._out.append(m.ready_for_query(self.status))
            self._flush()
            return
        handlers = {b"P": self._parse, b"B": self._bind, b"D": self._describe, b"E": self._execute, b"C": self._close}
        handler = handlers.get(kind)
        if handler is None:
            if kind in (b"F", b"d", b"c", b"f"):
                self._error(Refusal("0A000", "dpsql supports neither the function-call nor the COPY sub-protocol."))
                return
            raise m.ProtocolViolation(f"unknown message type {kind!r}")
        if self._skipping:
            return
        try:
            handler(m.Fields(body))
        except m.ProtocolViolation:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes an ErrorResponse
            self._error(exc)
            self._skipping = True

    # ------------------------------------------------------------ simple protocol

    def _simple(self, sql: str) -> None:
        try:
            pieces = st.split(sql)
        except Exception as exc:  # noqa: BLE001
            self._error(exc)
            return
        if not pieces:
            self._out.append(m.message(b"I"))
            return
        for piece in pieces:
            try:
                outcome = self._run(piece, piece.text)
            except Exception as exc:  # noqa: BLE001
                self._error(exc)
                return  # like Postgres: the rest of the Query message is skipped
            if outcome.columns is not None:
                self._out.append(m.row_description(outcome.columns))
            self._out.extend(m.data_row(row) for row in outcome.rows)
            self._out.append(m.command_complete(outcome.tag))

    # ------------------------------------------------------------ extended protocol

    def _parse(self, fields: m.Fields) -> None:
        name, sql = fields.cstring(), fields.cstring()
        count = fields.int16()
        oids = [fields.int32() for _ in range(max(count, 0))]
        statement = st.one_statement(sql)
        wanted = st.parameter_count(sql) if statement.keyword else 0
        oids += [0] * max(0, wanted - len(oids))
        self._remember(self._prepared, name, Prepared(statement, oids))
        self._out.append(m.message(b"1"))

    def _bind(self, fields: m.Fields) -> None:
        portal_name, name = fields.cstring(), fields.cstring()
        prepared = self._prepared.get(name)
        if prepared is None:
            raise Refusal("26000", f"prepared statement {name!r} does not exist")
        formats = [fields.int16() for _ in range(max(fields.int16(), 0))]
        count = fields.int16()
        values: list[str | None] = []
        for i in range(max(count, 0)):
            size = fields.int32()
            data = None if size == -1 else fields.raw(size)
            binary = (formats[0] if len(formats) == 1 else formats[i] if i < len(formats) else 0) == 1
            oid = prepared.oids[i] if i < len(prepared.oids) else 0
            if data is None:
                values.append(None)
            elif binary:
                values.append(st.decode_binary(data, oid, i + 1))
            else:
                try:
                    values.append(data.decode("utf-8"))
                except UnicodeDecodeError:
                    raise st.BadParameter(f"parameter ${i + 1} is not valid UTF-8.") from None
        result_formats = [fields.int16() for _ in range(max(fields.int16(), 0))]
        if any(f not in (0, 1) for f in result_formats):
            raise Refusal("08P01", "result format codes are 0 (text) or 1 (binary).")
        if len(values) != len(prepared.oids):
            raise Refusal("08P01", f"the statement takes {len(prepared.oids)} parameters, {len(values)} were bound")
        sql = st.bind(prepared.statement.text, values, prepared.oids) if values else prepared.statement.text
        self._remember(self._portals, portal_name, Portal(prepared, sql, result_formats))
        self._out.append(m.message(b"2"))

    def _describe(self, fields: m.Fields) -> None:
        """Describe a statement or a portal: its columns from the plan (charging nothing,
        reading no private row; :mod:`dpsql.pgwire.describe`), never by running it."""
        what, name = fields.byte(), fields.cstring()
        if what == b"S":
            prepared = self._prepared.get(name)
            if prepared is None:
                raise Refusal("26000", f"prepared statement {name!r} does not exist")
            self._describe_statement(prepared)
            self._out.append(m.parameter_description(prepared.oids))
            self._out.append(m.row_description(prepared.columns) if prepared.columns is not None else m.message(b"n"))
            return
        portal = self._portal(name)
        columns = self._portal_columns(portal)
        portal.described = True
        if columns is None:
            self._out.append(m.message(b"n"))
            return
        if len(portal.formats) > 1 and len(portal.formats) != len(columns):
            raise Refusal("08P01", f"Bind gave {len(portal.formats)} result formats for {len(columns)} columns")
        self._out.append(m.row_description(columns, portal.formats))

    def _describe_statement(self, prepared: Prepared) -> None:
        """The statement's columns, with its parameters NULL, and the types of the parameters
        the client left untyped (from the columns they are compared with)."""
        if prepared.described:
            return
        statement = prepared.statement
        sql = statement.text
        if prepared.oids:  # NULL, but 1 for a LIMIT or OFFSET (which NULL would not be)
            typed = describe.parameter_types(sql, prepared.oids, {})
            values = ["1" if limit else None for limit in describe.limit_parameters(sql, len(prepared.oids))]
            sql = st.bind(sql, values, [m.INT8 if v else oid for v, oid in zip(values, typed)])
        described = self._columns(statement, sql)
        prepared.columns = described.columns
        prepared.shape = self._shape()
        prepared.oids = describe.parameter_types(statement.text, prepared.oids, described.types)
        prepared.described = True

    def _portal_columns(self, portal: Portal) -> list[m.Column] | None:
        """The portal's columns; those of its statement when the statement was described
        (refused, before it runs, if its parameters would change them)."""
        if portal.columns is None:
            prepared = portal.prepared
            if prepared.described and prepared.shape != self._shape():
                raise Refusal("0A000", "cached plan must not change result type: dpsql.accuracy or dpsql.bias "
                              "changed since the statement was described; prepare it again.")
            if prepared.described and not prepared.oids:
                portal.columns = prepared.columns
            else:
                described = self._columns(prepared.statement, portal.sql, types=False)
                portal.columns = described.columns
                if portal.outcome is None and described.outcome is not None:
                    portal.outcome = described.outcome  # answered to be described (free): not again
            if prepared.described and portal.columns != prepared.columns:
                raise Refusal("0A000", "the bound parameters change the statement's result columns "
                              "(a parameter in the select list?): cast it, e.g. $1::float8, or prepare the "
                              "statement again.")
        return portal.columns

    def _shape(self) -> tuple[str, str]:
        """The settings that add result columns."""
        return self._setting("dpsql.accuracy"), self._setting("dpsql.bias")

    def _execute(self, fields: m.Fields) -> None:
        portal = self._portal(fields.cstring())
        limit = fields.int32()
        announced = self._portal_columns(portal) if portal.described or portal.prepared.described else None
        outcome = self._outcome(portal)
        if outcome.empty:
            self._out.append(m.message(b"I"))
            return
        if announced is not None and outcome.sent == 0 and outcome.columns is not None:
            outcome = portal.outcome = conform(outcome, announced)
        columns = outcome.columns or []
        binary = any(m.format_of(portal.formats, i) == 1 for i in range(len(columns)))
        end = len(outcome.rows) if limit <= 0 else min(len(outcome.rows), outcome.sent + limit)
        if binary and outcome.values is not None:
            values = outcome.values
            self._out.extend(m.binary_row(row, columns, portal.formats) for row in values[outcome.sent:end])
        else:  # text, or text columns only (SHOW, EXPLAIN), whose binary format is their text
            self._out.extend(m.data_row(row) for row in outcome.rows[outcome.sent:end])
        outcome.sent = end
        if end < len(outcome.rows):
            self._out.append(m.message(b"s"))
        else:
            self._out.append(m.command_complete(outcome.tag))

    def _close(self, fields: m.Fields) -> None:
        what, name = fields.byte(), fields.cstring()
        (self._prepared if what == b"S" else self._portals).pop(name, None)
        self._out.append(m.message(b"3"))

    def _portal(self, name: str) -> Portal:
        portal = self._portals.get(name)
        if portal is None:
            raise Refusal("34000", f"portal {name!r} does not exist")
        return portal

    def _outcome(self, portal: Portal) -> Outcome:
        if portal.outcome is None:
            statement = portal.prepared.statement
            portal.outcome = self._run(statement, portal.sql) if statement.keyword else Outcome("", empty=True)
        return portal.outcome

    @staticmethod
    def _remember(book: dict[str, Any], name: str, value: Any) -> None:
        if name not in book and len(book) >= _MAX_STATEMENTS:
            raise Refusal("53000", f"more than {_MAX_STATEMENTS} prepared statements or portals; close some.")
        book[name] = value


def conform(outcome: Outcome, announced: list[m.Column]) -> Outcome:
    """``outcome`` with the columns a Describe announced, in order: a ``_bias`` column the
    answer has no cells for (no rows) is NULL. Raises the charged :class:`dpsql.QueryFailed`
    (the query ran) if the answer's columns do not read as announced; the describe tests
    keep that from happening."""
    actual = outcome.columns or []
    picks: list[int | None] = []
    at = 0
    for column in announced:
        if at < len(actual) and actual[at].name == column.name:
            if not describe.compatible(column.oid, actual[at].oid):
                break
            picks.append(at)
            at += 1
        elif column.name.endswith("_bias"):
            picks.append(None)
        else:
            break
    if len(picks) != len(announced) or at != len(actual):
        log.error("pg answer's columns %s differ from the described %s", [(c.name, c.oid) for c in actual],
                  [(c.name, c.oid) for c in announced])
        raise QueryFailed()
    if picks == list(range(len(actual))) and all(a.oid == c.oid for a, c in zip(actual, announced)):
        return outcome

    def pick(row: list[Any]) -> list[Any]:
        return [None if i is None else row[i] for i in picks]

    values = None if outcome.values is None else [pick(row) for row in outcome.values]
    return Outcome(outcome.tag, list(announced), [pick(row) for row in outcome.rows], outcome.sent, outcome.empty, values)


def _startup_parameters(body: bytes) -> dict[str, str]:
    parts = body.split(b"\0")
    params = {}
    for key, value in zip(parts[::2], parts[1::2]):
        if key:
            params[key.decode("utf-8", "replace")[:64]] = value.decode("utf-8", "replace")[:256]
    return params


def _wait_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)

"""Postgres v3 wire messages: bounded reading, backend message builders, type OIDs.

Only what dpsql speaks: text-format results, the handful of types a noisy answer or the
catalog can hold. Every length read from the client is checked against a limit before a
byte is buffered, so a client cannot make the server allocate more than
:data:`MAX_MESSAGE_BYTES` per connection.
"""

from __future__ import annotations

import datetime
import decimal
import math
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_STARTUP_BYTES",
    "Column",
    "ProtocolViolation",
    "Reader",
    "columns_of",
    "data_row",
    "error_response",
    "message",
    "row_description",
]

MAX_MESSAGE_BYTES = 1_000_000  # the Flight server's request limit, for the same SQL
MAX_STARTUP_BYTES = 10_000

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

# type OIDs (pg_type.dat)
BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID = 16, 17, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, UNKNOWN, VARCHAR = 700, 701, 705, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, NUMERIC = 1082, 1083, 1114, 1184, 1700
_TYPE_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8,
               TIMESTAMP: 8, TIMESTAMPTZ: 8}


class ProtocolViolation(Exception):
    """The client broke the protocol (SQLSTATE 08P01); the connection is closed after saying so."""


class Reader:
    """Reads whole messages from a socket, never more than a fixed size each."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(min(left, 65536))
            if not chunk:
                raise ConnectionError("the client closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def startup(self) -> tuple[int, bytes]:
        """A startup-phase packet (no type byte): its code and the rest of its body."""
        (length,) = struct.unpack("!i", self.exactly(4))
        if not 8 <= length <= MAX_STARTUP_BYTES:
            raise ProtocolViolation(f"invalid startup packet length {length}")
        body = self.exactly(length - 4)
        return struct.unpack("!i", body[:4])[0], body[4:]

    def message(self) -> tuple[bytes, bytes]:
        """One typed message: its type byte and body."""
        kind = self.exactly(1)
        (length,) = struct.unpack("!i", self.exactly(4))
        if length < 4:
            raise ProtocolViolation(f"invalid message length {length}")
        if length - 4 > MAX_MESSAGE_BYTES:
            raise ProtocolViolation(
                f"message of {length - 4:,} bytes; dpsql takes at most {MAX_MESSAGE_BYTES:,} per message"
            )
        return kind, self.exactly(length - 4)


class Fields:
    """Cursor over a message body: C strings and big-endian integers, bounds-checked."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._at = 0

    def cstring(self) -> str:
        end = self._body.find(b"\0", self._at)
        if end < 0:
            raise ProtocolViolation("a string in the message is not NUL-terminated")
        text = self._body[self._at:end]
        self._at = end + 1
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("a string in the message is not valid UTF-8") from None

    def int16(self) -> int:
        return int(self._unpack("!h", 2))

    def int32(self) -> int:
        return int(self._unpack("!i", 4))

    def raw(self, size: int) -> bytes:
        if size < 0 or self._at + size > len(self._body):
            raise ProtocolViolation("the message is shorter than its fields say")
        data = self._body[self._at:self._at + size]
        self._at += size
        return data

    def byte(self) -> bytes:
        return self.raw(1)

    def _unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack(fmt, self.raw(size))[0]


# ---------------------------------------------------------------- building messages


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.replace("\0", "").encode("utf-8") + b"\0"


def error_response(sqlstate: str, text: str, *, severity: str = "ERROR", detail: str | None = None,
                   hint: str | None = None) -> bytes:
    fields = [b"S" + cstr(severity), b"V" + cstr(severity), b"C" + cstr(sqlstate), b"M" + cstr(text)]
    if detail:
        fields.append(b"D" + cstr(detail))
    if hint:
        fields.append(b"H" + cstr(hint))
    return message(b"E", b"".join(fields) + b"\0")


def notice(text: str) -> bytes:
    return message(b"N", b"S" + cstr("NOTICE") + b"V" + cstr("NOTICE") + b"C" + cstr("00000")
                   + b"M" + cstr(text) + b"\0")


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def ready_for_query(status: bytes) -> bytes:
    return message(b"Z", status)


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


@dataclass(frozen=True)
class Column:
    """One result column as RowDescription announces it."""

    name: str
    oid: int


def row_description(columns: Sequence[Column], formats: Sequence[int] = ()) -> bytes:
    """RowDescription; ``formats``: each column's format code as Bind asked (0 text, 1 binary)."""
    parts = [struct.pack("!h", len(columns))]
    for i, col in enumerate(columns):
        code = format_of(formats, i)
        parts.append(cstr(col.name) + struct.pack("!ihihih", 0, 0, col.oid, _TYPE_SIZES.get(col.oid, -1), -1, code))
    return message(b"T", b"".join(parts))


def format_of(formats: Sequence[int], index: int) -> int:
    """Column ``index``'s format code: Bind gives none (all text), one (for all), or one each."""
    if not formats:
        return 0
    return formats[0] if len(formats) == 1 else formats[index]


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!i", o) for o in oids))


def binary_row(values: Sequence[Any], columns: Sequence[Column], formats: Sequence[int]) -> bytes:
    """A DataRow of Python values, each column in its format: text, or Postgres's binary
    format of the column's announced type."""
    cells: list[bytes | None] = []
    for i, (value, col) in enumerate(zip(values, columns)):
        if value is None:
            cells.append(None)
        elif format_of(formats, i) == 1:
            cells.append(binary_value(value, col.oid))
        else:
            cells.append(_text(value).encode("utf-8"))
    return data_row(cells)


_EPOCH_DATE = datetime.date(2000, 1, 1)
_EPOCH = datetime.datetime(2000, 1, 1)
_PACKED = {INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I"}


def binary_value(value: Any, oid: int) -> bytes:
    """``value`` in Postgres's binary format for type ``oid`` (the types :func:`oid_for` gives)."""
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid in _PACKED:
        return struct.pack(_PACKED[oid], int(value))
    if oid == FLOAT8:
        return struct.pack("!d", float(value))
    if oid == FLOAT4:
        return struct.pack("!f", float(value))
    if oid == NUMERIC:
        return _numeric(decimal.Decimal(str(value)) if isinstance(value, float) else decimal.Decimal(value))
    if oid == DATE:
        return struct.pack("!i", (value - _EPOCH_DATE).days)
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        delta = value - _EPOCH
        return struct.pack("!q", (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if oid == TIME:
        return struct.pack("!q", ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond)
    if oid == BYTEA:
        return bytes(value)
    return _text(value).encode("utf-8")


def _numeric(number: decimal.Decimal) -> bytes:
    """NUMERIC's binary format: base-10000 digits, weight, sign, display scale."""
    if number.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    if number.is_infinite():
        return struct.pack("!hhHh", 0, 0, 0xD000 if number > 0 else 0xF000, 0)
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    text = "".join(map(str, digits))
    if exponent > 0:
        text += "0" * exponent
    text = text.rjust(scale + 1, "0")  # 0.00012: digits 12, scale 5
    whole, fraction = (text[:len(text) - scale] or "0"), text[len(text) - scale:] if scale else ""
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    fraction = fraction + "0" * (-len(fraction) % 4)
    groups = [int(whole[i:i + 4]) for i in range(0, len(whole), 4)] + [int(fraction[i:i + 4]) for i in range(0, len(fraction), 4)]
    weight = len(whole) // 4 - 1
    while groups and groups[0] == 0:  # leading zero groups
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack("!hhHh", len(groups), weight, 0x4000 if sign else 0, scale) + b"".join(
        struct.pack("!H", g) for g in groups)


def data_row(values: Iterable[bytes | None]) -> bytes:
    cells = list(values)
    parts = [struct.pack("!h", len(cells))]
    for cell in cells:
        parts.append(struct.pack("!i", -1) if cell is None else struct.pack("!i", len(cell)) + cell)
    return message(b"D", b"".join(parts))


# ---------------------------------------------------------------- Arrow -> Postgres text


def oid_for(kind: pa.DataType) -> int:
    """The Postgres type a column of this Arrow type is announced as."""
    if pa.types.is_boolean(kind):
        return BOOL
    if pa.types.is_int8(kind) or pa.types.is_int16(kind) or pa.types.is_uint8(kind):
        return INT2
    if pa.types.is_int32(kind) or pa.types.is_uint16(kind):
        return INT4
    if pa.types.is_integer(kind):
        return INT8 if not pa.types.is_uint64(kind) else NUMERIC
    if pa.types.is_float16(kind) or pa.types.is_float32(kind):
        return FLOAT4
    if pa.types.is_floating(kind):
        return FLOAT8
    if pa.types.is_decimal(kind):
        return NUMERIC
    if pa.types.is_date(kind):
        return DATE
    if pa.types.is_timestamp(kind):
        return TIMESTAMPTZ if kind.tz else TIMESTAMP
    if pa.types.is_time(kind):
        return TIME
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return BYTEA
    return TEXT


def columns_of(schema: pa.Schema) -> list[Column]:
    return [Column(field.name, oid_for(field.type)) for field in schema]


def text_value(value: Any) -> bytes | None:
    """A Python value (from Arrow) in Postgres's text output format."""
    if value is None:
        return None
    return _text(value).encode("utf-8")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, (int, decimal.Decimal, str)):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return "{" + ",".join("NULL" if v is None else _array_item(_text(v)) for v in value) + "}"
    return str(value)


def _array_item(text: str) -> str:
    if text == "" or any(c in text for c in ' ,{}"\\') or text.upper() == "NULL":
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def rows_of(table: pa.Table) -> list[list[bytes | None]]:
    """Every row of ``table`` in text format."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [[text_value(v) for v in row] for row in zip(*columns)] if columns else []

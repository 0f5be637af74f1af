"""Analyst tokens for the server: create, revoke, verify (DESIGN §4).

An auth file (TOML) maps each analyst to one token, stored only as a salted scrypt hash::

    format = "dpsql-auth"
    version = 1

    [analysts."alice"]
    token_id = "3f9a0c1b2d4e"            # public: picks the record, proves nothing
    salt = "9c0e..."                     # 16 random bytes, hex
    hash = "5be1..."                     # scrypt(secret, salt, n, r, p), 32 bytes, hex
    n = 16384
    r = 8
    p = 1
    created = "2025-01-01T12:00:00Z"

A token is ``<token_id>.<secret>``: ``secret`` is ``secrets.token_urlsafe(32)`` (256 random
bits) and ``token_id`` (48 random bits, hex) names the record to check it against, so a
request costs at most one hash however many analysts there are. A request with an unknown
id costs that one hash too (against a random decoy record at the default cost), so the
time of a refusal does not say whether the id exists. A token maps to exactly one
analyst; creating a token for an analyst who has one replaces (revokes) the old one.

The file is written atomically (a temporary file in the same directory, ``fsync``, then
``os.replace``) with mode 0600, under an advisory lock (``flock`` on the directory) so two
``dpsql token`` commands do not lose each other's change.

:class:`TokenVerifier` is what the server asks, once per request. scrypt is deliberately
slow (tens of milliseconds), so a verified token is remembered in memory under a keyed
HMAC-SHA256 digest (the key is random per process; the token itself is never kept). The
verifier re-reads the file whenever it changes (inode, size or modification time), and a
remembered token is honoured only while its analyst's record is unchanged: revoking or
replacing a token takes effect at the next request.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "auth.toml")
    >>> token = create_token(path, "alice")
    >>> TokenVerifier(path).analyst_for(token)
    'alice'
    >>> revoke_token(path, "alice")
    >>> TokenVerifier(path).analyst_for(token)
    Traceback (most recent call last):
    ...
    dpsql.errors.AuthenticationError: the token is wrong or revoked. Ask the data owner for a new one (dpsql token create ANALYST --auth FILE).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
import threading
import tomllib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import TypeVar

from dpsql.errors import AuthenticationError, Error, InternalError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "AUTH_FORMAT",
    "BackgroundHasher",
    "TokenRecord",
    "TokenVerifier",
    "create_token",
    "read_auth_file",
    "revoke_token",
]

AUTH_FORMAT = "dpsql-auth"
AUTH_VERSION = 1

#: scrypt cost of new tokens: 16 MiB of memory, a few tens of milliseconds.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_MAX_SCRYPT_N = 2**20
_SCRYPT_MAXMEM = 256 * 1024 * 1024
_SALT_BYTES = 16
_HASH_BYTES = 32
_TOKEN_ID_BYTES = 6
_MAX_ANALYST_LENGTH = 200
_MAX_TOKEN_LENGTH = 200

_F = TypeVar("_F")

_REJECTED = (
    "the token is wrong or revoked. Ask the data owner for a new one "
    "(dpsql token create ANALYST --auth FILE)."
)


@dataclass(frozen=True)
class TokenRecord:
    """One analyst's token as the auth file keeps it: a salted scrypt hash, never the token."""

    analyst: str
    token_id: str
    salt: bytes
    digest: bytes
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P
    created: str = ""

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` hashes to this record (constant-time comparison)."""
        return hmac.compare_digest(_scrypt(secret, self.salt, self.n, self.r, self.p), self.digest)


# ---------------------------------------------------------------- create and revoke


def create_token(path: str | os.PathLike[str], analyst: str) -> str:
    """Make a new random token for ``analyst``, store its salted hash in ``path``, return it.

    The file is created if missing. An analyst has one token: an old one is replaced and
    stops working. The returned token is the only copy; it cannot be recovered from the file.

    Raises:
        Error: a bad analyst name, or an auth file that is not one.
    """
    _check_analyst(analyst)
    token_id = secrets.token_hex(_TOKEN_ID_BYTES)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(_SALT_BYTES)
    record = TokenRecord(
        analyst=analyst,
        token_id=token_id,
        salt=salt,
        digest=_scrypt(secret, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P),
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    with _file_lock(path):
        records = read_auth_file(path) if os.path.exists(path) else {}
        records[analyst] = record
        _write_auth_file(path, records)
    return f"{token_id}.{secret}"


def revoke_token(path: str | os.PathLike[str], analyst: str) -> None:
    """Remove ``analyst``'s token from ``path``; a running server refuses it from its next request.

    Raises:
        Error: the file does not exist, or holds no token for ``analyst``.
    """
    with _file_lock(path):
        if not os.path.exists(path):
            raise Error(f"auth file {os.fspath(path)!r} does not exist, so there is no token to revoke.")
        records = read_auth_file(path)
        if analyst not in records:
            known = ", ".join(repr(a) for a in sorted(records)) or "none"
            raise Error(
                f"auth file {os.fspath(path)!r} has no token for analyst {analyst!r} "
                f"(analysts with a token: {known}). Names are case-sensitive."
            )
        del records[analyst]
        _write_auth_file(path, records)


# ---------------------------------------------------------------- verify


class TokenVerifier:
    """Answers "whose token is this?" for the server, fast after the first request.

    Thread-safe. A missing or unreadable auth file refuses every token (fails closed).
    ``hashing``: runs each scrypt check (default: in the calling thread); a server passes a
    :class:`BackgroundHasher`, so that token checks do not take CPU from queries' runs.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 hashing: Callable[[Callable[[], bool]], bool] | None = None) -> None:
        self.path = os.fspath(path)
        self._hashing = hashing if hashing is not None else _in_this_thread
        self._lock = threading.Lock()
        self._key = secrets.token_bytes(32)
        self._by_id: dict[str, TokenRecord] = {}
        self._version: tuple[int, int, int] | None = None
        self._verified: dict[bytes, TokenRecord] = {}
        self._load_error: str | None = None
        self._decoy = TokenRecord("", "", secrets.token_bytes(_SALT_BYTES), secrets.token_bytes(_HASH_BYTES))
        if not os.path.exists(self.path):
            raise Error(
                f"auth file {self.path!r} does not exist. Create a token first: "
                f"dpsql token create ANALYST --auth {self.path}"
            )
        self._refresh()
        if self._load_error is not None:
            raise Error(self._load_error)

    @property
    def analysts(self) -> list[str]:
        """The analysts that hold a token now, sorted."""
        with self._lock:
            self._refresh()
            return sorted(r.analyst for r in self._by_id.values())

    def holds(self, token: str) -> bool:
        """Whether ``token``'s id names a record of this file (its secret is NOT checked).

        For a server with two auth files (analysts, reporting clients): it picks the file
        whose :meth:`analyst_for` then checks the token, so each token costs one hash.
        """
        if not isinstance(token, str) or not 0 < len(token) <= _MAX_TOKEN_LENGTH:
            return False
        with self._lock:
            self._refresh()
            return token.partition(".")[0] in self._by_id

    def analyst_for(self, token: str) -> str:
        """The analyst ``token`` belongs to.

        Raises:
            AuthenticationError: the token is malformed, unknown, wrong or revoked.
        """
        if not isinstance(token, str) or not 0 < len(token) <= _MAX_TOKEN_LENGTH:
            raise AuthenticationError(_REJECTED)
        digest = hmac.new(self._key, token.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
        token_id, _, secret = token.partition(".")
        with self._lock:
            self._refresh()
            record = self._by_id.get(token_id)
            if record is not None and self._verified.get(digest) == record:
                return record.analyst
        # scrypt, outside the lock. An unknown id is hashed against a decoy record of the
        # same cost, so that a wrong secret for a real id and any secret for a made-up id
        # take the same time: token ids cannot be enumerated by timing (DESIGN §7).
        checked = record or self._decoy
        if not self._hashing(lambda: checked.matches(secret)) or record is None:
            raise AuthenticationError(_REJECTED)
        with self._lock:
            self._refresh()
            if self._by_id.get(token_id) != record:  # revoked or replaced while we were hashing
                raise AuthenticationError(_REJECTED)
            self._verified[digest] = self._by_id[token_id]
        return record.analyst

    def _refresh(self) -> None:
        """Re-read the file if it changed; forget verified tokens whose record changed."""
        try:
            info = os.stat(self.path)
            version: tuple[int, int, int] | None = (info.st_ino, info.st_size, info.st_mtime_ns)
        except OSError:
            version = None
        if version == self._version and self._version is not None:
            return
        self._version = version
        try:
            records = read_auth_file(self.path) if version is not None else {}
            self._load_error = None
        except (Error, OSError) as exc:  # fail closed until the file is fixed
            records = {}
            self._load_error = str(exc)
        by_id = {r.token_id: r for r in records.values()}
        # Keep a verified token only while its record is unchanged (equal, not identical:
        # every read makes new objects).
        self._verified = {
            k: by_id[r.token_id] for k, r in self._verified.items() if by_id.get(r.token_id) == r
        }
        self._by_id = by_id

    def load_error(self) -> str | None:
        """Why the auth file could not be read at its last change, or ``None``."""
        with self._lock:
            self._refresh()
            return self._load_error


def _in_this_thread(check: Callable[[], bool]) -> bool:
    return check()


class BackgroundHasher:
    """Runs scrypt checks one at a time in one thread at the lowest CPU priority (nice 19).

    A token's first check costs one scrypt (tens of milliseconds of a core). Eight analysts
    connecting at once would take both cores of a small machine for a few hundred
    milliseconds, beside the workers' runs, whose deadlines assume the cores are theirs
    (:mod:`dpsql.timing`, "CPU contention"): honest queries overran. Here the checks queue
    for one thread that runs only when the cores have nothing else to do (the OS scheduler
    gives nice 19 about 1.5% of a core against normal work). A check then waits for other
    checks and for the queries' runs, never for data: every token costs one scrypt, known
    or unknown id alike, so the refusal's timing still says nothing about which ids exist.

    >>> hasher = BackgroundHasher()
    >>> hasher(lambda: True)
    True
    >>> hasher.close()
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsql-scrypt", initializer=_lowest_priority)

    def __call__(self, check: Callable[[], bool]) -> bool:
        return self._pool.submit(check).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lowest_priority() -> None:
    """Nice 19 for the calling thread only (Linux: a thread is a task); elsewhere, as is."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # pragma: no cover - no per-thread priority here
        pass


# ---------------------------------------------------------------- the file


def read_auth_file(path: str | os.PathLike[str]) -> dict[str, TokenRecord]:
    """Read an auth file: analyst -> :class:`TokenRecord`.

    Raises:
        Error: the file is not valid TOML or not a dpsql auth file (the message says where).
        OSError: the file cannot be read.
    """
    where = os.fspath(path)
    with open(where, "rb") as f:
        try:
            document = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise Error(f"auth file {where!r} is not valid TOML: {exc}. Recreate it with dpsql token create.") from None
    if document.get("format") != AUTH_FORMAT or document.get("version") != AUTH_VERSION:
        raise Error(
            f"{where!r} is not a dpsql auth file (it must say format = {AUTH_FORMAT!r}, "
            f"version = {AUTH_VERSION}). Point --auth at a file written by dpsql token create."
        )
    analysts = document.get("analysts", {})
    if not isinstance(analysts, dict):
        raise Error(f"auth file {where!r}: [analysts] must be a table of analyst records.")
    records = {name: _parse_record(where, name, entry) for name, entry in analysts.items()}
    ids = [r.token_id for r in records.values()]
    if len(set(ids)) != len(ids):
        raise Error(f"auth file {where!r}: two analysts share a token_id; revoke and recreate their tokens.")
    return records


def _parse_record(where: str, analyst: str, entry: object) -> TokenRecord:
    problem = f"auth file {where!r}, analyst {analyst!r}:"
    if not isinstance(entry, dict):
        raise Error(f"{problem} the record must be a table. Recreate the token with dpsql token create.")
    try:
        record = TokenRecord(
            analyst=analyst,
            token_id=_field(entry, "token_id", str),
            salt=bytes.fromhex(_field(entry, "salt", str)),
            digest=bytes.fromhex(_field(entry, "hash", str)),
            n=_field(entry, "n", int),
            r=_field(entry, "r", int),
            p=_field(entry, "p", int),
            created=str(entry.get("created", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise Error(f"{problem} {exc}. Recreate the token with dpsql token create.") from None
    unknown = set(entry) - {"token_id", "salt", "hash", "n", "r", "p", "created"}
    if unknown:
        raise Error(f"{problem} unknown keys {sorted(unknown)}. Recreate the token with dpsql token create.")
    if not (2 <= record.n <= _MAX_SCRYPT_N and record.n & (record.n - 1) == 0 and 1 <= record.r <= 32
            and 1 <= record.p <= 16 and len(record.digest) == _HASH_BYTES and len(record.salt) >= 8
            and record.token_id and "." not in record.token_id):
        raise Error(f"{problem} the hash parameters are out of range. Recreate the token with dpsql token create.")
    return record


def _field(entry: Mapping[str, object], key: str, kind: type[_F]) -> _F:
    if key not in entry:
        raise KeyError(f"missing key {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{key!r} must be a {kind.__name__}")
    return value


def _write_auth_file(path: str | os.PathLike[str], records: Mapping[str, TokenRecord]) -> None:
    """Write ``records`` to ``path`` atomically, mode 0600."""
    where = os.fspath(path)
    text = _render(records)
    if {n: r for n, r in tomllib.loads(text).get("analysts", {}).items()}.keys() != records.keys():
        raise InternalError("the auth file did not round-trip through TOML.")
    directory = os.path.dirname(os.path.abspath(where))
    fd, temporary = tempfile.mkstemp(prefix=".dpsql-auth-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), stat.S_IRUSR | stat.S_IWUSR)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, where)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _render(records: Mapping[str, TokenRecord]) -> str:
    lines = [
        "# dpsql auth file: one token per analyst, kept only as a salted scrypt hash.",
        "# Managed by `dpsql token create|revoke ANALYST --auth FILE`; keep it private (mode 0600).",
        f'format = "{AUTH_FORMAT}"',
        f"version = {AUTH_VERSION}",
    ]
    for name in sorted(records):
        r = records[name]
        lines += [
            "",
            f"[analysts.{_quote(name)}]",
            f"token_id = {_quote(r.token_id)}",
            f'salt = "{r.salt.hex()}"',
            f'hash = "{r.digest.hex()}"',
            f"n = {r.n}",
            f"r = {r.r}",
            f"p = {r.p}",
            f"created = {_quote(r.created)}",
        ]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's; control characters are refused earlier)."""
    return json.dumps(text, ensure_ascii=False)


def _check_analyst(analyst: str) -> None:
    if not isinstance(analyst, str) or not analyst.strip():
        raise Error("the analyst name must be a non-empty string.")
    if len(analyst) > _MAX_ANALYST_LENGTH or any(ord(c) < 32 or ord(c) == 127 for c in analyst):
        raise Error(
            f"analyst name {analyst[:50]!r} is too long or has control characters; "
            f"use a plain name of at most {_MAX_ANALYST_LENGTH} characters."
        )


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        secret.encode("utf-8", "surrogateescape"), salt=salt, n=n, r=r, p=p,
        maxmem=_SCRYPT_MAXMEM, dklen=_HASH_BYTES,
    )


@contextmanager
def _file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An advisory lock, on the file's directory, for read-modify-write of the auth file.

    The file itself cannot carry the lock: each write replaces it with a new inode.
    """
    where = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(where))
    if not os.path.isdir(directory):
        raise Error(f"cannot write auth file {where!r}: the directory {directory!r} does not exist.")
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)

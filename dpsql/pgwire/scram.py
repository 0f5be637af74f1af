"""SCRAM-SHA-256 (RFC 5802, RFC 7677) for the Postgres front, with tokens as passwords.

The auth file keeps each token only as a salted scrypt hash, and SCRAM cannot be checked
against that: the server needs the token's SCRAM verifier (``StoredKey``, ``ServerKey``:
PBKDF2-HMAC-SHA256 of the token, as Postgres keeps in ``pg_authid``). So ``dpsql token
create`` also writes the verifier to a file beside the auth file, ``<auth>.scram`` (mode
0600, atomic), tied to the token by its ``token_id``::

    format = "dpsql-scram"
    version = 1

    [analysts."alice"]
    token_id = "3f9a0c1b2d4e"     # must equal the auth file's: a replaced or revoked token
    salt = "..."                  #   makes the verifier void at once
    iterations = 4096
    stored_key = "..."
    server_key = "..."

Like Postgres's verifier, it lets no one log in who does not know the token (the token has
256 random bits, so it cannot be guessed from the verifier either), but keep it as private
as the auth file.

An unknown analyst, or one whose verifier is missing or stale, goes through the same
exchange with a made-up salt and keys and fails at the proof, with the same work and the
same message: the exchange does not tell which analysts exist.

Example:
    >>> v = Verifier.derive("tok", "id1", salt=b"0123456789abcdef", iterations=4096)
    >>> exchange = ScramExchange(v)
    >>> first = "n,,n=,r=clientnonce"
    >>> server_first = exchange.first(first)
    >>> server_first.startswith("r=clientnonce")
    True
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
import threading
import tomllib
from dataclasses import dataclass

from dpsql.auth import read_auth_file
from dpsql.errors import AuthenticationError, Error

__all__ = ["ScramExchange", "Verifier", "VerifierStore", "remove_verifier", "store_verifier", "verifier_path"]

SCRAM_FORMAT = "dpsql-scram"
ITERATIONS = 4096
_NONCE_BYTES = 18
_MAX_SCRAM_MESSAGE = 2048
FAILED = "password authentication failed"


def verifier_path(auth: str | os.PathLike[str]) -> str:
    """Where the SCRAM verifiers of auth file ``auth`` are kept."""
    return os.fspath(auth) + ".scram"


@dataclass(frozen=True)
class Verifier:
    """What the server keeps to check a SCRAM proof of one token."""

    token_id: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(cls, token: str, token_id: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> Verifier:
        salt = secrets.token_bytes(16) if salt is None else salt
        salted = hashlib.pbkdf2_hmac("sha256", token.encode("utf-8"), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        return cls(
            token_id=token_id,
            salt=salt,
            iterations=iterations,
            stored_key=hashlib.sha256(client_key).digest(),
            server_key=hmac.new(salted, b"Server Key", hashlib.sha256).digest(),
        )

    @classmethod
    def decoy(cls, key: bytes, analyst: str) -> Verifier:
        """A verifier no token matches, with a salt that is stable per name (as Postgres does)."""
        salt = hmac.new(key, b"salt:" + analyst.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()[:16]
        return cls("", salt, ITERATIONS, secrets.token_bytes(32), secrets.token_bytes(32))


# ---------------------------------------------------------------- the file beside the auth file


def store_verifier(auth: str | os.PathLike[str], analyst: str, token: str) -> None:
    """Write ``analyst``'s SCRAM verifier for ``token`` (just created in ``auth``)."""
    token_id = token.partition(".")[0]
    path = verifier_path(auth)
    records = _read(path) if os.path.exists(path) else {}
    records[analyst] = Verifier.derive(token, token_id)
    _write(path, records)


def remove_verifier(auth: str | os.PathLike[str], analyst: str) -> None:
    """Drop ``analyst``'s verifier, if there is one (a revoked token's is void anyway)."""
    path = verifier_path(auth)
    if os.path.exists(path):
        records = _read(path)
        if records.pop(analyst, None) is not None:
            _write(path, records)


def _read(path: str) -> dict[str, Verifier]:
    with open(path, "rb") as f:
        try:
            document = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise Error(f"SCRAM verifier file {path!r} is not valid TOML: {exc}. Delete it and recreate the tokens.") from None
    if document.get("format") != SCRAM_FORMAT or document.get("version") != 1:
        raise Error(f"{path!r} is not a dpsql SCRAM verifier file; delete it and recreate the tokens.")
    records = {}
    for name, entry in document.get("analysts", {}).items():
        try:
            records[name] = Verifier(
                token_id=str(entry["token_id"]),
                salt=bytes.fromhex(entry["salt"]),
                iterations=int(entry["iterations"]),
                stored_key=bytes.fromhex(entry["stored_key"]),
                server_key=bytes.fromhex(entry["server_key"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise Error(f"{path!r}: the record of {name!r} is malformed; recreate that analyst's token.") from None
    return records


def _write(path: str, records: dict[str, Verifier]) -> None:
    lines = ["# dpsql SCRAM-SHA-256 verifiers for the Postgres front; written by dpsql token create.",
             "# Keep it private (mode 0600), like the auth file beside it.",
             f'format = "{SCRAM_FORMAT}"', "version = 1"]
    for name in sorted(records):
        v = records[name]
        lines += ["", f"[analysts.{json.dumps(name, ensure_ascii=False)}]", f"token_id = {json.dumps(v.token_id)}",
                  f'salt = "{v.salt.hex()}"', f"iterations = {v.iterations}",
                  f'stored_key = "{v.stored_key.hex()}"', f'server_key = "{v.server_key.hex()}"']
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".dpsql-scram-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), stat.S_IRUSR | stat.S_IWUSR)
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class VerifierStore:
    """The server's view of the verifiers: valid only while the auth file holds the same token.

    Both files are re-read when they change (inode, size, mtime), so ``dpsql token revoke``
    shuts an analyst out at their next connection.
    """

    def __init__(self, auth: str | os.PathLike[str]) -> None:
        self._auth = os.fspath(auth)
        self._path = verifier_path(auth)
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._version: tuple[object, object] | None = None
        self._valid: dict[str, Verifier] = {}

    def verifier_for(self, analyst: str) -> tuple[Verifier, bool]:
        """The analyst's verifier and True, or a decoy and False."""
        with self._lock:
            self._refresh()
            found = self._valid.get(analyst)
        return (found, True) if found is not None else (Verifier.decoy(self._key, analyst), False)

    def _refresh(self) -> None:
        version = (_stamp(self._auth), _stamp(self._path))
        if version == self._version:
            return
        self._version = version
        try:
            tokens = {name: r.token_id for name, r in read_auth_file(self._auth).items()}
            verifiers = _read(self._path) if os.path.exists(self._path) else {}
        except (Error, OSError):
            self._valid = {}  # fail closed until the files are fixed
            return
        self._valid = {n: v for n, v in verifiers.items() if v.token_id and tokens.get(n) == v.token_id}


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


# ---------------------------------------------------------------- the exchange


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange (no channel binding)."""

    def __init__(self, verifier: Verifier) -> None:
        self._verifier = verifier
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def first(self, client_first: str) -> str:
        """Read client-first-message, return server-first-message."""
        if len(client_first) > _MAX_SCRAM_MESSAGE:
            raise AuthenticationError("the SCRAM message is too long")
        gs2_flag, _, rest = client_first.partition(",")
        authzid, _, bare = rest.partition(",")
        if gs2_flag not in ("n", "y") or authzid:
            raise AuthenticationError("SCRAM: channel binding and authorization identities are not supported")
        attrs = _attributes(bare)
        client_nonce = attrs.get("r", "")
        if not client_nonce or "m" in attrs:
            raise AuthenticationError("SCRAM: the client-first-message is malformed")
        self._gs2 = f"{gs2_flag},,"
        self._client_first_bare = bare
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(_NONCE_BYTES)).decode()
        salt = base64.b64encode(self._verifier.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self._verifier.iterations}"
        return self._server_first

    def final(self, client_final: str, *, genuine: bool) -> str:
        """Check client-final-message; return server-final-message, or raise AuthenticationError."""
        if len(client_final) > _MAX_SCRAM_MESSAGE or not self._nonce:
            raise AuthenticationError(FAILED)
        without_proof, _, proof_part = client_final.rpartition(",p=")
        attrs = _attributes(without_proof)
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            proof = b""
        binding_ok = attrs.get("c") == base64.b64encode(self._gs2.encode()).decode()
        nonce_ok = hmac.compare_digest(attrs.get("r", "").encode(), self._nonce.encode())
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.new(self._verifier.stored_key, auth_message, hashlib.sha256).digest()
        client_key = bytes(a ^ b for a, b in zip(proof.ljust(32, b"\0")[:32], signature))
        proof_ok = len(proof) == 32 and hmac.compare_digest(hashlib.sha256(client_key).digest(), self._verifier.stored_key)
        if not (binding_ok and nonce_ok and proof_ok and genuine):
            raise AuthenticationError(FAILED)
        server_signature = hmac.new(self._verifier.server_key, auth_message, hashlib.sha256).digest()
        return "v=" + base64.b64encode(server_signature).decode()


def _attributes(text: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) == 1:
            attrs.setdefault(key, value)
    return attrs

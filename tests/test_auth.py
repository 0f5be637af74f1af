"""Tokens (dpsql.auth and ``dpsql token``): only salted hashes are kept, one analyst per
token, atomic 0600 writes, fast verification after the first, revocation takes effect."""

from __future__ import annotations

import os
import stat
import threading
import tomllib
from pathlib import Path

import pytest

import dpsql
from dpsql import auth
from dpsql.auth import TokenVerifier, create_token, read_auth_file, revoke_token
from dpsql.cli import main


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "auth.toml"


def test_create_keeps_only_a_salted_hash(path: Path) -> None:
    token = create_token(path, "alice")
    text = path.read_text()
    token_id, secret = token.split(".")
    assert secret not in text and token not in text
    assert len(secret) >= 43  # secrets.token_urlsafe(32): 256 bits
    record = tomllib.loads(text)["analysts"]["alice"]
    assert record["token_id"] == token_id
    assert len(bytes.fromhex(record["salt"])) == 16 and len(bytes.fromhex(record["hash"])) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TokenVerifier(path).analyst_for(token) == "alice"


def test_salts_differ_and_tokens_map_to_one_analyst(path: Path) -> None:
    tokens = {name: create_token(path, name) for name in ("alice", "bob", 'carol "the" analyst', "dörte")}
    records = read_auth_file(path)
    assert len({r.salt for r in records.values()}) == 4
    verifier = TokenVerifier(path)
    for name, token in tokens.items():
        assert verifier.analyst_for(token) == name
    alice_id = tokens["alice"].split(".")[0]
    bob_secret = tokens["bob"].split(".")[1]
    with pytest.raises(dpsql.AuthenticationError, match="wrong or revoked"):
        verifier.analyst_for(f"{alice_id}.{bob_secret}")  # one analyst's id, another's secret


@pytest.mark.parametrize("bad", ["", "nodot", ".", "abc.def", "x" * 5000, "ünïcode.tökén"])
def test_malformed_or_unknown_tokens_are_refused(path: Path, bad: str) -> None:
    create_token(path, "alice")
    with pytest.raises(dpsql.AuthenticationError):
        TokenVerifier(path).analyst_for(bad)


def test_a_changed_character_is_refused(path: Path) -> None:
    token = create_token(path, "alice")
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(dpsql.AuthenticationError):
        TokenVerifier(path).analyst_for(flipped)


def test_verification_is_cached_after_the_first(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = create_token(path, "alice")
    verifier = TokenVerifier(path)
    calls = []
    real = auth._scrypt
    monkeypatch.setattr(auth, "_scrypt", lambda *a: calls.append(1) or real(*a))
    for _ in range(50):
        assert verifier.analyst_for(token) == "alice"
    assert len(calls) == 1
    assert token.encode() not in repr(vars(verifier)).encode()  # the cache keeps digests, not tokens


def test_revocation_and_replacement_reach_a_running_verifier(path: Path) -> None:
    alice = create_token(path, "alice")
    bob = create_token(path, "bob")
    verifier = TokenVerifier(path)
    assert verifier.analyst_for(alice) == "alice"  # now cached
    revoke_token(path, "alice")
    with pytest.raises(dpsql.AuthenticationError):
        verifier.analyst_for(alice)
    assert verifier.analyst_for(bob) == "bob"
    new_bob = create_token(path, "bob")  # replaces bob's token
    with pytest.raises(dpsql.AuthenticationError):
        verifier.analyst_for(bob)
    assert verifier.analyst_for(new_bob) == "bob"
    assert verifier.analysts == ["bob"]


def test_a_corrupt_file_fails_closed(path: Path) -> None:
    token = create_token(path, "alice")
    verifier = TokenVerifier(path)
    assert verifier.analyst_for(token) == "alice"
    path.write_text("this is [not toml")
    with pytest.raises(dpsql.AuthenticationError):
        verifier.analyst_for(token)
    assert "not valid TOML" in (verifier.load_error() or "")
    with pytest.raises(dpsql.Error, match="not valid TOML"):
        TokenVerifier(path)
    path.unlink()
    with pytest.raises(dpsql.AuthenticationError):
        verifier.analyst_for(token)
    with pytest.raises(dpsql.Error, match="does not exist.*dpsql token create"):
        TokenVerifier(path)


def test_a_foreign_file_is_refused(path: Path) -> None:
    path.write_text('[privacy]\nmax_epsilon_per_query = 1.0\n')
    with pytest.raises(dpsql.Error, match="not a dpsql auth file"):
        create_token(path, "alice")
    assert "alice" not in path.read_text()


def test_writes_are_atomic_and_leave_no_temporary_files(path: Path) -> None:
    create_token(path, "alice")
    before = path.stat().st_ino
    create_token(path, "bob")
    assert path.stat().st_ino != before  # replaced, not rewritten in place
    assert sorted(os.listdir(path.parent)) == ["auth.toml"]


def test_concurrent_creates_lose_nothing(path: Path) -> None:
    names = [f"analyst{i}" for i in range(8)]
    threads = [threading.Thread(target=create_token, args=(path, n)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(read_auth_file(path)) == names


@pytest.mark.parametrize("name", ["", "   ", "a\nb", "x" * 500])
def test_bad_analyst_names_are_refused(path: Path, name: str) -> None:
    with pytest.raises(dpsql.Error, match="analyst name"):
        create_token(path, name)
    assert not path.exists()


def test_cli_prints_the_token_as_the_last_line(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "alice", "--auth", str(path)]) == 0
    out = capsys.readouterr().out
    token = out.rstrip("\n").splitlines()[-1]
    assert TokenVerifier(path).analyst_for(token) == "alice"
    assert out.count(token) == 1
    assert main(["token", "create", "alice", "--auth", str(path)]) == 0
    out = capsys.readouterr().out
    assert "replaced the previous token" in out
    with pytest.raises(dpsql.AuthenticationError):
        TokenVerifier(path).analyst_for(token)


def test_cli_revoke(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["token", "create", "alice", "--auth", str(path)])
    token = capsys.readouterr().out.splitlines()[-1]
    assert main(["token", "revoke", "alice", "--auth", str(path)]) == 0
    assert "revoked" in capsys.readouterr().out
    with pytest.raises(dpsql.AuthenticationError):
        TokenVerifier(path).analyst_for(token)
    assert main(["token", "revoke", "alice", "--auth", str(path)]) == 1
    assert "has no token for analyst 'alice'" in capsys.readouterr().err
    assert main(["token", "revoke", "bob", "--auth", str(path.parent / "missing.toml")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_a_server_hashes_tokens_in_one_thread_at_the_lowest_priority(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = create_token(path, "alice")
    seen: list[tuple[str, int]] = []
    matches = auth.TokenRecord.matches

    def spying(self: auth.TokenRecord, secret: str) -> bool:
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return matches(self, secret)

    monkeypatch.setattr(auth.TokenRecord, "matches", spying)
    hasher = auth.BackgroundHasher()
    try:
        verifier = TokenVerifier(path, hashing=hasher)
        assert verifier.analyst_for(token) == "alice"
        assert verifier.analyst_for(token) == "alice"  # remembered: no second scrypt
        with pytest.raises(dpsql.AuthenticationError):
            verifier.analyst_for(token.split(".")[0] + ".wrong")
        with pytest.raises(dpsql.AuthenticationError):
            verifier.analyst_for("000000000000.unknown")  # an unknown id: one scrypt too (the decoy)
    finally:
        hasher.close()
    assert len(seen) == 3
    assert all(name.startswith("dpsql-scrypt") and nice == 19 for name, nice in seen), seen

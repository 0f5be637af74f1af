"""Units of the Postgres front without a server: SCRAM, statement splitting, hints, binding."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from dpsql.auth import create_token, revoke_token
from dpsql.errors import AuthenticationError, Error
from dpsql.pgwire import statements as st
from dpsql.pgwire.scram import ScramExchange, Verifier, VerifierStore, store_verifier


def _client_final(token: str, client_first_bare: str, server_first: str) -> str:
    """What libpq computes (RFC 5802), written out independently of the server code."""
    attrs = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", token.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), message, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


def _login(store: VerifierStore, user: str, token: str) -> str:
    verifier, genuine = store.verifier_for(user)
    exchange = ScramExchange(verifier)
    server_first = exchange.first("n,,n=,r=abc123")
    return exchange.final(_client_final(token, "n=,r=abc123", server_first), genuine=genuine)


def test_scram_accepts_the_token_and_refuses_anything_else(tmp_path):
    auth = tmp_path / "auth.toml"
    token = create_token(auth, "alice")
    store_verifier(auth, "alice", token)
    store = VerifierStore(auth)
    assert _login(store, "alice", token).startswith("v=")
    for user, secret in [("alice", token + "x"), ("bob", token), ("alice", "")]:
        with pytest.raises(AuthenticationError, match="password authentication failed"):
            _login(store, user, secret)


def test_a_replaced_or_revoked_token_voids_its_verifier(tmp_path):
    auth = tmp_path / "auth.toml"
    old = create_token(auth, "alice")
    store_verifier(auth, "alice", old)
    store = VerifierStore(auth)
    create_token(auth, "alice")  # replaced without a new verifier: the old one must not work
    with pytest.raises(AuthenticationError):
        _login(store, "alice", old)
    create_token(auth, "bob")
    revoke_token(auth, "bob")
    with pytest.raises(AuthenticationError):
        _login(store, "bob", "anything")


def test_a_decoy_has_a_stable_salt_per_name():
    key = b"k" * 32
    assert Verifier.decoy(key, "x").salt == Verifier.decoy(key, "x").salt != Verifier.decoy(key, "y").salt


def test_split_keeps_semicolons_in_strings_and_comments():
    pieces = st.split("SELECT ';' AS a; /* ; */ SELECT 2 -- ;\n;;")
    assert [p.text for p in pieces] == ["SELECT ';' AS a", "SELECT 2"]
    assert st.split("  ") == []


def test_hints_set_epsilon_and_delta_and_refuse_typos():
    assert st.hint_of("SELECT /* dpsql: epsilon=0.3, delta=1e-7 */ COUNT(*) FROM t") == st.Hint(0.3, 1e-7)
    assert st.hint_of("SELECT COUNT(*) FROM t -- dpsql: epsilon=0.2") == st.Hint(0.2, None)
    assert st.hint_of("SELECT '/* dpsql: epsilon=9 */' AS s") == st.Hint()  # a string is not a comment
    with pytest.raises(Error, match="unknown option 'epsilom'"):
        st.hint_of("SELECT 1 /* dpsql: epsilom=1 */")
    with pytest.raises(Error, match="finite number"):
        st.hint_of("SELECT 1 /* dpsql: epsilon=nan */")


@pytest.mark.parametrize("value,oid,expected", [
    ("42", 20, "42"), ("-1.5", 701, "-1.5"), ("t", 16, "TRUE"), (None, 25, "NULL"),
    ("2024-01-02", 1082, "CAST('2024-01-02' AS DATE)"), ("it's", 0, "'it''s'"),
])
def test_parameters_become_typed_literals(value, oid, expected):
    assert st.bind("SELECT $1", [value], [oid]) == f"SELECT {expected}"


def test_several_statements_in_one_parse_are_refused():
    with pytest.raises(st.SyntaxProblem, match="multiple commands"):
        st.one_statement("SELECT 1; SELECT 2")

"""Messages name what the user wrote (issue 20): syntax errors in words with the caret
under the token at fault and no colour codes or class names, size and nesting limits
instead of RecursionError, and "did you mean" over allowed names only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql
from dpsql.diagnose import (
    MAX_PAREN_DEPTH,
    MAX_TREE_DEPTH,
    did_you_mean,
    edit_distance,
    parse_statements,
    syntax_message,
)

SYNTAX = [
    # (SQL, words the message must contain, the text the caret sits under)
    ("SELEC COUNT(*) FROM visits", "must start with SELECT, not 'SELEC'. Did you mean 'SELECT'?", "SELEC"),
    ("SELECT COUNT(*) FROM visits WHERE age > 3O", "unexpected 'O'", "O"),
    ("SELECT COUNT(*) FROM visits WHERE age >> 3 +", "+ needs a value after it", "+"),
    ("SELECT COUNT(*) FROM visits WHERE (age > 3", "'(' is never closed", "("),
    ("SELECT COUNT(* FROM visits", "'(' is never closed", "("),
    ("SELECT COUNT(*) FROM visits WHERE age > 3)", "')' closes no '('", ")"),
    ("SELECT COUNT(*) FROM visits WHERE city = 'abc", "string starting here is never closed", "'"),
    ('SELECT COUNT(*) FROM "visits', "quoted name starting here is never closed", '"'),
    ("SELECT COUNT(*) FROM visits /* note", "comment is never closed", "/*"),
    ("SELECT COUNT(*) FROM visits WHERE", "WHERE needs a condition", "WHERE"),
    ("SELECT COUNT(*) FROM visits WHERE age BETWEEN 3", "BETWEEN needs both ends", "3"),
    ("SELECT COUNT(*) FROM visits WHERE income > 10 AND AND age > 3", "AND needs a condition", "AND"),
    ("SELECT COUNT(*) FROM visits LIMIT", "LIMIT needs a value", "LIMIT"),
    ("SELECT region COUNT(*) FROM visits GROUP BY region", "a comma is missing before 'COUNT'", "COUNT"),
    ("SELECT COUNT(*)\nFROM visits\nWHERE age => 3", "unexpected '=>'", "=>"),
]


def _caret_text(message: str) -> str:
    """The text above the carets of a message's last two lines."""
    line, carets = message.splitlines()[-2:]
    start = carets.index("^")
    return line[start: start + carets.count("^")]


@pytest.mark.parametrize(("sql", "words", "under"), SYNTAX)
def test_syntax_errors_in_words_with_the_caret_on_the_token(sql: str, words: str, under: str) -> None:
    message = syntax_message(sql)
    assert message.startswith("the query is not valid SQL: ")
    assert words in message
    assert _caret_text(message) == under
    assert "\x1b" not in message and "<class" not in message and "sqlglot" not in message


def test_limits_refuse_instead_of_recursion_error() -> None:
    nested = "SELECT COUNT(*) FROM visits WHERE " + "(" * 50 + "age > 3" + ")" * 50
    with pytest.raises(dpsql.QueryRejected, match=f"parentheses 50 deep; at most {MAX_PAREN_DEPTH}"):
        parse_statements(nested)
    long_or = "SELECT COUNT(*) FROM visits WHERE " + " OR ".join(f"age = {i}" for i in range(1000))
    with pytest.raises(dpsql.QueryRejected, match=r"chain of 1000 terms joined by OR.*IN \(\.\.\.\)"):
        parse_statements(long_or)
    nots = "SELECT COUNT(*) FROM visits WHERE " + "NOT " * 400 + "age > 3"
    with pytest.raises(dpsql.QueryRejected, match="nests too deeply|levels deep"):
        parse_statements(nots)
    with pytest.raises(dpsql.QueryRejected, match="characters long"):
        parse_statements("SELECT COUNT(*) FROM visits WHERE city = '" + "x" * 1_000_001 + "'")
    fits = "SELECT COUNT(*) FROM visits WHERE " + "(" * MAX_PAREN_DEPTH + "age > 3" + ")" * MAX_PAREN_DEPTH
    assert len(parse_statements(fits)) == 1
    assert MAX_TREE_DEPTH >= 100


def test_edit_distance_and_did_you_mean() -> None:
    assert edit_distance("income", "incmoe") == 1  # a swap of neighbours
    assert edit_distance("", "abc") == 3 and edit_distance("Age", "age") == 0
    assert did_you_mean("agee", ["age", "income"]) == " Did you mean 'age'?"
    assert did_you_mean("REGION", ["region"]) == " Did you mean 'region'?"
    assert did_you_mean("vists", ["visits", "visit_s"]) in (" Did you mean 'visits'?",
                                                            " Did you mean 'visit_s' or 'visits'?")
    assert did_you_mean("completely_else", ["age", "income"]) == ""
    # only the names passed are ever suggested: a denied name close to the typo is not
    assert did_you_mean("ssm", ["age", "income"]) == ""


# ---------------------------------------------------------------- through the pipeline

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"


@pytest.fixture(scope="module")
def conn(demo_database: Callable[[int, int], Path]) -> dpsql.Connection:
    db = demo_database(2_000, 200)  # built once for the run (conftest)
    with dpsql.connect(db, policy=POLICY, analyst="alice") as connection:
        yield connection


def _refusal(conn: dpsql.Connection, sql: str) -> str:
    with pytest.raises(dpsql.Error) as caught:
        conn.execute(sql, epsilon=0.1)
    message = str(caught.value)
    assert "\x1b" not in message and "<class" not in message and "sqlglot" not in message
    return message


def test_did_you_mean_columns_and_tables(conn: dpsql.Connection) -> None:
    assert "Did you mean 'age'?" in _refusal(conn, "SELECT COUNT(*) FROM visits WHERE agee > 3")
    assert "Did you mean 'income'?" in _refusal(conn, "SELECT SUM(incme) FROM visits")
    assert "Did you mean 'visits'?" in _refusal(conn, "SELECT COUNT(*) FROM visit")


def test_did_you_mean_never_reveals_a_denied_or_unlisted_name(conn: dpsql.Connection) -> None:
    # ssn is denied and user_id is the unit (never grouped): neither is suggested for a typo
    message = _refusal(conn, "SELECT COUNT(*) FROM visits WHERE ssm = '1'")
    assert "ssn" not in message and "Did you mean" not in message
    message = _refusal(conn, "SELECT COUNT(*) FROM visits WHERE zipp = '1'")
    assert "Did you mean 'zip'?" in message  # a filter column is allowed in WHERE


def test_syntax_errors_through_execute(conn: dpsql.Connection) -> None:
    message = _refusal(conn, "SELECT COUNT(*) FROM visits WHERE age > 3O")
    assert message.startswith("the query is not valid SQL: unexpected 'O'")
    assert message.splitlines()[-1].index("^") == message.splitlines()[-2].index("3O") + 1


def test_limits_through_execute(conn: dpsql.Connection) -> None:
    nested = "SELECT COUNT(*) FROM visits WHERE " + "(" * 50 + "age > 3" + ")" * 50
    assert "parentheses 50 deep" in _refusal(conn, nested)
    long_or = "SELECT COUNT(*) FROM visits WHERE " + " OR ".join(f"age = {i}" for i in range(1000))
    assert "IN (...)" in _refusal(conn, long_or)
    in_list = "SELECT COUNT(*) AS n FROM visits WHERE age IN (" + ", ".join(str(i) for i in range(1000)) + ")"
    assert conn.execute(in_list, epsilon=0.1).fetchall()  # the suggested form is answered


def test_refusals_quote_what_the_user_wrote(conn: dpsql.Connection) -> None:
    for sql, quoted in [
        ("SELECT MEDIAN(age * 2) FROM visits", "MEDIAN(age * 2)"),
        ("SELECT COUNT(*) FROM visits WHERE repeat(zip, 3) = 'x'", "repeat(zip, 3)"),
        ("SELECT COUNT(*) FROM visits WHERE age > regexp_replace(city, 'a', 'b')", "regexp_replace(city, 'a', 'b')"),
    ]:
        message = _refusal(conn, sql)
        assert quoted in message.splitlines()[0], message


def test_count_1_and_date_literals_are_answered_or_quoted(conn: dpsql.Connection) -> None:
    for sql, quoted in [("SELECT COUNT(1) AS n FROM visits", "COUNT(1)"),
                        ("SELECT COUNT(*) AS n FROM visits WHERE age > DATE '2024-01-01'", "DATE '2024-01-01'"),
                        ("SELECT COUNT(*) AS n FROM visits WHERE city > DATE '2024-01-01'", "DATE '2024-01-01'")]:
        try:
            result = conn.execute(sql, epsilon=0.1)
        except dpsql.Error as exc:
            assert quoted in str(exc).splitlines()[0], str(exc)
            assert "CAST is not allowed" not in str(exc) and "bare column" not in str(exc)
        else:
            assert len(result) == 1


def test_an_internal_error_says_it_is_probably_a_bug_once() -> None:
    import pickle

    from dpsql.noise import laplace_noise

    with pytest.raises(dpsql.InternalError) as info:
        laplace_noise(1, -1.0)  # a broken assumption deep inside: the caller says what, the class says "bug"
    text = str(info.value)
    assert text.endswith(". This is probably a bug in dpsql: please report it.")
    assert text.count("bug") == 1
    again = pickle.loads(pickle.dumps(info.value))  # crossing a process or the wire adds nothing
    assert str(again) == text
    assert str(dpsql.InternalError("no trailing period")) == (
        "no trailing period. This is probably a bug in dpsql: please report it.")

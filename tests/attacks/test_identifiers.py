"""Fail-closed identifiers: case, quoting, Unicode look-alikes.

The database holds, beside the listed columns, look-alike columns the policy does not list
(a Cyrillic 'а' in 'sаlary', fullwidth 'ｓｓｎ', a zero-width joiner in 's\u200dsn', a long s
in 'ſecret') and a look-alike table ('vіsits', Cyrillic і). The adversary spells names every
way it can, hoping that some normalisation (NFKC, lower-casing, stripping) maps a look-alike
to a listed name, so that it reads an unlisted column, or maps a denied column to an
allowed spelling. Policy names match case-insensitively (str.casefold), never by Unicode
normalisation, and the engine only ever receives the policy's own spelling.
"""

from __future__ import annotations

import unicodedata

import pytest

import dpsql
from dpsql.rewrite import bounded_query

from attack_helpers import connect, exact_bounded, make_db, policy

pytestmark = pytest.mark.attack

CAFE_NFC = unicodedata.normalize("NFC", "café")
CAFE_NFD = unicodedata.normalize("NFD", "café")
assert CAFE_NFC != CAFE_NFD

COLUMNS = (
    'u BIGINT, salary DOUBLE, "sаlary" DOUBLE, ssn VARCHAR, "ｓｓｎ" VARCHAR, "s\u200dsn" VARCHAR, '
    f'"{CAFE_NFC}" DOUBLE, "ſecret" DOUBLE, "éclair" DOUBLE, "Éclair" DOUBLE, region VARCHAR'
)
POLICY = policy(f"""
[tables.visits]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.visits.columns]
salary = {{ bounds = [0, 100] }}
ssn = {{ access = "deny" }}
"{CAFE_NFC}" = {{ bounds = [0, 10] }}
secret = {{ access = "deny" }}
"éclair" = {{ bounds = [0, 1] }}
region = {{ public_values = ["north", "south"] }}
""")
#: salary 1..60; every look-alike holds a different, recognisable value.
ROWS = [(i, float(i % 60 + 1), 1e9, f"ssn{i}", f"fw{i}", f"zwj{i}", 2.5, 1e9, 0.25, 0.75, ["north", "south"][i % 2])
        for i in range(120)]
LOOKALIKE_TABLE = "vіsits"  # Cyrillic і: holds raw rows, not in the policy


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = make_db(tmp_path_factory.mktemp("ident") / "i.duckdb", {
        "visits": (COLUMNS, ROWS),
        f'"{LOOKALIKE_TABLE}"': ("u BIGINT, salary DOUBLE", [(i, 1e6) for i in range(50)]),
    })
    with connect(path, POLICY) as c:
        yield c


LOOKALIKE_COLUMNS = [
    'SELECT SUM("sаlary") FROM visits',  # Cyrillic а, quoted
    "SELECT SUM(sаlary) FROM visits",  # unquoted
    "SELECT SUM(ｓａｌａｒｙ) FROM visits",  # fullwidth: NFKC would give 'salary'
    'SELECT SUM("salary\u200b") FROM visits',  # zero-width space
    'SELECT SUM("sal\u00adary") FROM visits',  # soft hyphen
    'SELECT SUM("salary ") FROM visits',
    'SELECT SUM(" salary") FROM visits',
    'SELECT SUM("SALARY\u0301") FROM visits',  # a combining accent
    'SELECT COUNT("ｓｓｎ") FROM visits',
    "SELECT COUNT(*) FROM visits WHERE ｓｓｎ = 'fw1'",
    "SELECT COUNT(*) FROM visits WHERE \"s\u200dsn\" = 'zwj1'",
    'SELECT COUNT("ſecret") FROM visits',  # casefolds to the denied 'secret'
    'SELECT SUM("ſecret") FROM visits',
    f'SELECT SUM("{CAFE_NFD}") FROM visits',  # NFD spelling of a listed NFC name
    f'SELECT COUNT(*) FROM "{LOOKALIKE_TABLE}"',
    'SELECT COUNT(*) FROM ｖｉｓｉｔｓ',
    'SELECT COUNT(*) FROM "visits\u200b"',
    'SELECT COUNT(*) FROM "visits "',
    'SELECT COUNT(*) FROM "VISITS\u0130"',  # dotted capital I
    f'SELECT COUNT(*) FROM visits v JOIN "{LOOKALIKE_TABLE}" w ON v.u = w.u',
]


@pytest.mark.parametrize("sql", LOOKALIKE_COLUMNS)
def test_lookalike_names_fail_closed(conn, sql: str) -> None:  # type: ignore[no-untyped-def]
    before = conn.budget().queries
    with pytest.raises((dpsql.PolicyViolation, dpsql.QueryRejected)):
        conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert conn.budget().queries == before


DENIED_SPELLINGS = [
    'SELECT COUNT("SSN") FROM visits',
    'SELECT COUNT("Ssn") FROM visits',
    "SELECT COUNT(SsN) FROM visits",
    'SELECT COUNT(visits."SSN") FROM visits',
    'SELECT COUNT(V.ssn) FROM visits v',
    'SELECT COUNT("visits"."ssn") FROM "VISITS"',
    "SELECT COUNT(*) FROM visits WHERE SSN IS NOT NULL",
    "SELECT COUNT(*) FROM visits WHERE LENGTH(ssn) > 3",
    "SELECT SSN, COUNT(*) FROM visits GROUP BY SSN",
    "SELECT COUNT(*) FROM visits GROUP BY LOWER(\"Ssn\")",
    "SELECT COUNT(DISTINCT ssn) FROM visits",
    "SELECT COUNT(*) FROM visits ORDER BY ssn",
    "SELECT COUNT(*) FROM visits HAVING MAX(ssn) > ''",
    "WITH v AS (SELECT u, ssn AS region FROM visits) SELECT region, COUNT(*) FROM v GROUP BY region",
    "SELECT COUNT(*) FROM (SELECT u, SSN FROM visits) s",
    "SELECT COUNT(*) FROM (SELECT * FROM visits WHERE ssn = 'ssn1') s",
    "SELECT COUNT(*) FROM visits v JOIN visits w ON v.ssn = w.ssn",
    'SELECT COUNT("SECRET") FROM visits',
]


@pytest.mark.parametrize("sql", DENIED_SPELLINGS)
def test_a_denied_column_is_denied_under_every_spelling(conn, sql: str) -> None:  # type: ignore[no-untyped-def]
    before = conn.budget().queries
    with pytest.raises((dpsql.PolicyViolation, dpsql.QueryRejected)):
        conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert conn.budget().queries == before


def test_every_spelling_of_a_listed_column_reads_that_column(conn) -> None:  # type: ignore[no-untyped-def]
    """Case and quoting variants of 'salary' read the stored 'salary' (sum 3660 over the
    120 rows), never the Cyrillic look-alike (1e9 each, 100 after clipping: sum 12000);
    'Éclair' (not listed; DuckDB keeps it distinct from 'éclair') resolves by casefold to
    the listed 'éclair' (0.25 each), never to its own stored values (0.75 each)."""
    expected = sum(r[1] for r in ROWS)
    for spelling in ("salary", "SALARY", '"Salary"', "visits.salary", 'VISITS."SALARY"', "v.SaLaRy"):
        source = "visits v" if spelling.startswith("v.") else "visits"
        values = exact_bounded(conn, f"SELECT SUM({spelling}) FROM {source}", salt=1)
        assert values[("sum", "salary")][()] == pytest.approx(expected, abs=1e-6), spelling
    for spelling in ('"éclair"', '"Éclair"', '"ÉCLAIR"'):
        values = exact_bounded(conn, f"SELECT SUM({spelling}) FROM visits", salt=1)
        assert values[("sum", "éclair")][()] == pytest.approx(0.25 * len(ROWS)), spelling
    values = exact_bounded(conn, f'SELECT SUM("{CAFE_NFC.upper()}") FROM visits', salt=1)
    assert values[("sum", CAFE_NFC)][()] == pytest.approx(2.5 * len(ROWS))


def test_the_engine_only_sees_the_policys_spelling(conn) -> None:  # type: ignore[no-untyped-def]
    sql = 'SELECT "REGION", SUM("SaLaRy") FROM "VISITS" AS "v; DROP TABLE visits" GROUP BY 1'
    text = bounded_query(conn.plan(sql, epsilon=1.0), salt=0).query.sql(dialect="duckdb")
    assert '"salary"' in text and '"region"' in text
    assert "SaLaRy" not in text and "REGION" not in text and "DROP" not in text

"""Tests for dpsql.policy: loading, validation messages, lookups, schema checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpsql.errors import PolicyError
from dpsql.policy import (
    Budget,
    ColumnPolicy,
    Policy,
    TablePolicy,
    check_against_schema,
    load_policy,
    parse_policy,
)

DEMO = Path(__file__).resolve().parent.parent / "policies" / "demo.toml"

PRIVACY = """
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5
"""

BUDGET = """
[budget]
default = { epsilon = 5.0, delta = 1e-5 }
"""

TABLE = """
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 4
max_rows_per_unit = 10
"""

COLUMNS = """
[tables.visits.columns]
age = { bounds = [0, 100] }
"""

DEMO_SCHEMA = {
    "visits": {
        "user_id": "BIGINT",
        "region": "VARCHAR",
        "age": "INTEGER",
        "income": "DOUBLE",
        "visits": "INTEGER",
        "city": "VARCHAR",
        "zip": "VARCHAR",
        "ssn": "VARCHAR",
        "device": "VARCHAR",
    },
    "regions": {"region": "VARCHAR", "population": "BIGINT"},
}


def make(
    privacy: str = PRIVACY, budget: str = BUDGET, table: str = TABLE, columns: str = COLUMNS
) -> str:
    """A policy text built from the given sections (defaults are a valid policy)."""
    return privacy + budget + table + columns


def parse(text: str) -> Policy:
    """Parse with a recognisable source name, to check messages name the file."""
    return parse_policy(text, source="p.toml")


def with_column(entry: str) -> str:
    """A valid policy whose visits table lists one more column entry."""
    return make(columns=COLUMNS + entry + "\n")


def with_table_keys(lines: str) -> str:
    """A valid policy whose visits table has extra key lines."""
    return make(table=TABLE + lines + "\n")


# ---------------------------------------------------------------- the demo policy


@pytest.fixture(scope="module")
def demo() -> Policy:
    return load_policy(DEMO)


def test_demo_privacy_and_budgets(demo: Policy) -> None:
    assert demo.source == str(DEMO)
    assert demo.max_epsilon_per_query == 1.0
    assert demo.max_delta_per_query == 1e-6
    assert demo.default_epsilon == 0.5
    assert demo.accountant == "basic"
    assert demo.default_budget == Budget(5.0, 1e-5)
    assert demo.budget_for("alice") == Budget(10.0, 1e-5)
    assert demo.budget_for("bob") == Budget(5.0, 1e-5)


def test_demo_tables(demo: Policy) -> None:
    visits = demo.table("visits")
    assert visits is not None
    assert (visits.public, visits.privacy_unit) == (False, "user_id")
    assert (visits.max_groups_per_unit, visits.max_rows_per_unit) == (4, 10)
    regions = demo.table("regions")
    assert regions is not None
    assert regions.public and regions.privacy_unit is None
    assert set(demo.tables) == {"visits", "regions"}


@pytest.mark.parametrize(
    ("name", "access", "flags"),
    [
        # flags: can_filter, can_group, can_aggregate, is_public_key
        ("age", "aggregate", (True, True, True, False)),
        ("income", "aggregate", (True, True, True, False)),
        ("visits", "aggregate", (True, True, True, False)),
        ("region", "group", (True, True, False, True)),
        ("device", "group", (True, True, False, True)),
        ("city", "group", (True, True, False, False)),
        ("zip", "filter", (True, False, False, False)),
        ("ssn", "deny", (False, False, False, False)),
        ("user_id", "filter", (True, False, False, False)),
    ],
)
def test_demo_columns(demo: Policy, name: str, access: str, flags: tuple[bool, ...]) -> None:
    visits = demo.table("visits")
    assert visits is not None
    column = visits.column(name)
    assert column is not None
    assert column.access == access
    assert (column.can_filter, column.can_group, column.can_aggregate, column.is_public_key) == flags


def test_demo_bounds_and_public_values(demo: Policy) -> None:
    visits = demo.table("visits")
    assert visits is not None
    assert visits.columns["income"].bounds == (0, 250000)
    assert visits.columns["region"].public_values == ("north", "south", "east", "west")
    assert visits.columns["device"].public_values == ("mobile", "desktop", "tablet")


def test_demo_matches_demo_schema(demo: Policy) -> None:
    check_against_schema(demo, DEMO_SCHEMA)


def test_demo_matches_a_real_duckdb_schema(demo: Policy) -> None:
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE visits (user_id BIGINT, region VARCHAR, age INTEGER, income DOUBLE,"
        " visits INTEGER, city VARCHAR, zip VARCHAR, ssn VARCHAR, device VARCHAR)"
    )
    con.execute("CREATE TABLE regions (region VARCHAR, population BIGINT)")
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
    ).fetchall()
    schema: dict[str, dict[str, str]] = {}
    for table, column, kind in rows:
        schema.setdefault(table.casefold(), {})[column.casefold()] = kind
    check_against_schema(demo, schema)



@pytest.mark.parametrize("kind", ["UINT64", "INT128", "DECIMAL(18, 2)", "numeric", "FLOAT4", "utinyint"])
def test_bounds_accept_every_numeric_type_the_analyzer_accepts(demo: Policy, kind: str) -> None:
    schema = {t: dict(c) for t, c in DEMO_SCHEMA.items()}
    schema["visits"]["income"] = kind
    check_against_schema(demo, schema)  # one classifier: dpsql.sqltypes.parse_type


@pytest.mark.parametrize("kind", ["INTEGER[]", "VARCHAR", "DECIMAL(40,2)", "INTERVAL"])
def test_bounds_refuse_a_type_that_is_not_a_number(demo: Policy, kind: str) -> None:
    schema = {t: dict(c) for t, c in DEMO_SCHEMA.items()}
    schema["visits"]["income"] = kind
    with pytest.raises(PolicyError, match="bounds need a numeric column"):
        check_against_schema(demo, schema)


# ---------------------------------------------------------------- lookups


def test_lookups_ignore_case(demo: Policy) -> None:
    visits = demo.table("VISITS")
    assert visits is demo.table("Visits") is demo.table("visits")
    assert visits is not None
    assert visits.column("AGE") is visits.column("age")
    assert visits.column("User_ID") == ColumnPolicy("user_id", "filter")


@pytest.mark.attack
def test_casefold_not_just_lower() -> None:
    policy = parse(make(columns='[tables.visits.columns]\n"Straße" = { access = "group" }\n'))
    visits = policy.table("visits")
    assert visits is not None
    assert visits.column("STRASSE") is visits.column("straße")
    assert visits.column("STRASSE") is not None


@pytest.mark.attack
@pytest.mark.parametrize(
    "lookalike",
    [
        "vis\u0456ts",  # Cyrillic і
        "visits\u200b",  # zero-width space
        "ｖｉｓｉｔｓ",  # fullwidth: NFKC would map it to "visits"
        " visits",
    ],
)
def test_lookalike_table_names_do_not_match(demo: Policy, lookalike: str) -> None:
    assert demo.table(lookalike) is None


@pytest.mark.attack
@pytest.mark.parametrize("lookalike", ["\u0430ge", "ａｇｅ", "ag\u0435", "age "])
def test_lookalike_column_names_do_not_match(demo: Policy, lookalike: str) -> None:
    visits = demo.table("visits")
    assert visits is not None
    assert visits.column(lookalike) is None


@pytest.mark.attack
def test_unlisted_column_is_denied(demo: Policy) -> None:
    visits = demo.table("visits")
    assert visits is not None
    assert visits.column("email") is None
    assert demo.table("orders") is None


def test_public_table_columns_are_usable_but_unbounded(demo: Policy) -> None:
    regions = demo.table("regions")
    assert regions is not None
    column = regions.column("Population")
    assert column == ColumnPolicy("Population", "aggregate")
    assert column.can_filter and column.can_group
    assert not column.can_aggregate


def test_public_table_may_list_columns() -> None:
    text = make(
        table="[tables.regions]\npublic = true\n",
        columns="[tables.regions.columns]\npop = { bounds = [0, 1e9] }\nsecret = { access = \"deny\" }\n",
    )
    regions = parse(text).table("regions")
    assert regions is not None
    assert regions.column("pop") == ColumnPolicy("pop", "aggregate", (0, 1e9))
    column = regions.column("secret")
    assert column is not None and not column.can_filter


def test_analyst_names_are_exact() -> None:
    text = make(budget=BUDGET + "[budget.analysts]\nAlice = { epsilon = 9, delta = 0 }\n")
    policy = parse(text)
    assert policy.budget_for("Alice") == Budget(9.0, 0.0)
    assert policy.budget_for("alice") == Budget(5.0, 1e-5)


def test_unit_column_listed_as_filter_is_allowed() -> None:
    policy = parse(with_column('USER_ID = { access = "filter" }'))
    visits = policy.table("visits")
    assert visits is not None
    assert visits.column("user_id") == ColumnPolicy("USER_ID", "filter")


def test_row_level_table_has_caps_of_one() -> None:
    policy = parse(make(table="[tables.visits]\nmax_rows_per_unit = 1\n"))
    visits = policy.table("visits")
    assert visits is not None
    assert visits.privacy_unit is None and not visits.public
    assert (visits.max_groups_per_unit, visits.max_rows_per_unit) == (1, 1)


def test_accountant_defaults_to_basic_and_accepts_pld() -> None:
    assert parse(make()).accountant == "basic"
    assert parse(make(privacy=PRIVACY + 'accountant = "pld"\n')).accountant == "pld"


def test_explicit_access_overrides_implied_level() -> None:
    visits = parse(with_column('score = { bounds = [0, 1], access = "group" }')).table("visits")
    assert visits is not None
    score = visits.column("score")
    assert score is not None
    assert score.access == "group" and not score.can_aggregate and score.can_group


@pytest.mark.parametrize("extra", ["bounds = [0, 1]", 'public_values = ["a", "b"]'])
def test_filter_access_with_bounds_or_public_values_is_refused(extra: str) -> None:
    # issue 20: such a policy loaded, then every query refused to aggregate the column
    with pytest.raises(PolicyError, match=r'column \'score\': access = "filter" \(only in WHERE\) and '
                       r'(bounds|public_values) contradict each other.*Remove'):
        parse(with_column(f'score = {{ {extra}, access = "filter" }}'))


def test_integer_and_float_values_keep_their_type() -> None:
    visits = parse(with_column("x = { bounds = [-1.5, 2] }")).table("visits")
    assert visits is not None
    assert visits.columns["x"].bounds == (-1.5, 2)
    assert isinstance(visits.columns["age"].bounds[0], int)  # type: ignore[index]


# ---------------------------------------------------------------- records are frozen


def test_records_are_read_only(demo: Policy) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        demo.default_epsilon = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        demo.tables["x"] = demo.tables["visits"]  # type: ignore[index]
    visits = demo.table("visits")
    assert visits is not None
    with pytest.raises(TypeError):
        visits.columns["email"] = ColumnPolicy("email", "group")  # type: ignore[index]
    assert hash(visits) == hash(demo.table("VISITS"))


def test_direct_construction_folds_keys_and_forces_caps() -> None:
    table = TablePolicy("T", False, None, 5, 7, {"Age": ColumnPolicy("Age", "filter")})
    assert table.column("AGE") == ColumnPolicy("Age", "filter")
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (1, 1)
    policy = Policy("<x>", 1.0, 0.0, 1.0, "basic", Budget(1.0, 0.0), {}, {"T": table})
    assert policy.table("t") is table


def test_direct_construction_rejects_unknown_access() -> None:
    with pytest.raises(PolicyError, match="column 'x': unknown access 'read'"):
        ColumnPolicy("x", "read")


# ---------------------------------------------------------------- files


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"nope\.toml: policy file not found"):
        load_policy(tmp_path / "nope.toml")


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load_policy(tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(make().replace("visits", "vis\xedts").encode("latin-1"))
    with pytest.raises(PolicyError, match=r"latin1\.toml: the policy file is not UTF-8"):
        load_policy(path)


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(make() + "age = { bounds = [0, 100 }\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=r"broken\.toml: invalid TOML: Unclosed array \(at line 17, column \d+\)"):
        load_policy(path)


def test_error_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(with_column("bad = { bounds = [5, 1] }"), encoding="utf-8")
    with pytest.raises(PolicyError, match=r"mine\.toml: table 'visits', column 'bad': "):
        load_policy(str(path))


# ---------------------------------------------------------------- validation messages

P = r"p\.toml: "
PRIV = P + r"\[privacy\]: "
TBL = P + r"table 'visits': "

INVALID: list[tuple[str, str, str]] = [
    # (id, policy text, pattern the message must match)
    # ---- unknown keys
    (
        "top-level key",
        make() + "[tabels.x]\npublic = true\n",
        P + r"unknown key 'tabels' \(did you mean 'tables'\?\); allowed keys: budget, privacy, server, tables",
    ),
    (
        "privacy key",
        make(privacy=PRIVACY + "max_epsilon = 2\n"),
        PRIV + r"unknown key 'max_epsilon'.*allowed keys: accountant, default_epsilon, "
        r"max_delta_per_query, max_epsilon_per_query",
    ),
    (
        "budget key",
        make(budget=BUDGET + "analyst = {}\n"),
        P + r"\[budget\]: unknown key 'analyst' \(did you mean 'analysts'\?\); allowed keys: analysts, default",
    ),
    (
        "budget value key",
        make(budget="[budget]\ndefault = { epsilon = 5.0, delta = 0, eps = 1 }\n"),
        P + r"\[budget\] default: unknown key 'eps' \(did you mean 'epsilon'\?\); allowed keys: delta, epsilon",
    ),
    (
        "table key",
        with_table_keys("privacy_units = 'x'"),
        TBL + r"unknown key 'privacy_units' \(did you mean 'privacy_unit'\?\); allowed keys: columns, "
        r".*max_groups_per_unit, max_rows_per_unit, .*privacy_unit, public",
    ),
    (
        "column key",
        with_column("income = { bound = [0, 1] }"),
        P + r"table 'visits', column 'income': unknown key 'bound' \(did you mean 'bounds'\?\); "
        r"allowed keys: access, bounds, public_values",
    ),
    # ---- [privacy]
    (
        "missing privacy",
        make(privacy=""),
        P + r"missing \[privacy\] section; add one with max_epsilon_per_query",
    ),
    (
        "privacy not a table",
        "privacy = 1\n" + BUDGET + TABLE,
        PRIV + r"expected a \[privacy\] section, got 1",
    ),
    (
        "missing max epsilon",
        make(privacy="[privacy]\nmax_delta_per_query = 0\ndefault_epsilon = 0.5\n"),
        PRIV + r"missing max_epsilon_per_query; add it, e\.g\. max_epsilon_per_query = 1\.0",
    ),
    (
        "missing max delta",
        make(privacy="[privacy]\nmax_epsilon_per_query = 1\ndefault_epsilon = 0.5\n"),
        PRIV + r"missing max_delta_per_query; add it",
    ),
    (
        "zero epsilon",
        make(privacy=PRIVACY.replace("= 1.0", "= 0")),
        PRIV + r"max_epsilon_per_query must be greater than 0, got 0\.0",
    ),
    (
        "negative default epsilon",
        make(privacy=PRIVACY.replace("= 0.5", "= -0.5")),
        PRIV + r"default_epsilon must be greater than 0, got -0\.5",
    ),
    (
        "infinite epsilon",
        make(privacy=PRIVACY.replace("= 1.0", "= inf")),
        PRIV + r"max_epsilon_per_query must be a finite number, got inf",
    ),
    (
        "nan epsilon",
        make(privacy=PRIVACY.replace("= 1.0", "= nan")),
        PRIV + r"max_epsilon_per_query must be a finite number, got nan",
    ),
    (
        "string epsilon",
        make(privacy=PRIVACY.replace("= 1.0", '= "1.0"')),
        PRIV + r'max_epsilon_per_query must be a number, got "1\.0"',
    ),
    (
        "bool epsilon",
        make(privacy=PRIVACY.replace("= 1.0", "= true")),
        PRIV + r"max_epsilon_per_query must be a number, got true",
    ),
    (
        "delta one",
        make(privacy=PRIVACY.replace("1e-6", "1")),
        PRIV + r"max_delta_per_query must be in \[0, 1\), got 1\.0; .*use a small value such as 1e-6",
    ),
    (
        "negative delta",
        make(privacy=PRIVACY.replace("1e-6", "-1e-6")),
        PRIV + r"max_delta_per_query must be in \[0, 1\)",
    ),
    (
        "default above max",
        make(privacy=PRIVACY.replace("= 0.5", "= 2.0")),
        PRIV + r"default_epsilon = 2\.0 is more than max_epsilon_per_query = 1\.0; lower default_epsilon",
    ),
    (
        "unknown accountant",
        make(privacy=PRIVACY + 'accountant = "rdp"\n'),
        PRIV + r'unknown accountant "rdp"; use one of "basic", "pld"',
    ),
    # ---- [budget]
    (
        "missing budget",
        make(budget=""),
        P + r"missing \[budget\] section; add one with default = \{ epsilon = 5\.0, delta = 1e-5 \}",
    ),
    (
        "missing default budget",
        make(budget="[budget.analysts]\nalice = { epsilon = 1, delta = 0 }\n"),
        P + r"\[budget\]: missing the default budget; add default = ",
    ),
    (
        "budget not a table",
        make(budget="[budget]\ndefault = 5\n"),
        P + r"\[budget\] default: expected a budget such as \{ epsilon = 5\.0, delta = 1e-5 \}, got 5",
    ),
    (
        "budget delta one",
        make(budget="[budget]\ndefault = { epsilon = 5.0, delta = 1 }\n"),
        P + r"\[budget\] default: delta must be in \[0, 1\), got 1\.0",
    ),
    (
        "budget missing delta",
        make(budget="[budget]\ndefault = { epsilon = 5.0 }\n"),
        P + r"\[budget\] default: missing delta; add it, e\.g\. delta = 1e-6",
    ),
    (
        "analyst budget",
        make(budget=BUDGET + "[budget.analysts]\nbob = { epsilon = 0, delta = 0 }\n"),
        P + r"\[budget\.analysts\] analyst 'bob': epsilon must be greater than 0",
    ),
    (
        "analysts not a table",
        make(budget=BUDGET.replace("[budget]", "[budget]\nanalysts = 3")),
        P + r"\[budget\.analysts\]: expected a table of analyst budgets, got 3",
    ),
    # ---- tables
    ("no tables", PRIVACY + BUDGET, P + r"the policy lists no tables; add a \[tables\.NAME\] section"),
    (
        "table not a table",
        PRIVACY + BUDGET + "[tables]\nvisits = 3\n",
        TBL + r"expected a \[tables\.visits\] section, got 3",
    ),
    (
        "tables differ only in case",
        make() + "[tables.VISITS]\npublic = true\n",
        P + r"tables 'visits' and 'VISITS' differ only in case, and SQL names ignore case; keep one",
    ),
    (
        "empty table name",
        make() + '[tables.""]\npublic = true\n',
        P + r"table '': empty table name",
    ),
    (
        "zero groups",
        make(table=TABLE.replace("= 4", "= 0")),
        TBL + r"max_groups_per_unit must be a whole number of at least 1, got 0",
    ),
    (
        "negative rows",
        make(table=TABLE.replace("= 10", "= -10")),
        TBL + r"max_rows_per_unit must be a whole number of at least 1, got -10",
    ),
    (
        "bool cap",
        make(table=TABLE.replace("= 4", "= true")),
        TBL + r"max_groups_per_unit must be a whole number of at least 1, got true",
    ),
    (
        "float cap",
        make(table=TABLE.replace("= 4", "= 4.0")),
        TBL + r"max_groups_per_unit must be a whole number of at least 1, got 4\.0",
    ),
    (
        "string cap",
        make(table=TABLE.replace("= 4", '= "4"')),
        TBL + r'max_groups_per_unit must be a whole number of at least 1, got "4"',
    ),
    (
        "missing cap",
        make(table=TABLE.replace("max_rows_per_unit = 10\n", "")),
        TBL + r"missing max_rows_per_unit; add it, e\.g\. max_rows_per_unit = 1",
    ),
    (
        "row-level table with caps",
        make(table="[tables.visits]\nmax_groups_per_unit = 4\n"),
        TBL + r"without privacy_unit each row is its own privacy unit, so max_groups_per_unit is 1; "
        r'set privacy_unit = "<column>" or remove max_groups_per_unit',
    ),
    (
        "unit not a string",
        make(table=TABLE.replace('"user_id"', "1")),
        TBL + r'privacy_unit must be a column name such as "user_id", got 1',
    ),
    (
        "empty unit",
        make(table=TABLE.replace('"user_id"', '""')),
        TBL + r'privacy_unit must be a column name such as "user_id", got ""',
    ),
    (
        "public not bool",
        make(table="[tables.visits]\npublic = \"yes\"\n", columns=""),
        TBL + r'public must be true or false, got "yes"',
    ),
    (
        "public with unit",
        make(table="[tables.visits]\npublic = true\nprivacy_unit = \"user_id\"\n", columns=""),
        TBL + r"a public table has no privacy unit, so privacy_unit does not apply; remove privacy_unit",
    ),
    (
        "public with caps",
        make(table="[tables.visits]\npublic = true\nmax_rows_per_unit = 3\n", columns=""),
        TBL + r"a public table has no privacy unit, so max_rows_per_unit does not apply",
    ),
    # ---- the privacy unit column
    (
        "unit with bounds",
        with_column("user_id = { bounds = [0, 10] }"),
        P + r"table 'visits', column 'user_id': this is the privacy_unit column, which may only be "
        r"filtered on, counted distinct and joined on.*remove it from \[columns\]",
    ),
    (
        "unit with public values",
        with_column("User_Id = { public_values = [1, 2] }"),
        P + r"table 'visits', column 'User_Id': this is the privacy_unit column",
    ),
    (
        "unit as group",
        with_column('user_id = { access = "group" }'),
        P + r"table 'visits', column 'user_id': this is the privacy_unit column",
    ),
    (
        "unit as filter with bounds",
        with_column('user_id = { access = "filter", bounds = [0, 1] }'),
        P + r"table 'visits', column 'user_id': this is the privacy_unit column",
    ),
    # ---- columns
    (
        "column says nothing",
        with_column("income = {}"),
        P + r"table 'visits', column 'income': says nothing about how it may be used; give "
        r"bounds = \[lower, upper\].*public_values.*access",
    ),
    (
        "column not a table",
        with_column("income = [0, 100]"),
        P + r"table 'visits', column 'income': expected an inline table such as "
        r"income = \{ bounds = \[0, 100\] \}, got \[0, 100\]",
    ),
    (
        "columns not a table",
        make(table=TABLE + "columns = 3\n", columns=""),
        TBL + r"expected a \[columns\] section",
    ),
    (
        "columns differ only in case",
        with_column("AGE = { bounds = [0, 10] }"),
        TBL + r"columns 'age' and 'AGE' differ only in case",
    ),
    (
        "empty column name",
        with_column('"" = { access = "filter" }'),
        P + r"table 'visits', column '': empty column name",
    ),
    (
        "unknown access",
        with_column('income = { access = "read" }'),
        P + r"table 'visits', column 'income': unknown access \"read\"; use one of \"deny\", "
        r"\"filter\", \"group\", \"aggregate\"",
    ),
    (
        "access not a string",
        with_column("income = { access = 1 }"),
        P + r"table 'visits', column 'income': unknown access 1",
    ),
    (
        "deny with bounds",
        with_column('income = { access = "deny", bounds = [0, 1] }'),
        P + r"table 'visits', column 'income': access = \"deny\" cannot have bounds or public_values",
    ),
    (
        "deny with public values",
        with_column('income = { access = "deny", public_values = ["a"] }'),
        P + r"table 'visits', column 'income': access = \"deny\" cannot have bounds or public_values",
    ),
    (
        "aggregate without bounds",
        with_column('income = { access = "aggregate" }'),
        P + r"table 'visits', column 'income': access = \"aggregate\" needs bounds = \[lower, upper\]",
    ),
    (
        "aggregate with only public values",
        with_column('income = { access = "aggregate", public_values = [1, 2] }'),
        P + r"table 'visits', column 'income': access = \"aggregate\" needs bounds",
    ),
    # ---- bounds
    (
        "lower above upper",
        with_column("income = { bounds = [250000, 0] }"),
        P + r"table 'visits', column 'income': bounds must have lower < upper, but lower > upper "
        r"in \[250000, 0\]; swap them: bounds = \[0, 250000\]",
    ),
    (
        "lower equals upper",
        with_column("income = { bounds = [3, 3.0] }"),
        P + r"table 'visits', column 'income': bounds must have lower < upper, got \[3, 3\.0\]; widen",
    ),
    (
        "bounds not a list",
        with_column("income = { bounds = 100 }"),
        P + r"table 'visits', column 'income': bounds must be a list of two numbers \[lower, upper\], got 100",
    ),
    (
        "three bounds",
        with_column("income = { bounds = [0, 1, 2] }"),
        P + r"table 'visits', column 'income': bounds must be a list of two numbers \[lower, upper\], got \[0, 1, 2\]",
    ),
    (
        "one bound",
        with_column("income = { bounds = [0] }"),
        P + r"table 'visits', column 'income': bounds must be a list of two numbers",
    ),
    (
        "string bound",
        with_column('income = { bounds = ["0", 1] }'),
        P + r"table 'visits', column 'income': bounds must be a number, got \"0\"",
    ),
    (
        "bool bound",
        with_column("income = { bounds = [false, true] }"),
        P + r"table 'visits', column 'income': bounds must be a number, got false",
    ),
    (
        "infinite bound",
        with_column("income = { bounds = [0, inf] }"),
        P + r"table 'visits', column 'income': bounds must be a finite number, got inf",
    ),
    (
        "nan bound",
        with_column("income = { bounds = [nan, 1] }"),
        P + r"table 'visits', column 'income': bounds must be a finite number, got nan",
    ),
    (
        "huge integer bound",
        with_column("income = { bounds = [0, 1" + "0" * 400 + "] }"),
        P + r"table 'visits', column 'income': bounds must be a finite number",
    ),
    # ---- public_values
    (
        "empty public values",
        with_column("region = { public_values = [] }"),
        P + r"table 'visits', column 'region': public_values must be a non-empty list such as "
        r"\[\"a\", \"b\"\], got \[\]",
    ),
    (
        "public values not a list",
        with_column('region = { public_values = "north" }'),
        P + r"table 'visits', column 'region': public_values must be a non-empty list",
    ),
    (
        "duplicate public value",
        with_column('region = { public_values = ["north", "south", "north"] }'),
        P + r"table 'visits', column 'region': public_values lists \"north\" twice; remove the duplicate",
    ),
    (
        "duplicate numeric public value",
        with_column("n = { public_values = [1, 2, 1.0] }"),
        P + r"table 'visits', column 'n': public_values lists 1\.0 twice",
    ),
    (
        "nan public value",
        with_column("n = { public_values = [1.0, nan] }"),
        P + r"table 'visits', column 'n': public_values may not contain nan",
    ),
    (
        "nested public value",
        with_column("n = { public_values = [[1], [2]] }"),
        P + r"table 'visits', column 'n': public_values may hold only strings, numbers and booleans, got \[1\]",
    ),
    (
        "date public value",
        with_column("day = { public_values = [2024-01-31] }"),
        P + r"table 'visits', column 'day': public_values may hold only strings, numbers and "
        r"booleans, got 2024-01-31; write dates and times as strings such as \"2024-01-31\"",
    ),
    (
        "table public value",
        with_column("n = { public_values = [{ a = 1 }] }"),
        P + r"table 'visits', column 'n': public_values may hold only strings, numbers and booleans",
    ),
    (
        "mixed public values",
        with_column('n = { public_values = ["1", 2] }'),
        P + r"table 'visits', column 'n': public_values mixes numbers and strings; use values of one type",
    ),
    (
        "bool and int public values",
        with_column("n = { public_values = [true, 1] }"),
        P + r"table 'visits', column 'n': public_values mixes booleans and numbers",
    ),
]


@pytest.mark.parametrize(("text", "pattern"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_policy_is_rejected(text: str, pattern: str) -> None:
    with pytest.raises(PolicyError, match=pattern):
        parse(text)


def test_invalid_toml_from_a_string() -> None:
    with pytest.raises(PolicyError, match=r"<string>: invalid TOML: .*\(at line 1, column \d+\)"):
        parse_policy("[privacy\n")


def test_default_source_is_string() -> None:
    with pytest.raises(PolicyError, match=r"^<string>: \[privacy\]: missing max_epsilon_per_query"):
        parse_policy("[privacy]\n")


@pytest.mark.parametrize(
    "values",
    ['["a", "b"]', "[1, 2, 3]", "[1.5, 2]", "[true, false]", "[-inf, 0.0]"],
)
def test_valid_public_values(values: str) -> None:
    visits = parse(with_column(f"k = {{ public_values = {values} }}")).table("visits")
    assert visits is not None
    column = visits.column("k")
    assert column is not None and column.access == "group" and column.is_public_key


@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(allow_nan=False, allow_infinity=False))
def test_bounds_accepted_exactly_when_ordered(lower: float, upper: float) -> None:
    text = with_column(f"x = {{ bounds = [{lower!r}, {upper!r}] }}")
    if lower < upper:
        visits = parse(text).table("visits")
        assert visits is not None
        assert visits.columns["x"].bounds == (lower, upper)
    else:
        with pytest.raises(PolicyError, match="bounds must have lower < upper"):
            parse(text)


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1))
def test_ascii_names_match_in_any_case(name: str) -> None:
    text = make(table=f'[tables."{name}"]\npublic = true\n', columns="")
    policy = parse(text)
    assert policy.table(name.upper()) is policy.table(name.lower()) is policy.table(name)
    assert policy.table(name) is not None


# ---------------------------------------------------------------- the database schema


def schema_without(table: str, column: str | None = None) -> dict[str, dict[str, str]]:
    """The demo schema minus a table, or minus one column of it."""
    schema = {name: dict(columns) for name, columns in DEMO_SCHEMA.items()}
    if column is None:
        del schema[table]
    else:
        del schema[table][column]
    return schema


def test_schema_missing_table(demo: Policy) -> None:
    pattern = r"demo\.toml: the policy does not match the database:\n  - table 'visits' is not in "
    with pytest.raises(PolicyError, match=pattern + r"the database \(tables: regions\); fix the name"):
        check_against_schema(demo, schema_without("visits"))


def test_schema_missing_public_table(demo: Policy) -> None:
    with pytest.raises(PolicyError, match=r"table 'regions' is not in the database \(tables: visits\)"):
        check_against_schema(demo, schema_without("regions"))


def test_schema_missing_unit_column(demo: Policy) -> None:
    pattern = r"table 'visits': privacy_unit column 'user_id' is not in the table \(columns: region, "
    with pytest.raises(PolicyError, match=pattern + r".*\); fix privacy_unit"):
        check_against_schema(demo, schema_without("visits", "user_id"))


def test_schema_missing_listed_column(demo: Policy) -> None:
    pattern = r"table 'visits', column 'ssn' is not in the table \(columns: .*\); fix the name or remove it"
    with pytest.raises(PolicyError, match=pattern):
        check_against_schema(demo, schema_without("visits", "ssn"))


def test_schema_bounds_on_text_column(demo: Policy) -> None:
    schema = schema_without("regions")
    schema["regions"] = {}
    schema["visits"]["income"] = "VARCHAR"
    pattern = r"table 'visits', column 'income': bounds need a numeric column, but it is VARCHAR; remove bounds"
    with pytest.raises(PolicyError, match=pattern):
        check_against_schema(demo, schema)


def test_schema_lists_every_problem(demo: Policy) -> None:
    schema = schema_without("regions")
    del schema["visits"]["user_id"]
    schema["visits"]["age"] = "DATE"
    with pytest.raises(PolicyError) as info:
        check_against_schema(demo, schema)
    message = str(info.value)
    assert message.count("\n  - ") == 3
    assert "'regions'" in message and "'user_id'" in message and "'age'" in message


def test_schema_names_compare_casefolded(demo: Policy) -> None:
    schema = {
        name.upper(): {column.upper(): kind for column, kind in columns.items()}
        for name, columns in DEMO_SCHEMA.items()
    }
    check_against_schema(demo, schema)


@pytest.mark.attack
def test_schema_lookalike_column_does_not_count(demo: Policy) -> None:
    schema = schema_without("visits", "age")
    schema["visits"]["\u0430ge"] = "INTEGER"  # Cyrillic а
    with pytest.raises(PolicyError, match="column 'age' is not in the table"):
        check_against_schema(demo, schema)


NUMERIC = [
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL(18,3)", "DECIMAL(4, 1)",
    "decimal(38,10)", "double", "INT", "REAL", "NUMERIC",
]
NOT_NUMERIC = [
    "VARCHAR", "DATE", "TIMESTAMP", "BOOLEAN", "INTERVAL", "BLOB", "UUID", "INTEGER[]",
    "DOUBLE[3]", "STRUCT(a INTEGER)", "MAP(VARCHAR, INTEGER)", "TIME",
]


@pytest.mark.parametrize("kind", NUMERIC)
def test_numeric_types_may_have_bounds(demo: Policy, kind: str) -> None:
    schema = schema_without("regions", "population")
    schema["visits"]["income"] = kind
    check_against_schema(demo, schema)


@pytest.mark.parametrize("kind", NOT_NUMERIC)
def test_other_types_may_not_have_bounds(demo: Policy, kind: str) -> None:
    schema = schema_without("regions", "population")
    schema["visits"]["income"] = kind
    with pytest.raises(PolicyError, match=r"column 'income': bounds need a numeric column"):
        check_against_schema(demo, schema)

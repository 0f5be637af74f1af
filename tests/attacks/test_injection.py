"""Injection: several statements, DDL/DML, table functions, files, extensions, settings,
comment tricks, and hostile names in the places dpsql builds SQL from (the database path,
policy identifiers, the analyst's name).

Each hostile text must be refused with a dpsql.Error before any data is read: nothing
charged, no table changed, no file written, no extension loaded, no setting changed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest

import dpsql

from attack_helpers import connect, make_db, policy

pytestmark = pytest.mark.attack

POLICY = policy("""
[tables.visits]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.visits.columns]
income = { bounds = [0, 100] }
zip = { access = "filter" }
ssn = { access = "deny" }
[tables.regions]
public = true
""")
ROWS = [(i, float(i % 100), f"{i:05d}", f"ssn{i}") for i in range(100)]


def _fingerprint(path: Path) -> tuple[object, ...]:
    with duckdb.connect(str(path), read_only=True) as con:
        tables = con.sql("SELECT table_name, column_name FROM duckdb_columns() ORDER BY ALL").fetchall()
        rows = con.sql("SELECT COUNT(*), SUM(hash(u, income, zip, ssn)) FROM visits").fetchall()
    return tuple(tables), tuple(rows), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("inject")
    path = make_db(root / "data.duckdb", {
        "visits": ("u BIGINT, income DOUBLE, zip VARCHAR, ssn VARCHAR", ROWS),
        "regions": ("region VARCHAR", [("north",)]),
        "secrets": ("s VARCHAR", [("top secret",)]),
    })
    (root / "loot.csv").write_text("a\n1\n")
    return root, path


INJECTIONS = [
    "SELECT COUNT(*) FROM visits; DROP TABLE visits",
    "SELECT COUNT(*) FROM visits;DROP TABLE visits;",
    "SELECT COUNT(*) FROM visits; SELECT ssn FROM visits",
    "SELECT COUNT(*) FROM visits -- comment\n; DELETE FROM visits",
    "SELECT COUNT(*) FROM visits /* ; */ ; UPDATE visits SET income = 0",
    "/* x */ DROP TABLE visits",
    "SELECT COUNT(*) FROM visits WHERE zip = '1'; DROP TABLE visits; --'",
    "DROP TABLE visits",
    "DELETE FROM visits",
    "TRUNCATE visits",
    "INSERT INTO visits VALUES (1, 1, '1', '1')",
    "UPDATE visits SET income = 0",
    "ALTER TABLE visits ADD COLUMN x INT",
    "CREATE TABLE x AS SELECT * FROM visits",
    "CREATE MACRO m(a) AS a",
    "CREATE SECRET s (TYPE s3, KEY_ID 'x', SECRET 'y')",
    "CREATE VIEW v AS SELECT * FROM visits",
    "COPY visits TO '{root}/out.csv'",
    "COPY (SELECT * FROM visits) TO '{root}/out.parquet' (FORMAT parquet)",
    "EXPORT DATABASE '{root}/out'",
    "ATTACH '{root}/out.duckdb' AS stolen",
    "DETACH dpsql_data",
    "USE dpsql_data",
    "INSTALL httpfs",
    "LOAD httpfs",
    "FORCE INSTALL httpfs FROM community",
    "PRAGMA database_list",
    "PRAGMA enable_external_access",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET lock_configuration",
    "SET VARIABLE x = 1",
    "CALL pragma_version()",
    "CHECKPOINT",
    "VACUUM",
    "ANALYZE",
    "SUMMARIZE visits",
    "DESCRIBE visits",
    "SHOW TABLES",
    "EXPLAIN SELECT * FROM visits",
    "PREPARE p AS SELECT * FROM visits",
    "EXECUTE p",
    "BEGIN TRANSACTION",
    "SELECT * FROM visits",
    "SELECT ssn FROM visits",
    "SELECT COUNT(*) FROM read_csv('{root}/loot.csv')",
    "SELECT COUNT(*) FROM '{root}/loot.csv'",
    "SELECT COUNT(*) FROM read_csv('/etc/passwd')",
    "SELECT COUNT(*) FROM read_text('/etc/passwd')",
    "SELECT COUNT(*) FROM read_parquet('s3://bucket/x.parquet')",
    "SELECT COUNT(*) FROM sqlite_scan('/tmp/x.db', 't')",
    "SELECT COUNT(*) FROM glob('/*')",
    "SELECT COUNT(*) FROM duckdb_tables()",
    "SELECT COUNT(*) FROM duckdb_settings()",
    "SELECT COUNT(*) FROM information_schema.tables",
    "SELECT COUNT(*) FROM pg_catalog.pg_class",
    "SELECT COUNT(*) FROM range(10)",
    "SELECT COUNT(*) FROM generate_series(1, 10)",
    "SELECT COUNT(*) FROM (VALUES (1), (2)) v(x)",
    "SELECT COUNT(*) FROM secrets",
    # issue 14: a schema or database prefix is dropped and the name must still be a policy
    # table (main.visits reads the policy's visits, nothing else); these name no such table
    "SELECT COUNT(*) FROM dpsql_data.main.secrets",
    "SELECT COUNT(*) FROM dpsql_data.secrets",
    "SELECT COUNT(*) FROM system.main.duckdb_tables",
    "SELECT COUNT(*) FROM temp.main.secrets",
    "SELECT COUNT(*) FROM visits, secrets",
    "SELECT COUNT(*) FROM visits v JOIN secrets s ON v.zip = s.s",
    "SELECT COUNT(*) FROM visits v JOIN read_csv('/etc/passwd') p ON v.zip = p.column0",
    "SELECT COUNT(*) FROM visits UNION ALL SELECT COUNT(*) FROM secrets",
    "SELECT COUNT(*) FROM visits EXCEPT SELECT 1",
    "SELECT COUNT(*) FROM visits WHERE zip IN (SELECT s FROM secrets)",
    "SELECT COUNT(*) FROM visits WHERE zip = (SELECT s FROM secrets)",
    "SELECT (SELECT COUNT(*) FROM secrets) FROM visits",
    "SELECT COUNT(*), (SELECT MAX(ssn) FROM visits) FROM visits",
    "SELECT COUNT(*) FROM visits USING SAMPLE 1",
    "SELECT COUNT(*) FROM visits QUALIFY COUNT(*) > 1",
    "SELECT COUNT(*) FROM visits WINDOW w AS (ORDER BY u)",
    "PIVOT visits ON zip USING COUNT(*)",
    "FROM visits SELECT ssn",
    "FROM visits",
    "WITH x AS (DELETE FROM visits RETURNING *) SELECT COUNT(*) FROM x",
    "WITH x AS MATERIALIZED (SELECT * FROM secrets) SELECT COUNT(*) FROM x",
    "SELECT COUNT(*) FROM visits WHERE zip = getvariable('x')",
    "SELECT COUNT(*) FROM visits WHERE zip = current_setting('home_directory')",
    "SELECT COUNT(*) FROM visits WHERE zip = $1",
    "SELECT COUNT(*) FROM visits WHERE zip = ?",
    "SELECT COUNT(*) FROM visits WHERE zip = :x",
    "SELECT COUNT(*) FROM visits\x00; DROP TABLE visits",
    "SELECT COUNT(*) FROM visits；DROP TABLE visits",  # a fullwidth semicolon
    "SELECT COUNT(*) FROM visits WHERE zip = '\\'; DROP TABLE visits; --'",
    "SELECT COUNT(*) FROM visits WHERE zip = $$'; DROP TABLE visits; --$$ OR 1 = 1",
    "SELECT COUNT(*) FROM visits WHERE zip = E'\\x27; DROP TABLE visits'",
    "SELECT COUNT(*) FROM visits\nUNION\nSELECT ssn FROM visits",
    "SELECT COUNT(*) AS \"x\"\"; DROP TABLE visits; --\" FROM visits WHERE ssn = 'x'",
]


@pytest.fixture(scope="module")
def session(target):  # type: ignore[no-untyped-def]
    """One connection for every injection, and what must not change while they run."""
    root, path = target
    before = _fingerprint(path), sorted(p.name for p in root.iterdir())
    with connect(path, POLICY) as conn:
        settings = conn._engine.run("SELECT name, value FROM duckdb_settings() ORDER BY name").to_pylist()
        functions = conn._engine.run("SELECT COUNT(*) FROM duckdb_functions()").to_pylist()  # a LOAD adds some
        yield root, conn
        assert conn.budget().queries == 0
        assert conn._engine.run("SELECT name, value FROM duckdb_settings() ORDER BY name").to_pylist() == settings
        assert conn._engine.run("SELECT COUNT(*) FROM duckdb_functions()").to_pylist() == functions
    assert (_fingerprint(path), sorted(p.name for p in root.iterdir())) == before


@pytest.mark.parametrize("template", INJECTIONS)
def test_injections_are_refused_and_change_nothing(session, template: str) -> None:  # type: ignore[no-untyped-def]
    root, conn = session
    sql = template.replace("{root}", str(root))
    before = conn.budget().queries
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)) as info:
        conn.execute(sql, epsilon=1.0)
    assert "top secret" not in str(info.value) and "ssn1" not in str(info.value)
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)):
        conn.explain(sql, epsilon=1.0)
    assert conn.budget().queries == before


@pytest.mark.parametrize("suffix", ["TABLESAMPLE 1 ROWS", "AT (VERSION => 1)", "AS v(income, u)"])
def test_table_clauses_dpsql_does_not_model_cannot_change_what_is_read(session, suffix: str) -> None:  # type: ignore[no-untyped-def]
    """Sampling, time travel and column renames on a FROM table: dpsql builds the engine's
    SQL from its own nodes, so it would silently drop such a clause; it refuses each,
    before anything is read or charged."""
    _, conn = session
    before = conn.budget().queries
    with pytest.raises(dpsql.QueryRejected, match="not supported"):
        conn.execute(f"SELECT COUNT(*), SUM(income) FROM visits {suffix}", epsilon=1.0)
    assert conn.budget().queries == before


def test_nothing_changed(session, target) -> None:  # type: ignore[no-untyped-def]
    """Runs after the injections (same module fixture): the checks are in its teardown."""
    root, path = target
    assert path.exists()


def test_the_hardened_engine_refuses_what_the_analyzer_might_miss(target) -> None:  # type: ignore[no-untyped-def]
    """Defence in depth: even SQL sent straight to the engine (which dpsql never does with
    analyst text) cannot read files, load extensions, write, or unlock the configuration."""
    root, path = target
    with connect(path, POLICY) as conn:
        for sql in (f"SELECT * FROM read_csv('{root / 'loot.csv'}')", "INSTALL httpfs", "LOAD httpfs",
                    "SET enable_external_access = true", "SET lock_configuration = false",
                    "DROP TABLE dpsql_data.main.visits", "CREATE TABLE dpsql_data.main.x (a INT)",
                    f"ATTACH '{root / 'other.duckdb'}' AS o", f"COPY (SELECT 1) TO '{root / 'x.csv'}'"):
            with pytest.raises(duckdb.Error):
                conn._engine.run(sql)
    assert not (root / "x.csv").exists() and not (root / "other.duckdb").exists()


def test_hostile_names_where_dpsql_builds_sql(tmp_path: Path) -> None:
    """A database path, table and column names from the policy, and an analyst name that
    are SQL: each is quoted as one literal or identifier, never spliced in."""
    weird = tmp_path / "it's\"; DROP TABLE x; --.duckdb"
    table, column = 'my"table; DROP', "col'; DROP TABLE x; --"
    make_db(weird, {
        f'"{table.replace(chr(34), chr(34) * 2)}"': (f'u BIGINT, "{column}" DOUBLE', [(i, 1.0) for i in range(50)]),
        "x": ("a INT", [(1,)]),
    })
    pol = policy(f"""
[tables.'{table}']
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.'{table}'.columns]
"{column}" = {{ bounds = [0, 10] }}
""")
    ledger = tmp_path / "ledger'; DROP TABLE events; --.sqlite"
    quoted_table = '"' + table.replace('"', '""') + '"'
    with connect(weird, pol, analyst="bob'); DROP TABLE events; --", ledger=ledger) as conn:
        res = conn.execute(f'SELECT COUNT(*) AS n, SUM("{column}") AS s FROM {quoted_table}', epsilon=1e4)
        n, s = res.fetchall()[0]
        assert abs(n - 50) <= 1 and abs(s - 50) <= 1
        assert conn.budget().queries == 1
    with dpsql.Ledger(ledger) as book:
        assert book.status("bob'); DROP TABLE events; --", pol.budget_for("x")).queries == 1
    with duckdb.connect(str(weird), read_only=True) as con:
        assert con.sql("SELECT COUNT(*) FROM x").fetchall() == [(1,)]

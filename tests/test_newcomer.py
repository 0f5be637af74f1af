"""The rough edges a newcomer hit (issue 20): a fast --help, clean errors where a traceback
was, a policy check that catches what a query would refuse, explain for every column."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.cli import main

ROOT = Path(__file__).parents[1]
POLICY = ROOT / "policies" / "demo.toml"
HEAVY = ("scipy", "matplotlib", "dp_accounting", "pyarrow", "duckdb", "sqlglot", "numpy")


@pytest.fixture(scope="module")
def db(demo_database: Callable[[int, int], Path]) -> Path:
    return demo_database(3_000, 300)  # built once for the run (conftest)


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys; {code}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.split()


def test_import_and_help_load_nothing_heavy() -> None:
    assert _loaded_after("import dpsql") == []
    assert _loaded_after("import dpsql.cli; dpsql.cli._parser().format_help()") == []
    assert "scipy" not in _loaded_after("import dpsql; dpsql.connect")  # the audit's statistics stay out


def test_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "budget" in capsys.readouterr().out
    assert main(["audit", "--help"]) == 0
    assert "--query" in capsys.readouterr().out


def test_audit_errors_are_one_line(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.duckdb"
    assert main(["audit", "--db", str(missing), "--policy", str(POLICY), "--query", "SELECT COUNT(*) FROM visits"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --db") and "no such database file" in err and "Traceback" not in err
    assert main(["audit", "--db", str(db), "--policy", str(POLICY)]) == 1  # no --query: not the demo shapes
    err = capsys.readouterr().err
    assert "name the queries to audit" in err and "--query" in err
    assert not missing.exists()


def test_query_and_policy_check_on_a_missing_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.duckdb"
    assert main(["policy", "check", str(POLICY), "--db", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: database file") and err.count("\n") == 1
    assert not missing.exists()  # DuckDB would have created it


def _policy(tmp_path: Path, columns: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(f"""
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5
[budget]
default = {{ epsilon = 5.0, delta = 1e-5 }}
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
{columns}
""")
    return path


def test_policy_check_catches_public_values_of_the_wrong_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "t.duckdb"
    with duckdb.connect(str(data)) as con:
        con.execute("CREATE TABLE t AS SELECT range AS uid, CAST(range % 3 AS VARCHAR) AS kind, range % 3 AS code "
                    "FROM range(100)")
    cases = [('kind = { public_values = [0, 1, 2] }', "public_values [0, 1, 2] do not match its type VARCHAR"),
             ('code = { public_values = ["0", "1"] }', "public_values ['0', '1'] do not match its type BIGINT")]
    for column, message in cases:
        policy = _policy(tmp_path, column)
        assert main(["policy", "check", str(policy)]) == 0  # without the data it cannot know
        capsys.readouterr()
        assert main(["policy", "check", str(policy), "--db", str(data)]) == 1
        assert message in capsys.readouterr().err
        with pytest.raises(dpsql.PolicyError, match="do not match its type"):  # what a query met before
            dpsql.connect(data, policy=policy)
    good = _policy(tmp_path, 'kind = { public_values = ["0", "1", "2"] }')
    assert main(["policy", "check", str(good), "--db", str(data)]) == 0
    out = capsys.readouterr().out
    assert "1 table, 1 column" in out and "at most 1 group, 1 row per group" in out  # plurals


def test_explain_covers_every_output_column_by_alias(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        sql = ("SELECT region, COUNT(*) AS n, AVG(income) AS avg_income, MEDIAN(age) AS median_age, "
               "SUM(visits) / COUNT(*) AS ratio FROM visits GROUP BY region")
        explanation = conn.explain(sql, epsilon=0.5, delta=1e-7)
        assert conn.budget().queries == 0
    columns = explanation.columns
    assert list(columns) == ["region", "n", "avg_income", "median_age", "ratio"]
    assert columns["n"].half_width > 0 and columns["region"].half_width == 0
    assert columns["avg_income"].bounds == (0, 250_000) and columns["avg_income"].typical > 0
    assert columns["median_age"].bounds == (0, 100) and 0 < columns["median_age"].typical <= 100
    assert "per group at run time" in columns["median_age"].typical_note
    text = explanation.describe()
    for name in columns:
        assert f"\n  {name}: " in text
    assert "MEDIAN(" not in text.split("measurements:")[0]  # labelled by alias, not by SQL text
    assert repr(explanation) == text

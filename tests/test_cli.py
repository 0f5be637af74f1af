"""The command line, run in process: output, exit codes, and that refusals charge nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpsql.privacy import BudgetStatus, Ledger
from dpsql.cli import main
from dpsql.policy import load_policy

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "demo.toml"
BY_REGION = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def db(demo_db: Path) -> Path:
    return demo_db  # built once for the run (conftest)


def query(db: Path, ledger: Path | None, sql: str, *options: str, policy: Path = POLICY) -> int:
    argv = ["query", "--db", str(db), "--policy", str(policy), "--analyst", "alice", *options, sql]
    if ledger is not None:
        argv[1:1] = ["--ledger", str(ledger)]
    return main(argv)


def status(ledger: Path, policy: Path = POLICY) -> BudgetStatus:
    with Ledger(ledger) as book:
        return book.status("alice", load_policy(policy).budget_for("alice"))


# ---------------------------------------------------------------- dpsql query


def test_query_prints_table_privacy_and_budget(db, tmp_path, capsys):
    ledger = tmp_path / "budget.sqlite"
    assert query(db, ledger, BY_REGION, "--epsilon", "0.5") == 0
    out, err = capsys.readouterr()
    header, rule, *rows = out.split("\n\n")[0].splitlines()
    assert header.split() == ["region", "n", "avg_income"]
    assert [r.split()[0] for r in rows] == ["north", "south", "east", "west"]
    assert all("±" in r for r in rows)
    assert "charged to alice: epsilon=0.5, delta=0" in out
    assert "  n: laplace, noise std" in out and "  region: public" in out
    assert "budget left for alice: epsilon 9.5 of 10" in out
    assert err == ""
    assert status(ledger).queries == 1 and status(ledger).epsilon_spent == 0.5


def test_query_with_delta_uses_gaussian_and_defaults_epsilon(db, tmp_path, capsys):
    ledger = tmp_path / "budget.sqlite"
    assert query(db, ledger, "SELECT COUNT(*) AS n FROM visits", "--delta", "1e-7") == 0
    out = capsys.readouterr().out
    assert "charged to alice: epsilon=0.5, delta=1e-07" in out  # the policy's default_epsilon
    assert "n: gaussian" in out


def test_query_without_ledger_warns_that_nothing_is_kept(db, capsys):
    assert query(db, None, "SELECT COUNT(*) AS n FROM visits") == 0
    out, err = capsys.readouterr()
    assert "warning: no --ledger" in err
    assert "budget left for alice: epsilon 9.5 of 10" in out


def test_explain_shows_the_plan_and_charges_nothing(db, tmp_path, capsys):
    ledger = tmp_path / "budget.sqlite"
    assert query(db, ledger, BY_REGION, "--epsilon", "0.2", "--explain") == 0
    out = capsys.readouterr().out
    assert "would charge epsilon=0.2, delta=0 (laplace noise)" in out
    assert "n: laplace, noise std" in out and "bounded SQL:" in out  # labelled by the alias
    assert status(ledger).queries == 0


def test_explain_without_a_ledger_does_not_warn_about_recording(db, capsys):
    # issue 20: explain charges nothing, so "this charge is not recorded" was wrong there
    assert query(db, None, BY_REGION, "--explain") == 0
    captured = capsys.readouterr()
    assert "would charge" in captured.out and "not recorded" not in captured.err
    assert query(db, None, BY_REGION) == 0
    assert "this charge is not recorded" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sql", "options", "message"),
    [
        ("SELECT ssn FROM visits", (), "column 'ssn' of table 'visits' is denied"),
        ("SELECT * FROM visits", (), r"SELECT \* would release raw rows"),
        ("SELECT COUNT(*) FROM visits GROUP BY city", (), "partition selection"),
        ("SELECT COUNT(*) FROM visits", ("--epsilon", "5"), "max_epsilon_per_query"),
        ("SELECT COUNT(*) FROM visits", ("--delta", "0.5"), "max_delta_per_query"),
        ("SELECT COUNT(*) FROM nowhere", (), "nowhere"),
    ],
)
def test_refusal_prints_error_and_charges_nothing(db, tmp_path, capsys, sql, options, message):
    ledger = tmp_path / "budget.sqlite"
    assert query(db, ledger, sql, *options) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ")
    assert re.search(message, err)
    assert "Traceback" not in err
    assert status(ledger).queries == 0 and status(ledger).epsilon_spent == 0


def test_budget_exceeded_prints_error_and_charges_nothing(db, tmp_path, capsys):
    poor = tmp_path / "poor.toml"
    text = POLICY.read_text()
    poor.write_text(text.replace("alice = { epsilon = 10.0", "alice = { epsilon = 0.3"))
    ledger = tmp_path / "budget.sqlite"
    assert query(db, ledger, "SELECT COUNT(*) AS n FROM visits", "--epsilon", "0.5", policy=poor) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Budget exceeded for analyst 'alice'")
    assert status(ledger, poor).queries == 0


def test_missing_database_is_a_clean_error(tmp_path, capsys):
    assert query(tmp_path / "missing.duckdb", None, "SELECT COUNT(*) FROM visits") == 1
    err = capsys.readouterr().err
    assert "error: database file" in err and "does not exist" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["query", "SELECT 1"],  # no --db, no --policy
        ["query", "--db", "x", "--policy", "y", "--epsilon", "lots", "SELECT 1"],
        ["demo", "--rows", "0"],
        ["budget", "--policy", "p.toml"],
        ["policy"],
        ["frobnicate"],
    ],
)
def test_bad_command_line_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "usage: dpsql" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out


# ---------------------------------------------------------------- dpsql budget


def test_budget_shows_spent_and_remaining(db, tmp_path, capsys):
    ledger = tmp_path / "budget.sqlite"
    assert query(db, ledger, "SELECT COUNT(*) AS n FROM visits", "--epsilon", "0.25") == 0
    assert query(db, ledger, "SELECT COUNT(*) AS n FROM visits", "--epsilon", "0.5", "--delta", "1e-7") == 0
    capsys.readouterr()
    assert main(["budget", "--policy", str(POLICY), "--ledger", str(ledger), "--analyst", "alice"]) == 0
    out = capsys.readouterr().out
    assert "epsilon: 0.75 spent, 9.25 remaining of 10" in out
    assert "delta:   1e-07 spent, 9.9e-06 remaining of 1e-05" in out
    assert "queries: 2" in out


def test_budget_of_a_missing_ledger_is_full_and_creates_nothing(tmp_path, capsys):
    ledger = tmp_path / "never.sqlite"
    assert main(["budget", "--policy", str(POLICY), "--ledger", str(ledger), "--analyst", "bob"]) == 0
    out = capsys.readouterr().out
    assert "nothing spent" in out and "epsilon: 0 spent, 5 remaining of 5" in out
    assert not ledger.exists()


def test_budget_refuses_a_file_that_is_not_a_ledger(tmp_path, capsys):
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    assert main(["budget", "--policy", str(POLICY), "--ledger", str(junk), "--analyst", "alice"]) == 1
    assert "is not a dpsql budget ledger" in capsys.readouterr().err


# ---------------------------------------------------------------- dpsql policy check


def test_policy_check_ok_summarises_tables_and_access(db, capsys):
    assert main(["policy", "check", str(POLICY), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK: {POLICY}: 2 tables, 8 columns; matches database {db}")
    assert "table visits: private, privacy unit user_id" in out
    assert "table regions: public" in out
    assert "    income: aggregate, bounds [0, 250000]" in out
    assert "    region: group, public values north, south, east, west" in out
    assert "    zip: filter" in out and "    ssn: deny" in out
    assert "    alice: epsilon=10, delta=1e-05" in out


def test_policy_check_reports_a_bad_policy(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(POLICY.read_text().replace("age     = { bounds = [0, 100] }", "age = { bounds = [100, 0] }"))
    assert main(["policy", "check", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {bad}") and "age" in err


def test_policy_check_reports_a_policy_that_does_not_match_the_database(db, tmp_path, capsys):
    other = tmp_path / "other.toml"
    other.write_text(POLICY.read_text().replace("zip     =", "postcode ="))
    assert main(["policy", "check", str(other)]) == 0  # fine on its own
    capsys.readouterr()
    assert main(["policy", "check", str(other), "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "does not match the database" in err and "'postcode' is not in the table" in err


def test_policy_check_of_a_missing_file(tmp_path, capsys):
    assert main(["policy", "check", str(tmp_path / "nope.toml")]) == 1
    assert "policy file not found" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "dpsql", "policy", "check", "policies/demo.toml"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK: policies/demo.toml: 2 tables")


# ---------------------------------------------------------------- dpsql demo


def test_demo_builds_queries_and_shows_a_refusal(tmp_path, capsys):
    argv = ["demo", "--rows", "20000", "--units", "2000", "--dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert (tmp_path / "cache" / "visits-20000x2000.duckdb").exists()
    assert "built in" in out
    for sql in ("SELECT COUNT(*) AS visits FROM visits", "GROUP BY region, device",
                "COUNT(DISTINCT user_id)", "WHERE device = 'mobile'"):
        assert sql in out
    assert "n: gaussian" in out and "n: laplace" in out and "avg_income: laplace" in out
    assert "error: column 'ssn' of table 'visits' is denied" in out
    assert "nothing was charged. budget left for alice: epsilon 7.4 of 10" in out

    assert main(argv) == 0  # the second run reuses the cached database
    assert "(cached; delete it to rebuild)" in capsys.readouterr().out


def test_demo_reports_an_unusable_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["demo", "--rows", "100", "--units", "10", "--dir", str(blocker / "sub")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err

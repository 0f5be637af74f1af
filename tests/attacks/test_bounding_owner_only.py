"""The owner's bounding report is unreachable by an analyst (issue 15).

:mod:`dpsql.bounding` reads raw rows and returns exact, un-noised figures (how many rows
each cap drops, how many values are clipped, the number of units of a table). An analyst
who could call it would read the data for free. It is reached only from the owner's
command line (``dpsql policy check --db``, ``dpsql policy suggest``). Checked here:

- no module an analyst's request runs through imports it (the embedded Connection, the
  Flight server and its service, the Postgres front, the client): loading all of them in
  a fresh interpreter leaves ``dpsql.bounding`` unloaded;
- the Flight server's actions are the fixed set it lists, none of them bounding;
- SQL that names it, or anything like it, is refused by the analyzer, uncharged.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import dpsql

pytestmark = pytest.mark.attack

ANALYST_PATH = (
    "dpsql", "dpsql.connection", "dpsql.server", "dpsql.service", "dpsql.client", "dpsql.wire",
    "dpsql.pgwire", "dpsql.pgwire.session", "dpsql.pgwire.statements", "dpsql.pgwire.catalog",
    "dpsql.report", "dpsql.explain", "dpsql.repeats",
)


def test_no_analyst_module_imports_the_bounding_report() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {ANALYST_PATH!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        if e.name != name: raise\n"
        "print('dpsql.bounding' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr


def test_the_server_lists_no_bounding_action() -> None:
    from dpsql.server import ACTIONS

    assert not any("bound" in name or "suggest" in name or "policy" in name for name in ACTIONS)


@pytest.mark.parametrize("sql", [
    "SELECT dpsql.bounding.table_report('visits')",
    "SELECT table_report('visits', 'user_id', 10, 4)",
    "SELECT suggest('visits') FROM visits",
    "SELECT COUNT(*) FROM bounding",
    "SELECT COUNT(*) FROM visits WHERE suggest(user_id) > 0",
])
def test_sql_cannot_name_it(demo_conn, sql: str) -> None:
    before = demo_conn.budget()
    with pytest.raises(dpsql.Error):
        demo_conn.execute(sql, epsilon=0.1)
    assert demo_conn.budget().epsilon_spent == before.epsilon_spent


@pytest.fixture(scope="module")
def demo_conn(tmp_path_factory: pytest.TempPathFactory):
    from dpsql.cli import DEMO_POLICY
    from dpsql.demo import demo_database

    db = demo_database(tmp_path_factory.mktemp("owner_only") / "demo.duckdb", rows=2_000, units=200)
    with dpsql.connect(db, policy=DEMO_POLICY, analyst="mallory") as conn:
        yield conn

"""A real ``dpsql serve`` process that takes reports (``--reports``, ``--report-auth``), for
tests/test_server_reports.py and tests/attacks/test_report_ingestion.py.

The policy has one central table (``visits``, of the demo database) and four local tables,
one per mechanism: ``telemetry`` (adaptive range and GRR), ``survey`` (adaptive range),
``apps`` (OUE: 250 categories at eps 1, so 6 padding bits a row) and ``cities`` (OLH: 300 categories at eps ln 3,
where OLH ties OUE and wins). The server's speed model is pinned, so it starts without
measuring the machine; its slack and margin are generous (:mod:`deadline_helpers`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/test_server.py

from deadline_helpers import generous_deadlines  # noqa: E402
from dpsql.auth import create_token  # noqa: E402
from dpsql.demo import make_demo_database  # noqa: E402
from dpsql.pgwire.scram import store_verifier  # noqa: E402
from test_server import ServerProcess  # noqa: E402

APPS = [f"app{i}" for i in range(250)]
CITIES = [f"city{i}" for i in range(300)]
OS = ["linux", "mac", "windows"]
POLICY_TEXT = f"""
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5

[server]
queries_per_minute = 6000
deadline_base_ms = 50
deadline_ms_per_million_rows = 2000

[budget]
default = {{ epsilon = 5.0, delta = 1e-5 }}

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 4
max_rows_per_unit = 10
[tables.visits.columns]
age = {{ bounds = [0, 100] }}

[tables.telemetry]
model = "local"
epsilon = 1.0
[tables.telemetry.columns]
temp = {{ bounds = [-10, 50] }}
os = {{ categories = {OS!r} }}

[tables.survey]
model = "local"
epsilon = 2.0
[tables.survey.columns]
score = {{ bounds = [0, 10] }}

[tables.apps]
model = "local"
epsilon = 1.0
[tables.apps.columns]
app = {{ categories = {APPS!r} }}

[tables.cities]
model = "local"
epsilon = 1.0986122886681098
[tables.cities.columns]
city = {{ categories = {CITIES!r} }}
""".replace("'", '"')


@dataclass(frozen=True)
class Setup:
    db: Path
    policy: Path
    auth: Path
    report_auth: Path
    reports: Path
    analyst: str  # alice's token
    reporters: tuple[str, ...]  # reporting tokens


def make_setup(home: Path, reporters: int = 4) -> Setup:
    """A small demo database, the policy, an analyst token and reporting tokens."""
    db = home / "demo.duckdb"
    make_demo_database(db, rows=2_000, units=200)
    policy = home / "policy.toml"
    policy.write_text(POLICY_TEXT)
    generous_deadlines(policy, policy)  # the server tests using it are not about timing
    auth, report_auth = home / "auth.toml", home / "reporters.toml"
    analyst = _token(auth, "alice")
    tokens = tuple(_token(report_auth, f"device-group-{i}") for i in range(reporters))
    return Setup(db, policy, auth, report_auth, home / "reports.sqlite", analyst, tokens)


def _token(auth: Path, name: str) -> str:
    """A token and its SCRAM verifier, as ``dpsql token create`` makes them."""
    token = create_token(auth, name)
    store_verifier(auth, name, token)
    return token


class ReportServer(ServerProcess):
    """``python -m dpsql serve`` with the report options; its log goes to ``log``."""

    def __init__(self, setup: Setup, log: Path, *extra: str) -> None:  # noqa: D107
        import os
        import subprocess

        self.log = log
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        command = [sys.executable, "-m", "dpsql", "serve", "--db", str(setup.db), "--policy", str(setup.policy),
                   "--ledger", str(setup.db.parent / "ledger.sqlite"), "--auth", str(setup.auth),
                   "--reports", str(setup.reports), "--report-auth", str(setup.report_auth),
                   "--host", "127.0.0.1", "--port", "0", *extra]
        with open(log, "ab") as err:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env, cwd=root)
        addresses = self._addresses(2 if "--pg-port" in extra else 1)
        self.location = addresses[0]
        self.pg_address = addresses[-1] if len(addresses) > 1 else None  # host:port of --pg-port

    def _addresses(self, count: int) -> list[str]:
        """The ``listening on ADDRESS`` lines the server prints, ``count`` of them (bounded wait)."""
        import selectors
        import time

        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline, text = time.monotonic() + 30, b""
        while time.monotonic() < deadline and text.count(b"\n") < count:
            if selector.select(timeout=0.5):
                chunk = self.process.stdout.read1(4096)  # type: ignore[attr-defined]
                if not chunk:
                    break
                text += chunk
        selector.close()
        lines = text.decode().splitlines()[:count]
        if len(lines) < count or not all(line.startswith("listening on ") for line in lines):
            self.process.kill()
            self.process.wait(30)
            raise AssertionError(f"the server did not start: {text!r}\n{self.log.read_text()}")
        return [line.split()[-1] for line in lines]

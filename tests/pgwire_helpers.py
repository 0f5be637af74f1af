"""A real ``python -m dpsql serve --pg-port 0`` process for the Postgres-front tests.

The server's stdout gives both addresses (``listening on grpc://...`` then ``listening on
postgresql://...``); every wait is bounded, and the server is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from dpsql.auth import create_token
from dpsql.pgwire.scram import store_verifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deadline_helpers import generous_deadlines  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO_POLICY = ROOT / "policies" / "demo.toml"
START_SECONDS = 60.0
STOP_SECONDS = 40.0


def small_budget_policy(path: Path) -> Path:
    """The demo policy with a default budget of epsilon 1.0 (alice keeps 10), and generous
    deadlines (:mod:`deadline_helpers`): the tests using it are not about timing."""
    text = DEMO_POLICY.read_text()
    old = "default = { epsilon = 5.0, delta = 1e-5 }"
    assert old in text, "the demo policy changed; update small_budget_policy"
    path.write_text(text.replace(old, "default = { epsilon = 1.0, delta = 1e-5 }"))
    return generous_deadlines(path, path)


def token_for(auth: Path, analyst: str) -> str:
    """A token and its SCRAM verifier, as ``dpsql token create`` makes them."""
    token = create_token(auth, analyst)
    store_verifier(auth, analyst, token)
    return token


class PgServerProcess:
    def __init__(self, db: Path, policy: Path, ledger: Path, auth: Path, log: Path, *extra: str) -> None:
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        command = [sys.executable, "-m", "dpsql", "serve", "--db", str(db), "--policy", str(policy),
                   "--ledger", str(ledger), "--auth", str(auth), "--host", "127.0.0.1", "--port", "0",
                   "--pg-host", "127.0.0.1", "--pg-port", "0", *extra]
        with open(log, "ab") as err:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT)
        lines = self._read_lines(2)
        self.flight = lines[0].split()[-1]
        address = lines[1].split()[-1]
        assert address.startswith("postgresql://"), lines
        self.host, port = address.removeprefix("postgresql://").rsplit(":", 1)
        self.port = int(port)

    def _read_lines(self, count: int) -> list[str]:
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_SECONDS
        data = b""
        while time.monotonic() < deadline and data.count(b"\n") < count:
            if selector.select(timeout=0.5):
                chunk = self.process.stdout.read1(4096)  # type: ignore[attr-defined]
                if not chunk:
                    break
                data += chunk
        selector.close()
        lines = data.decode().splitlines()
        if len(lines) < count or not all(line.startswith("listening on ") for line in lines[:count]):
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            raise AssertionError(f"the server did not start: {data!r}\n{self.log.read_text()}")
        return lines

    def dsn(self, user: str, password: str, **extra: str) -> str:
        fields = {"host": self.host, "port": str(self.port), "user": user, "password": password,
                  "dbname": "dpsql", "connect_timeout": "10", **extra}
        return " ".join(f"{k}={v}" for k, v in fields.items())

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            raise AssertionError(f"the server did not stop on SIGTERM\n{self.log.read_text()}") from None
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code

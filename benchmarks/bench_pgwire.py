"""The Postgres front against Flight and the embedded API: latency and 8-client throughput.

Starts a real ``python -m dpsql serve --pg-port 0`` on loopback over a small demo table
(2,000 rows) and measures, for one small query:

- **latency**: the median of ``--repeat`` calls through psycopg and asyncpg (pg wire), ``dpsql.Client``
  (Flight) and ``dpsql.connect`` (embedded, in this process), interleaved call by call;
- **throughput**: ``--clients`` threads, each with its own connection and analyst, for
  ``--seconds``: queries per second and p50/p99 latency, pg wire then Flight.

Both with *repeats* (the same query again: after the first, the released answer comes back
free; this isolates the front's own cost) and *new queries* (a fresh alias each time:
planned, charged, run and noised; on a server these are released at the timing defence's
deadline, so they measure that deadline, not the protocol).

    python benchmarks/bench_pgwire.py                  # Markdown on stdout
    python benchmarks/bench_pgwire.py --write          # ... also appended to benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import asyncpg
import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import dpsql  # noqa: E402
from _shared import append_results, cpu_model, ram_gib  # noqa: E402
from dpsql.demo import make_demo_database  # noqa: E402
from pgwire_helpers import PgServerProcess, token_for  # noqa: E402

REPEAT_SQL = "SELECT COUNT(*) AS n FROM visits"
POLICY_TEXT = (HERE.parent / "policies" / "demo.toml").read_text().replace(
    "default = { epsilon = 5.0, delta = 1e-5 }", "default = { epsilon = 1000000.0, delta = 1e-5 }").replace(
    "alice = { epsilon = 10.0, delta = 1e-5 }", "alice = { epsilon = 1000000.0, delta = 1e-5 }")


def _policy_text() -> str:
    """The demo policy with budgets and a rate limit (where the policy has one) out of the way."""
    from dpsql.errors import PolicyError
    from dpsql.policy import load_policy

    if re.search(r"^queries_per_minute\s*=", POLICY_TEXT, re.MULTILINE):  # the demo policy's [server] has one
        return re.sub(r"^queries_per_minute\s*=\s*\d+", "queries_per_minute = 100000000", POLICY_TEXT, flags=re.MULTILINE)
    with_limit = POLICY_TEXT + "\n[server]\nqueries_per_minute = 100000000\n"
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(with_limit)
        f.flush()
        try:
            load_policy(f.name)
        except PolicyError:
            return POLICY_TEXT  # no [server] section in this version
    return with_limit


def _ms(samples: list[float]) -> str:
    return f"{1e3 * statistics.median(samples):.1f}"


def latency(process: PgServerProcess, tokens: dict[str, str], home: Path, repeat: int, fresh: int) -> list[str]:
    pg = psycopg.connect(process.dsn("alice", tokens["alice"]), autocommit=True)
    flight = dpsql.Client(process.flight, token=tokens["alice"])
    embedded = dpsql.connect(str(home / "demo.duckdb"), policy=str(home / "policy.toml"), analyst="alice",
                             ledger=str(home / "embedded.sqlite"))
    loop = asyncio.new_event_loop()  # asyncpg: every statement prepared and described server-side
    apg = loop.run_until_complete(asyncpg.connect(host=process.host, port=process.port, user="alice",
                                                  password=tokens["alice"], database="dpsql"))
    calls = {
        "pg wire (psycopg)": lambda sql: pg.execute(sql).fetchall(),
        "pg wire (asyncpg, prepared)": lambda sql: loop.run_until_complete(apg.fetch(sql)),
        "Flight (dpsql.Client)": lambda sql: flight.execute(sql).fetchall(),
        "embedded (dpsql.connect)": lambda sql: embedded.execute(sql).fetchall(),
    }
    rows = ["| path | repeat of an answer, median ms | new query, median ms |", "| --- | ---: | ---: |"]
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in calls}
    for name, call in calls.items():
        call(REPEAT_SQL)  # the first one is charged; the rest are repeats
    for i in range(repeat):
        for name, call in calls.items():
            started = time.perf_counter()
            call(REPEAT_SQL)
            times[name][0].append(time.perf_counter() - started)
    for i in range(fresh):
        for name, call in calls.items():
            started = time.perf_counter()
            call(f"SELECT COUNT(*) AS n_{i}_{len(name)} FROM visits")  # new to every path
            times[name][1].append(time.perf_counter() - started)
    for name, (repeats, news) in times.items():
        rows.append(f"| {name} | {_ms(repeats)} | {_ms(news)} |")
    pg.close()
    loop.run_until_complete(apg.close())
    loop.close()
    embedded.close()
    return rows


def throughput(process: PgServerProcess, tokens: dict[str, str], clients: int, seconds: float) -> list[str]:
    rows = ["| front | clients | queries/s | p50 ms | p99 ms |", "| --- | ---: | ---: | ---: | ---: |"]
    for front in ("pg wire", "Flight"):
        samples: list[float] = []
        lock = threading.Lock()
        window: dict[str, float] = {}
        ready = threading.Barrier(clients + 1, action=lambda: window.update(stop=time.monotonic() + seconds))

        def client(i: int) -> None:
            analyst = f"bench{i}"
            if front == "pg wire":
                conn = psycopg.connect(process.dsn(analyst, tokens[analyst]), autocommit=True)
                call = lambda: conn.execute(REPEAT_SQL).fetchall()  # noqa: E731
            else:
                flight = dpsql.Client(process.flight, token=tokens[analyst])
                call = lambda: flight.execute(REPEAT_SQL).fetchall()  # noqa: E731
            call()  # charged once (at the server's deadline); then repeats
            ready.wait(600)
            mine = []
            while time.monotonic() < window["stop"]:
                started = time.perf_counter()
                call()
                mine.append(time.perf_counter() - started)
            with lock:
                samples.extend(mine)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        ready.wait(600)  # every client connected and warm: the window starts now
        began = window["stop"] - seconds
        for t in threads:
            t.join(seconds + 120)
        elapsed = time.monotonic() - began
        samples.sort()
        p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))] if samples else float("nan")
        rows.append(f"| {front} | {clients} | {len(samples) / elapsed:.0f} | {_ms(samples)} | {1e3 * p99:.1f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--fresh", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        home = Path(directory)
        make_demo_database(home / "demo.duckdb", rows=2_000, units=200)
        (home / "policy.toml").write_text(_policy_text())
        auth = home / "auth.toml"
        tokens = {name: token_for(auth, name) for name in ["alice"] + [f"bench{i}" for i in range(args.clients)]}
        process = PgServerProcess(home / "demo.duckdb", home / "policy.toml", home / "ledger.sqlite", auth,
                                  home / "server.log")
        try:
            lat = latency(process, tokens, home, args.repeat, args.fresh)
            thr = throughput(process, tokens, args.clients, args.seconds)
        finally:
            process.stop()
    report = "\n".join([
        "## Postgres wire vs Flight vs embedded (bench_pgwire.py)", "",
        f"{cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB; load average "
        f"{os.getloadavg()[0]:.2f}; 2,000-row demo table; `{REPEAT_SQL}`.", "",
        *lat, "", *thr, "",
    ])
    print(report)
    if args.write:
        append_results(HERE / "RESULTS.md", report)


if __name__ == "__main__":
    main()

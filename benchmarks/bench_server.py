"""How fast is the proxy? Small queries per second and latency through ``dpsql serve``.

Starts a real ``python -m dpsql serve`` on loopback over a tiny demo table (1,000 rows),
with a file ledger, and measures:

- **throughput**: 8 client processes (``dpsql.Client``), each with its own analyst and
  token, send small queries (``SELECT COUNT(*) AS n_<i> FROM visits``) back to back for
  ``--seconds`` (default 10); queries per second over all of them, and the p50/p99 latency;
- **overhead**: one client alone, ``--repeat`` queries: median latency over the network,
  against the embedded API (``dpsql.connect`` on the same file, with a file ledger too) in
  this process, alternating one and the other so both see the same machine load. The difference is what the network path costs; the embedded median is the
  pipeline's fixed cost, which the server pays as well.

Both are measured twice: with *new queries* (a new alias each time: planned, run, noised,
charged, stored), and with *repeats* (one query again and again: after the first, the
stored answer comes back free, see :mod:`dpsql.repeats`), which isolates the server path.

The goal (issue 6): >= 300 q/s and p99 <= 50 ms with 8 clients on a 2-core machine.
Clients and server share the machine's cores, so the load average is printed with the
figures.

    python benchmarks/bench_server.py                 # Markdown on stdout
    python benchmarks/bench_server.py --write         # ... also appended to benchmarks/RESULTS.md
    python benchmarks/bench_server.py --clients 4 --seconds 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dpsql  # noqa: E402
from dpsql.auth import create_token  # noqa: E402
from dpsql.demo import make_demo_database  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
QUERY = "SELECT COUNT(*) AS n FROM visits"


def new_query(tag: str, i: int) -> str:
    """A query the server has not answered before (a repeat would be a free cache hit)."""
    return f"SELECT COUNT(*) AS n_{tag}_{i} FROM visits"
EPSILON = 0.001
BIG_BUDGET = "default = { epsilon = 1000000.0, delta = 1e-5 }"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent client processes (default 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the clients send (default 10)")
    parser.add_argument("--repeat", type=int, default=300, help="sequential queries for the overhead (default 300)")
    parser.add_argument("--rows", type=int, default=1000, help="rows of the tiny table (default 1000)")
    parser.add_argument("--no-repeats", dest="repeats", action="store_false",
                        help="skip the second run, where every query is a free repeat")
    parser.add_argument("--write", action="store_true", help=f"also append the report to {RESULTS}")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dpsql-bench-server-") as tmp:
        home = Path(tmp)
        db = home / "tiny.duckdb"
        make_demo_database(db, rows=args.rows, units=max(10, args.rows // 10))
        policy = home / "policy.toml"
        policy.write_text(_big_budget_policy())
        tokens = {f"bench{i}": create_token(home / "auth.toml", f"bench{i}") for i in range(args.clients + 1)}
        load_before = os.getloadavg()
        server = _start_server(db, policy, home)
        runs: dict[str, dict[str, object]] = {}
        try:
            location = server[1]
            overhead_token = tokens.pop(f"bench{args.clients}")
            for kind, fresh in (("new queries", True), ("repeats", False)):
                if kind == "repeats" and not args.repeats:
                    continue
                network, embedded = _sequential(location, overhead_token, db, policy,
                                                home / "embedded-ledger.sqlite", args.repeat, fresh)
                throughput = _throughput(location, list(tokens.values()), args.seconds, fresh)
                runs[kind] = {"network": network, "embedded": embedded, "throughput": throughput}
        finally:
            code = _stop_server(server[0])
        load_after = os.getloadavg()
    report = _report(args, runs, load_before, load_after, code)
    print(report)
    if args.write:
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write("\n" + report + "\n")
    return 0


def _big_budget_policy() -> str:
    text = (ROOT / "policies" / "demo.toml").read_text()
    lines = [BIG_BUDGET if line.startswith("default = {") else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the server


def _start_server(db: Path, policy: Path, home: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpsql", "serve", "--db", str(db), "--policy", str(policy),
         "--ledger", str(home / "ledger.sqlite"), "--auth", str(home / "auth.toml"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=log, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()  # the server prints this line once it listens, or exits
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}; see {home / 'server.log'}")
    return proc, line.split()[-1]


def _stop_server(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(30)


# ---------------------------------------------------------------- measurements


def _sequential(location: str, token: str, db: Path, policy: Path, ledger: Path, repeat: int,
                fresh: bool) -> tuple[list[float], list[float]]:
    """Latencies of ``repeat`` queries over the network and embedded, alternating one and
    the other so that both see the same machine load; after 20 warm-up rounds. New queries
    when ``fresh``, else the same query again and again (free repeats after the first)."""
    network: list[float] = []
    embedded: list[float] = []
    with dpsql.Client(location, token=token) as client, \
            dpsql.connect(db, policy=policy, analyst="embedded", ledger=ledger) as conn:
        for i in range(-20, repeat):
            for run, out, tag in ((client.execute, network, "net"), (conn.execute, embedded, "emb")):
                sql = new_query(tag, i + 20) if fresh else QUERY
                start = time.perf_counter()
                run(sql, epsilon=EPSILON)
                if i >= 0:
                    out.append(time.perf_counter() - start)
    return network, embedded


def _client_worker(location: str, token: str, fresh: bool, seconds: float, go: Any, out: Any) -> None:
    """Warm up, say so, wait for ``go``, then query back to back for ``seconds``."""
    latencies: list[float] = []
    errors = 0
    tag = f"w{os.getpid()}"
    with dpsql.Client(location, token=token) as client:
        for i in range(5):  # warm: the server verifies the token once, makes the Connection
            client.execute(new_query(tag + "warm", i), epsilon=EPSILON)
        client.execute(QUERY, epsilon=EPSILON)
        out.put(("ready", os.getpid()))
        if not go.wait(300):
            out.put(([], 0))
            return
        stop_at = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < stop_at:
            i += 1
            sql = new_query(tag, i) if fresh else QUERY
            start = time.perf_counter()
            try:
                client.execute(sql, epsilon=EPSILON)
            except dpsql.Error:
                errors += 1
                continue
            latencies.append(time.perf_counter() - start)
    out.put((latencies, errors))


def _throughput(location: str, tokens: list[str], seconds: float, fresh: bool) -> dict[str, float]:
    context = mp.get_context("spawn")
    queue = context.Queue()
    go = context.Event()
    workers = [context.Process(target=_client_worker, args=(location, t, fresh, seconds, go, queue)) for t in tokens]
    for w in workers:
        w.start()
    for _ in workers:  # every client imported, connected and warmed up
        queue.get(timeout=300)
    go.set()
    results = [queue.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join(30)
    latencies = sorted(lat for lats, _ in results for lat in lats)
    errors = sum(e for _, e in results)
    return {
        "queries": len(latencies),
        "errors": errors,
        "qps": len(latencies) / seconds,
        "p50_ms": 1e3 * _quantile(latencies, 0.50),
        "p99_ms": 1e3 * _quantile(latencies, 0.99),
        "max_ms": 1e3 * latencies[-1] if latencies else float("nan"),
    }


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---------------------------------------------------------------- the report


def _report(args: argparse.Namespace, runs: dict[str, dict[str, object]],
            load_before: tuple[float, float, float], load_after: tuple[float, float, float], code: int) -> str:
    lines = [
        f"## Server: {args.clients} clients, small queries ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)}. "
        f"`SELECT COUNT(*) AS n_... FROM visits` on {args.rows:,} rows, epsilon={EPSILON:g}, file ledger. "
        "*New queries* each have a new alias, so each is planned, run, noised, charged (ledger "
        "fsync) and stored for repeats (answers-file fsync); *repeats* ask one query again and "
        "again, answered free from the stored answer.",
        "",
        "| measure | " + " | ".join(runs) + " | goal |",
        "|---|" + "---|" * len(runs) + "---|",
    ]
    rows: list[tuple[str, list[str], str]] = [
        (f"throughput, {args.clients} client processes, {args.seconds:g} s", [], ">= 300 q/s"),
        ("latency p50 / p99 / max under that load", [], "p99 <= 50 ms"),
        (f"one client alone, median of {args.repeat}", [], ""),
        (f"embedded API (`dpsql.connect`), median of {args.repeat}", [], ""),
        ("network path overhead (difference)", [], ""),
        ("embedded pipeline's share of a network query", [], ""),
    ]
    for run in runs.values():
        t: dict[str, float] = run["throughput"]  # type: ignore[assignment]
        net = 1e3 * statistics.median(run["network"])  # type: ignore[arg-type]
        emb = 1e3 * statistics.median(run["embedded"])  # type: ignore[arg-type]
        cells = [
            f"{t['qps']:.0f} q/s ({t['queries']:.0f} queries, {t['errors']:.0f} errors)",
            f"{t['p50_ms']:.1f} / {t['p99_ms']:.1f} / {t['max_ms']:.1f} ms",
            f"{net:.2f} ms",
            f"{emb:.2f} ms",
            f"{net - emb:.2f} ms ({net / emb:.2f}x)",
            f"{100 * emb / net:.0f}%",
        ]
        for row, cell in zip(rows, cells):
            row[1].append(cell)
    lines += [f"| {name} | " + " | ".join(cells) + f" | {goal} |" for name, cells, goal in rows]
    lines += ["", f"Server exit code on SIGTERM: {code}."]
    return "\n".join(lines)


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    raise SystemExit(main())

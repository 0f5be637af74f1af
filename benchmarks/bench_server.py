"""How fast is the proxy? Small queries per second and latency through ``dpsql serve``.

Starts a real ``python -m dpsql serve`` on loopback over a tiny demo table (1,000 rows),
with a file ledger, and measures:

- **throughput**: 8 client processes (``dpsql.Client``), each with its own analyst and
  token, send small queries (``SELECT COUNT(*) AS n_<i> FROM visits``) back to back for
  ``--seconds`` (default 10); queries per second over all of them, and the p50/p99 latency
  (each client settles its heap after warming up, as the server's processes do: its own
  full garbage collections would otherwise count as the server's latency);
- **overhead**: one client alone, ``--repeat`` queries: median latency over the network,
  against the embedded API (``dpsql.connect`` on the same file, with a file ledger too) in
  this process, alternating one and the other so both see the same machine load. The difference is what the network path costs; the embedded median is the
  pipeline's fixed cost, which the server pays as well.

Both are measured with *new queries* (a new alias each time: planned, run, noised,
charged, stored) and with *repeats* (one query again and again: after the first, the
stored answer comes back free, see :mod:`dpsql.repeats`), which isolates the server path.
The throughput phases are interleaved, ``--rounds`` times new then repeats, with the same
client processes, so both kinds see the same machine load. For each kind the report also
gives the **server's CPU time per query** (the server process and its workers, from
``/proc``), which does not depend on how loaded the machine is, and the deadline model
the server used (``--workers`` and the timing defence are on, as in production).

The goal (issue 16): >= 300 q/s and p99 <= 50 ms with 8 clients on a 2-core machine, new
queries; repeats >= 1,000 q/s. Clients and server share the machine's cores, so the load
average is printed with the figures.

    python benchmarks/bench_server.py                 # Markdown on stdout
    python benchmarks/bench_server.py --write         # ... also appended to benchmarks/RESULTS.md
    python benchmarks/bench_server.py --shape eight --no-repeats   # eight aggregates by region instead of a COUNT
    python benchmarks/bench_server.py --clients 4 --seconds 5 --workers 1
    python benchmarks/bench_server.py --deadline-base-ms 5 --deadline-ms-per-million-rows 200  # pinned model
    python benchmarks/bench_server.py --compare /tmp/old-checkout   # two servers, phases interleaved

``--compare DIR`` starts a second server from the dpsql code in ``DIR`` (another checkout, e.g.
``git archive main | tar -x -C DIR``) on its own copy of the database, policy and tokens,
and runs every throughput phase against both, alternating, so both see the same machine load:
the ratio between them is the figure to trust on a shared machine. Each phase also records the
1-minute load average at its start.
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
from collections.abc import Collection
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dpsql  # noqa: E402
from dpsql.auth import create_token  # noqa: E402
from dpsql.demo import make_demo_database  # noqa: E402
from dpsql.timing import settle  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
#: ``--shape``: the query every client sends, ``{alias}`` a new name for a new query.
SHAPES = {
    "count": "SELECT COUNT(*) AS {alias} FROM visits",
    "eight": "SELECT region, COUNT(*) AS {alias}, SUM(income), AVG(income), COUNT(income), MIN(income), "
             "MAX(income), STDDEV(income), VARIANCE(income) FROM visits GROUP BY region",
}
QUERY = SHAPES["count"].format(alias="n")


def new_query(tag: str, i: int, shape: str = "count") -> str:
    """A query the server has not answered before (a repeat would be a free cache hit)."""
    return SHAPES[shape].format(alias=f"n_{tag}_{i}")
EPSILON = 0.001
BIG_BUDGET = "default = { epsilon = 1000000.0, delta = 1e-5 }"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent client processes (default 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the clients send (default 10)")
    parser.add_argument("--repeat", type=int, default=300, help="sequential queries for the overhead (default 300)")
    parser.add_argument("--rows", type=int, default=1000, help="rows of the tiny table (default 1000)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="count",
                        help="the clients' query in the throughput phases: a COUNT (default) or eight aggregates by region")
    parser.add_argument("--no-repeats", dest="repeats", action="store_false",
                        help="skip the second run, where every query is a free repeat")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of new queries then repeats")
    parser.add_argument("--workers", type=int, default=None, help="dpsql serve --workers (default: its own, one per core)")
    parser.add_argument("--slack", type=float, default=None, help="[server] deadline_slack (default: the policy's)")
    parser.add_argument("--margin-ms", type=float, default=None, help="[server] deadline_margin_ms (default: the policy's)")
    parser.add_argument("--deadline-base-ms", type=float, default=None, help="pin the speed model (with the next)")
    parser.add_argument("--deadline-ms-per-million-rows", type=float, default=None)
    parser.add_argument("--compare", default=None, metavar="DIR",
                        help="also run a server from the dpsql code in DIR, phases interleaved with this one's")
    parser.add_argument("--compare-workers", type=int, default=None, help="the compared server's --workers")
    parser.add_argument("--compare-deadline-base-ms", type=float, default=None,
                        help="pin the compared server's model (with the next; its formula may differ)")
    parser.add_argument("--compare-deadline-ms-per-million-rows", type=float, default=None)
    parser.add_argument("--compare-slack", type=float, default=None, help="the compared server's deadline_slack")
    parser.add_argument("--compare-margin-ms", type=float, default=None, help="the compared server's deadline_margin_ms")
    parser.add_argument("--logs", metavar="DIR", help="also keep each server's log in DIR (this.log, compared.log)")
    parser.add_argument("--write", action="store_true", help=f"also append the report to {RESULTS}")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dpsql-bench-server-") as tmp:
        home = Path(tmp)
        db = home / "tiny.duckdb"
        make_demo_database(db, rows=args.rows, units=max(10, args.rows // 10))
        policy = home / "policy.toml"
        policy.write_text(_bench_policy(args))
        tokens = {f"bench{i}": create_token(home / "auth.toml", f"bench{i}") for i in range(args.clients + 1)}
        load_before = os.getloadavg()
        codes = [("this", ROOT)] + ([("compared", Path(args.compare).resolve())] if args.compare else [])
        servers: list[tuple[subprocess.Popen[bytes], str]] = []
        runs: dict[str, dict[str, object]] = {}
        kinds = [("new queries", True)] + ([("repeats", False)] if args.repeats else [])
        exit_codes: list[int] = []
        try:
            for name, code in codes:
                folder = home / name
                folder.mkdir()
                own = policy
                if name == "compared" and (args.compare_deadline_base_ms is not None or args.compare_slack is not None
                                           or args.compare_margin_ms is not None):
                    own = folder / "policy.toml"
                    own.write_text(_bench_policy(args, args.compare_deadline_base_ms,
                                                 args.compare_deadline_ms_per_million_rows,
                                                 slack=args.compare_slack, margin_ms=args.compare_margin_ms))
                workers = args.compare_workers if name == "compared" and args.compare_workers else args.workers
                servers.append(_start_server(db, own, home / "auth.toml", folder, workers, code))
            overhead_token = tokens.pop(f"bench{args.clients}")
            for kind, fresh in kinds:
                network, embedded = _sequential(servers[0][1], overhead_token, db, policy,
                                                home / "embedded-ledger.sqlite", args.repeat, fresh)
                runs[kind] = {"network": network, "embedded": embedded}
            throughput = _throughput([loc for _, loc in servers], list(tokens.values()), args.seconds, kinds,
                                     args.rounds, [proc.pid for proc, _ in servers], args.shape)
            for kind, _ in kinds:
                runs[kind]["throughput"] = throughput[0][kind]
                if len(servers) > 1:
                    runs[kind]["compared"] = throughput[1][kind]
        finally:
            for proc, _ in servers:
                exit_codes.append(_stop_server(proc))
        logs = [(home / name / "server.log").read_text() for name, _ in codes]
        if args.logs:
            Path(args.logs).mkdir(parents=True, exist_ok=True)
            for (name, _), text in zip(codes, logs):
                (Path(args.logs) / f"{name}.log").write_text(text)
        models = [next((line.split("deadlines: ", 1)[1] for line in text.splitlines() if "deadlines: " in line), "?")
                  for text in logs]
        counts = [text.count("ran past its deadline") + text.count("missed its deadline") for text in logs]
        usages = [next((line.split("INFO dpsql.server: ", 1)[1] for line in text.splitlines() if "deadline use over" in line), "?")
                  for text in logs]
        overruns = [f"{n} in the server's log; {usage}" for n, usage in zip(counts, usages)]
        load_after = os.getloadavg()
    report = _report(args, runs, load_before, load_after, exit_codes, models, overruns, [str(c) for _, c in codes])
    print(report)
    if args.write:
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write("\n" + report + "\n")
    return 0


def _bench_policy(args: argparse.Namespace, base_ms: float | None = None, per_million_ms: float | None = None, *,
                  slack: float | None = None, margin_ms: float | None = None) -> str:
    """The demo policy with a budget and a rate limit that the benchmark cannot exhaust."""
    text = (ROOT / "policies" / "demo.toml").read_text()
    server = ["queries_per_minute = 100000000"]
    slack = slack if slack is not None else args.slack
    margin_ms = margin_ms if margin_ms is not None else getattr(args, "margin_ms", None)
    if slack is not None:
        server.append(f"deadline_slack = {slack}")
    if margin_ms is not None:
        server.append(f"deadline_margin_ms = {margin_ms}")
    if base_ms is None:
        base_ms, per_million_ms = args.deadline_base_ms, args.deadline_ms_per_million_rows
    if base_ms is not None:
        server += [f"deadline_base_ms = {base_ms}", f"deadline_ms_per_million_rows = {per_million_ms}"]
    lines = []
    for line in text.splitlines():
        if line.startswith("default = {"):
            line = BIG_BUDGET
        elif line.startswith(("queries_per_minute", "deadline_slack", "deadline_margin_ms")):
            continue
        lines.append(line)
        if line.strip() == "[server]":
            lines += server
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the server


def _start_server(db: Path, policy: Path, auth: Path, home: Path, workers: int | None,
                  code: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "PYTHONPATH": str(code) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(home / "server.log", "wb")
    extra = [] if workers is None else ["--workers", str(workers)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpsql", "serve", "--db", str(db), "--policy", str(policy),
         "--ledger", str(home / "ledger.sqlite"), "--auth", str(auth), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=log, env=env, cwd=str(home),
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
                try:
                    run(sql, epsilon=EPSILON)
                except dpsql.QueryFailed:  # an overrun (a loaded machine): timed like an answer
                    pass
                if i >= 0:
                    out.append(time.perf_counter() - start)
    return network, embedded


def _client_worker(locations: list[str], token: str, commands: Any, barrier: Any, out: Any,
                   shape: str = "count") -> None:
    """Warm up, say so, then for each command (server, fresh, seconds): wait for the others
    at the barrier, query that server back to back for ``seconds``, report; ``None`` ends."""
    tag = f"w{os.getpid()}"
    i = 0
    clients = [dpsql.Client(location, token=token) for location in locations]
    try:
        for client in clients:
            for j in range(6):  # warm: the server verifies the token once, makes the Connection
                try:
                    client.execute(new_query(tag + "warm", j, shape) if j < 5 else SHAPES[shape].format(alias="n"),
                                   epsilon=EPSILON)
                except dpsql.QueryFailed:  # an overrun on a loaded machine: counted in the phases
                    pass
        # The client process's own full garbage collections (its imports: pyarrow, duckdb,
        # sqlglot, ~150,000 tracked objects) stopped it 70-110 ms each, once or twice a run,
        # and showed in these latencies as if the server's: set apart, as a server's are.
        settle()
        out.put(("ready", os.getpid()))
        while (command := commands.get()) is not None:
            server, fresh, seconds = command
            client = clients[server]
            latencies: list[float] = []
            errors = 0
            barrier.wait(300)
            stop_at = time.perf_counter() + seconds
            while time.perf_counter() < stop_at:
                i += 1
                sql = new_query(tag, i, shape) if fresh else SHAPES[shape].format(alias="n")
                start = time.perf_counter()
                try:
                    client.execute(sql, epsilon=EPSILON)
                except dpsql.Error:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - start)
            out.put((latencies, errors))
    finally:
        for client in clients:
            client.close()


def _cpu_seconds(pid: int, clients: Collection[int] = ()) -> tuple[float, float, float]:
    """User + system CPU seconds of a server process, of its children alive now (its
    workers), and of the ``clients`` processes: three figures, so the report can say where a
    query's CPU goes."""
    tick = os.sysconf("SC_CLK_TCK")
    server = workers = others = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / tick
        if int(entry) == pid:
            server += used
        elif int(entry) in clients:  # before the children: a client may be one
            others += used
        elif int(fields[1]) == pid:  # fields[1]: the parent's pid
            workers += used
    return server, workers, others


def _throughput(locations: list[str], tokens: list[str], seconds: float, kinds: list[tuple[str, bool]],
                rounds: int, server_pids: list[int], shape: str = "count") -> list[dict[str, dict[str, float]]]:
    """Per server, per kind: throughput, latency quantiles, server CPU per query, errors
    and the load average at the start of each phase. Phases alternate: round by round,
    kind by kind, server by server."""
    context = mp.get_context("spawn")
    out = context.Queue()
    barrier = context.Barrier(len(tokens) + 1)
    commands = [context.Queue() for _ in tokens]
    workers = [context.Process(target=_client_worker, args=(locations, t, c, barrier, out, shape))
               for t, c in zip(tokens, commands)]
    for w in workers:
        w.start()
    for _ in workers:  # every client imported, connected and warmed up
        out.get(timeout=300)
    phase = seconds / rounds
    servers = range(len(locations))
    gathered: list[dict[str, list[float]]] = [{kind: [] for kind, _ in kinds} for _ in servers]
    errors = [dict.fromkeys(gathered[0], 0) for _ in servers]
    cpu: list[dict[str, list[float]]] = [{kind: [0.0, 0.0, 0.0] for kind, _ in kinds} for _ in servers]
    loads: list[dict[str, list[float]]] = [{kind: [] for kind, _ in kinds} for _ in servers]
    for _ in range(rounds):
        for kind, fresh in kinds:
            for server in servers:
                for c in commands:
                    c.put((server, fresh, phase))
                loads[server][kind].append(os.getloadavg()[0])
                barrier.wait(300)
                clients = [w.pid for w in workers if w.pid is not None]
                before = _cpu_seconds(server_pids[server], clients)
                results = [out.get(timeout=phase + 300) for _ in workers]
                after = _cpu_seconds(server_pids[server], clients)
                for j in range(3):
                    cpu[server][kind][j] += after[j] - before[j]
                for lats, errs in results:
                    gathered[server][kind] += lats
                    errors[server][kind] += errs
    for c in commands:
        c.put(None)
    for w in workers:
        w.join(30)
    reports = []
    for server in servers:
        report = {}
        for kind, _ in kinds:
            latencies = sorted(gathered[server][kind])
            report[kind] = {
                "queries": len(latencies),
                "errors": errors[server][kind],
                "qps": len(latencies) / seconds,
                "p50_ms": 1e3 * _quantile(latencies, 0.50),
                "p99_ms": 1e3 * _quantile(latencies, 0.99),
                "max_ms": 1e3 * latencies[-1] if latencies else float("nan"),
                "cpu_ms": 1e3 * sum(cpu[server][kind][:2]) / max(1, len(latencies) + errors[server][kind]),
                "cpu_server_ms": 1e3 * cpu[server][kind][0] / max(1, len(latencies) + errors[server][kind]),
                "cpu_workers_ms": 1e3 * cpu[server][kind][1] / max(1, len(latencies) + errors[server][kind]),
                "cpu_clients_ms": 1e3 * cpu[server][kind][2] / max(1, len(latencies) + errors[server][kind]),
                "load": statistics.mean(loads[server][kind]),
            }
        reports.append(report)
    return reports


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---------------------------------------------------------------- the report


def _report(args: argparse.Namespace, runs: dict[str, dict[str, object]],
            load_before: tuple[float, float, float], load_after: tuple[float, float, float], codes: list[int],
            models: list[str], overruns: list[str], sources: list[str]) -> str:
    compared = len(sources) > 1
    lines = [
        f"## Server: {args.clients} clients, small queries ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)}. "
        f"`{SHAPES[args.shape].format(alias='n_...')}` on {args.rows:,} rows, epsilon={EPSILON:g}, file ledger. "
        "*New queries* each have a new alias, so each is planned, run, noised, charged (ledger "
        "fsync) and stored for repeats (answers-file fsync); *repeats* ask one query again and "
        "again, answered free from the stored answer. Throughput phases interleaved: "
        f"{args.rounds} rounds of new then repeats{' (each on both servers, alternating)' if compared else ''}; "
        f"server `--workers {args.workers or 'default (one per core)'}`; "
        f"deadline model {models[0]}; overruns {overruns[0]}.",
    ]
    if compared:
        lines[-1] += (f" Compared server: code from `{sources[1]}`, `--workers "
                      f"{args.compare_workers or args.workers or 'default'}`, deadline model {models[1]}, overruns "
                      f"{overruns[1]}.")
    lines += [
        "",
        "| measure | " + " | ".join(runs) + " | goal |",
        "|---|" + "---|" * len(runs) + "---|",
    ]
    rows: list[tuple[str, list[str], str]] = [
        (f"throughput, {args.clients} client processes, {args.seconds:g} s", [], ">= 300 q/s new, 1,000 repeats"),
        ("latency p50 / p99 / max under that load", [], "p99 <= 50 ms"),
        ("CPU per query: server + workers (each; clients apart)", [], ""),
        ("load average (1 min) at the phases' starts, mean", [], ""),
    ]
    if compared:
        rows += [
            ("compared server: throughput", [], ""),
            ("compared server: latency p50 / p99 / max", [], ""),
            ("compared server: CPU per query", [], ""),
            ("compared server: load at its phases' starts", [], ""),
            ("throughput, this / compared", [], ""),
        ]
    rows += [
        (f"one client alone, median of {args.repeat}", [], ""),
        (f"embedded API (`dpsql.connect`), median of {args.repeat}", [], ""),
        ("network path overhead (difference)", [], ""),
        ("embedded pipeline's share of a network query", [], ""),
    ]
    for run in runs.values():
        cells = _cells(run["throughput"])  # type: ignore[arg-type]
        if compared:
            other: dict[str, float] = run["compared"]  # type: ignore[assignment]
            cells += _cells(other)
            cells.append(f"{run['throughput']['qps'] / max(other['qps'], 1e-9):.2f}x")  # type: ignore[index]
        net = 1e3 * statistics.median(run["network"])  # type: ignore[arg-type]
        emb = 1e3 * statistics.median(run["embedded"])  # type: ignore[arg-type]
        cells += [
            f"{net:.2f} ms",
            f"{emb:.2f} ms",
            f"{net - emb:.2f} ms ({net / emb:.2f}x)",
            f"{100 * emb / net:.0f}%",
        ]
        for row, cell in zip(rows, cells):
            row[1].append(cell)
    lines += [f"| {name} | " + " | ".join(cells) + f" | {goal} |" for name, cells, goal in rows]
    lines += ["", f"Server exit codes on SIGTERM: {', '.join(map(str, codes))}."]
    return "\n".join(lines)


def _cells(t: dict[str, float]) -> list[str]:
    return [
        f"{t['qps']:.0f} q/s ({t['queries']:.0f} queries, {t['errors']:.0f} errors)",
        f"{t['p50_ms']:.1f} / {t['p99_ms']:.1f} / {t['max_ms']:.1f} ms",
        f"{t['cpu_ms']:.2f} ms ({t['cpu_server_ms']:.2f} server, {t['cpu_workers_ms']:.2f} workers; "
        f"clients {t['cpu_clients_ms']:.2f})",
        f"{t['load']:.1f}",
    ]


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    raise SystemExit(main())

"""Timing side channels, measured from outside: can an analyst tell D from D' by the clock?

``D`` holds ordinary units; ``D'`` is ``D`` plus one target unit whose values were chosen
to make queries slower (a 100,000-character ``note`` for a guarded LIKE; a city that it
brings to the partition-selection threshold, so that one more group is often released). For each attack shape the script sends ``--runs``
fresh (charged, non-repeat) queries to a ``dpsql serve`` of D and of D', interleaved one
by one, through each front (Arrow Flight with ``dpsql.Client``, Postgres with psycopg 3),
times each request at the client, and reports:

- the two-sample Kolmogorov-Smirnov p-value of the D and D' times (the issue asks p > 0.01);
- a one-run threshold classifier: the threshold and direction that best separate the
  first half of the runs, scored on the second half (the issue asks at most 60%);
- the median answer time, and the median time of the same query run embedded without a
  deadline, so the latency the deadline adds is shown next to it;
- the same figures embedded *without* the deadline, to show that each attack does tell the
  neighbours apart when undefended (the control: the test has power).

Token checks: ``--runs`` refusals of a wrong secret for a real token id against as many
for an unknown id, timed at the verifier, KS-tested the same way.

    python benchmarks/bench_timing.py --runs 200 --write   # appends to benchmarks/RESULTS.md

``--workers N`` runs each server with N worker processes (N deadline slots; default: the
server's own, one per core). ``--busy`` adds the contention caveat of several slots
(:mod:`dpsql.timing`, "CPU contention"): during the attacks a second client per server sends
the guarded LIKE back to back, so one worker is busy with a run that is heavy only on D'
while the attack's query runs in another; the attack must still not tell D from D'.

The machine's speed is measured once (``dpsql.calibration.calibrate``) and pinned in both servers'
policies (``[server] deadline_base_ms``, ``deadline_ms_per_million_rows``): the comparison
is of two databases behind one server configuration.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import duckdb  # noqa: E402
import psycopg  # noqa: E402
from scipy import stats  # noqa: E402

import dpsql  # noqa: E402
from dpsql.auth import TokenVerifier, create_token  # noqa: E402
from dpsql.pgwire.scram import store_verifier  # noqa: E402
from dpsql.calibration import calibrate  # noqa: E402
from dpsql.timing import TimingModel  # noqa: E402
from _shared import append_results, cpu_model, ram_gib  # noqa: E402

UNITS = 20_000
POLICY = """
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-5
default_epsilon = 0.5
[budget]
default = { epsilon = 1e9, delta = 0.5 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.t.columns]
x = { bounds = [0, 100] }
zip = { access = "filter" }
note = { access = "filter" }
city = { access = "group" }
[server]
queries_per_minute = 1000000
"""

#: (name, SQL, delta): the attack shapes of the issue.
SHAPES = [
    ("guarded LIKE", "SELECT COUNT(*) AS n FROM t WHERE CASE WHEN zip = '99999' THEN note ELSE '' END LIKE '"
     + "%a" * 40 + "%b'", 0.0),
    ("partition selection", "SELECT city, COUNT(*) AS n FROM t GROUP BY city", 1e-6),
    ("plain COUNT", "SELECT COUNT(*) AS n FROM t", 0.0),
]


def make_databases(home: Path) -> tuple[Path, Path]:
    """D and D'. D has a city 'Edge' with one unit fewer than the partition-selection
    threshold; the target lives there, so in D' that group sits exactly at the threshold
    (released about half the time instead of rarely)."""
    paths = []
    threshold = None
    for name, extra in (("d", False), ("d2", True)):
        path = home / f"{name}.duckdb"
        con = duckdb.connect(str(path))
        con.execute(f"CREATE TABLE t AS SELECT range AS u, (range % 100)::DOUBLE AS x, 'z' || range AS zip, "
                    f"'n' AS note, 'c' || (range % 50) AS city FROM range({UNITS})")
        if threshold is None:
            with dpsql.connect(con, policy=dpsql.policy.parse_policy(POLICY)) as probe:
                selection = probe.plan(SHAPES[1][1], epsilon=0.5, delta=SHAPES[1][2]).selection
                assert selection is not None
                threshold = selection.threshold
        con.execute(f"INSERT INTO t SELECT {UNITS} + range, 1.0, 'e' || range, 'n', 'Edge' FROM range({threshold - 1})")
        if extra:  # the target: a long note, and the unit that brings 'Edge' to the threshold
            con.execute("INSERT INTO t VALUES (99999999, 42.0, '99999', repeat('a', 100000), 'Edge')")
        con.close()
        paths.append(path)
    return paths[0], paths[1]


def start_server(db: Path, home: Path, model: TimingModel,
                 workers: int | None = None) -> tuple[subprocess.Popen[bytes], list[str], str, Path]:
    home.mkdir(parents=True, exist_ok=True)
    policy = home / "policy.toml"
    policy.write_text(POLICY + f"deadline_base_ms = {1e3 * model.base!r}\n"
                      f"deadline_ms_per_million_rows = {1e9 * model.per_row!r}\n")
    token = create_token(home / "auth.toml", "mallory")
    store_verifier(home / "auth.toml", "mallory", token)  # for the Postgres front's SCRAM login
    log = home / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dpsql", "serve", "--db", str(db), "--policy", str(policy),
             "--ledger", str(home / "ledger.sqlite"), "--auth", str(home / "auth.toml"), "--port", "0",
             "--pg-port", "0", *([] if workers is None else ["--workers", str(workers)])],
            stdout=subprocess.PIPE, stderr=err, env=env,
        )
    assert proc.stdout is not None
    addresses = []
    for _ in range(2):  # Flight, then Postgres
        line = proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            proc.kill()
            raise SystemExit(f"the server did not start: {line!r}; see {log}")
        addresses.append(line.split()[-1])
    return proc, addresses, token, log


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def model_of(log: Path) -> str:
    match = re.search(r"deadlines: (TimingModel\(.*\))", log.read_text())
    return match.group(1) if match else "?"


def timed(call: object) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        call()  # type: ignore[operator]
        outcome = "answer"
    except dpsql.Error as exc:
        outcome = type(exc).__name__
    except psycopg.Error as exc:
        outcome = f"SQLSTATE {exc.sqlstate}"
    return time.perf_counter() - started, outcome


class PgClient:
    """The Postgres front through psycopg 3, with dpsql's per-query comment hint."""

    def __init__(self, address: str, token: str) -> None:
        host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
        self._conn = psycopg.connect(host=host, port=int(port), user="mallory", password=token, dbname="dpsql",
                                     autocommit=True)

    def execute(self, sql: str, *, epsilon: float, delta: float) -> None:
        with self._conn.cursor() as cur:
            cur.execute(f"/* dpsql: epsilon={epsilon!r}, delta={delta!r} */ {sql}")
            cur.fetchall()

    def close(self) -> None:
        self._conn.close()


def separability(a: list[float], b: list[float]) -> tuple[float, float]:
    """(KS p-value over all runs, held-out accuracy of the best one-run threshold)."""
    p = float(stats.ks_2samp(a, b).pvalue)
    half = len(a) // 2
    train = sorted([(t, 0) for t in a[:half]] + [(t, 1) for t in b[:half]])
    best, threshold, above = -1.0, 0.0, 1
    for i in range(len(train) + 1):  # a threshold between consecutive training times
        cut = train[i - 1][0] if i else train[0][0] - 1
        right = sum(label for _, label in train[i:]) + sum(1 - label for _, label in train[:i])
        for direction, score in ((1, right), (0, len(train) - right)):
            if score > best:
                best, threshold, above = score, cut, direction
    test = [(t, 0) for t in a[half:]] + [(t, 1) for t in b[half:]]
    correct = sum((t > threshold) == bool(above) if label == 1 else (t > threshold) != bool(above)
                  for t, label in test)
    return p, correct / len(test)


class Busy:
    """One background client per server sending the guarded LIKE (heavy on D' only) back to back."""

    def __init__(self, servers: list[tuple[str, str]]) -> None:
        import threading

        self._stop = threading.Event()
        self.sent = 0
        self._threads = [threading.Thread(target=self._run, args=(address, token, k), daemon=True)
                         for k, (address, token) in enumerate(servers)]
        for t in self._threads:
            t.start()

    def _run(self, address: str, token: str, k: int) -> None:
        with dpsql.Client(address, token=token) as client:
            i = 0
            while not self._stop.is_set():
                i += 1
                try:
                    client.execute(SHAPES[0][1], epsilon=0.25 + (1_000_000 * k + i) * 1e-9)
                except dpsql.Error:
                    pass
                self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def attack(shape: tuple[str, str, float], clients: list[object], runs: int, offset: int) -> dict[str, object]:
    name, sql, delta = shape
    times: list[list[float]] = [[], []]
    outcomes: list[dict[str, int]] = [{}, {}]
    for i in range(runs):
        for side in (0, 1) if i % 2 == 0 else (1, 0):  # interleaved, order alternating
            eps = 0.5 + (offset + i) * 1e-6  # a new query every time: no free repeat
            t, outcome = timed(lambda: clients[side].execute(sql, epsilon=eps, delta=delta))  # type: ignore[attr-defined]
            times[side].append(t)
            outcomes[side][outcome] = outcomes[side].get(outcome, 0) + 1
    p, accuracy = separability(times[0], times[1])
    return {"name": name, "p": p, "accuracy": accuracy, "median": [statistics.median(t) for t in times],
            "outcomes": [dict(sorted(o.items())) for o in outcomes]}


def embedded(shape: tuple[str, str, float], dbs: tuple[Path, Path], home: Path, runs: int) -> dict[str, object]:
    """The same attack on embedded connections without a deadline (the control)."""
    name, sql, delta = shape
    policy = dpsql.policy.parse_policy(POLICY)
    conns = [dpsql.connect(db, policy=policy, analyst="mallory", repeats=False) for db in dbs]
    try:
        times: list[list[float]] = [[], []]
        for i in range(runs):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                t, _ = timed(lambda: conns[side].execute(sql, epsilon=0.5, delta=delta))
                times[side].append(t)
        p, accuracy = separability(times[0], times[1])
        return {"name": name, "p": p, "accuracy": accuracy, "median": [statistics.median(t) for t in times]}
    finally:
        for conn in conns:
            conn.close()


def tokens(home: Path, runs: int) -> dict[str, object]:
    path = home / "tokens.toml"
    token = create_token(path, "alice")
    verifier = TokenVerifier(path)
    token_id = token.partition(".")[0]
    times: list[list[float]] = [[], []]
    for i in range(runs):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            attempt = f"{token_id}.wrong{i}" if side == 0 else f"{os.urandom(6).hex()}.wrong{i}"
            t, _ = timed(lambda: verifier.analyst_for(attempt))
            times[side].append(t)
    p, accuracy = separability(times[0], times[1])
    return {"p": p, "accuracy": accuracy, "median": [statistics.median(t) for t in times]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=None, help="dpsql serve --workers (default: one per core)")
    parser.add_argument("--busy", action="store_true", help="a concurrent guarded-LIKE client per server")
    parser.add_argument("--write", action="store_true", help="append the report to benchmarks/RESULTS.md")
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        dbs = make_databases(home)
        model = calibrate(pipeline=dpsql.Connection)  # once, for both servers: one configuration, two databases
        servers = [start_server(db, home / f"server{i}", model, args.workers) for i, db in enumerate(dbs)]
        busy = Busy([(addresses[0], token) for _, addresses, token, _ in servers]) if args.busy else None
        try:
            models = [model_of(log) for _, _, _, log in servers]
            clients = [dpsql.Client(addresses[0], token=token) for _, addresses, token, _ in servers]
            served = [attack(shape, clients, args.runs, 10_000 * k) for k, shape in enumerate(SHAPES)]
            pg = [PgClient(addresses[1], token) for _, addresses, token, _ in servers]
            try:
                served_pg = [attack(shape, pg, args.runs, 10_000 * (k + 10)) for k, shape in enumerate(SHAPES)]
            finally:
                for client in pg:
                    client.close()
        finally:
            if busy is not None:
                busy.stop()
            for proc, *_ in servers:
                stop_server(proc)
        control = [embedded(shape, dbs, home, args.runs) for shape in SHAPES]
        token_figures = tokens(home, args.runs)
    report = render(args, served, served_pg, control, token_figures, models, load_before, os.getloadavg(),
                    time.time() - started)
    print(report)
    if args.write:
        append_results(ROOT / "benchmarks" / "RESULTS.md", report)
    return 0


def render(args: argparse.Namespace, served: list[dict[str, object]], served_pg: list[dict[str, object]],
           control: list[dict[str, object]],
           token_figures: dict[str, object], models: list[str], load_before: tuple[float, ...],
           load_after: tuple[float, ...], seconds: float) -> str:
    lines = [
        f"## Timing side channels ({dt.date.today().isoformat()}, `python benchmarks/bench_timing.py --runs {args.runs}`)",
        "",
        f"{cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; {seconds:.0f} s. D: {UNITS:,} units; D' = D plus one target unit. "
        f"{args.runs} fresh queries per database, interleaved; times at the client. Server workers: "
        f"{args.workers or 'default (one per core)'}; busy neighbour (guarded LIKE in another worker): "
        f"{'yes' if args.busy else 'no'}.",
        "",
        f"Deadline models of the two servers (must agree): `{models[0]}` / `{models[1]}`.",
        "",
        "| attack | front | KS p | one-run classifier | median D / D' | "
        "embedded, no deadline: KS p | classifier | median D / D' | added latency |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for front, rows in (("Flight", served), ("Postgres", served_pg)):
        for s, c in zip(rows, control):
            ms, mc = s["median"], c["median"]  # type: ignore[index]
            lines.append(
                f"| {s['name']} | {front} | {s['p']:.3f} | {100 * s['accuracy']:.0f}% | "  # type: ignore[index]
                f"{1e3 * ms[0]:.1f} / {1e3 * ms[1]:.1f} ms | "  # type: ignore[index]
                f"{c['p']:.2g} | {100 * c['accuracy']:.0f}% | {1e3 * mc[0]:.1f} / {1e3 * mc[1]:.1f} ms | "  # type: ignore[index]
                f"{1e3 * (ms[0] - mc[0]):.0f} ms |"  # type: ignore[index]
            )
    mt = token_figures["median"]
    lines += [
        "",
        "Outcomes through the server: " + "; ".join(
            f"{s['name']} ({front}): D {s['outcomes'][0]}, D' {s['outcomes'][1]}"  # type: ignore[index]
            for front, rows in (("Flight", served), ("Postgres", served_pg)) for s in rows),
        "",
        f"Token checks (wrong secret for a real id vs an unknown id, {args.runs} each): KS p "
        f"{token_figures['p']:.3f}, classifier {100 * token_figures['accuracy']:.0f}%, medians "  # type: ignore[operator]
        f"{1e3 * mt[0]:.1f} / {1e3 * mt[1]:.1f} ms.",  # type: ignore[index]
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

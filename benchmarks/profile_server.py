"""Where a server's CPU goes per fresh query: cProfile in the server process and its workers.

Runs the Flight server of ``dpsql serve --workers N`` in this process over the 1,000-row demo
table of ``bench_server.py`` (same policy, a file ledger), with cProfile enabled around every
``DoGet`` handler (each gRPC thread its own profiler, merged at the end) and in each worker's
main thread (the one that answers queries); 8 client processes send new queries back to back
for ``--seconds``. Prints the CPU seconds of the server process and of its workers per query
(from ``/proc``, profiling included: read the split, not the absolute figure) and the top
functions of each side by cumulative time.

    python benchmarks/profile_server.py --seconds 10 --workers 2 --top 40

Profiling slows Python several-fold; the figures to quote come from ``bench_server.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.flight as flight  # noqa: E402

import dpsql  # noqa: E402
from dpsql.auth import TokenVerifier, create_token  # noqa: E402
from dpsql.demo import make_demo_database  # noqa: E402
from dpsql.flightfront import DpsqlFlightServer  # noqa: E402
from dpsql.service import Service  # noqa: E402

EPSILON = 0.001


def profiled_open(*args: Any, **kwargs: Any) -> Service:
    """A worker's ``Service.open`` that profiles the worker's main thread and writes the
    stats beside the ledger when the worker closes its service."""
    service = Service.open(*args, **kwargs)
    profile = cProfile.Profile(time.thread_time)
    close = service.close
    out = f"{args[2]}.worker{os.getpid()}.prof"

    def closing() -> None:
        profile.disable()
        profile.dump_stats(out)
        close()

    service.close = closing  # type: ignore[method-assign]
    profile.enable()
    return service


class ProfiledServer(DpsqlFlightServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profiles: list[cProfile.Profile] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.RecordBatchStream:
        profile = getattr(self._local, "profile", None)
        if profile is None:
            profile = self._local.profile = cProfile.Profile(time.thread_time)
            with self._lock:
                self.profiles.append(profile)
        profile.enable()
        try:
            return super().do_get(context, ticket)
        finally:
            profile.disable()


def client(location: str, token: str, seconds: float, start: Any, out: Any, repeats: bool = False) -> None:
    tag = f"p{os.getpid()}"
    done = 0
    with dpsql.Client(location, token=token) as c:
        for j in range(5):
            try:
                c.execute(f"SELECT COUNT(*) AS n_{tag}warm{j} FROM visits", epsilon=EPSILON)
            except dpsql.QueryFailed:
                pass
        start.wait()
        stop = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < stop:
            i += 1
            try:
                c.execute("SELECT COUNT(*) AS n FROM visits" if repeats else f"SELECT COUNT(*) AS n_{tag}_{i} FROM visits",
                          epsilon=EPSILON)
                done += 1
            except dpsql.QueryFailed:
                pass
    out.put(done)


def cpu(pid: int, clients: list[int]) -> tuple[float, float]:
    """CPU seconds of this process and of its children but the clients (bench_server's reader)."""
    from bench_server import _cpu_seconds  # noqa: PLC0415

    own, children, _ = _cpu_seconds(pid, clients)
    return own, children


def main() -> int:
    from bench_server import _bench_policy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--no-profile", action="store_true", help="the CPU split only, unprofiled")
    parser.add_argument("--repeats", action="store_true", help="one query again and again (free repeats), not new ones")
    parser.add_argument("--slack", type=float, default=None, help="[server] deadline_slack")
    parser.add_argument("--deadline-base-ms", type=float, default=None, help="pin the speed model (with the next)")
    parser.add_argument("--deadline-ms-per-million-rows", type=float, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-profile-server-") as tmp:
        home = Path(tmp)
        db = home / "tiny.duckdb"
        make_demo_database(db, rows=1000, units=100)
        policy = home / "policy.toml"
        policy.write_text(_bench_policy(args))
        auth = home / "auth.toml"
        tokens = [create_token(auth, f"a{i}") for i in range(args.clients)]
        ledger = home / "ledger.sqlite"
        import dpsql.service as service_module

        if not args.no_profile:  # the workers open their service with profiled_open
            original = service_module.WorkerSpec

            def spec(opener: Any, *rest: Any) -> Any:
                return original(profiled_open, *rest)

            service_module.WorkerSpec = spec  # type: ignore[misc,assignment]
        service = Service.open(str(db), str(policy), str(ledger), workers=args.workers)
        kind = DpsqlFlightServer if args.no_profile else ProfiledServer
        server = kind(flight.Location.for_grpc_tcp("127.0.0.1", 0), service, TokenVerifier(auth))
        location = f"grpc://127.0.0.1:{server.port}"
        context = mp.get_context("spawn")
        start = context.Barrier(args.clients + 1)
        out = context.Queue()
        procs = [context.Process(target=client, args=(location, t, args.seconds, start, out, args.repeats)) for t in tokens]
        for p in procs:
            p.start()
        start.wait()
        pids = [p.pid for p in procs if p.pid is not None]
        before = cpu(os.getpid(), pids)
        began = time.perf_counter()
        answered = sum(out.get() for _ in procs)
        elapsed = time.perf_counter() - began
        after = cpu(os.getpid(), pids)
        for p in procs:
            p.join()
        server.shutdown()
        service.close()
        print(f"{answered} answers in {elapsed:.1f} s ({answered / elapsed:.0f} q/s), load {os.getloadavg()[0]:.2f}; "
              f"CPU per answer: server {1e3 * (after[0] - before[0]) / answered:.2f} ms, "
              f"workers {1e3 * (after[1] - before[1]) / answered:.2f} ms")
        if args.no_profile:
            return 0
        stats = pstats.Stats(*[p for p in server.profiles if p.getstats()], stream=(text := io.StringIO()))
        stats.sort_stats("cumulative").print_stats(args.top)
        print("## server process (DoGet handlers)\n" + text.getvalue())
        worker_files = sorted(str(f) for f in home.glob("ledger.sqlite.worker*.prof"))
        if worker_files:
            stats = pstats.Stats(*worker_files, stream=(text := io.StringIO()))
            stats.sort_stats("cumulative").print_stats(args.top)
            print("## workers\n" + text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

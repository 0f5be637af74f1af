"""What a charge costs: fdatasync calls and milliseconds per :meth:`dpsql.Ledger.charge`.

Every new query commits one charge before its answer leaves (``BEGIN IMMEDIATE`` ... ``COMMIT``
on a SQLite file in WAL mode, ``synchronous=FULL``), and a new query on the server also
stores its answer for free repeats (``<ledger>.answers``, ``synchronous=NORMAL``: see
:mod:`dpsql.repeats` for why that file need not be durable). This script measures, in a
fresh directory next to the ledger's usual place (``--dir``, default the temp directory):

- ``charge``: N charges one after another from one process, as a worker does;
- ``charge, 4 processes``: four processes charging the same file at once (the server's
  workers), charges per second over all of them;
- for comparison only, the same single-process loop with ``synchronous=NORMAL`` on the
  ledger, which dpsql does **not** use: a power failure could then lose a charge whose
  answer was already released, and the analyst would have spent budget the ledger does
  not show.

fdatasync calls are counted with ``strace -f -c`` when strace is installed.

    python benchmarks/bench_ledger.py --charges 500
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpsql.privacy import Charge, Ledger  # noqa: E402

BUDGET = SimpleNamespace(epsilon=1e9, delta=1e-5)


def charges(path: str, n: int, analyst: str, synchronous: str | None = None) -> list[float]:
    """``n`` charges of epsilon 0.001; the wall time of each."""
    times = []
    with Ledger(path) as ledger:
        if synchronous is not None:
            ledger._conn.execute(f"PRAGMA synchronous = {synchronous}")
        for i in range(n):
            start = time.perf_counter()
            ledger.charge(analyst, BUDGET, Charge(0.001, 0.0, f"SELECT COUNT(*) AS n{i} FROM t"))
            times.append(time.perf_counter() - start)
    return times


def _child(path: str, n: int, analyst: str, go: object, out: object, flock: bool = True) -> None:
    if not flock:  # the comparison: writers queue on SQLite's busy handler alone
        import dpsql.privacy.ledger as module

        module._open_lock_file = lambda _path: None  # type: ignore[assignment]
    with Ledger(path):
        pass
    go.wait()  # type: ignore[attr-defined]
    out.put(charges(path, n, analyst))  # type: ignore[attr-defined]


def parallel(path: str, n: int, processes: int, flock: bool = True) -> float:
    """Charges per second with ``processes`` processes charging one file at once."""
    context = mp.get_context("spawn")
    go, out = context.Event(), context.Queue()
    children = [context.Process(target=_child, args=(path, n, f"p{k}", go, out, flock)) for k in range(processes)]
    for c in children:
        c.start()
    time.sleep(2.0)  # every child imported and opened the ledger
    start = time.perf_counter()
    go.set()
    for _ in children:
        out.get(timeout=600)
    elapsed = time.perf_counter() - start
    for c in children:
        c.join(30)
    return processes * n / elapsed


def inner(args: argparse.Namespace) -> None:
    directory = Path(tempfile.mkdtemp(dir=args.dir, prefix="dpsql-bench-ledger-"))
    try:
        full = charges(str(directory / "full.sqlite"), args.charges, "alice")
        print(f"charge, one process, synchronous=FULL (dpsql): median {1e3 * statistics.median(full):.3f} ms, "
              f"p99 {1e3 * sorted(full)[int(0.99 * len(full))]:.3f} ms over {len(full)}")
        if args.compare:
            normal = charges(str(directory / "normal.sqlite"), args.charges, "alice", "NORMAL")
            print(f"charge, one process, synchronous=NORMAL (not used; comparison): median "
                  f"{1e3 * statistics.median(normal):.3f} ms")
        rates: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):  # interleaved: the writers' flock queue, then SQLite's busy handler alone
            for flock in (True, False):
                rates[flock].append(parallel(str(directory / f"parallel{r}{flock}.sqlite"), args.charges // 4, 4, flock))
        for flock, label in ((True, "flock queue (dpsql)"), (False, "busy handler alone")):
            print(f"charge, 4 processes on one file (FULL), {label}: "
                  + ", ".join(f"{x:.0f}" for x in rates[flock]) + " charges/s")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=500)
    parser.add_argument("--dir", default=None, help="where the ledger files go (its disk is what is measured)")
    parser.add_argument("--compare", action="store_true", help="also time synchronous=NORMAL (not used by dpsql)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the 4-process comparison")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    print(f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.inner or shutil.which("strace") is None:
        inner(args)
        return 0
    with tempfile.NamedTemporaryFile(suffix=".strace") as trace:
        command = [sys.executable, __file__, "--inner", "--charges", str(args.charges), "--rounds", str(args.rounds)]
        command += [] if args.dir is None else ["--dir", args.dir]
        subprocess.run(["strace", "-f", "-c", "-e", "trace=fdatasync,fsync", "-o", trace.name, *command], check=True)
        counts = {line.split()[-1]: int(line.split()[3]) for line in Path(trace.name).read_text().splitlines()
                  if line.split() and line.split()[-1] in ("fdatasync", "fsync")}
    total = args.charges + 2 * args.rounds * 4 * (args.charges // 4)
    print(f"fdatasync calls: {counts.get('fdatasync', 0)} for {total} charges "
          f"({counts.get('fdatasync', 0) / total:.2f} per charge; fsync {counts.get('fsync', 0)}); "
          "strace slows each call, so take the times from a run without it: --inner")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a server's front remembers, and what a full garbage collection of it costs.

A server's front keeps one connection per analyst; each remembers plans and templates
(``dpsql.remembered``, ``dpsql.plancache``), and every full collection of the process scans
them all while it hands queries to workers and releases answers at their deadlines. This
opens ``--analysts`` connections on a 1,000-row demo table, has each plan ``--templates``
questions of distinct templates (a GROUP BY, a filtered COUNT, a SUM by device, two keys,
with more and more conjuncts), then counts the objects the collector tracks beyond those
frozen before, and times ``gc.collect()`` (the fastest of 5).

    python benchmarks/front_gc.py --analysts 64 --templates 64
    python benchmarks/front_gc.py --analysts 8 --templates 64 --compare /tmp/old-checkout

``--compare DIR`` runs the same in a subprocess on the dpsql code in ``DIR`` too (another
checkout), and prints both lines.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = (
    "SELECT region, COUNT(*) AS n, AVG(income) FROM visits WHERE {} GROUP BY region",
    "SELECT COUNT(*) AS n FROM visits WHERE region = 'north' AND {}",
    "SELECT device, SUM(income) AS s FROM visits WHERE {} GROUP BY device",
    "SELECT region, device, COUNT(*) AS n FROM visits WHERE {} GROUP BY region, device",
)


def measure(analysts: int, templates: int) -> str:
    import dpsql
    from dpsql.demo import make_demo_database

    with tempfile.TemporaryDirectory(prefix="dpsql-front-gc-") as folder:
        db = os.path.join(folder, "demo.duckdb")
        make_demo_database(db, rows=1000, units=100)
        conns = [dpsql.connect(db, policy=str(ROOT / "policies" / "demo.toml"), analyst=f"a{i}", ledger=None)
                 for i in range(analysts)]
        gc.collect()
        gc.freeze()
        frozen = len(gc.get_objects())
        started = time.perf_counter()
        for conn in conns:
            for k in range(templates):
                conditions = " AND ".join(f"age <> {100 + j}" for j in range(k // len(QUESTIONS) + 1))
                conn.plan(QUESTIONS[k % len(QUESTIONS)].format(conditions), epsilon=0.01)
        planning = (time.perf_counter() - started) / (analysts * templates)
        for _ in range(3):  # what stays is what is remembered (and keys untracked)
            gc.collect()
        tracked = len(gc.get_objects()) - frozen
        times = []
        for _ in range(5):
            started = time.perf_counter()
            gc.collect()
            times.append(time.perf_counter() - started)
        for conn in conns:
            conn.close()
    return (f"{analysts} analysts x {templates} templates: {tracked:,} tracked objects, full collection "
            f"{1e3 * min(times):.1f} ms; planning {1e3 * planning:.2f} ms a question")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--analysts", type=int, default=64)
    parser.add_argument("--templates", type=int, default=64, help="distinct templates each analyst plans")
    parser.add_argument("--compare", metavar="DIR", help="also run on the dpsql code in DIR")
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # one line, this code
    args = parser.parse_args(argv)
    if args.plain:
        print(measure(args.analysts, args.templates))
        return 0
    runs = [("this", None), ("compared", args.compare)] if args.compare else [("this", None)]
    for name, code in runs:
        env = dict(os.environ)
        if code is not None:
            env["PYTHONPATH"] = str(Path(code).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
        else:
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run([sys.executable, __file__, "--plain", "--analysts", str(args.analysts),
                              "--templates", str(args.templates)], env=env, capture_output=True, text=True, check=True)
        line = next(x for x in out.stdout.splitlines() if "analysts x" in x)
        print(f"{name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``dpsql audit``: the empirical privacy audit from the command line (its arguments are
defined in :mod:`dpsql.cli`, so that ``dpsql --help`` does not load scipy).

With ``--db``, ``--policy`` and ``--query`` (repeatable) it audits the data owner's own
deployment on those queries; without them, every query shape of :data:`SHAPES` on the
synthetic demo database (100,000 rows by default) and ``policies/demo.toml``. Exit code 0: no excess found; 3: some lower bound exceeds its claim; 1: an
error (nothing audited).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsql.connection import Connection
from dpsql.errors import Error
from dpsql.policy import Policy

__all__ = ["SHAPES", "Shape", "register_demo_udfs", "run_audit"]

EXCESS_EXIT = 3


@dataclass(frozen=True)
class Shape:
    """One query audited by default."""

    name: str
    sql: str
    epsilon: float = 1.0
    delta: float = 0.0


#: The query shapes ``dpsql audit`` checks on the demo data when given no ``--query``.
SHAPES: tuple[Shape, ...] = (
    Shape("COUNT", "SELECT COUNT(*) FROM visits"),
    Shape("SUM", "SELECT SUM(income) FROM visits"),
    Shape("AVG with WHERE", "SELECT AVG(income) FROM visits WHERE age > 40"),
    Shape("GROUP BY public key", "SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region"),
    Shape("GROUP BY two keys", "SELECT region, device, COUNT(*) FROM visits GROUP BY region, device"),
    Shape("GROUP BY private key", "SELECT city, COUNT(*) FROM visits GROUP BY city", delta=1e-6),
    Shape("Gaussian COUNT", "SELECT COUNT(*) FROM visits", delta=1e-6),
    Shape("MEDIAN", "SELECT MEDIAN(age) FROM visits", delta=1e-6),
    Shape("UDF (sample and aggregate)", "SELECT trimmed_mean(income) FROM visits"),
    Shape("UDF (PTR)", "SELECT ptr_median(age) FROM visits", delta=1e-6),
)


def register_demo_udfs(conn: Connection) -> None:
    """The UDFs the demo shapes use: a trimmed mean and a median forced through PTR."""
    conn.register_udf("trimmed_mean", _trimmed_mean, bounds=(0, 250_000))
    conn.register_udf("ptr_median", lambda v: float(np.median(v)), bounds=(0, 100),
                      local_sensitivity=_median_local_sensitivity, strategy="ptr")


def _trimmed_mean(values: np.ndarray) -> float:
    lo, hi = np.quantile(values, [0.1, 0.9])
    kept = values[(values >= lo) & (values <= hi)]
    return float(kept.mean()) if kept.size else float("nan")


def _median_local_sensitivity(values: np.ndarray, k: int) -> float:
    """How far the median of ``values`` (in [0, 100]) can move when k of them change."""
    ordered = np.sort(np.clip(values, 0, 100))
    n, mid = ordered.size, ordered.size // 2  # np.median averages ordered[mid - 1] and ordered[mid] when n is even
    lo = ordered[mid - 1 - k] if mid - 1 - k >= 0 else 0.0
    hi = ordered[mid + k] if mid + k < n else 100.0
    return float(hi - lo)


def run_audit(args: argparse.Namespace, demo_database: Callable[[int], Path], demo_policy: Callable[[], Policy]) -> int:
    """Run the audits the arguments ask for and print a report; the exit code says the verdict."""
    from dpsql.audit import AuditReport, audit  # noqa: PLC0415 - scipy loads slowly

    if (args.db is None) != (args.policy is None):
        raise Error("give both --db and --policy (your deployment), or neither (the demo database)")
    if args.db is not None and not args.query:
        raise Error("name the queries to audit on your database with --query SQL (repeatable); the "
                    "built-in query shapes read the demo database's tables, so they run only without --db.")
    for option, path in (("--db", args.db), ("--neighbour", args.neighbour)):
        if path is not None and not Path(path).is_file():
            raise Error(f"{option} {path!r}: no such database file; pass the path of an existing DuckDB file.")
    database = Path(args.db) if args.db else demo_database(args.rows)
    policy = args.policy if args.policy else demo_policy()
    shapes = [Shape(f"query {i}", q, args.epsilon, args.delta or 0.0) for i, q in enumerate(args.query or (), 1)]
    if not shapes:
        shapes = [Shape(s.name, s.sql, args.epsilon or s.epsilon,
                        s.delta if args.delta is None else args.delta) for s in SHAPES]
    reports: list[AuditReport] = []
    for number, shape in enumerate(shapes, 1):
        print(f"\n[{number}/{len(shapes)}] {shape.name}", flush=True)
        samples: dict[str, list[dict[tuple[object, ...], object]]] = {}
        report = audit(database, policy, shape.sql, epsilon=shape.epsilon, delta=shape.delta or None,
                       runs=args.runs, neighbour=args.neighbour, unit_rows=args.unit_rows,
                       unit_groups=args.unit_groups, confidence=args.confidence,
                       setup=register_demo_udfs if args.db is None else None,
                       progress=sys.stderr, samples=samples)
        print(report.format(), flush=True)
        if args.histogram:
            from dpsql.audit.plot import plot_audit  # noqa: PLC0415 - matplotlib loads slowly

            path = Path(args.histogram)
            if len(shapes) > 1:
                path = path.with_name(f"{path.stem}-{number}{path.suffix}")
            plot_audit(path, report, samples)
            print(f"  histogram: {path}")
        reports.append(report)
    failed = [r for r in reports if not r.passed]
    print(f"\n{len(reports) - len(failed)} of {len(reports)} audits found no excess"
          + (f"; EXCESS in: {', '.join(r.sql for r in failed)}" if failed else ""))
    return EXCESS_EXIT if failed else 0

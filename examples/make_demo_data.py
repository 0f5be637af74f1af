"""Write the dpsql demo database (a messy ``visits`` table and a public ``regions`` table).

    python examples/make_demo_data.py --out demo.duckdb
    python examples/make_demo_data.py --out big.duckdb --rows 10000000 --units 200000

The data is synthetic and reproducible: the same arguments always give the same file.
See :mod:`dpsql.demo` for what is in it and why.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
from dpsql.demo import make_demo_database  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the dpsql demo DuckDB database.")
    parser.add_argument("--out", type=Path, default=Path("demo.duckdb"), help="file to write (replaced)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in visits")
    parser.add_argument("--units", type=int, default=100_000, help="distinct users (privacy units)")
    parser.add_argument("--seed", type=int, default=20261121, help="seed of the data generator")
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.units <= 0:
        parser.error("--rows and --units must be positive")
    start = time.perf_counter()
    make_demo_database(args.out, rows=args.rows, units=args.units, seed=args.seed)
    print(f"wrote {args.out}: {args.rows:,} rows, {min(args.units, args.rows):,} units"
          f" in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

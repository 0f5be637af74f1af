"""``dpsql demo``: a synthetic database, queried as alice, with a refused query at the end."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpsql.cli.common import format_budget_line, format_result, indent
from dpsql.errors import Error, InternalError, PolicyError

if TYPE_CHECKING:
    from dpsql.connection import Connection
    from dpsql.policy import Policy

#: The policy the demo uses: ``policies/demo.toml`` of the source checkout.
DEMO_POLICY = Path(__file__).resolve().parents[2] / "policies" / "demo.toml"

_DEMO_ANALYST = "alice"


@dataclass(frozen=True)
class _DemoQuery:
    title: str
    sql: str
    epsilon: float
    delta: float = 0.0


_DEMO_QUERIES = (
    _DemoQuery(
        "How many visits? A user counts at most 10 rows (max_rows_per_unit): heavy users are capped.",
        "SELECT COUNT(*) AS visits FROM visits",
        0.1,
    ),
    _DemoQuery(
        "Per region: public keys, so every region is shown, and income is clipped to [0, 250000].",
        "SELECT region, COUNT(*) AS n, SUM(visits) AS total_visits, AVG(income) AS avg_income\n"
        "FROM visits GROUP BY region",
        0.5,
    ),
    _DemoQuery(
        "A filtered average.",
        "SELECT AVG(age) AS avg_age FROM visits WHERE device = 'mobile' AND income >= 50000",
        0.3,
    ),
    _DemoQuery(
        "Two keys, with delta > 0: calibrated Gaussian noise instead of Laplace.",
        "SELECT region, device, COUNT(*) AS n FROM visits GROUP BY region, device",
        0.5,
        1e-7,
    ),
    _DemoQuery(
        "Distinct users: the privacy unit may be counted, never selected.",
        "SELECT COUNT(DISTINCT user_id) AS users FROM visits",
        0.2,
    ),
    _DemoQuery(
        "Cities are not listed in the policy: only cities with enough users pass partition selection.",
        "SELECT city, COUNT(*) AS n FROM visits GROUP BY city ORDER BY n DESC LIMIT 5",
        0.5,
        1e-7,
    ),
    _DemoQuery(
        "An order statistic: the median age, by smooth sensitivity or PTR (the result says which).",
        "SELECT MEDIAN(age) AS median_age, STDDEV(age) AS sd_age FROM visits",
        0.5,
        1e-7,
    ),
)

_REFUSED_DEMO_QUERY = "SELECT ssn, income FROM visits WHERE age > 90"


def default_demo_dir() -> Path:
    """The cache folder for the demo database: ``$XDG_CACHE_HOME/dpsql-demo`` or ``~/.cache/dpsql-demo``.

    >>> default_demo_dir().name
    'dpsql-demo'
    """
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "dpsql-demo"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "dpsql-demo"
    return Path.home() / ".cache" / "dpsql-demo"


def run_demo(args: argparse.Namespace) -> int:
    """``dpsql demo``: build the synthetic database if needed, then query it as alice."""
    import dpsql  # noqa: PLC0415 - loads DuckDB and Arrow

    start = time.perf_counter()
    policy = demo_policy()
    database = demo_database(args.dir or default_demo_dir(), args.rows, args.units)
    tables = None
    if getattr(args, "source", "duckdb") == "parquet":
        from dpsql.datasources import export_parquet  # noqa: PLC0415

        tables = export_parquet(database, database.with_name(database.stem + "-parquet"))
        print(f"tables: {', '.join(f'{name} = {path}' for name, path in tables.items())}")
    with dpsql.connect(None if tables else database, policy=policy, analyst=_DEMO_ANALYST, ledger=None,
                       tables=tables) as conn:
        print(f"policy: {policy.source}\nanalyst: {_DEMO_ANALYST}, in-memory ledger")
        print(format_budget_line(conn.budget()))
        for number, query in enumerate(_DEMO_QUERIES, 1):
            _run_demo_query(conn, number, query)
        _run_refused_demo_query(conn, len(_DEMO_QUERIES) + 1)
    print(f"\ndone in {time.perf_counter() - start:.1f} s. Try your own:")
    print(f"   dpsql query --db {shlex.quote(str(database))} --policy {shlex.quote(policy.source)} "
          '--ledger budget.sqlite --analyst alice "SELECT ..."')
    return 0


def demo_policy() -> Policy:
    from dpsql.policy import load_policy  # noqa: PLC0415

    if not DEMO_POLICY.is_file():
        raise PolicyError(
            f"the demo policy {DEMO_POLICY} is missing. `dpsql demo` reads policies/demo.toml "
            "from a source checkout: clone the repository and run `pip install -e .` there."
        )
    return load_policy(DEMO_POLICY)


def demo_database(directory: Path, rows: int, units: int) -> Path:
    """Return the cached demo database for (rows, units), building it first if needed."""
    path = directory / f"visits-{rows}x{units}.duckdb"
    if path.exists():
        print(f"database: {path} (cached; delete it to rebuild)")
        return path
    from dpsql.demo import make_demo_database  # noqa: PLC0415 - loads numpy, DuckDB and Arrow

    directory.mkdir(parents=True, exist_ok=True)
    print(f"building the demo database: {rows:,} rows, {units:,} users ...", flush=True)
    start = time.perf_counter()
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:  # build under another name, so an interrupted build is never taken for a cache
        make_demo_database(partial, rows=rows, units=units)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
        partial.with_name(partial.name + ".wal").unlink(missing_ok=True)
    print(f"database: {path} (built in {time.perf_counter() - start:.1f} s)")
    return path


def _run_demo_query(conn: Connection, number: int, query: _DemoQuery) -> None:
    print(f"\n-- {number}. {query.title}")
    print(indent(query.sql))
    print(f"   epsilon={query.epsilon:g}, delta={query.delta:g}\n")
    result = conn.execute(query.sql, epsilon=query.epsilon, delta=query.delta)
    print(format_result(result, conn.analyst))
    print(format_budget_line(conn.budget()))


def _run_refused_demo_query(conn: Connection, number: int) -> None:
    print(f"\n-- {number}. A query the policy refuses: ssn is denied, and raw rows are never released.")
    print(indent(_REFUSED_DEMO_QUERY) + "\n")
    try:
        conn.execute(_REFUSED_DEMO_QUERY, epsilon=0.5)
    except Error as exc:
        print(f"error: {exc}")
    else:  # pragma: no cover - the demo policy denies ssn
        raise InternalError("the demo policy answered a query on ssn")
    print(f"nothing was charged. {format_budget_line(conn.budget())}")

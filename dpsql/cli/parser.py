"""The ``dpsql`` command line's arguments: one sub-parser per command, each naming the
function that runs it. Loads nothing heavy (``dpsql --help`` starts in a blink)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dpsql.cli.commands import (
    run_budget,
    run_query,
    run_serve,
    run_token_create,
    run_token_revoke,
)
from dpsql.cli.demo import default_demo_dir, demo_database, demo_policy, run_demo
from dpsql.cli.policy import run_policy_check, run_policy_import, run_policy_suggest
from dpsql.version import __version__

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsql", description="Differentially private SQL over DuckDB."
    )
    parser.add_argument("--version", action="version", version=f"dpsql {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    demo = commands.add_parser("demo", help="run example queries on a synthetic database")
    demo.add_argument("--dir", type=Path, help=f"where to keep the database (default {default_demo_dir()})")
    demo.add_argument("--rows", type=positive_int, default=1_000_000, help="rows (default 1000000)")
    demo.add_argument("--units", type=positive_int, default=100_000, help="users (default 100000)")
    demo.add_argument("--source", choices=("duckdb", "parquet"), default="duckdb",
                      help="read the demo tables from the DuckDB file (default) or from Parquet files beside it")
    demo.set_defaults(command=run_demo)

    query = commands.add_parser("query", help="answer one SQL query with differential privacy")
    query.add_argument("sql", metavar="SQL", help="one SELECT statement")
    _add_connection_arguments(query)
    query.add_argument("--epsilon", type=float, help="epsilon to spend (default: the policy's default_epsilon)")
    query.add_argument("--delta", type=float, help="delta to spend (default 0: Laplace noise, pure DP)")
    query.add_argument(
        "--explain", action="store_true", help="show cost, accuracy and bounded SQL; read no data, charge nothing"
    )
    query.set_defaults(command=run_query)

    budget = commands.add_parser("budget", help="show an analyst's spent and remaining budget")
    budget.add_argument("--policy", required=True, help="the policy file (gives the analyst's total)")
    budget.add_argument("--ledger", required=True, help="the budget ledger (SQLite file)")
    budget.add_argument("--analyst", help="whose budget to show (default: every analyst, the owner's view)")
    budget.add_argument(
        "--plot", metavar="FILE.png", help="draw the budget: spent against total, spending over time and, for "
        "one analyst, the trade-off curve (needs matplotlib: pip install 'dpsql[plot]')"
    )
    budget.set_defaults(command=run_budget)

    policy = commands.add_parser("policy", help="work with policy files")
    policy_commands = policy.add_subparsers(title="commands", metavar="COMMAND", required=True)
    check = policy_commands.add_parser("check", help="check a policy file (and a database against it)")
    check.add_argument("policy", metavar="POLICY", help="the TOML policy file")
    check.add_argument("--db", help="also check that this DuckDB file matches the policy, that its delta "
                       "suits the tables' sizes, and report what the caps and bounds keep (exact: owner only)")
    check.add_argument("--sources", action="store_true", help="also read every table's `source =` and match it "
                       "to the policy (a missing or unreadable source is an error)")
    check.set_defaults(command=run_policy_check)
    suggest = policy_commands.add_parser(
        "suggest", help="propose caps and bounds keeping a share of rows and sums (exact: owner only)")
    suggest.add_argument("table", metavar="TABLE", help="the table to bound")
    suggest.add_argument("--db", required=True, help="the DuckDB file (opened read-only)")
    suggest.add_argument("--policy", help="take the unit, bounded columns and group keys from this policy")
    suggest.add_argument("--unit", help="the privacy unit column (default: the policy's; none: each row is one)")
    suggest.add_argument("--share", type=float, default=0.99, help="share of rows and of sums to keep (0.99)")
    suggest.add_argument("--epsilon", type=float, default=1.0, help="epsilon at which to price the noise (1)")
    suggest.set_defaults(command=run_policy_suggest)
    imported = policy_commands.add_parser(
        "import", help="translate SmartNoise SQL metadata (YAML) into a dpsql policy, printed as TOML")
    imported.add_argument("metadata", metavar="SMARTNOISE_YAML", help="the SmartNoise metadata file")
    imported.set_defaults(command=run_policy_import)

    token = commands.add_parser("token", help="create or revoke an analyst's token for dpsql serve")
    token_commands = token.add_subparsers(title="commands", metavar="COMMAND", required=True)
    create = token_commands.add_parser("create", help="make a new token (printed once, as the last line)")
    revoke = token_commands.add_parser("revoke", help="revoke an analyst's token")
    for sub, run in ((create, run_token_create), (revoke, run_token_revoke)):
        sub.add_argument("analyst", metavar="ANALYST", help="whose token (the budget it spends)")
        sub.add_argument("--auth", required=True, help="the auth file (TOML; keeps only salted hashes)")
        sub.set_defaults(command=run)

    audit = commands.add_parser("audit", help="measure a lower bound on the epsilon queries really spend")
    _add_audit_arguments(audit)
    audit.set_defaults(command=_run_audit)

    serve = commands.add_parser("serve", help="run the Arrow Flight proxy for remote analysts")
    _add_source_arguments(serve, "queries")
    serve.add_argument("--ledger", required=True, help="budget ledger file, created if missing")
    serve.add_argument("--auth", required=True, help="the auth file written by dpsql token create")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8815, help="port (default 8815; 0 picks a free one)")
    serve.add_argument("--tls-cert", help="PEM certificate: serve grpc+tls (needs --tls-key)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument("--pg-port", type=_port, default=None,
                       help="also serve the Postgres wire protocol (psql, psycopg, BI tools) on this port "
                            "(default off; 0 picks a free one)")
    serve.add_argument("--pg-host", default="127.0.0.1", help="address of the Postgres front (default 127.0.0.1)")
    serve.add_argument("--reports", help="the report store of the policy's local tables (SQLite, created if missing)")
    serve.add_argument("--report-auth", help="reporting clients' tokens (dpsql token create NAME --auth FILE; "
                       "a file apart from --auth): turns on the report action, needs --reports")
    serve.add_argument("--report-batch", type=positive_int, default=100, metavar="K",
                       help="reports of a column reach the store shuffled, K at a time (default 100)")
    serve.add_argument("--report-rate", type=positive_int, default=600, metavar="N",
                       help="report requests per reporting token per minute (default 600)")
    serve.add_argument("--workers", type=positive_int, default=None, metavar="N",
                       help="worker processes answering queries, each with its own engine and deadline slot "
                       "(default: one per core; 1: in the server process)")
    serve.set_defaults(command=run_serve)
    return parser


def _add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``dpsql audit`` (run by :mod:`dpsql.audit.command`)."""
    parser.add_argument("--db", help="the database D (default: the demo database)")
    parser.add_argument("--policy", help="the policy (default: policies/demo.toml with the demo database)")
    parser.add_argument("--query", action="append", metavar="SQL",
                        help="a query to audit (repeatable; default: every demo shape, on the demo data only)")
    parser.add_argument("--epsilon", type=float, help="epsilon of each run (default 1 for the demo shapes, "
                        "else the policy's default)")
    parser.add_argument("--delta", type=float, help="delta of each run (default: the shape's, or 0)")
    parser.add_argument("--runs", type=int, default=500, help="runs on each database (default 500)")
    parser.add_argument("--neighbour", help="the neighbouring database D' (default: D plus a generated "
                        "worst-case unit)")
    parser.add_argument("--unit-rows", type=int, default=1000, help="rows of the generated unit (default 1000)")
    parser.add_argument("--unit-groups", type=int, default=20, help="groups of the generated unit (default 20)")
    parser.add_argument("--confidence", type=float, default=0.95, help="of each lower bound (default 0.95)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the demo database (default 100000)")
    parser.add_argument("--histogram", metavar="FILE.png",
                        help="draw each audit's answers on D and D' (needs matplotlib); with several "
                        "queries, FILE-1.png, FILE-2.png, ...")


def _run_audit(args: argparse.Namespace) -> int:
    """``dpsql audit``: see :mod:`dpsql.audit.command`."""
    from dpsql.audit.command import run_audit  # noqa: PLC0415 - scipy loads slowly

    directory = default_demo_dir()
    return run_audit(args, lambda rows: demo_database(directory, rows, max(1, rows // 10)), demo_policy)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {text}")
    return value


def _add_source_arguments(parser: argparse.ArgumentParser, runs: str) -> None:
    """Where the data is and which policy guards it (``dpsql query`` and ``dpsql serve``)."""
    parser.add_argument("--db", help="the DuckDB database file (opened read-only); not needed when the policy "
                        "names each table's source")
    parser.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                        help=f"what runs the bounded {runs} (spark: needs pyspark and Java 17+; reads the sources)")
    parser.add_argument("--spark-master", default="local[2]", help="the Spark master for --engine spark "
                        "(default local[2]; or spark://HOST:7077, yarn, k8s://...)")
    parser.add_argument("--policy", required=True, help="the TOML policy file")


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    _add_source_arguments(parser, "query")
    parser.add_argument("--analyst", default="default", help="whose budget is charged (default: 'default')")
    parser.add_argument("--ledger", help="budget ledger file, created if missing (default: none, nothing is kept)")


def positive_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value

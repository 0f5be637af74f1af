"""The ``dpsql`` command line (DESIGN §4): ``demo``, ``query``, ``budget``, ``policy check``,
``token create|revoke``, ``audit`` and ``serve``.

Each subcommand is a small function that takes the parsed arguments, prints, and returns
an exit code. Errors are never shown as tracebacks: a :class:`dpsql.Error` (or a file
system error) prints ``error: <message>`` on stderr and exits 1; a bad command line exits 2
with argparse's usage message.

>>> main(["policy", "check", str(DEMO_POLICY)])  # doctest: +ELLIPSIS
OK: .../demo.toml: 2 tables, 8 columns
...
0
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from dpsql.errors import Error, InternalError, PolicyError
from dpsql.version import __version__

if TYPE_CHECKING:  # the rest loads when a command runs: `dpsql --help` starts in a blink
    from dpsql.connection import Connection, Explanation
    from dpsql.policy import ColumnPolicy, Policy, TablePolicy
    from dpsql.privacy import BudgetStatus, Ledger
    from dpsql.result import PrivacyReport, Result

__all__ = ["DEMO_POLICY", "default_demo_dir", "main"]

#: The policy the demo uses: ``policies/demo.toml`` of the source checkout.
DEMO_POLICY = Path(__file__).resolve().parents[1] / "policies" / "demo.toml"

_DEMO_ANALYST = "alice"
_SHOWN_VALUES = 6  # public values listed by ``policy check`` before "..."


# ---------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dpsql`` command line with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 on a dpsql or file system error, 2 on a bad command line.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or argparse's usage error
        return stop.code if isinstance(stop.code, int) else 2
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except (Error, OSError) as exc:
        if isinstance(exc, BrokenPipeError):  # `dpsql demo | head`: stop quietly
            # Swap the Python object only: pointing file descriptor 1 at /dev/null would
            # also silence whoever runs main() in-process (a test runner).
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
            return 1
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsql", description="Differentially private SQL over DuckDB."
    )
    parser.add_argument("--version", action="version", version=f"dpsql {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    demo = commands.add_parser("demo", help="run example queries on a synthetic database")
    demo.add_argument("--dir", type=Path, help=f"where to keep the database (default {default_demo_dir()})")
    demo.add_argument("--rows", type=_positive_int, default=1_000_000, help="rows (default 1000000)")
    demo.add_argument("--units", type=_positive_int, default=100_000, help="users (default 100000)")
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
    serve.add_argument("--db", help="the DuckDB database file (opened read-only); not needed when the policy "
                       "names each table's source")
    serve.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                       help="what runs the bounded queries (spark: needs pyspark and Java 17+; reads the sources)")
    serve.add_argument("--spark-master", default="local[2]", help="the Spark master for --engine spark "
                       "(default local[2]; or spark://HOST:7077, yarn, k8s://...)")
    serve.add_argument("--policy", required=True, help="the TOML policy file")
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
    serve.add_argument("--report-batch", type=_positive_int, default=100, metavar="K",
                       help="reports of a column reach the store shuffled, K at a time (default 100)")
    serve.add_argument("--report-rate", type=_positive_int, default=600, metavar="N",
                       help="report requests per reporting token per minute (default 600)")
    serve.add_argument("--workers", type=_positive_int, default=None, metavar="N",
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
    return run_audit(args, lambda rows: _demo_database(directory, rows, max(1, rows // 10)), _demo_policy)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {text}")
    return value


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="the DuckDB database file (opened read-only); not needed when the policy "
                        "names each table's source")
    parser.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                        help="what runs the bounded query (spark: needs pyspark and Java 17+; reads the sources)")
    parser.add_argument("--spark-master", default="local[2]", help="the Spark master for --engine spark "
                        "(default local[2]; or spark://HOST:7077, yarn, k8s://...)")
    parser.add_argument("--policy", required=True, help="the TOML policy file")
    parser.add_argument("--analyst", default="default", help="whose budget is charged (default: 'default')")
    parser.add_argument("--ledger", help="budget ledger file, created if missing (default: none, nothing is kept)")


def _positive_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


# ---------------------------------------------------------------- dpsql query


def run_query(args: argparse.Namespace) -> int:
    """``dpsql query``: print the noisy table, what it cost, and the budget left."""
    import dpsql  # noqa: PLC0415 - loads DuckDB and Arrow

    if args.ledger is None and not args.explain:  # explain charges nothing: nothing to record
        print(
            "warning: no --ledger: this charge is not recorded, so the analyst's budget "
            "does not carry over to the next command. Pass --ledger FILE to keep it.",
            file=sys.stderr,
        )
    if args.db is not None and args.engine == "duckdb":  # without --db: the policy's sources
        _check_database_file(args.db)
    from dpsql.datasources import cli_database  # noqa: PLC0415 - loads pyspark only for --engine spark

    with dpsql.connect(cli_database(args), policy=args.policy, analyst=args.analyst, ledger=args.ledger) as conn:
        if args.explain:
            print(_format_explanation(conn.explain(args.sql, epsilon=args.epsilon, delta=args.delta)))
        else:
            result = conn.execute(args.sql, epsilon=args.epsilon, delta=args.delta)
            print(_format_result(result, conn.analyst))
        print(_format_budget_line(conn.budget()))
    return 0


def _format_result(result: Result, analyst: str) -> str:
    return f"{result.format()}\n\n{_format_privacy(result.privacy, analyst)}"


def _format_privacy(report: PrivacyReport, analyst: str) -> str:
    lines = [f"charged to {analyst}: epsilon={report.epsilon:g}, delta={report.delta:g}"]
    for name, column in report.columns.items():
        std = f", noise std {column.noise_std:.4g}" if column.noise_std is not None else ""
        lines.append(f"  {name}: {column.mechanism}{std}")
    lines += [f"  note: {note}" for note in report.notes]
    return "\n".join(lines)


def _format_explanation(explanation: Explanation) -> str:
    """What ``explain`` shows (the same text as ``repr`` of an explanation, embedded or
    remote), then the bounded SQL."""
    lines = [
        explanation.describe(),
        "bounded SQL:",
        *(f"  {line}" for line in explanation.bounded_sql.splitlines()),
    ]
    return "\n".join(lines)


def _check_database_file(path: str) -> None:
    """A clear error for a database path that is not a file (DuckDB would create one)."""
    if not os.path.isfile(path):
        where = "is a directory" if os.path.isdir(path) else "does not exist"
        raise Error(f"database file {path!r} {where}; pass the path of an existing DuckDB file "
                    "(dpsql demo builds one).")


def _format_budget_line(status: BudgetStatus) -> str:
    return (
        f"budget left for {status.analyst}: epsilon {status.epsilon_remaining:g} of "
        f"{status.epsilon_total:g}, delta {status.delta_remaining:g} of {status.delta_total:g} "
        f"({_plural(status.queries, 'query', 'queries')} charged)"
    )


def _plural(count: int, word: str, plural: str | None = None) -> str:
    """``1 query``, ``2 queries``, ``0 tables``.

    >>> _plural(1, "analyst"), _plural(2, "query", "queries")
    ('1 analyst', '2 queries')
    """
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


# ---------------------------------------------------------------- dpsql budget


def run_budget(args: argparse.Namespace) -> int:
    """``dpsql budget``: what an analyst (or, without ``--analyst``, every analyst) has spent
    and has left, from the ledger; reads no data.

    Spending is composed by the policy's accountant. With ``--plot FILE.png``, also draws
    the budget's pictures (:mod:`dpsql.budget_plot`).
    """
    from dpsql.policy import load_policy  # noqa: PLC0415
    from dpsql.privacy import Ledger  # noqa: PLC0415, F811 - loads the accountants

    policy = load_policy(args.policy)
    exists = os.path.exists(args.ledger)
    where = args.ledger if exists else f"{args.ledger} (no such file yet: nothing spent)"
    # A missing ledger means nothing was spent; read it as empty rather than create it.
    with Ledger(args.ledger if exists else None, accountant=policy.accountant) as ledger:
        if args.analyst is None:
            return _budget_of_everyone(args, policy, ledger, where)
        status = ledger.status(args.analyst, policy.budget_for(args.analyst))
        print(f"analyst {status.analyst}, ledger {where}")
        s = status
        print(f"  epsilon: {s.epsilon_spent:g} spent, {s.epsilon_remaining:g} remaining of {s.epsilon_total:g}")
        print(f"  delta:   {s.delta_spent:g} spent, {s.delta_remaining:g} remaining of {s.delta_total:g}")
        print(f"  queries: {status.queries}")
        print(f"  accountant: {status.accountant}"
              + (" (epsilon at the budget's delta)" if s.accountant != "basic" else ""))
        if status.mu is not None:
            group = status.group_privacy(2)
            print(f"  Gaussian-DP: mu={status.mu:.4g} (every measurement was Gaussian); "
                  f"a group of 2 units: mu={group.mu:.4g}")
        if args.plot:
            from dpsql.budget_plot import plot_analyst, spending  # noqa: PLC0415 - matplotlib loads slowly

            charges = [event.to_charge() for event in ledger.events(args.analyst)]
            plot_analyst(args.plot, spending(ledger, policy, args.analyst), charges)
            print(f"  picture: {args.plot}")
    return 0


def _budget_of_everyone(args: argparse.Namespace, policy: Policy, ledger: Ledger, where: str) -> int:
    """The data owner's view: every analyst of the policy and the ledger."""
    names = sorted({*policy.analysts, *ledger.analysts()})
    print(f"ledger {where}: {_plural(len(names), 'analyst')} (accountant {policy.accountant})")
    for name in names:
        status = ledger.status(name, policy.budget_for(name))
        print(f"  {name}: epsilon {status.epsilon_spent:g} of {status.epsilon_total:g} spent, delta "
              f"{status.delta_spent:g} of {status.delta_total:g} ({_plural(status.queries, 'query', 'queries')})")
    if args.plot:
        from dpsql.budget_plot import plot_owner, spending  # noqa: PLC0415 - matplotlib loads slowly

        plot_owner(args.plot, [spending(ledger, policy, name) for name in names])
        print(f"  picture: {args.plot}")
    return 0


# ---------------------------------------------------------------- dpsql policy check


def run_policy_check(args: argparse.Namespace) -> int:
    """``dpsql policy check``: load the policy (and match it to ``--db``), then summarise it."""
    from dpsql.policy import check_against_schema, load_policy  # noqa: PLC0415

    policy = load_policy(args.policy)
    against, bounding = "", []
    if args.db is None and args.sources:  # the policy's `source =` tables alone (dpsql.datasources)
        from dpsql.datasources import open_engine  # noqa: PLC0415

        engine = open_engine(None, policy)
        try:
            check_against_schema(policy, engine.schema())
        finally:
            engine.close()
        against = "; matches its sources"
    if args.db is not None:
        from dpsql.engine import DuckDBEngine  # noqa: PLC0415 - loads DuckDB

        _check_database_file(args.db)
        from dpsql.datasources import open_engine  # noqa: PLC0415 - the file, and any sources

        engine = open_engine(args.db, policy)
        try:
            check_against_schema(policy, engine.schema())
            from dpsql.bounding import check_lines  # noqa: PLC0415 - the owner's exact figures

            bounding = check_lines(policy, engine)  # a PolicyError if delta is too large for n
        finally:
            engine.close()
        against = f"; matches database {args.db}"
    columns = sum(len(table.columns) for table in policy.tables.values())
    print(f"OK: {policy.source}: {_plural(len(policy.tables), 'table')}, {_plural(columns, 'column')}{against}")
    print("\n".join(_describe_policy(policy)))
    print("\n".join(bounding))
    return 0


def run_policy_suggest(args: argparse.Namespace) -> int:
    """``dpsql policy suggest``: caps and bounds as TOML, and what they keep (owner only)."""
    from dpsql.bounding import run_suggest  # noqa: PLC0415

    return run_suggest(args)


def _describe_policy(policy: Policy) -> list[str]:
    lines = [
        f"  per query: epsilon <= {policy.max_epsilon_per_query:g} (default "
        f"{policy.default_epsilon:g}), delta <= {policy.max_delta_per_query:g}; "
        f"accountant {policy.accountant}",
        f"  budget: default epsilon={policy.default_budget.epsilon:g}, delta={policy.default_budget.delta:g}",
    ]
    lines += [
        f"    {name}: epsilon={b.epsilon:g}, delta={b.delta:g}" for name, b in policy.analysts.items()
    ]
    for table in policy.tables.values():
        lines.append(f"  table {table.name}: {_describe_table(table)}")
        lines += [f"    {c.name}: {_describe_column(c)}" for c in table.columns.values()]
    return lines


def _describe_table(table: TablePolicy) -> str:
    if table.public:
        return "public (every column usable)"
    if table.privacy_unit is None:
        return "private, each row is its own privacy unit"
    return (
        f"private, privacy unit {table.privacy_unit}; each unit counts in at most "
        f"{_plural(table.max_groups_per_unit, 'group')}, {_plural(table.max_rows_per_unit, 'row')} per group"
    )


def _describe_column(column: ColumnPolicy) -> str:
    if column.access == "deny":
        return "deny"
    text = column.access
    if column.bounds is not None:
        text += f", bounds [{column.bounds[0]:g}, {column.bounds[1]:g}]"
    if column.public_values is not None:
        shown = ", ".join(str(v) for v in column.public_values[:_SHOWN_VALUES])
        more = len(column.public_values) - _SHOWN_VALUES
        text += f", public values {shown}" + (f", ... ({more} more)" if more > 0 else "")
    return text


# ---------------------------------------------------------------- dpsql token, dpsql serve


def run_token_create(args: argparse.Namespace) -> int:
    """``dpsql token create``: store a salted hash, print the token once as the last line."""
    from dpsql.auth import create_token, read_auth_file

    replaced = os.path.exists(args.auth) and args.analyst in read_auth_file(args.auth)
    token = create_token(args.auth, args.analyst)
    from dpsql.pgwire.scram import store_verifier

    store_verifier(args.auth, args.analyst, token)  # for SCRAM-SHA-256 logins to --pg-port
    if replaced:
        print(f"replaced the previous token of {args.analyst!r}: it no longer works.")
    print(f"token for analyst {args.analyst!r} (its salted hash is in {args.auth}; the token "
          "itself is shown only this once):")
    print(f"  revoke it with: dpsql token revoke {shlex.quote(args.analyst)} --auth {shlex.quote(args.auth)}")
    print(token)
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    """``dpsql token revoke``: remove the analyst's token; a running server refuses it at once."""
    from dpsql.auth import revoke_token

    revoke_token(args.auth, args.analyst)
    from dpsql.pgwire.scram import remove_verifier

    remove_verifier(args.auth, args.analyst)
    print(f"revoked the token of {args.analyst!r} in {args.auth}")
    return 0


def _serve_database(args: argparse.Namespace) -> object:
    from dpsql.datasources import cli_database  # noqa: PLC0415 - loads pyspark only for --engine spark

    return cli_database(args)


def run_serve(args: argparse.Namespace) -> int:
    """``dpsql serve``: answer remote analysts until SIGTERM or Ctrl-C."""
    from dpsql.server import ServeOptions, configure_logging, serve

    configure_logging()
    database = _serve_database(args)
    workers = args.workers
    if workers is None:  # one per core, where each worker can open its own engine
        from dpsql.timing import available_cores  # noqa: PLC0415

        workers = available_cores() if database is None or isinstance(database, str | os.PathLike) else 1
    options = ServeOptions(
        database=database, policy=args.policy, ledger=args.ledger, auth=args.auth, workers=workers,
        host=args.host, port=args.port, tls_cert=args.tls_cert, tls_key=args.tls_key,
        pg_port=args.pg_port, pg_host=args.pg_host, reports=args.reports, report_auth=args.report_auth,
        report_batch=args.report_batch, report_rate=args.report_rate,
    )
    return serve(options, on_ready=lambda location: print(f"listening on {location}", flush=True),
                 on_pg_ready=lambda address: print(f"listening on {address}", flush=True))


# ---------------------------------------------------------------- dpsql demo


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
    policy = _demo_policy()
    database = _demo_database(args.dir or default_demo_dir(), args.rows, args.units)
    tables = None
    if getattr(args, "source", "duckdb") == "parquet":
        from dpsql.datasources import export_parquet  # noqa: PLC0415

        tables = export_parquet(database, database.with_name(database.stem + "-parquet"))
        print(f"tables: {', '.join(f'{name} = {path}' for name, path in tables.items())}")
    with dpsql.connect(None if tables else database, policy=policy, analyst=_DEMO_ANALYST, ledger=None,
                       tables=tables) as conn:
        print(f"policy: {policy.source}\nanalyst: {_DEMO_ANALYST}, in-memory ledger")
        print(_format_budget_line(conn.budget()))
        for number, query in enumerate(_DEMO_QUERIES, 1):
            _run_demo_query(conn, number, query)
        _run_refused_demo_query(conn, len(_DEMO_QUERIES) + 1)
    print(f"\ndone in {time.perf_counter() - start:.1f} s. Try your own:")
    print(f"   dpsql query --db {shlex.quote(str(database))} --policy {shlex.quote(policy.source)} "
          '--ledger budget.sqlite --analyst alice "SELECT ..."')
    return 0


def _demo_policy() -> Policy:
    from dpsql.policy import load_policy  # noqa: PLC0415

    if not DEMO_POLICY.is_file():
        raise PolicyError(
            f"the demo policy {DEMO_POLICY} is missing. `dpsql demo` reads policies/demo.toml "
            "from a source checkout: clone the repository and run `pip install -e .` there."
        )
    return load_policy(DEMO_POLICY)


def _demo_database(directory: Path, rows: int, units: int) -> Path:
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
    print(_indent(query.sql))
    print(f"   epsilon={query.epsilon:g}, delta={query.delta:g}\n")
    result = conn.execute(query.sql, epsilon=query.epsilon, delta=query.delta)
    print(_format_result(result, conn.analyst))
    print(_format_budget_line(conn.budget()))


def _run_refused_demo_query(conn: Connection, number: int) -> None:
    print(f"\n-- {number}. A query the policy refuses: ssn is denied, and raw rows are never released.")
    print(_indent(_REFUSED_DEMO_QUERY) + "\n")
    try:
        conn.execute(_REFUSED_DEMO_QUERY, epsilon=0.5)
    except Error as exc:
        print(f"error: {exc}")
    else:  # pragma: no cover - the demo policy denies ssn
        raise InternalError("the demo policy answered a query on ssn; this is a bug in dpsql")
    print(f"nothing was charged. {_format_budget_line(conn.budget())}")


def _indent(text: str) -> str:
    return "\n".join(f"   {line}" for line in text.splitlines())


def run_policy_import(args: argparse.Namespace) -> int:
    """``dpsql policy import smartnoise.yaml > policy.toml``: the translated policy on stdout,
    what could not be mapped on stderr (and as comments in the policy)."""
    from dpsql.smartnoise_import import translate_file  # noqa: PLC0415 - PyYAML only when asked

    translation = translate_file(args.metadata)
    print(translation.policy, end="")
    for note in translation.notes:
        print(f"dpsql policy import: not mapped: {note}", file=sys.stderr)
    return 0

"""``dpsql query``, ``dpsql budget``, ``dpsql token create|revoke`` and ``dpsql serve``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING

from dpsql.cli.common import (
    check_database_file,
    format_budget_line,
    format_explanation,
    format_result,
    plural,
)

if TYPE_CHECKING:
    from dpsql.policy import Policy
    from dpsql.privacy import Ledger


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
        check_database_file(args.db)
    from dpsql.datasources import cli_database  # noqa: PLC0415 - loads pyspark only for --engine spark

    with dpsql.connect(cli_database(args), policy=args.policy, analyst=args.analyst, ledger=args.ledger) as conn:
        if args.explain:
            print(format_explanation(conn.explain(args.sql, epsilon=args.epsilon, delta=args.delta)))
        else:
            result = conn.execute(args.sql, epsilon=args.epsilon, delta=args.delta)
            print(format_result(result, conn.analyst))
        print(format_budget_line(conn.budget()))
    return 0


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
    print(f"ledger {where}: {plural(len(names), 'analyst')} (accountant {policy.accountant})")
    for name in names:
        status = ledger.status(name, policy.budget_for(name))
        print(f"  {name}: epsilon {status.epsilon_spent:g} of {status.epsilon_total:g} spent, delta "
              f"{status.delta_spent:g} of {status.delta_total:g} ({plural(status.queries, 'query', 'queries')})")
    if args.plot:
        from dpsql.budget_plot import plot_owner, spending  # noqa: PLC0415 - matplotlib loads slowly

        plot_owner(args.plot, [spending(ledger, policy, name) for name in names])
        print(f"  picture: {args.plot}")
    return 0


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

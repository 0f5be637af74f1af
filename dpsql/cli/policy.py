"""``dpsql policy check``, ``dpsql policy suggest`` and ``dpsql policy import``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from dpsql.cli.common import check_database_file, plural

if TYPE_CHECKING:
    from dpsql.policy import ColumnPolicy, Policy, TablePolicy

_SHOWN_VALUES = 6  # public values listed by ``policy check`` before "..."


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
        check_database_file(args.db)
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
    print(f"OK: {policy.source}: {plural(len(policy.tables), 'table')}, {plural(columns, 'column')}{against}")
    print("\n".join(_describe_policy(policy)))
    print("\n".join(bounding))
    return 0


def run_policy_suggest(args: argparse.Namespace) -> int:
    """``dpsql policy suggest``: caps and bounds as TOML, and what they keep (owner only)."""
    from dpsql.bounding_suggest import run_suggest  # noqa: PLC0415

    return run_suggest(args)


def run_policy_import(args: argparse.Namespace) -> int:
    """``dpsql policy import smartnoise.yaml > policy.toml``: the translated policy on stdout,
    what could not be mapped on stderr (and as comments in the policy)."""
    from dpsql.smartnoise_import import translate_file  # noqa: PLC0415 - PyYAML only when asked

    translation = translate_file(args.metadata)
    print(translation.policy, end="")
    for note in translation.notes:
        print(f"dpsql policy import: not mapped: {note}", file=sys.stderr)
    return 0


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
        f"{plural(table.max_groups_per_unit, 'group')}, {plural(table.max_rows_per_unit, 'row')} per group"
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

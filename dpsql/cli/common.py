"""What several commands print: results, budgets, counts (and the database-file check)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dpsql.errors import Error

if TYPE_CHECKING:
    from dpsql.connection import Explanation
    from dpsql.privacy import BudgetStatus
    from dpsql.result import PrivacyReport, Result


def format_result(result: Result, analyst: str) -> str:
    return f"{result.format()}\n\n{format_privacy(result.privacy, analyst)}"


def format_privacy(report: PrivacyReport, analyst: str) -> str:
    return report.format(f"charged to {analyst}: epsilon={report.epsilon:g}, delta={report.delta:g}")


def format_explanation(explanation: Explanation) -> str:
    """What ``explain`` shows (the same text as ``repr`` of an explanation, embedded or
    remote), then the bounded SQL."""
    lines = [
        explanation.describe(),
        "bounded SQL:",
        *(f"  {line}" for line in explanation.bounded_sql.splitlines()),
    ]
    return "\n".join(lines)


def check_database_file(path: str) -> None:
    """A clear error for a database path that is not a file (DuckDB would create one)."""
    if not os.path.isfile(path):
        where = "is a directory" if os.path.isdir(path) else "does not exist"
        raise Error(f"database file {path!r} {where}; pass the path of an existing DuckDB file "
                    "(dpsql demo builds one).")


def format_budget_line(status: BudgetStatus) -> str:
    return (
        f"budget left for {status.analyst}: epsilon {status.epsilon_remaining:g} of "
        f"{status.epsilon_total:g}, delta {status.delta_remaining:g} of {status.delta_total:g} "
        f"({plural(status.queries, 'query', 'queries')} charged)"
    )


def plural(count: int, word: str, plural: str | None = None) -> str:
    """``1 query``, ``2 queries``, ``0 tables``.

    >>> plural(1, "analyst"), plural(2, "query", "queries")
    ('1 analyst', '2 queries')
    """
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def indent(text: str) -> str:
    return "\n".join(f"   {line}" for line in text.splitlines())

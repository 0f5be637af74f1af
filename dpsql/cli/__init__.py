"""The ``dpsql`` command line (DESIGN §4): ``demo``, ``query``, ``budget``, ``policy check``,
``token create|revoke``, ``audit`` and ``serve``.

Each subcommand is a small function that takes the parsed arguments, prints, and returns
an exit code. Errors are never shown as tracebacks: a :class:`dpsql.Error` (or a file
system error) prints ``error: <message>`` on stderr and exits 1; a bad command line exits 2
with argparse's usage message.

The modules: :mod:`~dpsql.cli.parser` (the arguments), :mod:`~dpsql.cli.commands` (query,
budget, token, serve), :mod:`~dpsql.cli.policy` (policy check, suggest, import),
:mod:`~dpsql.cli.demo` and :mod:`~dpsql.cli.common` (what several commands print).

>>> main(["policy", "check", str(DEMO_POLICY)])  # doctest: +ELLIPSIS
OK: .../demo.toml: 2 tables, 8 columns
...
0
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from dpsql.cli.demo import DEMO_POLICY, default_demo_dir
from dpsql.cli.parser import build_parser as _parser
from dpsql.errors import Error

__all__ = ["DEMO_POLICY", "default_demo_dir", "main"]


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

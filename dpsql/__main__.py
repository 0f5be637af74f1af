"""``python -m dpsql``: the same as the ``dpsql`` command."""

from dpsql.cli import main

raise SystemExit(main())

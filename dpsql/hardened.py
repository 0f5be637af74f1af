"""The one way dpsql opens a DuckDB of its own: private, in memory, hardened.

DuckDB lets SQL read any Python variable or file by name (replacement scans,
``read_csv``, ``COPY``) and install or load extensions. Every DuckDB dpsql opens (the
engine's instance that attaches the data file, the post-processor's, the pgwire catalog,
the scratch instance that folds constants) starts from :data:`CONFIG`, which switches off
replacement scans and extension loading, and is then :func:`lock`-ed: external access off,
configuration locked, so no later statement can switch anything back on. What needs
external access (``ATTACH`` of the data file, the ``allowed_paths`` of a source list) is
done between :func:`open_private` and :func:`lock`.

Spilling. An instance that reads private data (:func:`open_for_data`: the engines')
spills to a folder of its own, made for it under the system's temporary folder with mode
0700 and removed when the connection is collected (or at exit). DuckDB's default for an
in-memory instance is ``.tmp`` in the working directory, which may not be writable (a query
that needs to spill would then fail) and, with the default umask, readable by other local
users, while the spilled blocks hold private rows. The memory limit and the thread count stay
DuckDB's defaults, public facts of the machine (80% of its RAM, one thread per core): what a
query may use never depends on the data.

>>> con = scratch()
>>> con.execute("SELECT 1 + 1").fetchall()
[(2,)]
>>> scratch_rows("SELECT DATE '2024-01-31' + INTERVAL 1 MONTH")
[(datetime.datetime(2024, 2, 29, 0, 0),)]
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import weakref

import duckdb

__all__ = ["CONFIG", "lock", "open_for_data", "open_private", "scratch", "scratch_rows"]

#: Settings every dpsql DuckDB opens with (fixed at start-up).
CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,
}

_LOCK_STATEMENTS = (
    "SET enable_external_access = false",
    "SET lock_configuration = true",
)


def open_private(**settings: str | bool | int | float) -> duckdb.DuckDBPyConnection:
    """A new private in-memory DuckDB with :data:`CONFIG` and ``settings`` (such as
    ``threads=1``), not yet locked: set it up, then call :func:`lock`."""
    return duckdb.connect(":memory:", config={**CONFIG, **settings})


def open_for_data(**settings: str | bool | int | float) -> duckdb.DuckDBPyConnection:
    """:func:`open_private` for an instance that reads private data: with a private spill
    folder of its own (see the module docstring)."""
    folder = tempfile.mkdtemp(prefix="dpsql-spill-")  # mode 0700
    try:
        con = open_private(temp_directory=folder, **settings)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(con, shutil.rmtree, folder, True)
    return con


def lock(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Switch external access off and lock the configuration; returns ``con``."""
    for statement in _LOCK_STATEMENTS:
        con.execute(statement)
    return con


def scratch(**settings: str | bool | int | float) -> duckdb.DuckDBPyConnection:
    """A new private DuckDB for data-free work, locked from the start."""
    return lock(open_private(**settings))


_shared: list[duckdb.DuckDBPyConnection] = []
_shared_lock = threading.Lock()


def scratch_rows(sql: str) -> list[tuple[object, ...]]:
    """Run a data-free query on the process's one shared scratch DuckDB and return its rows.

    Raises:
        duckdb.Error: the query fails (the caller words the message).
    """
    with _shared_lock:
        if not _shared:
            _shared.append(scratch(threads=1))
        return _shared[0].execute(sql).fetchall()

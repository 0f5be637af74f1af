"""Opening a connection: the engine (a DuckDB file, a wrapped connection, Spark or
``tables=``), the policy checked against it, the ledger and the deadline model, then a
:class:`~dpsql.connection.Connection` over them. :func:`connect` is ``dpsql.connect``."""

from __future__ import annotations

import os
from collections.abc import Mapping

import duckdb

from dpsql.connection import Connection
from dpsql.datasources import open_engine
from dpsql.errors import Error
from dpsql.local.store import ReportStore
from dpsql.noise import RandomSource
from dpsql.policy import Policy, check_against_schema, load_policy
from dpsql.privacy import Ledger
from dpsql.calibration import calibrate
from dpsql.timing import Timing, TimingModel, table_sizes

__all__ = ["connect"]


def connect(
    database: str | os.PathLike[str] | duckdb.DuckDBPyConnection | object | None = None,
    policy: str | os.PathLike[str] | Policy | None = None,
    analyst: str = "default",
    ledger: str | os.PathLike[str] | Ledger | None = None,
    *,
    noise_source: RandomSource | None = None,
    repeats: bool = True,
    data_version: str | None = None,
    deadline: bool | TimingModel = False,
    tables: Mapping[str, object] | None = None,
    reports: str | os.PathLike[str] | ReportStore | None = None,
    dialect: str | None = None,
) -> Connection:
    """Open a differentially private connection.

    Args:
        database: a DuckDB file (opened read-only and hardened), an existing
            ``duckdb.DuckDBPyConnection`` (trusted as configured; see :mod:`dpsql.engine`),
            a ``pyspark.sql.SparkSession`` (:mod:`dpsql.spark`), or ``None`` when the
            tables come from ``tables=`` or the policy's ``source =`` entries.
        tables: policy table name -> its data: a Parquet/CSV/JSON path, glob or folder,
            ``"file.duckdb:table"``, or a pandas/polars DataFrame or Arrow table
            (:mod:`dpsql.datasources`); read through dpsql's own hardened DuckDB, or by
            Spark when ``database`` is a SparkSession.
        policy: the policy file, or a loaded :class:`~dpsql.policy.Policy`.
        analyst: whose budget queries are charged to.
        ledger: a SQLite ledger path (shared safely by every process that opens it), a
            :class:`~dpsql.privacy.Ledger`, or ``None`` for an in-memory ledger that
            lasts as long as the connection.
        noise_source: for tests only: a seeded :class:`~dpsql.noise.RandomSource`.
            Production noise always comes from the operating system's CSPRNG.
        repeats: ``True`` (the default): a repeated query (same analyst, SQL up to spacing
            and keyword case, epsilon, delta, policy and data) gets its first answer again,
            free; answers are kept beside the ledger file (``<ledger>.answers``) or in
            memory. ``False``: every execute is charged and draws fresh noise (for
            statistical tests of the noise).
        data_version: for a wrapped connection whose data changes: a name for the data's
            current version (a load date, a snapshot id). Stored answers are served again
            only under the same version; nothing reads the data to find out whether it
            changed (see :mod:`dpsql.repeats`). A file opened by path is versioned by its
            identity and modification time.
        deadline: hold each answer that reads data until a deadline computed from public
            facts (:mod:`dpsql.timing`): ``True`` measures this machine's speed first
            (about a second), or pass a :class:`~dpsql.timing.TimingModel`. Off by default:
            in the embedded API the analyst shares the process; the server always does it.
        reports: the report store (a SQLite path or a ``ReportStore``) holding the shuffled
            reports of the policy's ``model = "local"`` tables; queries over them are
            answered from it, free of central budget (:mod:`dpsql.local`).
        dialect: the SQL dialect queries are written in (sqlglot's reader names:
            "postgres", "bigquery", "tsql", "spark" ...); ``execute(dialect=...)``
            overrides it per query. Default: DuckDB's.

    Raises:
        PolicyError: the policy is malformed or does not match the database.
    """
    if policy is None:
        raise Error("dpsql.connect needs policy=: the policy file, or a loaded dpsql.Policy.")
    loaded = policy if isinstance(policy, Policy) else load_policy(policy)
    engine = open_engine(database, loaded, tables=tables, data_version=data_version)
    try:
        check_against_schema(loaded, engine.schema())
        timing = None
        if deadline is not False:
            model = deadline if isinstance(deadline, TimingModel) else calibrate(pipeline=Connection, engine=engine)
            timing = Timing(model, table_sizes(loaded, engine), engine.interrupt)
        book = ledger if isinstance(ledger, Ledger) else Ledger(ledger, accountant=loaded.accountant)
    except BaseException:
        engine.close()
        raise
    try:
        return Connection(engine, loaded, analyst, book, noise_source=noise_source, repeats=repeats, timing=timing,
                          reports=reports, dialect=dialect)
    except BaseException:
        engine.close()
        if book is not ledger:
            book.close()
        raise

"""The speed model of the deadlines (:mod:`dpsql.timing`), measured on synthetic data.

:func:`calibrate` times the whole pipeline on generated tables (never the private data)
when a server starts, unless the owner pins the model in ``[server]``; :func:`warm_up` runs
it once so that first-time costs do not fall inside the first analyst's deadline.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dpsql.engine import DuckDBEngine, small_settings
from dpsql.policy import parse_policy
from dpsql.privacy import Ledger
from dpsql.timing import TimingModel

if TYPE_CHECKING:
    import duckdb

__all__ = ["calibrate", "warm_up"]


def calibrate(rows: tuple[int, int] = (2_000, 200_000), repeats: int = 3, *,
              pipeline: Callable[..., Any], engine: Any = None) -> TimingModel:
    """Measure this machine's speed on synthetic data (never the private data).

    ``pipeline`` is the :class:`~dpsql.connection.Connection` class whose path is timed
    (passed in: the connection sits above this module and uses it). ``engine``: the engine
    the deadlines are for; its ``scratch(rows)`` gives an engine of the same kind over the
    generated table (a Spark query costs a second where DuckDB's costs milliseconds);
    ``None`` or an engine without it: DuckDB.

    Runs ``SELECT g, COUNT(*), AVG(x) FROM t GROUP BY g`` through the whole pipeline on two
    generated tables of ``rows`` rows and fits ``base + per_row * rows`` to the median of
    ``repeats`` runs of each (after one warm-up run), each rounded up to a 19% step. The
    base is the calibration query's (work 1.95, :data:`~dpsql.timing.CALIBRATION_WORK`); a
    plan of more work gets a base scaled by its work, one of less the whole base
    (:class:`~dpsql.timing.TimingModel`: shorter deadlines for lighter plans made honest
    COUNTs overrun under load, in November and again in December, HISTORY.md). The tails
    are the slack's job. Takes one to two seconds on DuckDB.
    """
    policy = parse_policy(_CALIBRATION_POLICY, "<timing calibration>")
    scratch = getattr(engine, "scratch", None) or functools.partial(_duckdb_scratch, small=getattr(engine, "one_thread", False))
    times = []
    with tempfile.TemporaryDirectory(prefix="dpsql-calibration-") as folder:
        for n in rows:
            synthetic = scratch(int(n))
            # A ledger file and an answers file, as the server has: their commits are part
            # of every new query's time.
            ledger = Ledger(os.path.join(folder, f"ledger{n}.sqlite"))
            conn = pipeline(synthetic, policy, "calibration", ledger)
            try:
                runs = []
                for i in range(repeats + 1):  # the first run warms caches up and is not counted
                    sql = "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY g"
                    plan = conn.plan(sql, epsilon=1.0 - i * 1e-6)  # a new query each time
                    started = time.perf_counter()
                    conn._answer(plan, sql)  # what a deadline covers: from the charge on
                    runs.append(time.perf_counter() - started)
                times.append(statistics.median(runs[1:] or runs))
            finally:
                conn.close()
                synthetic.close()
    per_row = max(1e-9, (times[1] - times[0]) / (rows[1] - rows[0]))
    base = max(1e-3, times[0] - per_row * rows[0])
    return TimingModel(base=_quantized(base), per_row=_quantized(per_row))


def _duckdb_scratch(rows: int, small: bool = False) -> DuckDBEngine:
    """A DuckDB engine over the calibration table ``t``: ``u`` (four rows each), ``g``
    (seven groups), ``x`` in [0, 1000); closed with its connection. ``small``: set up as
    DuckDB serves a small file (:attr:`~dpsql.engine.DuckDBEngine.one_thread`: one thread,
    plain bounded queries prepared unoptimized), when the engine the deadlines are for is
    one, so that the base is that of the path its queries take (before, a small file's
    deadlines were measured on DuckDB's defaults, where an optimized prepared statement is
    bound and planned again on every run). Measured (issue 16, ``benchmarks/deadline_work.py
    --heavy`` with and without ``--small``, load 0.3): the calibration query's answer on
    2,000 rows 5.2 against 8.8 ms (p50), eight aggregates 25.6 against 31.8 ms; three
    calibrations each, alternating, gave bases of 4.7-5.5 against 9.3-15.6 ms."""
    import duckdb

    con = duckdb.connect(":memory:", config={"python_enable_replacements": False})
    con.execute(f"CREATE TABLE t AS SELECT range // 4 AS u, 'g' || (range % 7) AS g, "
                f"(range * 7919 % 1000)::DOUBLE AS x FROM range({int(rows)})")
    return _ScratchDuckDB(con, small_settings(con) if small else None)


class _ScratchDuckDB(DuckDBEngine):
    def __init__(self, con: duckdb.DuckDBPyConnection, plain: duckdb.DuckDBPyConnection | None) -> None:
        super().__init__(con)
        if plain is not None:  # a small file's two connections (DuckDBEngine._open_hardened)
            self._plain, self._small = plain, True

    def close(self) -> None:
        if self._plain is not None:
            self._plain.close()
        self._con.close()


def warm_up(pipeline: Callable[..., Any]) -> None:
    """Run the pipeline once on a small synthetic table, so that what a process does only
    the first time (imports, caches) does not fall inside the first analyst's deadline.
    :func:`calibrate` does this itself; a server whose model is pinned calls this."""
    calibrate(rows=(100, 200), repeats=0, pipeline=pipeline)


def _quantized(value: float) -> float:
    """``value`` rounded up to a step of 2**(1/4) (19%): two calibrations on one machine
    then mostly agree, and the model carries less of the moment it was measured.

    >>> _quantized(1.0), round(_quantized(1.1), 4)
    (1.0, 1.1892)
    """
    return float(2.0 ** (math.ceil(4 * math.log2(value) - 1e-9) / 4))


_CALIBRATION_POLICY = """
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 1.0
[budget]
default = { epsilon = 1000000.0, delta = 1e-5 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 4
[tables.t.columns]
g = { public_values = ["g0", "g1", "g2", "g3", "g4", "g5", "g6"] }
x = { bounds = [0, 1000] }
"""

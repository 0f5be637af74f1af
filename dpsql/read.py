"""The one step that reads private data: the plan's bounded query (:mod:`dpsql.rewrite`)
on the engine, then the noise (:mod:`dpsql.release`).

The connection calls :meth:`Reader.read` only after the charge. Whatever goes wrong in it
(an engine error, an interrupt at the deadline, a bug) becomes one
:class:`~dpsql.errors.QueryFailed` with a fixed message: never the engine's text, which
could quote or depend on one person's row (DESIGN §7). The cause goes to the ``dpsql``
logger (type and stack, no message) for the data owner.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Hashable, Mapping

import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.engine import Engine
from dpsql.errors import QueryFailed
from dpsql.noise import RandomSource
from dpsql.plan import QueryPlan
from dpsql.release import noisy_table
from dpsql.release.udf import UDF
from dpsql.rewrite import Bounded, bounded_query, value_query
from dpsql.rewrite.key import KeyMemo, parameterized

__all__ = ["Reader"]

log = logging.getLogger("dpsql")

#: Bounded queries kept per reader by bounding key (:mod:`dpsql.rewrite.key`), oldest dropped first.
_BOUNDED = 128


class Reader:
    """Reads plans' bounded queries from one engine and adds their noise.

    Args:
        engine: where the data is.
        source: for tests only: a seeded noise source (production noise: the OS CSPRNG).
        udfs: the registered functions' code, by name (the connection's registry, read
            when a plan's value release names one; plans hold only their specs).
    """

    def __init__(self, engine: Engine, source: RandomSource | None = None,
                 udfs: Mapping[str, UDF] | None = None) -> None:
        self._engine = engine
        self._source = source
        self._udfs: Mapping[str, UDF] = {} if udfs is None else udfs
        self._prepared: dict[int, tuple[QueryPlan, exp.Expression | str, Bounded, dict[str, str]]] = {}
        self._by_key: dict[Hashable, tuple[exp.Expression | str, Bounded]] = {}
        self._keys = KeyMemo()
        self._lock = threading.Lock()

    def read(self, plan: QueryPlan, late: threading.Event | None = None) -> tuple[pa.Table, dict[str, list[object]]]:
        """The noisy table of ``plan`` and what each order statistic or UDF used.

        The exception of a failure is raised outside this ``except`` block, so not even
        ``__context__`` carries it to the caller. ``late`` is set when the query's deadline
        has passed (:mod:`dpsql.timing`): what was read is then discarded.

        Raises:
            QueryFailed: reading or noising failed, whatever the cause.
        """
        try:
            prepared, bounded, literals = self._bounded(plan)
            _in_time(late)
            exact = self._engine.run(prepared, {**bounded.arguments(), **literals})
            if late is None or not late.is_set():
                return self._noisy(plan, exact, late)
        except Exception as exc:  # noqa: BLE001 - every cause gets the same answer
            log.warning("a charged query failed while reading the data (%s); stack:\n%s",
                        type(exc).__name__, "".join(traceback.format_tb(exc.__traceback__)))
        raise QueryFailed()

    def forget(self, plan: QueryPlan | None = None) -> None:
        """Drop every plan's prepared query (the plans they belong to were dropped); the
        queries kept by bounding key stay (they belong to no plan). ``plan``: also its key,
        remembered by its fields (a server's worker, whose plans arrive unpickled, never the
        same objects twice: kept, they were only dead trees that every full garbage
        collection scanned)."""
        self._prepared.clear()
        if plan is not None:
            self._keys.drop(plan)

    def _bounded(self, plan: QueryPlan) -> tuple[exp.Expression | str, Bounded, dict[str, str]]:
        """The bounded query as the engine runs it, its salts left as parameters, and the
        plan's literal parameters: prepared once per plan (a plan is immutable; generating
        SQL is most of a small query's fixed cost), with the parameter names rewrite
        reported. A new plan with the bounding key of one seen before (another alias,
        epsilon, ORDER BY, comparison constant ...: :mod:`dpsql.rewrite.key`) shares its
        query: the tree is neither built nor written again, and only its literal
        parameters (the plan's own constants, bound as VARCHAR values) differ."""
        held = self._prepared.get(id(plan))
        if held is None or held[0] is not plan:
            found = self._keys.keyed(plan)
            key, literals = found if found is not None else (None, {})
            with self._lock:
                shared = self._by_key.pop(key, None) if key is not None else None
            if shared is None:
                bounded = bounded_query(parameterized(plan) if literals else plan, list_parameters=True)
                shared = (self._engine.prepare(bounded.query), bounded)
            if key is not None:
                with self._lock:  # reads on several threads (deadlines) share this cache
                    if len(self._by_key) >= _BOUNDED:
                        self._by_key.pop(next(iter(self._by_key)))
                    self._by_key[key] = shared  # most recently used last
            held = (plan, *shared, literals)
            self._prepared[id(plan)] = held
        return held[1], held[2], held[3]

    def _noisy(self, plan: QueryPlan, exact: pa.Table,
               late: threading.Event | None = None) -> tuple[pa.Table, dict[str, list[object]]]:
        """Noisy aggregates, fetching first the values order statistics and UDFs read."""
        values = {}
        for r in plan.value_releases:
            _in_time(late)
            values[r.name] = self._engine.run(value_query(plan, r))
        report: dict[str, list[object]] = {}
        return noisy_table(plan, exact, self._source, values=values, report=report, udfs=self._udfs), report


def _in_time(late: threading.Event | None) -> None:
    """Raise (a failure like any other) when the deadline has passed: its interrupt, made
    between two statements, would be lost, and the next one would run to its end."""
    if late is not None and late.is_set():
        raise TimeoutError("past the deadline")

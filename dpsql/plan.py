"""Plain frozen data that every pass shares.

``analyze`` turns SQL into a :class:`QueryPlan`; ``rewrite`` turns the plan into bounded SQL;
``noise`` and ``postprocess`` carry out what the plan already decided. Nothing downstream of
planning makes a privacy decision.

Fixed point. Every measurement is a sum of per-row integers: a COUNT adds 1 per kept row, a
SUM adds ``round(clipped * 2**frac_bits)``. The engine sums them exactly (HUGEINT). Before the
noise the exact sum is floored to the *release lattice* by an arithmetic shift of
``shift`` bits, so released numbers are multiples of ``2**(shift - frac_bits)`` and the noise
is an integer on that lattice. Flooring by ``2**shift`` maps two sums that differ by at most
``D`` to values that differ by at most ``ceil(D / 2**shift)``; that is the per-group
sensitivity ``group_sensitivity`` the noise is calibrated to. A negative ``shift`` refines the
lattice instead (exact sums are multiplied by ``2**-shift``), so that a count's noise, say,
is not coarser than its calibration: a noisy COUNT is then rounded to a whole number,
which is post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import sqlglot.expressions as exp


#: The table of noisy aggregates that post-processing evaluates the select list over.
NOISY_TABLE = "__noisy"

#: How a registered function or order statistic is answered (:mod:`dpsql.release.udf`).
Strategy = Literal["auto", "ptr", "smooth", "sample_and_aggregate"]

#: Seconds one sample-and-aggregate block may run, unless the registration says otherwise.
DEFAULT_TIME_LIMIT = 0.1


@dataclass(frozen=True)
class LaplaceParams:
    """Discrete Laplace noise, as the exact integers its sampler takes, in release-lattice
    units: ``P(z)`` proportional to ``exp(-|z| s / t)`` (scale ``t / s``).

    Plain data (hashable, JSON-able with :func:`dataclasses.asdict`); the sampler, its
    standard deviation and quantiles come from :mod:`dpsql.noise` (``sampler(params)``).
    """

    t: int
    s: int
    kind: Literal["laplace"] = field(default="laplace", init=False)


@dataclass(frozen=True)
class GaussianParams:
    """Discrete Gaussian noise, as the exact integers its sampler takes, in release-lattice
    units: ``P(z)`` proportional to ``exp(-z^2 / (2 t m))`` (``sigma^2 = t m``; ``t`` is
    the Laplace scale the sampler proposes from). Plain data, like :class:`LaplaceParams`.
    """

    t: int
    m: int
    kind: Literal["gaussian"] = field(default="gaussian", init=False)


#: The noise a measurement carries: plain parameters, told apart by ``kind``.
NoiseParams = LaplaceParams | GaussianParams


MeasurementKind = Literal[
    "count_rows", "count_values", "count_units", "count_distinct_values", "sum", "sum_centred", "sum_squares"
]
AggregateFunction = Literal[
    "count", "count_distinct", "sum", "avg", "var_pop", "var_samp", "stddev_pop", "stddev_samp", "value"
]

#: The alias of the source table in bounded SQL; row predicates refer to it.
SOURCE_ALIAS = "__t"

__all__ = [
    "SOURCE_ALIAS",
    "Aggregate",
    "GaussianParams",
    "GroupKey",
    "LaplaceParams",
    "Measurement",
    "NoiseParams",
    "QueryPlan",
    "Selection",
    "Source",
    "ValueRelease",
]


@dataclass(frozen=True)
class Source:
    """One table the bounded query reads.

    Attributes:
        alias: its canonical alias (``__t`` for the primary private table, ``__t1`` ...).
        table: the policy table.
        join: "from" for the primary table, else "inner" or "left".
        on: the join condition over canonical column references.
        query: for a derived table (a per-unit aggregating subquery, issue 14), the query
            that computes it, over policy tables named as in the policy; ``None`` for a
            table read as it is.
        types: its columns' engine types (casefolded name, type): a derived table's from
            the analyzer, a stored table's from the engine when the plan is bound
            (:func:`dpsql.engine.bind`).
        row_id: an expression telling its rows apart (keyed row sampling, row-level
            units), set when the plan is bound: the engine's row id, or a hash of the row.
    """

    alias: str
    table: str
    join: str = "from"
    on: exp.Expr | None = None
    query: exp.Select | None = None
    types: tuple[tuple[str, str], ...] = ()
    row_id: exp.Expression | None = None


@dataclass(frozen=True)
class GroupKey:
    """One GROUP BY key.

    Attributes:
        name: the key's column in the bounded query and in the noisy table (``__g0`` ...).
        column: the policy column it groups by, or ``None`` for an expression.
        expression: the key over the source table's canonical columns.
        public_values: the values the output has exactly, when they are known without
            looking at the data (listed by the policy, or an expression of listed columns);
            ``None`` for a private key, whose groups go through partition selection.
        filters: (column reference, values) pairs restricting source rows to the values the
            policy lists, so that a value it does not list can never appear.
        family: the key's type family (string, number, boolean, date, timestamp).
    """

    name: str
    column: str | None
    expression: exp.Expression
    public_values: tuple[object, ...] | None
    filters: tuple[tuple[exp.Column, tuple[object, ...]], ...] = ()
    family: str = "string"

    @property
    def is_public(self) -> bool:
        return self.public_values is not None


@dataclass(frozen=True)
class Measurement:
    """One noisy quantity: an exact bounded sum plus discrete noise.

    Attributes:
        name: its column in the bounded query (``__m0`` ...).
        kind: what each kept row adds (see module docstring).
        column: the policy column summed or counted, ``None`` for ``COUNT(*)``.
        bounds: clipping bounds of ``column`` for sums.
        frac_bits: fixed-point fraction bits of per-row values (0 for counts).
        row_bound: the largest absolute per-row integer contribution.
        group_bound: the largest change one unit makes to one group's exact sum.
        shift: bits dropped (floored) before the noise.
        group_sensitivity: ``ceil(group_bound / 2**shift)``, in release-lattice units.
        noise: the calibrated noise's parameters, in release-lattice units (its standard
            deviation and quantiles: ``dpsql.noise.noise_std(m)``, ``half_width(m)``).
        epsilon: this measurement's share of epsilon (Laplace), for reporting.
        mu: this measurement's Gaussian-DP mu (Gaussian), for reporting.
        source: the canonical alias of the table ``column`` belongs to.
        expression: for an aggregate over an expression (``SUM(a * b)``), the expression
            over canonical columns, compiled total (:mod:`dpsql.analyze.predicates`);
            ``column`` is then its text. ``None`` for a bare column.
        expression_type: the engine type ``expression`` evaluates to.
        bounds_from: where ``bounds`` came from: "policy", "interval arithmetic" or
            "analyst" (:mod:`dpsql.intervals`).
    """

    name: str
    kind: MeasurementKind
    column: str | None
    bounds: tuple[float, float] | None
    frac_bits: int
    row_bound: int
    group_bound: int
    shift: int
    group_sensitivity: int
    noise: NoiseParams
    epsilon: float = 0.0
    mu: float = 0.0
    source: str = SOURCE_ALIAS
    expression: exp.Expression | None = None
    expression_type: str = ""
    bounds_from: str = "policy"

    @property
    def lattice(self) -> float:
        """The step of released values, in the column's own units."""
        return float(2.0 ** (self.shift - self.frac_bits))

    @property
    def mechanism(self) -> str:
        return self.noise.kind


@dataclass(frozen=True)
class Selection:
    """DP partition selection for private group keys.

    A group is released only when its number of distinct units (after contribution
    bounding: a unit is in at most ``l0`` groups) plus discrete Laplace noise of scale
    ``l0 / epsilon`` reaches ``threshold``. Existing groups' unit counts move by at most 1 in
    at most ``l0`` groups (epsilon-DP); a group that exists only because of one unit has count
    1 and appears with probability ``P(Z >= threshold - 1) = p**(threshold-1) / (1 + p)``,
    ``p = exp(-1/scale)``, at most ``delta / l0`` each, so at most ``delta`` in all.

    Attributes:
        name: the unit-count column of the bounded query.
        noise: the discrete Laplace noise added to unit counts (its parameters).
        threshold: the smallest noisy unit count released.
        epsilon: the share of epsilon spent on selection.
        delta: the share of delta spent on selection.
    """

    name: str
    noise: LaplaceParams
    threshold: int
    epsilon: float
    delta: float


@dataclass(frozen=True)
class ValueRelease:
    """An order statistic or registered UDF, answered per group from the values themselves
    (:mod:`dpsql.release.udf`): PTR, smooth sensitivity or sample-and-aggregate, picked per group
    from a noisy unit count.

    Attributes:
        name: its aggregate column in the noisy table.
        target: a :class:`QuantileSpec`, or the :class:`UDFSpec` of a registered function.
        column: the policy column whose values it reads; ``source`` its table's alias.
        epsilon: epsilon per group (the query's share divided by the groups a unit may
            touch): 5% of it buys the noisy unit count, the rest the answer.
        delta: delta per group, likewise.
        rows_per_unit: the most values one unit contributes to one group.
    """

    name: str
    target: QuantileSpec | UDFSpec
    column: str
    source: str
    epsilon: float
    delta: float
    rows_per_unit: int

    #: the share of a release's epsilon spent on its noisy unit count
    COUNT_SHARE = 0.05

    @property
    def count_epsilon(self) -> float:
        """The epsilon of the noisy unit count that picks the mechanism, per group."""
        return self.epsilon * self.COUNT_SHARE

    @property
    def answer_epsilon(self) -> float:
        """The epsilon left for the answer itself, per group."""
        return self.epsilon - self.count_epsilon

    def describe(self) -> dict[str, object]:
        return {
            "measurement": "value_release",
            "function": self.target.name,
            "column": self.column,
            "mechanism": "udf_auto",
            "epsilon": self.epsilon,
            "delta": self.delta,
        }


@dataclass(frozen=True)
class Aggregate:
    """One aggregate call of the analyst's query, computed from measurements.

    Attributes:
        name: its column in the noisy table (``__a0`` ...).
        function: count, count_distinct, sum or avg.
        sql: the call as the analyst wrote it, for messages and reports.
        measurements: the names of the measurements it is post-processed from
            (avg: the centred sum, then the count).
        bounds: the column's clipping bounds (sum, avg).
    """

    name: str
    function: AggregateFunction
    sql: str
    measurements: tuple[str, ...]
    bounds: tuple[float, float] | None = None


@dataclass(frozen=True)
class QueryPlan:
    """Everything decided about one query before any data is read.

    Attributes:
        sql: the analyst's SQL text.
        table: the policy table read.
        unit_column: the privacy unit column, ``None`` for a row-level table.
        where: the row filter, as a sqlglot condition over the table's columns.
        group_keys: GROUP BY keys, in order.
        max_rows_per_unit: rows a unit keeps per group (Linf cap).
        max_groups_per_unit: groups a unit keeps (L0 cap), as used for sensitivity.
        sample_groups: whether the rewrite must enforce the L0 cap (not needed when
            a unit cannot be in more groups than the cap anyway).
        measurements: the noisy quantities.
        aggregates: the analyst's aggregate calls, each over some measurements.
        output: the final SELECT over the noisy table ``__noisy`` (columns: the
            group keys and the aggregates); HAVING, ORDER BY and LIMIT live here.
        output_names: the output column names, in order.
        epsilon: epsilon of the query's own measurements (what it is charged, but for
            ``bias_epsilon``).
        delta: delta charged for the query.
        bias_epsilon: the epsilon set aside for the bias estimates (``execute(sql,
            bias=True)``, :mod:`dpsql.release.bias`), charged with the query; 0 without.
        mechanism: "laplace" or "gaussian".
        selection: partition selection, when a key is private.
        sources: the tables read, the primary one first, with their joins.
        unit_is_row: the primary table has no privacy unit but is joined: each of its rows
            is a unit (identified by its row id) and is bounded like one.
        normalized: the query as the analyzer read it (DuckDB's dialect, after
            :mod:`dpsql.normalize`): what repeats are keyed on, whatever the dialect.
        tables: casefolded policy table -> the engine's fully qualified reference to it,
            for every table the bounded query reads (derived tables' inner ones too); set
            when the plan is bound to an engine (:func:`dpsql.engine.bind`), so that
            :mod:`dpsql.rewrite` needs nothing but the plan.
        list_parameters: whether the bound engine binds lists as query parameters (DuckDB
            does): long lists of listed key values are then bound, not written out.
    """

    sql: str
    table: str
    unit_column: str | None
    where: exp.Expr | None
    group_keys: tuple[GroupKey, ...]
    max_rows_per_unit: int
    max_groups_per_unit: int
    sample_groups: bool
    measurements: tuple[Measurement, ...]
    aggregates: tuple[Aggregate, ...]
    output: exp.Select
    output_names: tuple[str, ...]
    epsilon: float
    delta: float
    mechanism: str
    selection: Selection | None = None
    sources: tuple[Source, ...] = ()
    unit_is_row: bool = False
    value_releases: tuple[ValueRelease, ...] = ()
    notes: tuple[str, ...] = field(default=())
    normalized: str = ""
    tables: tuple[tuple[str, exp.Table], ...] = ()
    list_parameters: bool = False
    bias_epsilon: float = 0.0

    def measurement(self, name: str) -> Measurement:
        for m in self.measurements:
            if m.name == name:
                return m
        raise KeyError(name)

    def table_ref(self, name: str) -> exp.Table:
        """The engine's reference to policy table ``name`` (a copy; the plan must be bound)."""
        key = name.casefold()
        for table, ref in self.tables:
            if table == key:
                return ref.copy()
        raise KeyError(f"table {name!r} is not bound in this plan; bind it to an engine first (dpsql.engine.bind)")

    def source(self, alias: str) -> Source:
        """The source read as ``alias``."""
        for source in self.sources:
            if source.alias == alias:
                return source
        raise KeyError(alias)


@dataclass(frozen=True)
class UDFSpec:
    """What a plan knows of a registered function: plain data. Its code (``fn``, its local
    sensitivity) stays in the connection's registry (:class:`dpsql.release.udf.UDF`, whose
    ``spec`` this is), and the release looks it up by ``name``.

    Attributes:
        name: the SQL name, lower case.
        bounds: ``(lo, hi)``: answers are clipped into it; a failed block gives the midpoint.
        has_local_sensitivity: whether a local sensitivity was registered (PTR and smooth
            sensitivity need one).
        strategy: "auto", "ptr", "smooth" or "sample_and_aggregate".
        time_limit: seconds one sample-and-aggregate block may run.
    """

    name: str
    bounds: tuple[float, float]
    has_local_sensitivity: bool = False
    strategy: Strategy = "auto"
    time_limit: float = DEFAULT_TIME_LIMIT


@dataclass(frozen=True)
class QuantileSpec:
    """A built-in order statistic: ``QUANTILE_CONT(col, q)``; MEDIAN is ``q = 0.5``.

    >>> QuantileSpec(0.5, (0.0, 100.0)).name
    'median'
    """

    q: float
    bounds: tuple[float, float]
    strategy: Strategy = "auto"

    @property
    def name(self) -> str:
        return "median" if self.q == 0.5 else f"quantile_cont({self.q:g})"

    @property
    def has_local_sensitivity(self) -> bool:
        return True

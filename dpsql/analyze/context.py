"""What every analysis pass reads and fills: the query, the policy, the scope, and the keys,
aggregates and measurements planned so far.

The passes of :data:`dpsql.analyze.RULES` run in order over one :class:`Context`; each fills
the fields it names and may read what earlier passes filled. Checking passes raise; none
quietly repairs a query.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from dpsql.analyze.calibrate import MeasurementSpec
from dpsql.analyze.scope import Pending, Resolved, Scope
from dpsql.plan import Aggregate, GroupKey, Measurement, QuantileSpec, Selection, UDFSpec, ValueRelease
from dpsql.policy import Policy, TablePolicy
from dpsql.normalize import Normalized

__all__ = ["Context", "PublicRows", "PublicValues"]

#: Reads the distinct values of a public table's column (public data), or None if too many.
PublicValues = Callable[[str, str], "tuple[object, ...] | None"]

#: Reads the rows of a query over public tables only (public data), for IN / EXISTS lists.
PublicRows = Callable[[exp.Select], "list[tuple[object, ...]]"]


@dataclass
class Context:
    """The analysis of one query, filled in pass by pass."""

    sql: str
    policy: Policy
    schema: Mapping[str, Mapping[str, str]]
    requested: tuple[float | None, float | None]
    public_values: PublicValues | None = None
    udfs: Mapping[str, UDFSpec] = field(default_factory=dict)
    dialect: str | None = None
    public_rows: PublicRows | None = None
    normalized: Normalized | None = None
    bias: bool = False
    # filled by the passes, in order
    epsilon: float = field(init=False)
    delta: float = field(init=False)
    bias_epsilon: float = 0.0
    select: exp.Select = field(init=False)
    scope: Scope = field(init=False)
    pending: Pending = field(init=False)
    keys: dict[str, GroupKey] = field(default_factory=dict)
    condition: exp.Expr | None = None
    values: dict[str, tuple[Aggregate, QuantileSpec | UDFSpec, Resolved]] = field(default_factory=dict)
    aggregates: dict[str, Aggregate] = field(default_factory=dict)
    specs: dict[tuple[str, str | None], MeasurementSpec] = field(default_factory=dict)
    output: exp.Select = field(init=False)
    names: tuple[str, ...] = field(init=False)
    l0: int = field(init=False)
    sample_groups: bool = field(init=False)
    selection: Selection | None = None
    measurements: tuple[Measurement, ...] = ()
    value_releases: tuple[ValueRelease, ...] = ()
    semijoins: list[exp.Expr] = field(default_factory=list)  # IN / EXISTS over the unit's rows

    @property
    def primary(self) -> TablePolicy:
        return self.scope.primary.table

"""The policy as frozen records: :class:`Policy` holds :class:`TablePolicy` records, which
hold :class:`ColumnPolicy` records (loaded and checked by :mod:`dpsql.policy.parse`).

Table and column names are looked up case-insensitively with :meth:`str.casefold`, the way
SQL identifiers are, and exactly otherwise: no Unicode normalisation, so a look-alike name
(a Cyrillic ``а`` in ``visits``) never matches. Analyst names are matched exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dpsql.errors import PolicyError

__all__ = ["Budget", "ColumnPolicy", "Policy", "ServerLimits", "TablePolicy"]

_ACCESS_LEVELS = ("deny", "filter", "group", "aggregate")
#: The default floor on a query's epsilon (DESIGN §7): a budget of 5 then pays for at most
#: 5,000 data-reading runs, each a chance to probe a side channel, not 2.5e12.
DEFAULT_MIN_EPSILON = 1e-3

@dataclass(frozen=True)
class ServerLimits:
    """The ``[server]`` section: what the server fronts enforce besides the budget.

    Attributes:
        queries_per_minute: Data-reading queries one analyst may send per minute (a burst
            of a tenth of it at once); explain and budget calls are not counted.
        deadline_slack: How much slower than the machine's measured speed a query may run
            before it is interrupted at its deadline (:mod:`dpsql.timing`).
        deadline_margin_ms: Milliseconds added to every modelled deadline (scheduler jitter,
            an interrupt landing, a slow fsync); the server's log says at stop how much of
            their deadlines answers used (:class:`~dpsql.timing.DeadlineUsage`).
        deadline_ms: A fixed deadline for every query instead of the measured model.
        deadline_base_ms, deadline_ms_per_million_rows: the speed model itself (both or
            neither), instead of measuring it when the server starts: deadlines then do not
            change from one start to the next. The base is the fixed cost of the calibration
            query (:func:`dpsql.calibration.calibrate`); a plan of more work gets it scaled
            by its work (:class:`~dpsql.timing.TimingModel`).
    """

    queries_per_minute: int = 600
    deadline_slack: float = 3.0
    deadline_margin_ms: float = 20.0
    deadline_ms: float | None = None
    deadline_base_ms: float | None = None
    deadline_ms_per_million_rows: float | None = None


@dataclass(frozen=True)
class Budget:
    """An (epsilon, delta) privacy budget: a per-analyst lifetime allowance."""

    epsilon: float
    delta: float


@dataclass(frozen=True)
class ColumnPolicy:
    """What a query may do with one column.

    Attributes:
        name: The column name as written in the policy.
        access: ``"deny"`` (never used), ``"filter"`` (WHERE only), ``"group"`` (WHERE
            and GROUP BY) or ``"aggregate"`` (also inside aggregates; needs ``bounds``).
        bounds: Clipping range ``(lower, upper)``, lower < upper. Numbers keep the type
            the policy gave them, so integer bounds stay ``int``.
        public_values: Known group keys; grouping by them needs no partition selection.
        categories: In a local table (``model = "local"``), the domain of a categorical
            column, reported through a frequency oracle (:mod:`dpsql.local`).
    """

    name: str
    access: str
    bounds: tuple[float, float] | None = None
    public_values: tuple[object, ...] | None = None
    categories: tuple[object, ...] | None = None

    def __post_init__(self) -> None:
        if self.access not in _ACCESS_LEVELS:
            allowed = ", ".join(repr(level) for level in _ACCESS_LEVELS)
            raise PolicyError(
                f"column {self.name!r}: unknown access {self.access!r}; use one of {allowed}"
            )

    @property
    def can_filter(self) -> bool:
        """Whether the column may appear in WHERE."""
        return self.access != "deny"

    @property
    def can_group(self) -> bool:
        """Whether the column may appear in GROUP BY."""
        grouping = self.access in ("group", "aggregate") or self.public_values is not None
        return grouping and self.access != "deny"

    @property
    def can_aggregate(self) -> bool:
        """Whether the column may be summed or averaged (it has bounds to clip to)."""
        return self.bounds is not None and self.access == "aggregate"

    @property
    def is_public_key(self) -> bool:
        """Whether grouping by the column uses the public key list, not partition selection."""
        return self.public_values is not None and self.access != "deny"


@dataclass(frozen=True)
class TablePolicy:
    """How one table may be queried.

    Attributes:
        name: The table name as written in the policy.
        public: True for a public table: every column usable, no privacy unit.
        privacy_unit: The column identifying whom the table is about, or None for a
            public table or a row-level table (each row is its own privacy unit).
        max_groups_per_unit: How many groups one unit may contribute to (L0); 1 when
            ``privacy_unit`` is None.
        max_rows_per_unit: How many rows one unit may contribute per group (Linf); 1
            when ``privacy_unit`` is None.
        columns: The listed columns, keyed by casefolded name (read-only).
        declared_rows: A public upper bound on the table's row count, for the server's
            deadlines (:mod:`dpsql.timing`); ``None``: the server coarsens the real count.
        model: ``"central"`` (dpsql holds the raw rows) or ``"local"`` (clients perturb
            their own values before sending them; see :mod:`dpsql.local`).
        epsilon: In a local table, the epsilon each client report spends.
        source: Where the table's data lives when it is not a table of the database: a
            Parquet/CSV/JSON path, glob or folder, or ``"file.duckdb:table"``, relative
            to the policy file's folder (:mod:`dpsql.datasources`); ``None``: the database's.
        privacy_link: ``(column, table, referenced column)``: the table's rows belong to
            the privacy unit of the ``table`` row whose ``referenced column`` equals this
            row's ``column`` (a foreign key, like the DuckDB privacy extension's
            PRIVACY_LINK); the table then has no ``privacy_unit`` of its own, and its
            caps apply to a unit's rows reached through the link.
    """

    name: str
    public: bool
    privacy_unit: str | None
    max_groups_per_unit: int
    max_rows_per_unit: int
    columns: Mapping[str, ColumnPolicy] = field(hash=False)
    declared_rows: int | None = None
    model: str = "central"
    epsilon: float | None = None
    source: str | None = None
    privacy_link: tuple[str, str, str] | None = None

    def __post_init__(self) -> None:
        folded = {name.casefold(): column for name, column in self.columns.items()}
        object.__setattr__(self, "columns", MappingProxyType(folded))
        if self.privacy_unit is None and self.privacy_link is None:
            object.__setattr__(self, "max_groups_per_unit", 1)
            object.__setattr__(self, "max_rows_per_unit", 1)

    def column(self, name: str) -> ColumnPolicy | None:
        """Look a column up by name, ignoring case (casefold) but nothing else.

        The privacy unit column, when not listed, is ``ColumnPolicy(unit, "filter")``:
        it may be filtered on, counted distinct and joined on. In a public table an
        unlisted name gives ``ColumnPolicy(name, "aggregate")`` without bounds (so
        ``can_aggregate`` is False); the name is not checked against the database.
        Otherwise an unlisted column is None: denied.

        Args:
            name: The column name as the query spells it.

        Returns:
            The column's policy, or None if the column may not be used at all.
        """
        key = name.casefold()
        listed = self.columns.get(key)
        if listed is not None:
            return listed
        if self.privacy_unit is not None and key == self.privacy_unit.casefold():
            return ColumnPolicy(self.privacy_unit, "filter")
        if self.public:
            return ColumnPolicy(name, "aggregate")
        return None


@dataclass(frozen=True)
class Policy:
    """A whole policy file.

    Attributes:
        source: The file it came from, or ``"<string>"``.
        max_epsilon_per_query: The most epsilon one query may spend.
        max_delta_per_query: The most delta one query may spend.
        default_epsilon: The epsilon a query spends when it names none.
        accountant: ``"basic"`` (sequential composition) or ``"pld"``.
        default_budget: The lifetime budget of an analyst not listed in ``analysts``.
        analysts: Lifetime budgets by exact analyst name (read-only).
        tables: Table policies keyed by casefolded name (read-only).
        min_epsilon_per_query: The least epsilon one query may spend (a floor on how many
            data-reading runs a budget buys; DESIGN §7).
        server: Limits of the server fronts: rate and deadlines.
    """

    source: str
    max_epsilon_per_query: float
    max_delta_per_query: float
    default_epsilon: float
    accountant: str
    default_budget: Budget
    analysts: Mapping[str, Budget] = field(hash=False)
    tables: Mapping[str, TablePolicy] = field(hash=False)
    min_epsilon_per_query: float = DEFAULT_MIN_EPSILON
    server: ServerLimits = field(default_factory=lambda: ServerLimits())

    def __post_init__(self) -> None:
        object.__setattr__(self, "analysts", MappingProxyType(dict(self.analysts)))
        folded = {name.casefold(): table for name, table in self.tables.items()}
        object.__setattr__(self, "tables", MappingProxyType(folded))

    def table(self, name: str) -> TablePolicy | None:
        """Look a table up by name, ignoring case (casefold); None if not in the policy."""
        return self.tables.get(name.casefold())

    def budget_for(self, analyst: str) -> Budget:
        """The lifetime budget of ``analyst`` (exact name), or the default budget."""
        return self.analysts.get(analyst, self.default_budget)


# ---------------------------------------------------------------- loading

"""The collection client: a client perturbs its own record before anything leaves it.

``Reporter(policy, "telemetry")`` reads the local table's section of the policy: the
epsilon of one report, and per column its ``bounds`` (a number, through the adaptive-range
mechanism, :mod:`dpsql.local.ranges`) or ``categories`` (a category, through a frequency
oracle, :mod:`dpsql.local.frequency`). :meth:`Reporter.report` turns one record into one
:class:`~dpsql.local.reports.Reports` per column, so the columns travel apart.

Budget. Each report is ``epsilon``-LDP. A record of ``m`` columns spends ``m * epsilon``
(basic composition) against anyone who can link its reports, such as the shuffler; see
:mod:`dpsql.local.shuffle` for what shuffling adds. :attr:`Reporter.epsilon_per_record`
says it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpsql.local._common import ReportError
from dpsql.local.frequency import FrequencyOracle, categories_digest, choose_oracle, perturb_category
from dpsql.local.ranges import AdaptiveRange
from dpsql.local.reports import Reports
from dpsql.noise import RandomSource
from dpsql.policy import ColumnPolicy, Policy, TablePolicy, load_policy

__all__ = ["ColumnMechanism", "Reporter", "mechanisms_for"]


@dataclass(frozen=True)
class ColumnMechanism:
    """How one column of a local table is reported.

    Attributes:
        column: The column's policy.
        range: For a number: the adaptive-range mechanism.
        oracle: For a category: the frequency oracle.
        params: The text stored with every report (mechanism, parameters, domain).
    """

    column: ColumnPolicy
    range: AdaptiveRange | None
    oracle: FrequencyOracle | None
    params: str


def mechanisms_for(table: TablePolicy) -> dict[str, ColumnMechanism]:
    """The mechanism of every column of a local table, keyed by casefolded name."""
    if table.model != "local" or table.epsilon is None:
        raise ReportError(f"table {table.name!r} is not a local table; give it model = \"local\" "
                          "and epsilon = ... in the policy")
    out: dict[str, ColumnMechanism] = {}
    for key, column in table.columns.items():
        if column.bounds is not None:
            m = AdaptiveRange(column.bounds[0], column.bounds[1], table.epsilon)
            params = f"range;lower={m.lower!r};upper={m.upper!r};epsilon={m.epsilon!r}"
            out[key] = ColumnMechanism(column, m, None, params)
        else:
            categories = column.categories or ()
            oracle = choose_oracle(len(categories), table.epsilon)
            params = f"{oracle.describe()};categories={categories_digest(categories)}"
            out[key] = ColumnMechanism(column, None, oracle, params)
    return out


class Reporter:
    """Perturbs records of one local table on the client.

    Args:
        policy: The policy (a loaded :class:`~dpsql.policy.Policy` or a file).
        table: The local table's name.
        source: A seeded source for unit tests only; by default the OS CSPRNG.

    >>> from dpsql.policy import parse_policy
    >>> policy = parse_policy('''
    ... [privacy]
    ... max_epsilon_per_query = 1.0
    ... max_delta_per_query = 0
    ... default_epsilon = 1.0
    ... [budget]
    ... default = { epsilon = 5.0, delta = 0 }
    ... [tables.telemetry]
    ... model = "local"
    ... epsilon = 1.0
    ... [tables.telemetry.columns]
    ... temp = { bounds = [-10, 50] }
    ... os = { categories = ["linux", "mac", "windows"] }
    ... ''')
    >>> reporter = Reporter(policy, "telemetry")
    >>> [(r.column, len(r)) for r in reporter.report({"temp": 21.5, "os": "mac"})]
    [('temp', 1), ('os', 1)]
    >>> reporter.epsilon_per_record
    2.0
    """

    def __init__(self, policy: Policy | str | os.PathLike[str], table: str, *,
                 source: RandomSource | None = None) -> None:
        loaded = policy if isinstance(policy, Policy) else load_policy(policy)
        found = loaded.table(table)
        if found is None:
            raise ReportError(f"the policy has no table {table!r}; add a [tables.{table}] section "
                              'with model = "local"')
        self._table = found
        self._mechanisms = mechanisms_for(found)
        self._source = source

    @property
    def table(self) -> TablePolicy:
        return self._table

    @property
    def epsilon_per_report(self) -> float:
        """What one column's report spends."""
        return float(self._table.epsilon)  # type: ignore[arg-type]

    @property
    def epsilon_per_record(self) -> float:
        """What one whole record spends against anyone who can link its reports."""
        return self.epsilon_per_report * len(self._mechanisms)

    def report(self, record: Mapping[str, object]) -> tuple[Reports, ...]:
        """One record's reports, one bundle per column (in the policy's column order).

        Raises:
            ReportError: a column missing from the record, a field the table does not
                list, a number that is NaN, or a category not in the policy.
        """
        return self.report_many({name: [value] for name, value in record.items()})

    def report_many(self, columns: Mapping[str, npt.ArrayLike | list[object]]) -> tuple[Reports, ...]:
        """Many clients' records at once, given column-wise (a simulation of many clients,
        or a trusted gateway): one bundle per column, row ``i`` being client ``i``'s report."""
        given = {name.casefold(): values for name, values in columns.items()}
        unknown = sorted(set(given) - set(self._mechanisms))
        if unknown:
            raise ReportError(f"the record has field(s) {unknown} that table {self._table.name!r} "
                              f"does not list; remove them (listed: {sorted(self._mechanisms)})")
        missing = sorted(set(self._mechanisms) - set(given))
        if missing:
            raise ReportError(f"the record lacks column(s) {missing} of table {self._table.name!r}; "
                              "every record reports every column (a missing value would be visible)")
        sizes = {len(v) for v in given.values()}  # type: ignore[arg-type]
        if len(sizes) != 1:
            raise ReportError(f"the columns have different lengths {sorted(sizes)}; give one value per client in each")
        return tuple(self._column(key, mechanism, given[key]) for key, mechanism in self._mechanisms.items())

    def _column(self, key: str, mechanism: ColumnMechanism, values: object) -> Reports:
        name, table = key, self._table.name.casefold()
        if mechanism.range is not None:
            try:
                numbers = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                raise ReportError(f"column {name!r} takes numbers, got {values!r}") from None
            reported = mechanism.range.perturb(numbers, source=self._source)
            return Reports(table, name, mechanism.params, values=reported)
        categories = mechanism.column.categories or ()
        reports = perturb_category(values, categories, self.epsilon_per_report,  # type: ignore[arg-type]
                                   oracle=mechanism.oracle.kind, source=self._source)  # type: ignore[union-attr, arg-type]
        return Reports(table, name, mechanism.params, items=reports.items, keys=reports.keys, bits=reports.bits)

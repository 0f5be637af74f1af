"""Report building: the :class:`~dpsql.result.Result` of a query, with its privacy report
(per output column: the mechanism, the noise, the measurements) and its accuracy, for a
fresh answer and for a free repeat; and the charge a plan records in the ledger.

Reads only the plan and the released values: nothing here touches private data.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Protocol

import pyarrow as pa
import sqlglot.expressions as exp

from dpsql.codec import jsonable
from dpsql.plan import QueryPlan, UDFSpec, ValueRelease
from dpsql.privacy import Charge
from dpsql.noise import noise_std
from dpsql.privacy.events import describe, events_of
from dpsql.release.bias import bias_events
from dpsql.release.udf.registry import choose_strategy
from dpsql.result import Accuracy, ColumnPrivacy, PrivacyReport, Result

__all__ = ["charge_of", "described", "fresh_result", "listed_keys_result", "privacy_report", "uses_udf", "with_values"]


class _Postprocessor(Protocol):
    def run(self, plan: QueryPlan, noisy: pa.Table) -> tuple[pa.Table, dict[str, list[float | None]]]: ...


def charge_of(plan: QueryPlan, sql: str) -> Charge:
    """What the plan costs: its (epsilon, delta) and the typed privacy event of each
    measurement (:func:`dpsql.privacy.events.events_of`); with a bias estimate
    (``plan.bias_epsilon``), its share and events too (:func:`dpsql.release.bias.bias_events`)."""
    if plan.bias_epsilon:
        share = plan.bias_epsilon
        return Charge(plan.epsilon + share, plan.delta, sql, (*events_of(plan), *bias_events(plan, share)))
    return Charge(plan.epsilon, plan.delta, sql, events_of(plan))


def fresh_result(plan: QueryPlan, table: object, cells: dict[str, list[float | None]], sql: str, *,
            cached: bool) -> Result:
    result = Result(table, privacy_report(plan), Accuracy(cells), sql)
    result.cached = cached
    return result


def listed_keys_result(plan: QueryPlan, post: _Postprocessor, sql: str) -> Result:
    """GROUP BY keys the policy lists, and nothing measured (``SELECT DISTINCT region``):
    the answer is every listed value, known without the data, so nothing is read or
    charged (issue 14, item 3)."""
    from dpsql.release import noisy_schema  # noqa: PLC0415 - the noisy table's types

    schema = noisy_schema(plan)
    grid = list(itertools.product(*(k.public_values or () for k in plan.group_keys)))
    columns = [pa.array([row[i] for row in grid], type=schema.field(k.name).type) for i, k in enumerate(plan.group_keys)]
    noisy = pa.table(columns, names=[k.name for k in plan.group_keys])
    table, cells = post.run(plan, noisy)
    report = privacy_report(plan)
    note = "only keys the policy lists were asked for: the answer is known without the data, and free"
    return Result(table, replace(report, epsilon=0.0, delta=0.0, notes=(*report.notes, note)), Accuracy(cells), sql)


def uses_udf(plan: QueryPlan) -> bool:
    """Whether a registered UDF answers part of the query: its code is not part of the
    repeat key, so such queries are answered afresh (and charged) every time."""
    return any(isinstance(r.target, UDFSpec) for r in getattr(plan, "value_releases", ()))


def described(plan: QueryPlan) -> tuple[dict[str, object], ...]:
    """Every noisy quantity of the plan, as the ledger records it."""
    selection = (describe(plan.selection),) if plan.selection is not None else ()
    values = tuple(describe(r) for r in plan.value_releases)
    return selection + tuple(describe(m) for m in plan.measurements) + values


#: How a smooth-sensitivity answer's ± is made (issue 15 item 4; :mod:`dpsql.release.udf.smooth`).
SMOOTH_HALF_WIDTH = (
    "smooth sensitivity's noise scale is set by the data's smooth sensitivity S, which is not private, "
    "so its ± comes from a differentially private upper bound of S bought with 20% of this release's "
    "epsilon: it covers the noise with probability at least 95% and is typically about twice as wide "
    "as S itself would give. PTR and sample-and-aggregate give an exact ±."
)


def with_values(result: Result, plan: QueryPlan, report: dict[str, list[object]]) -> Result:
    """The privacy report with what each order statistic or UDF actually used, and why."""
    if not report:
        return result
    columns = dict(result.privacy.columns)
    notes = list(result.privacy.notes)
    for name, projection in zip(plan.output_names, plan.output.expressions):
        refs = [c.name for c in projection.find_all(exp.Column) if c.name in report]
        outs = [o for r in refs for o in report[r]]
        if not outs:
            continue
        mechanisms = "+".join(sorted({o.mechanism for o in outs}))  # type: ignore[attr-defined]
        described = tuple(jsonable(o.describe()) for o in outs)  # type: ignore[attr-defined]
        columns[name] = ColumnPrivacy(mechanisms, None, described)
        why = str(outs[0].parameters.get("why", ""))  # type: ignore[attr-defined]
        per_group = " (chosen per group from a noisy unit count; first group shown)" if len(outs) > 1 else ""
        notes.append(f"{name}: {why}{per_group}")
        if any(o.mechanism == "smooth_sensitivity" for o in outs):  # type: ignore[attr-defined]
            notes.append(f"{name}: {SMOOTH_HALF_WIDTH}")
        refused = sum(bool(o.refused) for o in outs)  # type: ignore[attr-defined]
        if refused:
            notes.append(f"{name}: {refused} of {len(outs)} group(s) refused by PTR (NULL): {outs[0].reason or 'unstable'}")  # type: ignore[attr-defined]
    result.privacy = replace(result.privacy, columns=columns, notes=tuple(notes))
    return result


def _expected_value_privacy(releases: list[ValueRelease]) -> ColumnPrivacy:
    """The mechanism an order statistic or UDF is expected to use, before running: the
    choice is made per group from a noisy unit count, so this models a group of
    ``_NOMINAL_UNITS`` units."""
    names = {"smooth": "smooth_sensitivity", "ptr": "ptr", "sample_and_aggregate": "sample_and_aggregate"}
    described = []
    for r in releases:
        eps = r.answer_epsilon
        strategy, why = choose_strategy(r.target, _NOMINAL_UNITS, eps, r.delta, rows_per_unit=r.rows_per_unit)
        described.append(jsonable({**describe(r), "mechanism": names[strategy], "why": why,
                                   "decided": "per group at run time"}))
    mechanism = "+".join(sorted({str(d["mechanism"]) for d in described}))
    return ColumnPrivacy(mechanism, None, tuple(described))


#: The group size :func:`_expected_value_privacy` models.
_NOMINAL_UNITS = 1000


def privacy_report(plan: QueryPlan) -> PrivacyReport:
    by_name = {a.name: a for a in plan.aggregates}
    keys = {k.name: k for k in plan.group_keys}
    columns: dict[str, ColumnPrivacy] = {}
    for name, projection in zip(plan.output_names, plan.output.expressions):
        refs = [c.name for c in projection.find_all(exp.Column)]
        used = [by_name[r] for r in refs if r in by_name]
        measurements = tuple(plan.measurement(n) for a in used for n in a.measurements)
        values = [r for r in plan.value_releases if r.name in refs]
        if values and not measurements:
            columns[name] = _expected_value_privacy(values)
            continue
        if not measurements:
            private = any(r in keys and not keys[r].is_public for r in refs)
            public = any(r in keys for r in refs)
            mechanism = "partition_selection" if private else "public" if public else "none"
            described = (jsonable(describe(plan.selection)),) if private and plan.selection else ()
            columns[name] = ColumnPrivacy(mechanism, None, described)
            continue
        mechanisms = "+".join(sorted({m.mechanism for m in measurements}))
        bare = projection.unalias()
        simple = len(used) == 1 and used[0].function in ("count", "count_distinct", "sum") and bare.name in by_name
        std = noise_std(measurements[0]) if simple else None
        columns[name] = ColumnPrivacy(mechanisms, std, tuple(jsonable(describe(m)) for m in measurements))
    notes = plan.notes + ((bias_note(plan),) if plan.measurements or plan.value_releases else ())
    return PrivacyReport(plan.epsilon, plan.delta, columns, notes)


def bias_note(plan: QueryPlan) -> str:
    """What every noisy cell's interval leaves out (issue 15): the bias of bounding."""
    return (f"± is a 95% interval of the noise only. Contribution bounding is not in it: rows beyond "
            f"{plan.max_rows_per_unit} per person and group or beyond {plan.max_groups_per_unit} group(s) "
            "per person are dropped, and values are clipped into their bounds, which can bias an answer "
            "(a COUNT or SUM of non-negative values only downwards). The data owner measures that bias "
            "with `dpsql policy check --db`.")

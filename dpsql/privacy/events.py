"""Typed privacy events: what each released measurement guarantees, as frozen records.

In the style of dp_accounting's ``DpEvent``: the plan's measurements become events
(:func:`events_of`), a :class:`~dpsql.privacy.Charge` carries them, the ledger stores them
(:func:`encode` / :func:`decode`, versioned) and each accountant composes the ones it
``supports(event)``; a charge with an event an accountant does not support is composed
from its own (epsilon, delta) instead.

=====================================  ============================================
event                                   guarantee
=====================================  ============================================
:class:`LaplaceEvent`                   ``epsilon``-DP (discrete Laplace noise)
:class:`GaussianEvent`                  ``mu``-GDP (discrete Gaussian noise)
:class:`PartitionSelectionEvent`        (``epsilon``, ``delta``)-DP (noisy threshold)
:class:`ValueReleaseEvent`              (``epsilon``, ``delta``)-DP per group (UDFs, order statistics)
:class:`UnknownEvent`                   none of its own (a description dpsql cannot read)
=====================================  ============================================

Every event also keeps its ``description``: the JSON-able dict reports and the ledger
show (mechanism, column, bounds, lattice ...), exactly as it was given.

Stored form. The ledger's ``mechanisms`` column holds ``{"version": 2, "events": [...]}``,
each event ``{"type": ..., <its parameters>, "description": {...}}``. Rows written before
events were typed (version 1) hold a bare list of descriptions; :func:`decode` reads both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dpsql.errors import Error
from dpsql.noise import noise_std, scale
from dpsql.plan import Measurement, QueryPlan, Selection, ValueRelease

__all__ = [
    "EVENTS_VERSION",
    "DpEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "PartitionSelectionEvent",
    "UnknownEvent",
    "ValueReleaseEvent",
    "decode",
    "describe",
    "encode",
    "event_from_description",
    "events_of",
]

#: The version of the stored form written by :func:`encode`.
EVENTS_VERSION = 2


@dataclass(frozen=True, kw_only=True)
class DpEvent:
    """One released measurement's privacy guarantee (subclasses say which).

    Attributes:
        description: the JSON-able description shown in reports and stored in the ledger
            (not compared: two events with the same guarantee are equal).
    """

    kind: ClassVar[str] = "unknown"
    description: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def describe(self) -> dict[str, Any]:
        """The description, as a new dict."""
        return dict(self.description)

    def parameters(self) -> dict[str, float]:
        """The typed parameters, for the stored form."""
        return {}


@dataclass(frozen=True, kw_only=True)
class LaplaceEvent(DpEvent):
    """Discrete Laplace noise calibrated to ``epsilon``-DP."""

    kind: ClassVar[str] = "laplace"
    epsilon: float

    def parameters(self) -> dict[str, float]:
        return {"epsilon": self.epsilon}


@dataclass(frozen=True, kw_only=True)
class GaussianEvent(DpEvent):
    """Discrete Gaussian noise calibrated to ``mu``-GDP."""

    kind: ClassVar[str] = "gaussian"
    mu: float

    def parameters(self) -> dict[str, float]:
        return {"mu": self.mu}


@dataclass(frozen=True, kw_only=True)
class PartitionSelectionEvent(DpEvent):
    """Private group keys released by a noisy unit count over a threshold: (epsilon, delta)-DP."""

    kind: ClassVar[str] = "partition_selection"
    epsilon: float
    delta: float

    def parameters(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True, kw_only=True)
class ValueReleaseEvent(DpEvent):
    """An order statistic or UDF answered from the values (PTR, smooth sensitivity or
    sample-and-aggregate, chosen per group): (epsilon, delta)-DP per group."""

    kind: ClassVar[str] = "value_release"
    epsilon: float
    delta: float

    def parameters(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(DpEvent):
    """A description dpsql cannot read as a guarantee (a malformed or future one): no
    accountant supports it, so its charge composes from its own (epsilon, delta)."""

    kind: ClassVar[str] = "unknown"


_TYPES: dict[str, type[DpEvent]] = {
    cls.kind: cls for cls in (LaplaceEvent, GaussianEvent, PartitionSelectionEvent, ValueReleaseEvent, UnknownEvent)
}


def describe(quantity: Measurement | Selection | ValueRelease) -> dict[str, object]:
    """The JSON-able description of one noisy quantity of a plan, for the ledger and reports
    (its noise's standard deviation or scale from :mod:`dpsql.noise`: the plan holds only
    the noise's parameters)."""
    if isinstance(quantity, ValueRelease):
        return quantity.describe()
    if isinstance(quantity, Selection):
        return {
            "measurement": "partition_selection",
            "mechanism": "laplace_threshold",
            "epsilon": quantity.epsilon,
            "delta": quantity.delta,
            "threshold": quantity.threshold,
            "noise_scale": scale(quantity.noise),
        }
    m = quantity
    return {
        "measurement": m.kind,
        "column": m.column,
        "bounds": list(m.bounds) if m.bounds is not None else None,
        "bounds_from": m.bounds_from if m.bounds is not None else None,
        "mechanism": m.mechanism,
        "epsilon": m.epsilon,
        "mu": m.mu,
        "sensitivity": m.group_sensitivity,
        "lattice": m.lattice,
        "noise_std": noise_std(m),
    }


def events_of(plan: QueryPlan) -> tuple[DpEvent, ...]:
    """The events a plan releases, built from its typed fields: partition selection, then
    each measurement, then each value release (the order the ledger has always shown)."""
    events: list[DpEvent] = []
    if plan.selection is not None:
        s = plan.selection
        events.append(PartitionSelectionEvent(epsilon=s.epsilon, delta=s.delta, description=describe(s)))
    for m in plan.measurements:
        if m.mechanism == "gaussian":
            events.append(GaussianEvent(mu=m.mu, description=describe(m)))
        else:
            events.append(LaplaceEvent(epsilon=m.epsilon, description=describe(m)))
    for r in plan.value_releases:
        events.append(ValueReleaseEvent(epsilon=r.epsilon, delta=r.delta, description=describe(r)))
    return tuple(events)


def _positive(value: object) -> float | None:
    """``value`` as a float if it is a finite number > 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def _amount(value: object) -> float | None:
    """``value`` as a float if it is a finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def event_from_description(description: Mapping[str, Any]) -> DpEvent:
    """The event a (version 1) description stands for: read by its ``"mechanism"``;
    anything malformed or unknown is an :class:`UnknownEvent`."""
    kind = description.get("mechanism")
    if kind == "laplace" and (epsilon := _positive(description.get("epsilon"))) is not None:
        return LaplaceEvent(epsilon=epsilon, description=description)
    if kind == "gaussian" and (mu := _positive(description.get("mu"))) is not None:
        return GaussianEvent(mu=mu, description=description)
    epsilon, delta = _amount(description.get("epsilon")), _amount(description.get("delta"))
    if epsilon is not None and delta is not None:
        if kind == "laplace_threshold":
            return PartitionSelectionEvent(epsilon=epsilon, delta=delta, description=description)
        if kind == "udf_auto":
            return ValueReleaseEvent(epsilon=epsilon, delta=delta, description=description)
    return UnknownEvent(description=description)


def encode(events: Sequence[DpEvent]) -> str:
    """The stored form (version :data:`EVENTS_VERSION`), as JSON text.

    Raises:
        TypeError, ValueError: a description is not JSON-able.
    """
    rows = [{"type": e.kind, **e.parameters(), "description": dict(e.description)} for e in events]
    return json.dumps({"version": EVENTS_VERSION, "events": rows}, sort_keys=True)


def decode(text: str) -> tuple[DpEvent, ...]:
    """Events from their stored form: version 2, or a version 1 list of descriptions.

    Raises:
        Error: the text is neither (a ledger written by a newer dpsql).
    """
    stored = json.loads(text)
    if isinstance(stored, list):  # version 1: descriptions only
        return tuple(event_from_description(d) for d in stored)
    if not isinstance(stored, dict) or stored.get("version") != EVENTS_VERSION:
        version = stored.get("version") if isinstance(stored, dict) else None
        raise Error(
            f"the ledger holds privacy events of an unknown version ({version!r}; this dpsql reads "
            f"{EVENTS_VERSION} and 1): it was written by a newer dpsql. Upgrade dpsql to read it; "
            "never edit or reset a ledger to get around this (its charges are the budget spent)."
        )
    events = []
    for row in stored["events"]:
        cls = _TYPES.get(row.get("type"), UnknownEvent)
        params = {k: v for k, v in row.items() if k not in ("type", "description") and cls is not UnknownEvent}
        events.append(cls(description=row.get("description", {}), **params))
    return tuple(events)

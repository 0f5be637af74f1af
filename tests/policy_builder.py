"""Policies for tests: the ``[privacy]`` and ``[budget]`` preamble written once.

A test names only what it is about (its tables, and the limits that differ from these
defaults); :func:`policy_text` writes the rest. The ``make_policy`` fixture in
``conftest.py`` parses the text.

>>> print(policy_text('[tables.t]\\nprivacy_unit = "u"\\n', max_epsilon=1.0, budget=(5.0, 1e-5)))
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-06
default_epsilon = 1.0
[budget]
default = { epsilon = 5.0, delta = 1e-05 }
[tables.t]
privacy_unit = "u"
<BLANKLINE>
"""

from __future__ import annotations

from collections.abc import Mapping

from dpsql.policy import Policy, parse_policy


def policy_text(tables: str = "", *, max_epsilon: float = 10.0, max_delta: float = 1e-6, default_epsilon: float = 1.0,
                budget: tuple[float, float] = (1e6, 0.5), analysts: Mapping[str, tuple[float, float]] | None = None,
                privacy: str = "") -> str:
    """A policy file's text: the limits, the default budget (epsilon, delta), any analysts'
    own budgets, extra ``[privacy]`` lines (``accountant = "pld"``), then ``tables``."""
    lines = [
        "[privacy]",
        f"max_epsilon_per_query = {float(max_epsilon)!r}",
        f"max_delta_per_query = {float(max_delta)!r}",
        f"default_epsilon = {float(default_epsilon)!r}",
        *([privacy.strip("\n")] if privacy else []),
        "[budget]",
        f"default = {{ epsilon = {float(budget[0])!r}, delta = {float(budget[1])!r} }}",
    ]
    if analysts:
        lines.append("[budget.analysts]")
        lines += [f"{name} = {{ epsilon = {float(e)!r}, delta = {float(d)!r} }}" for name, (e, d) in analysts.items()]
    return "\n".join(lines) + "\n" + tables.lstrip("\n")


def make_policy(tables: str = "", *, source: str = "<test policy>", **limits: object) -> Policy:
    """:func:`policy_text`, parsed."""
    return parse_policy(policy_text(tables, **limits), source=source)  # type: ignore[arg-type]

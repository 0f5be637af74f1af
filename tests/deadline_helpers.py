"""Generous deadlines for the servers of functional tests.

A server releases every answer that reads data at a deadline of ``slack x`` its calibrated
model ``+ margin`` (:mod:`dpsql.timing`); a run past it is an overrun, answered with the charged
``dpsql.QueryFailed``. The production values (slack 3, margin 20 ms) are sized for a machine
whose speed was measured while it was as busy as it is when it answers. A test machine shared
with other jobs is not: at load 5-20 on two cores, with the test run ``nice``-d, a server gets
a twentieth of a core or less for seconds at a time, and honest queries overran, failing tests
about tokens, parameters, budgets and races that are not about time at all.

:func:`generous_deadlines` writes a copy of a policy whose ``[server]`` section has a slack of
:data:`SLACK` and a margin of :data:`MARGIN_MS`: a run may be 20 times slower than the model and
stall half a second more before it overruns. Answers are still held until their deadline (the
servers' release path is unchanged, ~1 s a fresh data query on the demo database), so the tests
that use it keep few fresh queries. Tests ABOUT timing (``tests/attacks`` timing and
side-channel tests, ``tests/test_workers.py``, the benchmarks) keep the real deadlines and do
not use this.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dpsql.policy import load_policy

SLACK = 20.0
MARGIN_MS = 500.0
_REPLACED = re.compile(r"^\s*(deadline_slack|deadline_margin_ms)\s*=")
_SECTION = re.compile(r"^\s*\[")


def generous_deadlines(policy: Path, into: Path) -> Path:
    """Write ``policy`` to ``into`` with ``[server] deadline_slack = SLACK`` and
    ``deadline_margin_ms = MARGIN_MS`` (replacing any given), checked by the policy parser."""
    text = policy.read_text()
    server = tomllib.loads(text).get("server", {})
    assert "deadline_ms" not in server, f"{policy} pins a fixed deadline; a test that does so is about timing"
    keys = [f"deadline_slack = {SLACK}", f"deadline_margin_ms = {MARGIN_MS}"]
    lines, in_server, added = [], False, False
    for line in text.splitlines():
        if _SECTION.match(line):
            in_server = line.strip() == "[server]"
        if in_server and _REPLACED.match(line):
            continue
        lines.append(line)
        if in_server and line.strip() == "[server]":
            lines.extend(keys)
            added = True
    if not added:
        lines += ["", "[server]", *keys]
    into.write_text("\n".join(lines) + "\n")
    limits = load_policy(into).server
    assert (limits.deadline_slack, limits.deadline_margin_ms) == (SLACK, MARGIN_MS), limits
    return into

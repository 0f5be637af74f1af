"""The generous deadlines the functional server tests run with (tests/deadline_helpers.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deadline_helpers import MARGIN_MS, SLACK, generous_deadlines  # noqa: E402
from dpsql.policy import load_policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "policies" / "demo.toml"


def test_the_demo_policy_gets_the_generous_slack_and_margin_and_keeps_the_rest(tmp_path: Path) -> None:
    before = load_policy(DEMO)
    after = load_policy(generous_deadlines(DEMO, tmp_path / "p.toml"))
    assert before.server.deadline_slack == 3.0  # the demo's own value is replaced, not duplicated
    assert (after.server.deadline_slack, after.server.deadline_margin_ms) == (SLACK, MARGIN_MS)
    assert after.server.queries_per_minute == before.server.queries_per_minute
    assert dataclasses.replace(after, server=before.server, source=before.source) == before  # nothing else changed


def test_a_policy_without_a_server_section_gets_one_and_a_pinned_model_is_kept(tmp_path: Path) -> None:
    text = DEMO.read_text()
    start = text.index("[server]")
    end = text.index("\n[", start + 1)
    bare = tmp_path / "bare.toml"
    bare.write_text(text[:start] + text[end + 1:])
    assert load_policy(bare).server.deadline_slack == 3.0
    assert load_policy(generous_deadlines(bare, bare)).server.deadline_slack == SLACK
    pinned = tmp_path / "pinned.toml"
    pinned.write_text(text.replace("[server]\n", "[server]\ndeadline_base_ms = 50\ndeadline_ms_per_million_rows = 2000\n"))
    limits = load_policy(generous_deadlines(pinned, pinned)).server
    assert (limits.deadline_base_ms, limits.deadline_ms_per_million_rows, limits.deadline_slack) == (50, 2000, SLACK)


def test_a_fixed_deadline_is_left_to_the_timing_tests(tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(DEMO.read_text().replace("[server]\n", "[server]\ndeadline_ms = 300\n"))
    with pytest.raises(AssertionError, match="pins a fixed deadline"):
        generous_deadlines(fixed, tmp_path / "out.toml")

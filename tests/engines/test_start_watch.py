"""The Spark session fixture's start-up watchdog (``engine_support.start_watched``): a start
that hangs in a child process is killed and tried again, and a run fails fast instead of
holding CI until its time limit."""

from __future__ import annotations

import subprocess
import time

import pytest

from engine_support import start_watched


def _hanging_then(result: str, hangs: int) -> tuple[list[subprocess.Popen[bytes]], object]:
    """A start that waits on a child that never exits (as pyspark waits on its JVM) for its
    first ``hangs`` calls, raising when the child is killed; then returns ``result``."""
    children: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        if len(children) < hangs:
            child = subprocess.Popen(["sleep", "600"])
            children.append(child)
            if child.wait() != 0:
                raise RuntimeError("Java gateway process exited before sending its port number")
        return result

    return children, start


def _sleeps(cmd: str) -> bool:
    return cmd.startswith("sleep 600")


def test_a_start_that_hangs_is_killed_and_started_again() -> None:
    children, start = _hanging_then("session", hangs=1)
    began = time.monotonic()
    assert start_watched(start, limit=1.0, tries=2, kills=_sleeps) == "session"
    assert time.monotonic() - began < 20
    assert len(children) == 1 and children[0].returncode == -9  # SIGKILL, by the watchdog


def test_a_start_that_always_hangs_fails_with_what_happened() -> None:
    children, start = _hanging_then("never", hangs=10)
    with pytest.raises(pytest.fail.Exception, match="did not start in 2 tries of 1 s"):
        start_watched(start, limit=1.0, tries=2, kills=_sleeps)
    assert [c.returncode for c in children] == [-9, -9]


def test_an_error_at_start_is_raised_at_once_not_retried() -> None:
    calls = []

    def start() -> None:
        calls.append(1)
        raise ValueError("no Java runtime")

    with pytest.raises(ValueError, match="no Java runtime"):
        start_watched(start, limit=5.0, tries=2)
    assert calls == [1]


def test_a_quick_start_returns_its_session() -> None:
    assert start_watched(lambda: "session", limit=5.0) == "session"


def test_only_the_picked_children_are_killed() -> None:
    other = subprocess.Popen(["sleep", "601"])
    try:
        children, start = _hanging_then("session", hangs=1)
        assert start_watched(start, limit=1.0, tries=2, kills=_sleeps) == "session"
        assert children[0].returncode == -9 and other.poll() is None
    finally:
        other.kill()
        other.wait()

"""The server's per-query path: what a served repeat and a fresh answer cost the front."""

from __future__ import annotations

import dataclasses

from dpsql.codec import dumps, report_from_payload, report_payload
from dpsql.result import ColumnPrivacy, PrivacyReport


def _report() -> PrivacyReport:
    measurements = ({"mechanism": "laplace", "bounds": [0, 1], "nested": {"k": [1, 2]}}, {"scale": 2.5})
    return PrivacyReport(0.5, 1e-6, {"n": ColumnPrivacy("laplace", 2.0, measurements),
                                     "k": ColumnPrivacy("public")}, ("a note",))


def test_report_payload_dumps_as_dataclasses_asdict_did() -> None:
    report = _report()
    old = {"epsilon": report.epsilon, "delta": report.delta,
           "columns": {name: dataclasses.asdict(c) for name, c in report.columns.items()},
           "notes": list(report.notes)}
    assert dumps(report_payload(report)) == dumps(old)
    assert report_from_payload(report_payload(report)) == report


def test_report_payload_names_every_field_of_a_column() -> None:
    # a field added to ColumnPrivacy must be added to the payload too
    payload = report_payload(_report())["columns"]["n"]
    assert list(payload) == [f.name for f in dataclasses.fields(ColumnPrivacy)]


def test_the_watchdog_interrupt_in_flight_lands_before_disarm_returns() -> None:
    import threading
    import time

    from dpsql.watchdog import Watchdog

    events: list[str] = []
    started = threading.Event()

    def slow_interrupt() -> None:
        started.set()
        time.sleep(0.2)
        events.append("interrupted")

    dog = Watchdog(slow_interrupt)
    late = threading.Event()
    dog.arm(time.monotonic(), late)  # due at once
    assert started.wait(5)
    dog.disarm()
    events.append("disarmed")
    assert late.is_set() and events == ["interrupted", "disarmed"]


def test_the_watchdog_rearmed_many_times_fires_only_for_a_passed_deadline() -> None:
    import threading
    import time

    from dpsql.watchdog import Watchdog

    fired: list[int] = []
    dog = Watchdog(lambda: fired.append(1))
    for _ in range(200):  # deadlines never reached: no interrupt
        late = threading.Event()
        dog.arm(time.monotonic() + 30, late)
        dog.disarm()
        assert not late.is_set()
    late = threading.Event()
    dog.arm(time.monotonic() + 0.05, late)
    assert late.wait(5) and fired == [1]
    dog.disarm()


def test_a_program_that_leaves_without_closing_its_worker_pool_still_exits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The workers ignore SIGTERM (the server stops them after its calls in flight), which is
    # what multiprocessing sends daemonic children at exit before joining them: without the
    # pool's exit hook this program never ends.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "leave.py"
    script.write_text(
        "from pathlib import Path\n"
        "from dpsql.demo import make_demo_database\n"
        "from dpsql.service import Service\n"
        "if __name__ == '__main__':\n"
        f"    home = Path({str(tmp_path)!r})\n"
        "    make_demo_database(home / 'tiny.duckdb', rows=200, units=20)\n"
        "    text = (Path({root!r}) / 'policies' / 'demo.toml').read_text()\n".replace("{root!r}", repr(str(root)))
        + "    (home / 'policy.toml').write_text(text.replace('[server]', '[server]\\ndeadline_ms = 500', 1))\n"
        "    service = Service.open(home / 'tiny.duckdb', home / 'policy.toml', home / 'ledger.sqlite', workers=2)\n"
        "    print('opened', flush=True)\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert "opened" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 0

"""What the benchmark scripts share: the core query, its hand-written floor, and the
machine description of their reports. Standard library only, so a benchmark's child
process can import it cheaply."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

#: The query bench_core and bench_scale time.
QUERY = "SELECT region, COUNT(*), SUM(income), AVG(income) FROM visits GROUP BY region"

#: Its user-level floor: one GROUP BY unit, group pass feeding the group aggregate.
FLOOR = """
SELECT region, sum(n), sum(s), sum(s) / sum(c) FROM (
    SELECT user_id, region, count(*) AS n, sum(income) AS s, count(income) AS c
    FROM visits GROUP BY ALL
) GROUP BY region"""


def cpu_model() -> str:
    """The CPU's model name (what ``lscpu`` shows), or what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gib() -> float:
    """Physical memory in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def append_results(path: Path, text: str) -> None:
    """Append one report section to a RESULTS.md."""
    with path.open("a", encoding="utf-8") as f:
        f.write("\n" + text)


def process_cpu() -> float:
    """This process's CPU seconds so far, user and system, every thread's (DuckDB's included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

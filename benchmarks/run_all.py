"""The benchmarks behind issue 16's goals in one command; rewrites ``benchmarks/RESULTS.md``.

    python benchmarks/run_all.py --list              # the sections, their commands and time estimates
    python benchmarks/run_all.py                     # every section, full size; report on stdout
    python benchmarks/run_all.py --write             # ... and RESULTS.md rewritten from this run
    python benchmarks/run_all.py --only smartnoise,scale --write
    python benchmarks/run_all.py --skip server
    python benchmarks/run_all.py --quick --output /tmp/results.md   # small sizes: checks the runner

Sections (each a subprocess, run with this interpreter and ``PYTHONPATH`` set to the
repository; each script interleaves its own systems round by round, so a change in the
machine's load hits dpsql and what it is compared with alike):

    shapes      bench_shapes.py            dpsql / floor per query shape, 10M rows
    scale       bench_scale.py             core GROUP BY at 10M and 100M rows of Parquet: raw,
                                           floor and dpsql interleaved, peak RSS of each process
    fixed       bench_fixed_cost.py        a new small query (1,000 rows) against raw DuckDB
    smartnoise  vs_smartnoise.py           SmartNoise SQL / dpsql on its four queries, 1M rows
    server      bench_server.py            8 clients through ``dpsql serve``: q/s, p99, CPU/query

Every section is run one after the other, never two at once. The report records the date,
the commit, the machine, the versions and the load average before and after each section;
timing figures are only worth comparing on a quiet machine (the report says how busy it was).

``--write`` rewrites ``benchmarks/RESULTS.md``: the sections run now, then, under "Earlier
runs", the sections of the previous RESULTS.md this run did not redo, each with its own date.
A previous RESULTS.md that this runner did not write (no section markers) is moved whole to
``benchmarks/HISTORY.md`` first. ``--quick`` figures are not results: ``--quick --write`` is
refused (use ``--output``). A failed section does not stop the others; the exit code is 1
if any failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
HISTORY = HERE / "HISTORY.md"
sys.path.insert(0, str(HERE))
from _shared import cpu_model, ram_gib  # noqa: E402

BEGIN = "<!-- run_all:section {name} {when} -->"
END = "<!-- run_all:end {name} -->"
_MARK = re.compile(r"<!-- run_all:section (\S+) (.+?) -->\n(.*?)<!-- run_all:end \1 -->", re.S)


@dataclass(frozen=True)
class Section:
    name: str
    script: str
    title: str
    args: tuple[str, ...]
    quick: tuple[str, ...]
    minutes: float  # estimate, full size, quiet 2-core machine, data already generated
    goals: str


SECTIONS = (
    Section("shapes", "bench_shapes.py", "dpsql / floor per query shape",
            ("--repeat", "7"), ("--rows", "1000000", "--units", "100000", "--repeat", "1"), 4.0,
            "WHERE, public join, private key, two keys <= 1.4x the floor; 8 aggregates <= 2x; "
            "100,000 public keys <= 1.5x; MEDIAN <= 1.5x a hand-written bounded median"),
    # bench_scale's own run counts (5 at 10M, 3 at 100M): three 10M runs per engine gave 1.22x,
    # 1.33x and 1.65x the floor in three of these runs, seven 1.21x (HISTORY.md, 2026-12-07)
    Section("scale", "bench_scale.py", "Core GROUP BY from Parquet, time and peak memory",
            ("--sizes", "10M,100M"), ("--sizes", "1M", "--repeat", "1"), 4.0,
            "dpsql / floor <= 1.3x (wall and CPU) at 10M and 100M; dpsql peak RSS <= 1 GiB at 100M"),
    Section("fixed", "bench_fixed_cost.py", "A new small query, by stage",
            ("--rounds", "300"), ("--rounds", "30", "--warmup", "5"), 1.0,
            "p50 <= 3x raw DuckDB's p50 on the same 1,000-row table, default file ledger"),
    Section("smartnoise", "vs_smartnoise.py", "dpsql vs SmartNoise SQL",
            ("--runs", "30"), ("--runs", "3"), 4.0,
            "SmartNoise / dpsql >= 20x on each of the four queries"),
    Section("server", "bench_server.py", "Server, 8 client processes",
            (), ("--seconds", "2", "--rounds", "1", "--repeat", "30"), 3.0,
            "new queries >= 300 q/s with p99 <= 50 ms; repeats >= 1,000 q/s"),
)
FIRST_RUN_NOTE = ("first run only: the 10M demo DuckDB (~1 min), the 100M Parquet file (~4-6 min, 2.6 GB) "
                  "and the SmartNoise virtualenv (~1 min) are made once under benchmarks/ and reused")


@dataclass
class Outcome:
    section: Section
    command: list[str]
    code: int = 0
    seconds: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    when: str = ""
    report: str = ""
    errors: str = ""
    goal_lines: list[str] = field(default_factory=list)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def run_section(section: Section, quick: bool, i: int, n: int) -> Outcome:
    args = section.quick if quick else section.args
    command = [sys.executable, str(HERE / section.script), *args]
    outcome = Outcome(section, command, when=_now())
    shown = " ".join(["python", f"benchmarks/{section.script}", *args])
    print(f"\n=== [{i}/{n}] {section.name}: {shown}  (estimate {section.minutes:g} min full size;"
          f" load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    # stdout (the Markdown report) is kept; stderr (progress) goes to the terminal as it comes
    proc = subprocess.run(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    outcome.seconds = time.monotonic() - t0
    outcome.load = (load0, os.getloadavg()[0])
    outcome.code = proc.returncode
    outcome.report = proc.stdout
    outcome.goal_lines = goal_lines(proc.stdout)
    state = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    print(f"=== [{i}/{n}] {section.name}: {state} in {outcome.seconds / 60:.1f} min", file=sys.stderr, flush=True)
    return outcome


def goal_lines(report: str) -> list[str]:
    """What a section's report says of its goals: its "Goal ..." lines, the rows of its tables
    that carry a goal (last cell ``<= ...`` or ``>= ...``, or a ratio row), and the rows it
    marks as not met."""
    keep = []
    for line in report.splitlines():
        line = line.strip()
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else []
        if line.startswith("Goal"):
            keep.append(line)
        elif cells and ("<=" in cells[-1] or ">=" in cells[-1]) and any(ch.isdigit() for c in cells[1:-1] for ch in c):
            keep.append(f"{cells[0]}: {' / '.join(c for c in cells[1:-1] if c)} (goal {cells[-1]})")
        elif cells and "ratio" in cells[0]:
            keep.append(f"{cells[0]}: {' / '.join(c for c in cells[1:] if c)}")
        elif cells and ("**no**" in line or "MISSED" in line):
            keep.append(f"not met: {cells[0]}")
    return keep


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def header(outcomes: list[Outcome], started: str, loads: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    import duckdb
    import sqlglot

    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "--untracked-files=no") else ""
    la0, la1 = loads
    total = sum(o.seconds for o in outcomes)
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python benchmarks/run_all.py --write` (started {started}, {total / 60:.1f} min), commit"
        f" {commit}{dirty}. Machine: {cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB RAM,"
        f" {platform.system()} {platform.release()}; Python {platform.python_version()}, DuckDB"
        f" {duckdb.__version__}, sqlglot {sqlglot.__version__}. Load average (1 / 5 / 15 min)"
        f" {' / '.join(f'{x:.2f}' for x in la0)} at the start, {' / '.join(f'{x:.2f}' for x in la1)} at the end"
        f"{' (a busy machine: read ratios, not absolute times)' if la0[0] > 1.0 or la1[0] > 2.5 else ''}.",
        "",
        "Every section below is one script's report, verbatim; each interleaves its systems round by"
        " round. Older results, and the benchmarks of other issues: [`HISTORY.md`](HISTORY.md).",
        "",
        "| section | goal (issue 16) | what the run says | exit | minutes | load before / after |",
        "|---|---|---|---:|---:|---|",
    ]
    for o in outcomes:
        said = "<br>".join(_cell(g) for g in o.goal_lines) or "see the section"
        lines.append(f"| [{o.section.name}](#{_anchor(o.section)}) | {o.section.goals} | {said} | {o.code} |"
                     f" {o.seconds / 60:.1f} | {o.load[0]:.2f} / {o.load[1]:.2f} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _anchor(section: Section) -> str:
    return re.sub(r"[^a-z0-9 -]", "", f"{section.name}: {section.title}".lower()).replace(" ", "-")


def section_text(o: Outcome) -> str:
    shown = " ".join(["python", f"benchmarks/{o.section.script}", *o.command[2:]])
    body = o.report.strip()
    # the scripts' own level-2 headings become level 3 under the section's heading
    body = re.sub(r"(?m)^(#{2,5}) ", lambda m: "#" + m.group(1) + " ", body)
    status = "" if o.code == 0 else f" **FAILED (exit {o.code})**: its report may be partial."
    return (f"{BEGIN.format(name=o.section.name, when=o.when)}\n## {o.section.name}: {o.section.title}\n\n"
            f"Run {o.when}, {o.seconds / 60:.1f} min, load {o.load[0]:.2f} before / {o.load[1]:.2f} after:"
            f" `{shown}`.{status}\n\n{body}\n{END.format(name=o.section.name)}\n")


def assemble(outcomes: list[Outcome], previous: str, started: str,
             loads: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    """The new RESULTS.md: this run's sections, then the earlier ones it did not redo."""
    done = {o.section.name for o in outcomes}
    earlier = [(name, when, text) for name, when, text in _MARK.findall(previous) if name not in done]
    parts = [header(outcomes, started, loads), *(section_text(o) for o in outcomes)]
    if earlier:
        parts.append("# Earlier runs (not redone by the run above; each section gives its own date)\n")
        parts += [f"{BEGIN.format(name=name, when=when)}\n{text}{END.format(name=name)}\n"
                  for name, when, text in earlier]
    return "\n".join(parts)


def move_to_history(previous: str) -> None:
    """Put a RESULTS.md this runner did not write at the top of HISTORY.md, dated."""
    old = HISTORY.read_text(encoding="utf-8") if HISTORY.exists() else ""
    title = "# Benchmark history\n\nEarlier contents of `RESULTS.md`, newest first, as they were.\n"
    old = old.removeprefix(title).lstrip("\n")
    body = re.sub(r"(?m)^(#{1,5}) ", lambda m: "#" + m.group(1) + " ", previous.strip())
    moved = f"## RESULTS.md as it was before {_now()}\n\n{body}\n"
    HISTORY.write_text(title + "\n" + moved + ("\n" + old if old else ""), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    names = [s.name for s in SECTIONS]
    parser.add_argument("--only", help=f"comma-separated sections to run, of {','.join(names)}")
    parser.add_argument("--skip", help="comma-separated sections not to run")
    parser.add_argument("--quick", action="store_true", help="small sizes (checks the runner; not results)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {RESULTS.relative_to(ROOT)} from this run")
    parser.add_argument("--output", type=Path, help="write the assembled report here (RESULTS.md is untouched)")
    parser.add_argument("--list", action="store_true", help="list the sections and their time estimates")
    args = parser.parse_args(argv)
    unknown = {*(args.only or "").split(","), *(args.skip or "").split(",")} - {"", *names}
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; the sections are {', '.join(names)}")
    if args.quick and args.write:
        parser.error("--quick figures are not results: use --output PATH to see the assembled report")
    chosen = [s for s in SECTIONS if (not args.only or s.name in args.only.split(","))
              and not (args.skip and s.name in args.skip.split(","))]
    if args.list:
        for s in chosen:
            print(f"{s.name:<11} ~{s.minutes:g} min  python benchmarks/{s.script} {' '.join(s.args)}\n"
                  f"{'':<11} goal: {s.goals}")
        print(f"total ~{sum(s.minutes for s in chosen):g} min on a quiet 2-core machine ({FIRST_RUN_NOTE})")
        return 0
    print(f"sections: {', '.join(s.name for s in chosen)}; estimate ~{sum(s.minutes for s in chosen):g} min"
          f" full size on a quiet 2-core machine ({FIRST_RUN_NOTE})", file=sys.stderr)
    started, load0 = _now(), os.getloadavg()
    outcomes = [run_section(s, args.quick, i, len(chosen)) for i, s in enumerate(chosen, 1)]
    previous = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    text = assemble(outcomes, previous, started, (load0, os.getloadavg()))
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    if args.write:
        if previous.strip() and not _MARK.search(previous):
            move_to_history(previous)
            print(f"moved the previous {RESULTS.name} to {HISTORY.name}", file=sys.stderr)
        RESULTS.write_text(text, encoding="utf-8")
        print(f"rewrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)
    print("\n" + "\n".join(f"{o.section.name:<11} exit {o.code}  {o.seconds / 60:5.1f} min  load"
                           f" {o.load[0]:.2f} / {o.load[1]:.2f}" for o in outcomes), file=sys.stderr)
    return 1 if any(o.code for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())

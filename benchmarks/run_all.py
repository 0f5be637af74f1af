"""Run the whole benchmark suite, one script after another, with progress.

    python benchmarks/run_all.py                 # everything, full size (~15 min once the data exist;
                                                 # the first run also writes 2.7 GB of Parquet, ~4 min)
    python benchmarks/run_all.py --quick         # smaller variants (a few minutes)
    python benchmarks/run_all.py --write         # ... each script also appends to RESULTS.md
    python benchmarks/run_all.py --only scale,noise
    python benchmarks/run_all.py --skip smartnoise

The steps (each a subprocess, run with this interpreter and ``PYTHONPATH`` set to the
repository, so that ``dpsql`` imports without being installed):

    scale       bench_scale.py                 raw / floor / dpsql at 1M, 10M, 100M rows of
                                               Parquet, peak memory, latency_vs_rows.png
                                               (--quick: 1M and 10M, 3 runs)
    fixed       bench_core.py --fixed-only     the fixed cost of one query on 1,000 rows
                                               (--quick: 50 runs instead of 200)
    noise       bench_noise.py                 the exact noise samplers
                                               (--quick: 200,000 draws, 3 runs)
    smartnoise  vs_smartnoise.py               dpsql against SmartNoise SQL, if the file exists
                                               (--quick: fewer runs, if it takes --runs)

Each script's report goes to stdout as it comes; progress and a summary (exit code, time
and load average of every step) go to stderr. A failed step does not stop the others; the
exit code is 1 if any failed. The other scripts of ``benchmarks/`` (bounding strategies,
server, accounting, accuracy) answer design questions and are run on their own.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    optional: bool = False  # skipped, not failed, when the script is not there


STEPS = (
    Step("scale", "bench_scale.py", quick=("--quick",)),
    Step("fixed", "bench_core.py", args=("--fixed-only",), quick=("--tiny-runs", "50")),
    Step("noise", "bench_noise.py", quick=("--draws", "200000", "--repeat", "3")),
    Step("smartnoise", "vs_smartnoise.py", quick=("--runs", "10"), optional=True),
)


@dataclass
class Outcome:
    step: Step
    code: int | None = None  # None: skipped
    seconds: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    why: str = ""
    command: list[str] = field(default_factory=list)


def supported(path: Path, flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` (and their values) minus the options ``path --help`` does not list."""
    try:
        text = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                              env=_env(), timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    kept: list[str] = []
    skip_value = False
    for item in flags:
        if item.startswith("--"):
            skip_value = item not in text
            if not skip_value:
                kept.append(item)
        elif not skip_value:
            kept.append(item)
    return tuple(kept)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_step(step: Step, i: int, n: int, args: argparse.Namespace, started: float) -> Outcome:
    path = HERE / step.script
    outcome = Outcome(step)
    if not path.exists():
        outcome.why = f"{step.script} not found"
        if not step.optional:
            outcome.code = 1
        return outcome
    extra = step.args + (step.quick if args.quick else ())
    if step.optional:  # another author's script: pass only what it says it takes
        extra = supported(path, extra)
    if args.write:
        extra += supported(path, ("--write",)) if step.optional else ("--write",)
    outcome.command = [sys.executable, str(path), *extra]
    shown = " ".join(["python", f"benchmarks/{step.script}", *extra])
    elapsed = time.monotonic() - started
    print(f"\n=== [{i}/{n}] {step.name}: {shown}  (suite at {elapsed / 60:.1f} min,"
          f" load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    sys.stdout.flush()
    outcome.code = subprocess.run(outcome.command, cwd=ROOT, env=_env()).returncode
    outcome.seconds = time.monotonic() - t0
    outcome.load = (load0, os.getloadavg()[0])
    state = "ok" if outcome.code == 0 else f"FAILED (exit {outcome.code})"
    print(f"=== [{i}/{n}] {step.name}: {state} in {outcome.seconds:.0f} s", file=sys.stderr, flush=True)
    return outcome


def summary(outcomes: list[Outcome], total: float) -> str:
    lines = ["", f"=== benchmark suite: {total / 60:.1f} min", "step        exit   seconds   load before/after"]
    for o in outcomes:
        if o.code is None:
            lines.append(f"{o.step.name:<11} skipped ({o.why})")
        else:
            load = f"{o.load[0]:.2f} / {o.load[1]:.2f}" if o.command else o.why
            lines.append(f"{o.step.name:<11} {o.code:<6} {o.seconds:>7.0f}   {load}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    names = [s.name for s in STEPS]
    parser.add_argument("--quick", action="store_true", help="smaller variants of every step")
    parser.add_argument("--write", action="store_true", help="each script appends its report to RESULTS.md")
    parser.add_argument("--only", help=f"comma-separated steps to run, of {','.join(names)}")
    parser.add_argument("--skip", help="comma-separated steps not to run")
    args = parser.parse_args(argv)
    chosen = [s for s in STEPS if (not args.only or s.name in args.only.split(","))
              and not (args.skip and s.name in args.skip.split(","))]
    unknown = {*(args.only or "").split(","), *(args.skip or "").split(",")} - {"", *names}
    if unknown:
        parser.error(f"unknown step(s) {', '.join(sorted(unknown))}; the steps are {', '.join(names)}")
    started = time.monotonic()
    outcomes = [run_step(step, i, len(chosen), args, started) for i, step in enumerate(chosen, 1)]
    print(summary(outcomes, time.monotonic() - started), file=sys.stderr)
    return 1 if any(o.code not in (0, None) for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())

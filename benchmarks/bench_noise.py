"""How fast are dpsql's exact noise samplers, and OpenDP's? (issue 3, item 1)

Times 1,000,000 draws (best and median of ``--repeat`` runs) of dpsql's discrete Laplace
at scales 1, 1e3, 1e6 and discrete Gaussian at sigma 4.5, 1e3, 1e6, all from the
production CSPRNG (``SystemRandom``, os.urandom). The goal: noise for 1M output cells in
at most 1 s.

If ``import opendp`` works in the running interpreter, OpenDP's exact samplers are timed
too, the way dpsql would have to call them: a ``make_laplace`` / ``make_gaussian``
measurement on integer vectors applied to a Python list of 1M zeros (the time includes
converting the list to Rust and back). OpenDP is not a dpsql dependency; install it in a
separate venv to compare:

    python3 -m venv /tmp/opendp-venv
    /tmp/opendp-venv/bin/pip install opendp==0.16.0 numpy==2.4.6 -e .
    /tmp/opendp-venv/bin/python benchmarks/bench_noise.py            # table on stdout
    /tmp/opendp-venv/bin/python benchmarks/bench_noise.py --write    # ... and RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _shared import cpu_model  # noqa: E402
from dpsql.noise import DiscreteGaussian, DiscreteLaplace, gaussian_noise, laplace_noise

RESULTS = Path(__file__).with_name("RESULTS.md")
LAPLACE_SCALES = (1.0, 1e3, 1e6)
GAUSSIAN_SIGMAS = (4.5, 1e3, 1e6)


def machine() -> str:
    """CPU model, core count, Python and numpy versions."""
    import numpy as np
    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}")


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def time_runs(draw: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best and median wall seconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        draw()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def dpsql_cases(n: int) -> list[tuple[str, str, Callable[[], object]]]:
    cases: list[tuple[str, str, Callable[[], object]]] = []
    for scale in LAPLACE_SCALES:
        lap: DiscreteLaplace = laplace_noise(1, 1 / scale)
        cases.append(("dpsql discrete Laplace", f"scale {scale:g} (t={lap.t}, s={lap.s})",
                      lambda lap=lap: lap.sample(n)))
    for sigma in GAUSSIAN_SIGMAS:
        gauss: DiscreteGaussian = gaussian_noise(1, 1 / sigma)
        cases.append(("dpsql discrete Gaussian", f"sigma {gauss.sigma:.4g} (t={gauss.t}, m={gauss.m})",
                      lambda gauss=gauss: gauss.sample(n)))
    return cases


def opendp_cases(n: int) -> tuple[list[tuple[str, str, Callable[[], object]]], str]:
    try:
        import opendp
        import opendp.prelude as dp
    except ImportError as exc:
        return [], f"OpenDP not timed: {exc}"
    from importlib.metadata import version
    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=int))
    zeros = [0] * n
    cases: list[tuple[str, str, Callable[[], object]]] = []
    for scale in LAPLACE_SCALES:
        meas = dp.m.make_laplace(domain, dp.l1_distance(T=int), scale=scale)
        cases.append(("OpenDP make_laplace (int)", f"scale {scale:g}",
                      lambda meas=meas: meas(zeros)))
    for sigma in GAUSSIAN_SIGMAS:
        meas = dp.m.make_gaussian(domain, dp.l2_distance(T=int), scale=sigma)
        cases.append(("OpenDP make_gaussian (int)", f"sigma {sigma:g}",
                      lambda meas=meas: meas(zeros)))
    del opendp
    return cases, f"OpenDP {version('opendp')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="append to benchmarks/RESULTS.md")
    args = parser.parse_args()

    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    other, other_note = opendp_cases(args.draws)
    load_before = load_average()
    rows = []
    for sampler, param, draw in dpsql_cases(args.draws) + other:
        draw()  # warm-up (imports, lazily built tables)
        best, median = time_runs(draw, args.repeat)
        rows.append(f"| {sampler} | {param} | {best:.3f} | {median:.3f} | "
                    f"{args.draws / median:,.0f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    load_after = load_average()

    lines = [
        f"{machine()}; {other_note}",
        f"load average (1, 5, 15 min) {load_before} before, {load_after} after",
        "",
        f"{args.draws:,} draws per run from the OS CSPRNG, best and median of {args.repeat} "
        "runs (after one warm-up run); draws/s from the median:",
        "",
        "| sampler | parameter | best s | median s | draws/s |",
        "|---|---|---:|---:|---:|",
        *rows,
    ]
    text = "\n".join(lines)
    print(f"{when}\n{text}")
    if args.write:
        with RESULTS.open("a") as out:
            out.write(f"\n\n## Noise samplers ({when})\n\n{text}\n")
        print(f"appended to {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()

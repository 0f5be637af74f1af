"""Error against the row cap: the bias the caps cause and the noise they cost (issue 15).

On the 1M-row demo data (rows per user lognormal: the median user has a handful, a few
have hundreds), for ``max_rows_per_unit`` R from 1 to 1,000: the exact bias of an ungrouped
``COUNT(*)`` and ``SUM(income)`` (from :mod:`dpsql.bounding`, the owner's report), the 95%
half-width of the noise at epsilon 1 and 0.1 (Laplace, each query alone), and the expected
total error ``sqrt(bias^2 + noise variance)``, all relative to the truth. Marks the demo
policy's cap (10) and the cap ``dpsql policy suggest --db DB visits --policy
policies/demo.toml`` proposes (99% of the rows and of each of the policy's bounded columns'
sums: age, income, visits): R = 372, set by the sum of ``visits``. It prints too the
smallest cap that keeps 99% of the rows alone (266).

    python benchmarks/bounding_error.py            # writes benchmarks/bounding_error.png

The figures are exact expectations (no sampling), so the picture is the same on every run.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpsql.bounding import _policy_inputs, suggest, table_report  # noqa: E402
from dpsql.demo import demo_database  # noqa: E402
from dpsql.policy import load_policy  # noqa: E402

HERE = Path(__file__).parent
CAPS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 1000)
BOUNDS = {"income": (0.0, 250_000.0)}


def main() -> None:
    db = str(demo_database(HERE / "data" / "demo-1m.duckdb", rows=1_000_000, units=100_000))
    rows: list[tuple[int, float, float, float, float, float, float]] = []
    for r in CAPS:
        rep = table_report(db, "visits", unit="user_id", max_rows=r, max_groups=1, bounds=BOUNDS, epsilon=1.0)
        (income,) = rep.columns
        rows.append((r, rep.ungrouped.rows_kept / rep.ungrouped.rows - 1, income.kept_total / income.total - 1,
                     rep.noise["COUNT(*)"] / rep.ungrouped.rows, rep.noise["SUM(income)"] / income.total,
                     float(rep.ungrouped.rows), income.total))
        print(f"R={r:5d}  COUNT bias {100 * rows[-1][1]:+7.2f}%  noise(eps 1) ±{100 * rows[-1][3]:.3f}%   "
              f"SUM(income) bias {100 * rows[-1][2]:+7.2f}%  noise(eps 1) ±{100 * rows[-1][4]:.3f}%", flush=True)
    # What the owner's command prints: the policy's bounded columns and groupings as inputs.
    table = load_policy(HERE.parent / "policies" / "demo.toml").table("visits")
    assert table is not None and table.privacy_unit is not None
    bounds, groupings = _policy_inputs(table)
    s = suggest(db, "visits", unit=table.privacy_unit, columns=list(bounds), groupings=groupings, epsilon=1.0)
    rows_only = suggest(db, "visits", unit=table.privacy_unit, columns=[], epsilon=1.0)
    print(f"dpsql policy suggest (99% of rows and of each bounded column's sum): max_rows_per_unit = "
          f"{s.max_rows}, max_groups_per_unit = {s.max_groups}; keeps {100 * s.report.ungrouped.row_share:.2f}% "
          f"of rows; bounds {s.bounds}")
    print(f"99% of the rows alone: max_rows_per_unit = {rows_only.max_rows} "
          f"(keeps {100 * rows_only.report.ungrouped.row_share:.2f}%)")
    draw(rows, s.max_rows, HERE / "bounding_error.png")


def draw(rows: list[tuple[int, float, float, float, float, float, float]], suggested: int, path: Path) -> None:
    caps = [r[0] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    z = 1 / math.log(20)  # Laplace: sd = sqrt(2) b, 95% half-width = b ln 20
    for ax, (title, bias_i, noise_i) in zip(axes, (("COUNT(*)", 1, 3), ("SUM(income), bounds [0, 250000]", 2, 4))):
        shown = [(c, abs(r[bias_i]) * 100) for c, r in zip(caps, rows) if abs(r[bias_i]) > 1e-6]  # 0 is off a log axis
        ax.plot(*zip(*shown), "k-", lw=2, label="bias of the caps and clipping (exact)")
        for eps, style in ((1.0, "-"), (0.1, "--")):
            noise = [r[noise_i] / eps * 100 for r in rows]
            total = [math.hypot(abs(r[bias_i]), math.sqrt(2) * z * r[noise_i] / eps) * 100 for r in rows]
            ax.plot(caps, noise, "C0" + style, label=f"noise, 95% half-width (epsilon {eps:g})")
            ax.plot(caps, total, "C3" + style, label=f"expected total error, RMS (epsilon {eps:g})")
        ax.axvline(10, color="grey", ls=":", lw=1)
        ax.text(10, 60, " demo policy\n R = 10", color="grey", fontsize=8, va="top")
        ax.axvline(suggested, color="C2", ls=":", lw=1.5)
        ax.text(suggested, 0.02, f"policy suggest (99%) \nR = {suggested} ", color="C2", fontsize=8, va="top", ha="right")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-3, 100)
        ax.set_xlabel("max_rows_per_unit (R)")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    axes[1].text(1.2, 4.5, "floor: clipping at 250,000\n(the demo's junk incomes)", fontsize=8, color="k")
    axes[0].set_ylabel("error, % of the true answer")
    axes[1].legend(fontsize=7.5, loc="lower left")
    fig.suptitle("Demo data (1M visits, 100k users): a tight cap is cheap in noise and costly in bias", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

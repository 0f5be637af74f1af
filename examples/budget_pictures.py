"""Draw the budget pictures of README's "Pictures of the budget" (docs/budget_*.png).

A simulated week on the demo data: three analysts run real queries through dpsql (each
charged to one ledger); the charges' times are then spread over seven days, as a week of
work would. Run from the repository root:

    python examples/budget_pictures.py [OUT_DIR]

then look at OUT_DIR/budget_alice.png (one analyst) and OUT_DIR/budget_owner.png (every
analyst). ``dpsql budget --plot`` draws the same pictures from any ledger.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import dpsql
from dpsql.budget_plot import plot_analyst, plot_owner, spending
from dpsql.demo import make_demo_database

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "demo.toml"
DAY = 86_400.0

# (analyst, epsilon, delta, SQL): each line one query, in the order they are run
WORK = [
    ("alice", 0.1, 0.0, "SELECT COUNT(*) AS n FROM visits"),
    ("alice", 0.3, 0.0, "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"),
    ("alice", 0.5, 0.0, "SELECT region, AVG(income) AS avg_income FROM visits GROUP BY region"),
    ("bob", 0.5, 0.0, "SELECT device, COUNT(*) AS n FROM visits GROUP BY device"),
    ("alice", 0.2, 1e-7, "SELECT device, SUM(visits) AS v FROM visits GROUP BY device"),
    ("carol", 0.25, 0.0, "SELECT AVG(age) AS a FROM visits"),
    ("bob", 1.0, 1e-7, "SELECT city, COUNT(*) AS n FROM visits GROUP BY city"),
    ("alice", 0.4, 1e-7, "SELECT MEDIAN(age) AS m FROM visits"),
    ("bob", 0.8, 0.0, "SELECT region, AVG(age) AS a FROM visits GROUP BY region"),
    ("alice", 0.3, 0.0, "SELECT COUNT(*) AS n FROM visits WHERE age > 40"),
    ("bob", 1.0, 0.0, "SELECT region, SUM(income) AS s FROM visits GROUP BY region"),
    ("alice", 0.5, 0.0, "SELECT COUNT(*) AS n FROM visits WHERE income > 100000"),
    ("bob", 0.9, 0.0, "SELECT device, AVG(income) AS a FROM visits GROUP BY device"),
    ("alice", 0.25, 0.0, "SELECT AVG(visits) AS v FROM visits"),
]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "demo.duckdb"
        ledger = Path(tmp) / "budget.sqlite"
        make_demo_database(db, rows=20_000, units=2_000)
        for analyst, epsilon, delta, sql in WORK:
            with dpsql.connect(db, policy=POLICY, analyst=analyst, ledger=ledger) as conn:
                conn.execute(sql, epsilon=epsilon, delta=delta)
        start = time.time() - 7 * DAY
        with sqlite3.connect(ledger) as raw:  # a week of work: spread the charges' times
            ids = [row[0] for row in raw.execute("SELECT id FROM events ORDER BY id")]
            for i, event in enumerate(ids):
                raw.execute("UPDATE events SET time = ? WHERE id = ?", (start + 7 * DAY * i / len(ids), event))
        policy = dpsql.load_policy(POLICY)
        with dpsql.Ledger(ledger, accountant=policy.accountant) as book:
            every = [spending(book, policy, name) for name in ("alice", "bob", "carol", "dave")]
            charges = [r.to_charge() for r in book.events("alice")]
        plot_analyst(out / "budget_alice.png", every[0], charges)
        plot_owner(out / "budget_owner.png", every)
    print(f"wrote {out / 'budget_alice.png'} and {out / 'budget_owner.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs")

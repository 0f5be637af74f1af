"""Dry runs (issue 3, item 7): explain and epsilon_for read no data and spend nothing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import dpsql
from dpsql.privacy import Ledger
from dpsql.connection import Connection
from dpsql.engine import DuckDBEngine
from dpsql.explain import Explanation
from dpsql.policy import load_policy

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
SQL = "SELECT region, COUNT(*) AS n, SUM(visits) AS v, AVG(age) AS mean_age FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def db(demo_db: Path) -> Path:
    return demo_db  # built once for the run (conftest)


class NoDataEngine:
    """The real engine's schema and naming, but any attempt to read data fails the test."""

    def __init__(self, engine: DuckDBEngine) -> None:
        self._engine = engine
        self.dialect = engine.dialect

    def schema(self) -> Any:
        return self._engine.schema()

    def table(self, name: str) -> Any:
        return self._engine.table(name)

    def row_id(self, alias: str, table: str | None = None) -> Any:
        return self._engine.row_id(alias)

    def distinct_values(self, *args: Any, **kwargs: Any) -> Any:  # public tables only
        return self._engine.distinct_values(*args, **kwargs)  # type: ignore[attr-defined]

    def run(self, query: object) -> Any:
        raise AssertionError("explain read data: engine.run was called")

    def shown_sql(self, query: Any) -> str:  # text only: reads nothing
        return self._engine.shown_sql(query)

    def run_fingerprinted(self, query: object, tables: object) -> Any:
        raise AssertionError("explain read data: engine.run_fingerprinted was called")

    def fingerprint(self, tables: object) -> Any:
        raise AssertionError("explain read data: engine.fingerprint was called")

    def close(self) -> None:
        self._engine.close()


def dry_connection(db: Path, ledger: Ledger, analyst: str = "alice") -> Connection:
    return Connection(NoDataEngine(DuckDBEngine(db)), load_policy(POLICY), analyst, ledger)


def ledger_state(ledger: Ledger, analyst: str) -> tuple[object, ...]:
    budget = load_policy(POLICY).budget_for(analyst)
    return ledger.status(analyst, budget), tuple(ledger.events(analyst))


@pytest.mark.attack
def test_explain_reads_no_data_and_charges_nothing(db: Path, tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "budget.sqlite")
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as real:
        real.execute("SELECT COUNT(*) FROM visits", epsilon=0.3)  # something already spent
    ledger = Ledger(tmp_path / "budget.sqlite")
    conn = dry_connection(db, ledger)
    before = ledger_state(ledger, "alice")
    explanation = conn.explain(SQL, epsilon=0.6)
    conn.explain(SQL, epsilon=0.6, delta=1e-7)
    conn.epsilon_for(SQL, "n", 600.0)
    conn.epsilon_for(SQL, "mean_age", 10.0, count=5000)
    assert ledger_state(ledger, "alice") == before
    assert (explanation.epsilon, explanation.delta, explanation.mechanism) == (0.6, 0.0, "laplace")
    composition = explanation.composition
    assert composition is not None and composition.accountant == "basic"
    assert composition.before == (0.3, 0.0)
    assert composition.after == pytest.approx((0.9, 0.0)) and composition.epsilon == pytest.approx(0.6)
    assert composition.fits
    conn.close()


def test_explain_describes_every_output_column(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        laplace = conn.explain(SQL, epsilon=0.6)
        gauss = conn.explain(SQL, epsilon=0.6, delta=1e-7)
    assert list(laplace.columns) == ["region", "n", "v", "mean_age"]
    assert laplace.columns["region"].mechanism == "public" and laplace.columns["region"].half_width == 0
    for name in ("n", "v", "mean_age"):
        assert laplace.columns[name].mechanism == "laplace"
        assert gauss.columns[name].mechanism == "gaussian"
        assert laplace.columns[name].measurements
    assert laplace.columns["n"].half_width > 0 and laplace.columns["v"].half_width > 0
    assert laplace.columns["mean_age"].half_width is None and laplace.columns["mean_age"].depends_on == "count"
    assert set(laplace.mechanisms) == {m.name for m in laplace.plan.measurements}
    assert laplace.privacy.columns["n"].noise_std == laplace.columns["n"].noise_std > 0
    bounded = laplace.bounded_sql.lower()
    assert '"visits"' in bounded and "least(" in bounded and '"__u"' in bounded  # per-unit bounding
    assert laplace.accuracy == {"COUNT(*)": laplace.columns["n"].half_width, "SUM(visits)": laplace.columns["v"].half_width}
    text = repr(laplace)
    assert "n: laplace, noise std" in text and "half_width_for" in text and "basic accountant" in text
    assert f"±{laplace.columns['n'].half_width:,.4g}" in text


def test_expected_half_widths_are_what_the_result_reports(db: Path) -> None:
    # COUNT(age) is the very count AVG(age) divides by (one shared measurement)
    sql = "SELECT region, COUNT(age) AS n, SUM(visits) AS v, AVG(age) AS mean_age FROM visits GROUP BY region"
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        explanation = conn.explain(sql, epsilon=0.9)
        res = conn.execute(sql, epsilon=0.9)
    for name in ("region", "n", "v"):
        assert res.accuracy.cells(name) == [explanation.half_width_for(name)] * 4
    # AVG: at the noisy count and mean, the explanation's formula is the release's
    counts = res.arrow()["n"].to_pylist()
    means = res.arrow()["mean_age"].to_pylist()
    for count, mean, reported in zip(counts, means, res.accuracy.cells("mean_age")):
        expected = explanation.half_width_for("mean_age", count=count, mean=mean)
        assert expected == pytest.approx(reported, rel=1e-3)  # the count is rounded to whole
    worst = explanation.half_width_for("mean_age", count=counts[0])
    assert worst >= explanation.half_width_for("mean_age", count=counts[0], mean=50)
    assert explanation.half_width_for("mean_age", count=10**9) < 1e-3
    assert explanation.half_width_for("mean_age", count=1) == 100  # capped at upper - lower


def test_half_width_for_refuses_what_it_cannot_know(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        explanation = conn.explain("SELECT COUNT(*) AS n, COUNT(*) * 2 AS twice, AVG(age) AS a FROM visits")
    with pytest.raises(dpsql.Error, match="pass count=N"):
        explanation.half_width_for("a")
    with pytest.raises(dpsql.Error, match="expression"):
        explanation.half_width_for("twice")
    with pytest.raises(dpsql.Error, match="no single output column 'nope'; the query's columns are: n, twice, a"):
        explanation.half_width_for("nope")
    assert explanation.columns["twice"].depends_on == "data"


@pytest.mark.parametrize("delta", [0.0, 1e-7])
def test_epsilon_for_is_the_smallest_epsilon_meeting_the_target(db: Path, delta: float) -> None:
    sql = "SELECT region, COUNT(*) AS n, AVG(income) AS a FROM visits GROUP BY region"
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        for column, target, count in (("n", 500.0, None), ("a", 20_000.0, 5_000)):
            epsilon = conn.epsilon_for(sql, column, target, delta=delta, count=count)
            assert 0 < epsilon <= conn.policy.max_epsilon_per_query

            def width(eps: float, column: str = column, count: int | None = count) -> float:
                return conn.explain(sql, epsilon=eps, delta=delta).half_width_for(column, count=count)

            assert width(epsilon) <= target
            assert width(epsilon * (1 - 2e-3)) > target  # no meaningfully smaller epsilon will do
            assert conn.explain(sql, epsilon=1.0, delta=delta).epsilon_for(column, target, count=count) == epsilon
        assert conn.budget().queries == 0


def test_epsilon_for_says_when_the_target_is_out_of_reach(db: Path) -> None:
    sql = "SELECT region, COUNT(*) AS n, AVG(income) AS a FROM visits GROUP BY region"
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        with pytest.raises(dpsql.Error, match=r"even epsilon=1 \(the policy's max_epsilon_per_query\) gives column 'n'"):
            conn.epsilon_for(sql, "n", 50.0)
        with pytest.raises(dpsql.Error, match="pass count=N"):
            conn.epsilon_for(sql, "a", 100.0)
        with pytest.raises(dpsql.Error, match="group key"):
            conn.epsilon_for(sql, "region", 1.0)
        with pytest.raises(dpsql.Error, match="positive finite"):
            conn.epsilon_for(sql, "n", -1.0)
        with pytest.raises(dpsql.PolicyViolation):
            conn.epsilon_for(sql, "n", 10.0, delta=0.5)  # above the policy's max delta


class HalvingAccountant:
    """A made-up tight accountant whose compose takes a target delta."""

    name = "halving"

    def __init__(self) -> None:
        self.calls: list[float] = []

    def compose(self, events: list[Any], target_delta: float = 0.0) -> tuple[float, float]:
        self.calls.append(target_delta)
        return sum(e.epsilon for e in events) / 2, target_delta


def test_explain_composes_with_the_ledgers_accountant(db: Path) -> None:
    accountant = HalvingAccountant()
    ledger = Ledger(None, accountant=accountant)  # type: ignore[arg-type]
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        conn.execute("SELECT COUNT(*) FROM visits", epsilon=0.8)
        explanation = conn.explain("SELECT COUNT(*) FROM visits", epsilon=0.4)
        assert conn.budget().queries == 1
    composition = explanation.composition
    assert composition is not None and composition.accountant == "halving"
    assert composition.before == (0.4, 1e-5) and composition.after == pytest.approx((0.6, 1e-5))
    assert composition.epsilon == pytest.approx(0.2)
    assert 1e-5 in accountant.calls  # asked at the budget's delta


def test_an_accountant_that_cannot_dry_run_gives_no_composition(db: Path) -> None:
    class Broken:
        name = "broken"

        def compose(self, events: list[Any]) -> tuple[float, float]:
            raise RuntimeError("cannot")

    ledger = Ledger(None)
    ledger.accountant = Broken()  # type: ignore[assignment]
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        explanation = conn.explain("SELECT COUNT(*) FROM visits", epsilon=0.4)
    assert isinstance(explanation, Explanation) and explanation.composition is None
    assert explanation.epsilon == 0.4 and not math.isnan(explanation.columns["COUNT(*)"].half_width or math.nan)

"""A result in a notebook and a DataFrame (issue 20): a readable repr and HTML with the
values and their ±, the charge, the mechanisms and notes; df(accuracy=True); numbers shown
with the precision their noise allows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
SQL = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def result(demo_database: Callable[[int, int], Path]) -> dpsql.Result:
    db = demo_database(5_000, 500)  # built once for the run (conftest)
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        return conn.execute(SQL, epsilon=0.5)


def test_repr_shows_values_charge_and_mechanisms(result: dpsql.Result) -> None:
    text = repr(result)
    assert text.startswith("<dpsql Result: 4 rows, charged epsilon=0.5, delta=0>")
    assert "region  n" in text and "north" in text and "±" in text
    assert "n: laplace, noise std" in text and "region: public" in text


def test_integers_are_integers(result: dpsql.Result) -> None:
    n_cell = result.format().splitlines()[2].split()[1:4]  # "123 ± 240"
    assert n_cell[1] == "±" and n_cell[0].lstrip("-").isdigit() and n_cell[2].replace(",", "").isdigit()
    assert ".00" not in " ".join(n_cell)


def test_html_for_notebooks(result: dpsql.Result) -> None:
    html = result._repr_html_()
    assert html.count("<tr>") == 5 and "<th" in html and "±" in html
    assert "charged epsilon=0.5, delta=0" in html and "laplace" in html


def test_df_with_intervals(result: dpsql.Result) -> None:
    pytest.importorskip("pandas")
    plain = result.df()
    assert list(plain.columns) == ["region", "n", "avg_income"]
    frame = result.df(accuracy=True)
    assert list(frame.columns) == ["region", "n", "n_ci95", "avg_income", "avg_income_ci95"]
    assert frame["n_ci95"].tolist() == result.accuracy.cells("n")
    assert (frame["avg_income_ci95"] > 0).all()


def test_small_half_widths_keep_their_digits() -> None:
    from dpsql.display import cell_text

    assert cell_text(0.25, 0.0031, integer=False) == "0.2500 ± 0.0031"
    assert cell_text(12.0, 239.6, integer=True) == "12 ± 240"
    assert cell_text(None, None, integer=True) == "NULL"

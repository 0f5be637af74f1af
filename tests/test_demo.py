"""The demo data generator: shape, determinism, and the mess it is meant to contain."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest

from dpsql.demo import REGIONS, demo_database, make_demo_database

ROWS, UNITS = 5000, 500

VISITS_SCHEMA = [
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("income", "DOUBLE"),
    ("visits", "INTEGER"),
    ("city", "VARCHAR"),
    ("zip", "VARCHAR"),
    ("ssn", "VARCHAR"),
    ("device", "VARCHAR"),
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    make_demo_database(path, rows=ROWS, units=UNITS)
    return path


def query(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.sql(sql).fetchall()


def fingerprint(path: Path) -> str:
    """A digest of every row, in a fixed order: equal digests mean equal data."""
    rows = query(path, "SELECT * FROM visits ORDER BY ALL") + query(path, "SELECT * FROM regions ORDER BY ALL")
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def test_schema(demo: Path) -> None:
    assert query(demo, "SELECT column_name, data_type FROM information_schema.columns"
                       " WHERE table_name = 'visits' ORDER BY ordinal_position") == VISITS_SCHEMA
    assert query(demo, "SELECT column_name, data_type FROM information_schema.columns"
                       " WHERE table_name = 'regions' ORDER BY ordinal_position") == [
        ("region", "VARCHAR"), ("name", "VARCHAR"), ("population", "BIGINT")]


def test_row_and_unit_counts(demo: Path) -> None:
    assert query(demo, "SELECT count(*), count(DISTINCT user_id) FROM visits") == [(ROWS, UNITS)]
    assert query(demo, "SELECT count(*) FROM visits WHERE user_id IS NULL") == [(0,)]


def test_regions_are_the_public_ones(demo: Path) -> None:
    assert query(demo, "SELECT region FROM regions ORDER BY region") == sorted((r,) for r in REGIONS)
    assert query(demo, "SELECT DISTINCT region FROM visits ORDER BY region") == sorted((r,) for r in REGIONS)


def test_same_seed_same_data(demo: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.duckdb"
    make_demo_database(again, rows=ROWS, units=UNITS)
    assert fingerprint(again) == fingerprint(demo)


def test_other_seed_other_data(demo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    make_demo_database(other, rows=ROWS, units=UNITS, seed=1)
    assert fingerprint(other) != fingerprint(demo)


def test_rows_per_unit_are_skewed(demo: Path) -> None:
    [(median, largest, over_cap)] = query(
        demo,
        "SELECT median(n), max(n), avg((n > 10)::INT)"
        " FROM (SELECT user_id, count(*) AS n FROM visits GROUP BY user_id)",
    )
    assert median <= 10  # most users have a few rows
    assert largest >= 10 * median  # a few have very many
    assert over_cap > 0.05  # so max_rows_per_unit = 10 really binds


def test_units_span_several_regions(demo: Path) -> None:
    [(many, single)] = query(
        demo,
        "SELECT count(*) FILTER (WHERE g = 4), count(*) FILTER (WHERE g = 1)"
        " FROM (SELECT user_id, count(DISTINCT region) AS g FROM visits GROUP BY user_id)",
    )
    assert many > 0 and single > 0
    # A home region: each unit's most common region holds most of its rows.
    [(home_share,)] = query(
        demo,
        "SELECT sum(top) / sum(n) FROM (SELECT user_id, max(c) AS top, sum(c) AS n FROM"
        " (SELECT user_id, region, count(*) AS c FROM visits GROUP BY ALL) GROUP BY user_id)",
    )
    assert home_share > 0.8


def test_junk_values_are_present(demo: Path) -> None:
    [(bad_age, rich, null_income, nan_income, inf_income, null_device, over_50)] = query(
        demo,
        """SELECT
            count(*) FILTER (WHERE age < 0 OR age > 100),
            count(*) FILTER (WHERE income > 250000 AND NOT isinf(income)),
            count(*) FILTER (WHERE income IS NULL),
            count(*) FILTER (WHERE isnan(income)),
            count(*) FILTER (WHERE isinf(income)),
            count(*) FILTER (WHERE device IS NULL),
            count(*) FILTER (WHERE visits > 50)
        FROM visits""",
    )
    assert bad_age > 0 and rich > 0 and null_income > 0 and null_device > 0 and over_50 > 0
    assert nan_income == 2 and inf_income == 1
    assert query(demo, "SELECT min(visits) >= 0, max(visits) <= 60 FROM visits") == [(True, True)]
    assert query(demo, "SELECT DISTINCT device FROM visits WHERE device IS NOT NULL ORDER BY 1") == [
        ("desktop",), ("mobile",), ("tablet",)]


def test_cities_are_skewed_with_single_user_ones(demo: Path) -> None:
    counts = query(demo, "SELECT city, count(DISTINCT user_id) FROM visits GROUP BY city")
    loners = [city for city, users in counts if users == 1]
    assert len(loners) >= 5  # the rare cities, each held by one user
    assert max(users for _, users in counts) > 20 * min(users for _, users in counts)


def test_identifier_formats(demo: Path) -> None:
    assert query(demo, "SELECT bool_and(regexp_full_match(ssn, '\\d{3}-\\d{2}-\\d{4}')),"
                       " bool_and(regexp_full_match(zip, '\\d{5}')) FROM visits") == [(True, True)]


def test_demo_database_creates_once(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "demo.duckdb"
    assert demo_database(path, rows=200, units=20) == path
    stamp = path.stat().st_mtime_ns
    demo_database(path, rows=999, units=99)  # exists: left alone
    assert path.stat().st_mtime_ns == stamp
    assert query(path, "SELECT count(*) FROM visits") == [(200,)]


def test_units_capped_at_rows(tmp_path: Path) -> None:
    path = tmp_path / "few.duckdb"
    make_demo_database(path, rows=10, units=50)
    assert query(path, "SELECT count(*), count(DISTINCT user_id) FROM visits") == [(10, 10)]


def test_rejects_non_positive_sizes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rows and units must be positive"):
        make_demo_database(tmp_path / "x.duckdb", rows=0)

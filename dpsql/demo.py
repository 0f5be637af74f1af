"""Synthetic demo data: a ``visits`` table with realistic mess, and a public ``regions`` table.

The data is built to exercise everything dpsql has to defend against, so that examples,
tests and benchmarks run on the same shapes a real deployment meets:

- **Skewed contributions.** Rows per user follow a lognormal law: the median user has a
  handful of rows, a few users have hundreds. Per-unit caps (``max_rows_per_unit = 10``,
  ``max_groups_per_unit = 4`` in ``policies/demo.toml``) really bind.
- **A home region per user**, with some rows in the other regions, so a user spans
  several ``GROUP BY region`` groups.
- **Junk values** a naive query would let through: ages outside ``[0, 100]`` (``-1``,
  ``130``, ``999``), incomes far above the policy's upper bound ``250000``, ``NULL``
  incomes, a couple of ``NaN`` incomes and one ``+inf``; visit counts above the bound 50;
  ``NULL`` devices.
- **Rare keys.** About 200 cities with a Zipf-like popularity, plus a few cities held by a
  single user: partition selection must never release those.
- **Identifiers** (``zip``, ``ssn``) that the demo policy restricts or denies.

Columns of ``visits``:
``user_id BIGINT, region VARCHAR, age INTEGER, income DOUBLE, visits INTEGER,
city VARCHAR, zip VARCHAR, ssn VARCHAR, device VARCHAR``.
``regions(region VARCHAR, name VARCHAR, population BIGINT)`` is public.

The generator is numpy with a seeded ``PCG64``: this is synthetic *data*, not privacy
noise, so it is meant to be reproducible. The same ``(rows, units, seed)`` always gives the
same database. Columns are built vectorised and loaded through Arrow: a million rows take
a couple of seconds, ten million work the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

__all__ = ["REGIONS", "demo_database", "make_demo_database"]

#: The public region keys, as listed in ``policies/demo.toml``.
REGIONS: tuple[str, ...] = ("north", "south", "east", "west")

_REGION_NAMES = ("North", "South", "East", "West")
_REGION_POPULATION = (2_450_000, 3_120_000, 1_870_000, 2_010_000)
_REGION_WEIGHTS = (0.30, 0.27, 0.23, 0.20)
_HOME_REGION_SHARE = 0.85  # a row is in the user's home region with this probability
_HOME_CITY_SHARE = 0.90  # ... and in the user's home city with this one

_CITY_PREFIXES = (
    "Ash", "Bel", "Cor", "Dun", "El", "Fair", "Glen", "Har", "Iver", "Kel",
    "Lin", "Mar", "Nor", "Oak", "Pem", "Ros", "Sil", "Thorn", "Wal", "Yar",
)
_CITY_SUFFIXES = ("bridge", "bury", "dale", "field", "ford", "haven", "mouth", "port", "ton", "wick")
_RARE_CITIES = ("Lonely Pine", "Quill Hollow", "Saltmarsh End", "Vexley", "Zennor Cove")

_DEVICES = ("mobile", "desktop", "tablet")
_DEVICE_WEIGHTS = (0.55, 0.35, 0.08)  # the remaining 2 % are NULL

_ROWS_PER_UNIT_SIGMA = 1.3  # lognormal spread of per-user activity


def make_demo_database(
    path: str | os.PathLike[str],
    rows: int = 1_000_000,
    units: int = 100_000,
    seed: int = 20261121,
) -> None:
    """Write the demo DuckDB database to ``path``, replacing any file already there.

    Args:
        path: the DuckDB file to write.
        rows: number of rows in ``visits``.
        units: number of distinct users (privacy units); capped at ``rows``.
        seed: seed of the data generator; the same arguments give the same data.

    Raises:
        ValueError: if ``rows`` or ``units`` is not positive.

    >>> import tempfile, duckdb
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     db = f"{tmp}/demo.duckdb"
    ...     make_demo_database(db, rows=1000, units=100)
    ...     with duckdb.connect(db, read_only=True) as con:
    ...         con.sql("SELECT count(*), count(DISTINCT user_id) FROM visits").fetchall()
    [(1000, 100)]
    """
    if rows <= 0 or units <= 0:
        raise ValueError(f"rows and units must be positive, got rows={rows}, units={units}")
    units = min(units, rows)
    rng = np.random.Generator(np.random.PCG64(seed))
    visits = _visits_table(rng, rows, units)
    path = Path(path)
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as con:
        con.execute("SET enable_progress_bar = false")
        con.register("visits_arrow", visits)
        con.execute(
            "CREATE TABLE visits AS SELECT user_id::BIGINT AS user_id, region::VARCHAR AS region,"
            " age::INTEGER AS age, income::DOUBLE AS income, visits::INTEGER AS visits,"
            " city::VARCHAR AS city, zip::VARCHAR AS zip, ssn::VARCHAR AS ssn,"
            " device::VARCHAR AS device FROM visits_arrow"
        )
        con.unregister("visits_arrow")
        con.register("regions_arrow", _regions_table())
        con.execute(
            "CREATE TABLE regions AS SELECT region::VARCHAR AS region, name::VARCHAR AS name,"
            " population::BIGINT AS population FROM regions_arrow"
        )
        con.unregister("regions_arrow")
        con.execute("CHECKPOINT")


def demo_database(path: str | os.PathLike[str], **kwargs: int) -> Path:
    """Return ``path``, first writing the demo database there if no file exists yet.

    Keyword arguments (``rows``, ``units``, ``seed``) go to :func:`make_demo_database`;
    an existing file is reused as is, whatever it was generated with.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     first = demo_database(f"{tmp}/demo.duckdb", rows=500, units=50)
    ...     again = demo_database(first)  # already there: not rewritten
    ...     again == first and first.stat().st_size > 0
    True
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        make_demo_database(path, **kwargs)
    return path


def _visits_table(rng: np.random.Generator, rows: int, units: int) -> pa.Table:
    """Build ``visits`` as an Arrow table: per-user attributes, then one entry per row."""
    user_ids = 10_000_000 + rng.permutation(units * 7)[:units].astype(np.int64)
    owner = _row_owners(rng, rows, units)  # index of the row's user, shuffled row order
    per_user = _user_attributes(rng, units)

    region = per_user["home_region"][owner]
    away = rng.random(rows) >= _HOME_REGION_SHARE
    region[away] = rng.integers(0, len(REGIONS), int(away.sum()))

    # A row is in the user's home city, sometimes in another common city (never a rare one).
    city = per_user["city"][owner]
    travel = rng.random(rows) >= _HOME_CITY_SHARE
    popularity = per_user["city_popularity"]
    city[travel] = rng.choice(len(popularity), int(travel.sum()), p=popularity)

    return pa.table(
        {
            "user_id": user_ids[owner],
            "region": _dictionary(region, REGIONS),
            "age": per_user["age"][owner],
            "income": _row_incomes(rng, per_user["income"][owner]),
            "visits": np.minimum(rng.geometric(1 / 8, rows) - 1, 60).astype(np.int32),
            "city": _dictionary(city, per_user["city_names"]),
            "zip": _dictionary(owner, per_user["zip"]),
            "ssn": _dictionary(owner, per_user["ssn"]),
            "device": _devices(rng, rows),
        }
    )


def _row_owners(rng: np.random.Generator, rows: int, units: int) -> np.ndarray:
    """Return, per row, the index of its user: every user has one row, the rest are skewed."""
    weights = rng.lognormal(0.0, _ROWS_PER_UNIT_SIGMA, units)
    extra = rng.multinomial(rows - units, weights / weights.sum())
    owner = np.repeat(np.arange(units, dtype=np.int64), extra + 1)
    rng.shuffle(owner)
    return owner


def _user_attributes(rng: np.random.Generator, units: int) -> dict[str, np.ndarray]:
    """Draw what belongs to a user: home region, age, income, city, zip and ssn."""
    age = np.clip(np.rint(rng.normal(41.0, 19.0, units)), 0, 100).astype(np.int32)
    junk_age = rng.random(units) < 0.002
    age[junk_age] = rng.choice(np.array([-1, 130, 999], dtype=np.int32), int(junk_age.sum()))

    # Lognormal around 45k: about 1.5 % of users earn more than the bound 250k.
    income = rng.lognormal(np.log(45_000.0), 0.8, units)
    rich = rng.random(units) < 0.001
    income[rich] *= rng.uniform(10.0, 100.0, int(rich.sum()))  # a very long tail

    common = [p + s for p in _CITY_PREFIXES for s in _CITY_SUFFIXES]
    popularity = _city_popularity(rng, len(common))
    city = rng.choice(len(common), units, p=popularity)
    # Each rare city is the home of exactly one user, and no other row is ever there.
    loners = rng.choice(units, min(len(_RARE_CITIES), units), replace=False)
    city[loners] = len(common) + np.arange(len(loners))

    zip_base = 10_000 + 400 * (city % 200)
    zips = zip_base + rng.integers(0, 400, units)
    ssn_area = rng.integers(1, 900, units)
    ssn_group = rng.integers(1, 100, units)
    ssn_serial = rng.integers(1, 10_000, units)
    return {
        "home_region": rng.choice(len(REGIONS), units, p=_REGION_WEIGHTS),
        "age": age,
        "income": income,
        "city": city,
        "city_names": np.array(common + list(_RARE_CITIES), dtype=object),
        "city_popularity": popularity,
        "zip": np.array([f"{z:05d}" for z in zips.tolist()], dtype=object),
        "ssn": np.array(
            [
                f"{a:03d}-{g:02d}-{s:04d}"
                for a, g, s in zip(ssn_area.tolist(), ssn_group.tolist(), ssn_serial.tolist())
            ],
            dtype=object,
        ),
    }


def _city_popularity(rng: np.random.Generator, cities: int) -> np.ndarray:
    """Zipf-like probabilities (exponent 1.1) over the common cities, in a shuffled order."""
    popularity = 1.0 / np.arange(1, cities + 1) ** 1.1
    return rng.permutation(popularity / popularity.sum())


def _row_incomes(rng: np.random.Generator, income: np.ndarray) -> pa.Array:
    """Per-row incomes: the user's income, with some NULLs, a couple of NaNs and one +inf."""
    income = income.round(2)
    rows = len(income)
    null = rng.random(rows) < 0.005
    odd = rng.choice(rows, min(rows, 3), replace=False)
    income[odd[:2]] = np.nan
    income[odd[2:]] = np.inf
    null[odd] = False
    return pa.array(income, mask=null)


def _devices(rng: np.random.Generator, rows: int) -> pa.Array:
    """Per-row device, NULL for about 2 % of rows."""
    weights = np.array((*_DEVICE_WEIGHTS, 1.0 - sum(_DEVICE_WEIGHTS)))
    code = rng.choice(len(weights), rows, p=weights)
    return _dictionary(code, _DEVICES, null=code == len(_DEVICES))


def _dictionary(
    codes: np.ndarray, values: tuple[str, ...] | np.ndarray, null: np.ndarray | None = None
) -> pa.DictionaryArray:
    """A dictionary-encoded string column: cheap to build, cast to VARCHAR by DuckDB."""
    codes = codes.astype(np.int32)
    if null is not None:
        codes[null] = 0  # masked slots must still hold a valid index
    indices = pa.array(codes, mask=null)
    return pa.DictionaryArray.from_arrays(indices, pa.array(list(values), type=pa.string()))


def _regions_table() -> pa.Table:
    """The public ``regions`` table, one row per region."""
    return pa.table(
        {
            "region": list(REGIONS),
            "name": list(_REGION_NAMES),
            "population": pa.array(_REGION_POPULATION, type=pa.int64()),
        }
    )

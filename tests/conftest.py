"""Shared fixtures: a small DuckDB file with known exact contents, and its policy.

The database is built with duckdb directly from rows generated here, so a test can compute
every exact bounded aggregate independently of dpsql. Tables:

``noise_t``      the workhorse: 100 public groups ``g00``..``g99`` (``g99`` has no rows),
                 rows in a group ``zz`` the policy does not list, 400 units that each stay
                 within the caps (at most 2 public groups, at most 3 rows per group), so
                 the exact bounded sums do not depend on the salt.
``clip_t``       one row per unit with NULL, NaN, +inf, -inf and out-of-range values.
``clip_rows``    the same rows in a row-level table (no privacy unit).
``heavy_t``      one unit with 1000 rows in ``g00`` and 1 to 5 rows in each of 50 more
                 groups, plus light units.
``rowpick_t``    200 units, each alone in its own group with 20 rows ``x = 2**r``.
``grouppick_t``  200 units, each with its own 10 groups ``j{unit}_{i}``: 10 rows in ``i = 0``
                 and one row in each of ``i = 1..9``.
``order_t``      2000 units with one arbitrary double each (float sums depend on order).

``stats_database(path, rows, seed)`` writes the same tables with each table's rows
permuted, for order-independence tests.

Also shared by many test files: ``demo_database(rows, units)``, the demo database
(:func:`dpsql.demo.make_demo_database`) built once per size for the whole run (tests only
read it: dpsql attaches it read-only); ``demo_db``, the 20,000-row one; and
``make_policy``, a policy with the ``[privacy]``/``[budget]`` preamble written by
:mod:`policy_builder`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from dpsql.policy import Policy, parse_policy
from policy_builder import make_policy as _make_policy

from stats_tables import (  # noqa: F401 - re-exported for the fixtures below
    CLIP_BOUNDS,
    CLIP_K,
    CLIP_X,
    GROUPPICK_GROUPS,
    GROUPPICK_MAX_GROUPS,
    GROUPPICK_PER_UNIT,
    GROUPPICK_UNITS,
    HEAVY_GROUPS,
    HEAVY_MAX_GROUPS,
    HEAVY_MAX_ROWS,
    HEAVY_UNIT,
    NOISE_GROUPS,
    NOISE_MAX_GROUPS,
    NOISE_MAX_ROWS,
    NOISE_X_BOUNDS,
    NOISE_Y_BOUNDS,
    ROWPICK_MAX_ROWS,
    ROWPICK_ROWS,
    ROWPICK_UNITS,
    StatsData,
    _grouppick_rows,
    _heavy_rows,
    _noise_rows,
    _order_rows,
    _rowpick_rows,
    grouppick_key,
    stats_database,
)


@pytest.fixture(scope="session")
def stats_data(tmp_path_factory: pytest.TempPathFactory) -> StatsData:
    clip = [(uid, x, k) for uid, (x, k) in enumerate(zip(CLIP_X, CLIP_K))]
    rows = {
        "noise_t": _noise_rows(),
        "clip_t": clip,
        "clip_rows": [(x, k) for _, x, k in clip],
        "heavy_t": _heavy_rows(),
        "rowpick_t": _rowpick_rows(),
        "grouppick_t": _grouppick_rows(),
        "order_t": _order_rows(),
    }
    path = stats_database(tmp_path_factory.mktemp("stats") / "stats.duckdb", rows)
    return StatsData(path, rows)


def _values(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


STATS_POLICY = f"""
[privacy]
max_epsilon_per_query = 1000.0
max_delta_per_query = 0.1
default_epsilon = 1.0

[budget]
default = {{ epsilon = 1e9, delta = 0.5 }}

[tables.noise_t]
privacy_unit = "uid"
max_groups_per_unit = {NOISE_MAX_GROUPS}
max_rows_per_unit = {NOISE_MAX_ROWS}
[tables.noise_t.columns]
g = {{ public_values = {_values(NOISE_GROUPS)} }}
x = {{ bounds = [{NOISE_X_BOUNDS[0]}, {NOISE_X_BOUNDS[1]}] }}
y = {{ bounds = [{NOISE_Y_BOUNDS[0]}, {NOISE_Y_BOUNDS[1]}] }}

[tables.clip_t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.clip_t.columns]
x = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}
k = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}

[tables.clip_rows.columns]
x = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}
k = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}

[tables.heavy_t]
privacy_unit = "uid"
max_groups_per_unit = {HEAVY_MAX_GROUPS}
max_rows_per_unit = {HEAVY_MAX_ROWS}
[tables.heavy_t.columns]
g = {{ public_values = {_values(HEAVY_GROUPS)} }}
x = {{ bounds = [0, 16] }}

[tables.rowpick_t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = {ROWPICK_MAX_ROWS}
[tables.rowpick_t.columns]
g = {{ public_values = {_values(tuple(f"u{j:03d}" for j in range(ROWPICK_UNITS)))} }}
x = {{ bounds = [0, {2**ROWPICK_ROWS}] }}

[tables.grouppick_t]
privacy_unit = "uid"
max_groups_per_unit = {GROUPPICK_MAX_GROUPS}
max_rows_per_unit = 1
[tables.grouppick_t.columns]
g = {{ public_values = {_values(GROUPPICK_GROUPS)} }}

[tables.order_t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.order_t.columns]
x = {{ bounds = [{NOISE_X_BOUNDS[0]}, {NOISE_X_BOUNDS[1]}] }}
"""


@pytest.fixture(scope="session")
def stats_policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The policy as a TOML file (the form dpsql.connect usually gets)."""
    path = tmp_path_factory.mktemp("policy") / "stats.toml"
    path.write_text(STATS_POLICY, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def stats_policy() -> Policy:
    """The policy parsed in memory; every analyst has a practically unlimited budget."""
    return parse_policy(STATS_POLICY, source="<stats policy>")


# ---------------------------------------------------------------- a fast subset

#: What ``pytest --fast`` leaves out (pyproject's markers say what each one is). Plain
#: ``pytest`` (the README's command, what CI runs) still runs all of it.
FAST_SKIPS = ("server", "multiprocess", "audit", "udf_timeout")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="skip the server, multi-process, audit and UDF-timeout tests (a developer's quick run)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    kept, skipped = [], []
    for item in items:
        (skipped if any(item.get_closest_marker(m) for m in FAST_SKIPS) else kept).append(item)
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = kept


# ---------------------------------------------------------------- shared by many files

#: In CI (``CI=true``, what .ci/run sets) hypothesis draws the same examples every run, so a
#: red build is reproducible and never a lucky draw; locally it keeps exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def demo_database(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int], Path]:
    """``demo_database(rows, units)``: the demo database of that size, built once per run."""
    built: dict[tuple[int, int], Path] = {}

    def build(rows: int, units: int) -> Path:
        if (rows, units) not in built:
            from dpsql.demo import make_demo_database  # noqa: PLC0415 - loads numpy and DuckDB

            path = tmp_path_factory.mktemp(f"demo-{rows}x{units}") / "demo.duckdb"
            make_demo_database(path, rows=rows, units=units)
            built[(rows, units)] = path
        return built[(rows, units)]

    return build


@pytest.fixture(scope="session")
def demo_db(demo_database: Callable[[int, int], Path]) -> Path:
    """The demo database most API tests read: 20,000 visits of 2,000 users."""
    return demo_database(20_000, 2_000)


@pytest.fixture(scope="session")
def make_policy() -> Callable[..., Policy]:
    """``make_policy(tables, max_epsilon=..., budget=(eps, delta), ...)``: see :mod:`policy_builder`."""
    return _make_policy

"""The corpus's database and policy: the schemas peer systems' analysts query, rebuilt here.

Four families of tables, each modelled on the peer suite its queries come from (the data
is synthetic and small; only the shapes matter):

- **PUMS** (SmartNoise SQL's test data): ``pums`` with a person id ``pid``, ``age`` and
  ``income`` bounded, and ``sex``, ``educ``, ``race``, ``married`` declared as strings the
  way SmartNoise's ``PUMS.yaml`` declares them (so queries comparing them with numbers or
  booleans exercise the string/number rules). ``pums_rows`` is the row-privacy variant.
- **Telemetry** (SmartNoise's ``Devices.yaml``): ``crashes``, ``census``, ``rollouts``, all
  keyed by ``DeviceID``.
- **customers / orders** (the DuckDB ``privacy`` extension's tests and its TPC-H
  benchmark): ``customer`` is the privacy unit; ``orders`` carries ``o_custkey``;
  ``lineitem`` reaches the unit only through ``l_orderkey -> orders.o_orderkey`` (a
  ``privacy_link``, when the policy language has it); ``nation``, ``region``, ``part``,
  ``supplier`` are public.
- **visits** (dpsql's own demo, BigQuery / ZetaSQL differential privacy examples, Uber
  Chorus' workload): ``visits`` and the public ``regions``; BigQuery's ``professors``;
  Chorus' ``trips`` with the public ``cities``.

:func:`build_database` writes the DuckDB file; :func:`policy_text` the TOML policy (it
includes the ``privacy_link`` of ``lineitem`` only when dpsql's policy parser accepts it,
so the corpus measures what dpsql supports, never a policy it cannot load).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

SEED = 20261124

#: The schema prefixes peer queries put in front of table names, by table.
PREFIXES = {"pums": "PUMS", "crashes": "Telemetry", "census": "Telemetry", "rollouts": "Telemetry"}


def _money(values: np.ndarray) -> pa.Array:
    """Values rounded to cents, as DECIMAL(15,2)."""
    return pa.array([Decimal(f"{float(v):.2f}") for v in values], pa.decimal128(15, 2))


def _dates(rng: np.random.Generator, n: int, start: dt.date, days: int) -> list[dt.date]:
    return [start + dt.timedelta(days=int(d)) for d in rng.integers(0, days, n)]


def _tables(rng: np.random.Generator) -> dict[str, pa.Table]:
    t: dict[str, pa.Table] = {}
    # -- PUMS -------------------------------------------------------------------------
    n = 2000
    pid = np.repeat(np.arange(1000), 2)  # two rows per person: a household-style table
    t["pums"] = pa.table({
        "pid": pa.array(pid, pa.int32()),
        "age": pa.array(rng.integers(0, 95, n), pa.int32()),
        "sex": [str(v) for v in rng.integers(0, 2, n)],
        "educ": [str(v) for v in rng.integers(1, 17, n)],
        "race": [str(v) for v in rng.integers(1, 7, n)],
        "income": pa.array(rng.integers(0, 400_000, n), pa.int32()),
        "married": [str(v) for v in rng.integers(0, 2, n)],
    })
    t["pums_rows"] = t["pums"].drop(["pid"])
    # -- Telemetry ----------------------------------------------------------------------
    n = 3000
    devices = rng.integers(0, 800, n)
    t["crashes"] = pa.table({
        "DeviceID": pa.array(devices, pa.int64()),
        "Refurbished": pa.array(rng.integers(0, 2, n).astype(bool)),
        "Temperature": pa.array(rng.uniform(20, 70, n)),
        "Building": [f"B{v}" for v in rng.integers(0, 12, n)],
        "Region": [["LATAM", "EMEA", "APAC", "NA"][v] for v in rng.integers(0, 4, n)],
        "Crashes": pa.array(rng.integers(0, 12, n), pa.int32()),
    })
    t["census"] = pa.table({
        "DeviceID": pa.array(np.arange(800), pa.int64()),
        "OEM": [f"oem{v}" for v in rng.integers(0, 20, 800)],
        "Memory": [f"{2 ** v}GB" for v in rng.integers(1, 6, 800)],
        "Disk": pa.array(rng.integers(100, 10_000, 800), pa.int32()),
    })
    t["rollouts"] = pa.table({
        "DeviceID": pa.array(np.arange(800), pa.int64()),
        "RolloutID": pa.array(rng.integers(1, 5, 800), pa.int32()),
        "StartTrial": [dt.datetime(2024, 1, 1) + dt.timedelta(hours=int(h)) for h in rng.integers(0, 5000, 800)],
        "EndTrial": [dt.datetime(2024, 9, 1) + dt.timedelta(hours=int(h)) for h in rng.integers(0, 5000, 800)],
        "TrialGroup": pa.array(rng.integers(1, 4, 800), pa.int32()),
    })
    # -- customers / orders (TPC-H shaped) ----------------------------------------------
    customers, orders, lines = 500, 2000, 6000
    t["customer"] = pa.table({
        "c_custkey": pa.array(np.arange(customers), pa.int64()),
        "c_name": [f"Customer#{i:09d}" for i in range(customers)],
        "c_nationkey": pa.array(rng.integers(0, 25, customers), pa.int32()),
        "c_mktsegment": [["AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD"][v]
                         for v in rng.integers(0, 5, customers)],
        "c_acctbal": _money(rng.uniform(-999, 9999, customers)),
    })
    t["orders"] = pa.table({
        "o_orderkey": pa.array(np.arange(orders), pa.int64()),
        "o_custkey": pa.array(rng.integers(0, customers, orders), pa.int64()),
        "o_orderstatus": [["F", "O", "P"][v] for v in rng.integers(0, 3, orders)],
        "o_totalprice": _money(rng.uniform(900, 400_000, orders)),
        "o_orderdate": _dates(rng, orders, dt.date(1992, 1, 1), 2400),
        "o_orderpriority": [["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"][v]
                            for v in rng.integers(0, 5, orders)],
        "o_comment": [["special requests", "regular", "urgent packages"][v] for v in rng.integers(0, 3, orders)],
    })
    ship = _dates(rng, lines, dt.date(1992, 1, 10), 2400)
    t["lineitem"] = pa.table({
        "l_orderkey": pa.array(rng.integers(0, orders, lines), pa.int64()),
        "l_partkey": pa.array(rng.integers(0, 200, lines), pa.int32()),
        "l_suppkey": pa.array(rng.integers(0, 20, lines), pa.int32()),
        "l_quantity": _money(rng.integers(1, 51, lines)),
        "l_extendedprice": _money(rng.uniform(900, 95_000, lines)),
        "l_discount": _money(rng.integers(0, 11, lines) / 100),
        "l_tax": _money(rng.integers(0, 9, lines) / 100),
        "l_returnflag": [["A", "N", "R"][v] for v in rng.integers(0, 3, lines)],
        "l_linestatus": [["F", "O"][v] for v in rng.integers(0, 2, lines)],
        "l_shipdate": ship,
        "l_commitdate": [d + dt.timedelta(days=int(k)) for d, k in zip(ship, rng.integers(-30, 30, lines))],
        "l_receiptdate": [d + dt.timedelta(days=int(k)) for d, k in zip(ship, rng.integers(1, 30, lines))],
        "l_shipmode": [["AIR", "MAIL", "SHIP", "TRUCK", "RAIL"][v] for v in rng.integers(0, 5, lines)],
    })
    t["nation"] = pa.table({
        "n_nationkey": pa.array(np.arange(25), pa.int32()),
        "n_name": [f"NATION{i}" for i in range(25)],
        "n_regionkey": pa.array(np.arange(25) % 5, pa.int32()),
    })
    t["region"] = pa.table({"r_regionkey": pa.array(np.arange(5), pa.int32()),
                            "r_name": ["AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"]})
    t["part"] = pa.table({
        "p_partkey": pa.array(np.arange(200), pa.int32()),
        "p_brand": [f"Brand#{1 + v // 5}{1 + v % 5}" for v in rng.integers(0, 25, 200)],
        "p_type": [["PROMO BRUSHED", "MEDIUM POLISHED", "STANDARD ANODIZED"][v] for v in rng.integers(0, 3, 200)],
        "p_size": pa.array(rng.integers(1, 51, 200), pa.int32()),
    })
    t["supplier"] = pa.table({
        "s_suppkey": pa.array(np.arange(20), pa.int32()),
        "s_name": [f"Supplier#{i:09d}" for i in range(20)],
        "s_nationkey": pa.array(rng.integers(0, 25, 20), pa.int32()),
    })
    # -- visits, professors, trips -----------------------------------------------------
    n = 4000
    users = rng.integers(0, 1000, n)
    t["visits"] = pa.table({
        "user_id": pa.array(users, pa.int64()),
        "region": [["north", "south", "east", "west"][v] for v in rng.integers(0, 4, n)],
        "city": [f"city{v}" for v in rng.integers(0, 30, n)],
        "age": pa.array(rng.integers(18, 90, n), pa.int32()),
        "income": pa.array(rng.uniform(0, 250_000, n)),
        "duration": pa.array(rng.uniform(0, 3600, n)),
        "visit_date": _dates(rng, n, dt.date(2024, 1, 1), 365),
        "visit_ts": [dt.datetime(2024, 1, 1) + dt.timedelta(minutes=int(m)) for m in rng.integers(0, 525_600, n)],
        "device": [["mobile", "desktop", "tablet"][v] for v in rng.integers(0, 3, n)],
        "is_new": pa.array(rng.integers(0, 2, n).astype(bool)),
        "zip": [f"{v:05d}" for v in rng.integers(10_000, 99_999, n)],
        "ssn": [f"{v:09d}" for v in rng.integers(0, 10**9, n)],
    })
    t["regions"] = pa.table({"region": ["north", "south", "east", "west"], "country": ["A", "A", "B", "B"]})
    t["professors"] = pa.table({
        "id": pa.array(rng.integers(100, 400, 900), pa.int64()),
        "item": [["pencil", "pen", "scissors"][v] for v in rng.integers(0, 3, 900)],
        "quantity": pa.array(rng.integers(0, 120, 900), pa.int64()),
    })
    n = 4000
    t["trips"] = pa.table({
        "trip_id": pa.array(np.arange(n), pa.int64()),
        "rider_id": pa.array(rng.integers(0, 1200, n), pa.int64()),
        "driver_id": pa.array(rng.integers(0, 300, n), pa.int64()),
        "city_id": pa.array(rng.integers(1, 21, n), pa.int32()),
        "distance_km": pa.array(rng.gamma(2.0, 4.0, n)),
        "fare": pa.array(rng.gamma(2.0, 12.0, n)),
        "status": [["completed", "cancelled"][v] for v in (rng.random(n) < 0.1).astype(int)],
        "requested_at": [dt.datetime(2023, 1, 1) + dt.timedelta(minutes=int(m)) for m in rng.integers(0, 525_600, n)],
    })
    t["cities"] = pa.table({
        "city_id": pa.array(np.arange(1, 21), pa.int32()),
        "city_name": [f"City {i}" for i in range(1, 21)],
        "country": [["US", "BR", "IN", "FR"][i % 4] for i in range(20)],
    })
    return t


def build_database(path: Path) -> Path:
    """Write every corpus table into a new DuckDB file at ``path``."""
    con = duckdb.connect(str(path))
    try:
        for name, table in _tables(np.random.default_rng(SEED)).items():
            con.register("__src", table)
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM __src')
            con.unregister("__src")
    finally:
        con.close()
    return path


def _quoted(values: list[object]) -> str:
    return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in values) + "]"


_POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 0.01
default_epsilon = 1.0
accountant = "basic"

[budget]
default = {{ epsilon = 1e9, delta = 0.9 }}

[tables.pums]
privacy_unit = "pid"
max_groups_per_unit = 4
max_rows_per_unit = 2
[tables.pums.columns]
age = {{ bounds = [0, 100] }}
income = {{ bounds = [0, 500000] }}
sex = {{ public_values = ["0", "1"] }}
married = {{ public_values = ["0", "1"] }}
educ = {{ access = "group" }}
race = {{ access = "group" }}

[tables.pums_rows]
[tables.pums_rows.columns]
age = {{ bounds = [0, 100] }}
income = {{ bounds = [0, 500000] }}
sex = {{ public_values = ["0", "1"] }}
married = {{ public_values = ["0", "1"] }}
educ = {{ access = "group" }}
race = {{ access = "group" }}

[tables.crashes]
privacy_unit = "DeviceID"
max_groups_per_unit = 3
max_rows_per_unit = 5
[tables.crashes.columns]
Refurbished = {{ public_values = [true, false] }}
Temperature = {{ bounds = [25.0, 65.0] }}
Building = {{ access = "group" }}
Region = {{ access = "group" }}
Crashes = {{ bounds = [0, 10] }}

[tables.census]
privacy_unit = "DeviceID"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.census.columns]
OEM = {{ access = "group" }}
Memory = {{ access = "group" }}
Disk = {{ bounds = [100, 10000] }}

[tables.rollouts]
privacy_unit = "DeviceID"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.rollouts.columns]
RolloutID = {{ access = "group" }}
StartTrial = {{ access = "group" }}
EndTrial = {{ access = "group" }}
TrialGroup = {{ public_values = [1, 2, 3] }}

[tables.customer]
privacy_unit = "c_custkey"
max_groups_per_unit = 4
max_rows_per_unit = 1
[tables.customer.columns]
c_name = {{ access = "deny" }}
c_nationkey = {{ public_values = {nations} }}
c_mktsegment = {{ public_values = ["AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD"] }}
c_acctbal = {{ bounds = [-1000, 10000] }}

[tables.orders]
privacy_unit = "o_custkey"
max_groups_per_unit = 4
max_rows_per_unit = 10
[tables.orders.columns]
o_orderkey = {{ access = "filter" }}
o_orderstatus = {{ public_values = ["F", "O", "P"] }}
o_totalprice = {{ bounds = [0, 500000] }}
o_orderdate = {{ access = "group" }}
o_orderpriority = {{ public_values = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"] }}
o_comment = {{ access = "filter" }}
{lineitem}
[tables.nation]
public = true
[tables.region]
public = true
[tables.part]
public = true
[tables.supplier]
public = true

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 4
max_rows_per_unit = 10
[tables.visits.columns]
region = {{ public_values = ["north", "south", "east", "west"] }}
device = {{ public_values = ["mobile", "desktop", "tablet"] }}
city = {{ access = "group" }}
age = {{ bounds = [0, 100] }}
income = {{ bounds = [0, 250000] }}
duration = {{ bounds = [0, 3600] }}
visit_date = {{ access = "group" }}
visit_ts = {{ access = "group" }}
is_new = {{ public_values = [true, false] }}
zip = {{ access = "filter" }}
ssn = {{ access = "deny" }}

[tables.regions]
public = true

[tables.professors]
privacy_unit = "id"
max_groups_per_unit = 3
max_rows_per_unit = 5
[tables.professors.columns]
item = {{ public_values = ["pencil", "pen", "scissors"] }}
quantity = {{ bounds = [0, 100] }}

[tables.trips]
privacy_unit = "rider_id"
max_groups_per_unit = 5
max_rows_per_unit = 20
[tables.trips.columns]
driver_id = {{ access = "filter" }}
city_id = {{ public_values = {cities} }}
distance_km = {{ bounds = [0, 100] }}
fare = {{ bounds = [0, 200] }}
status = {{ public_values = ["completed", "cancelled"] }}
requested_at = {{ access = "group" }}

[tables.cities]
public = true
"""

_LINEITEM = """
[tables.lineitem]
privacy_link = {{ column = "l_orderkey", references = "orders.o_orderkey" }}
max_groups_per_unit = 4
max_rows_per_unit = 20
[tables.lineitem.columns]
l_orderkey = {{ access = "filter" }}
l_partkey = {{ access = "group" }}
l_suppkey = {{ access = "group" }}
l_quantity = {{ bounds = [0, 50] }}
l_extendedprice = {{ bounds = [0, 100000] }}
l_discount = {{ bounds = [0, 0.1] }}
l_tax = {{ bounds = [0, 0.08] }}
l_returnflag = {{ public_values = ["A", "N", "R"] }}
l_linestatus = {{ public_values = ["F", "O"] }}
l_shipdate = {{ access = "group" }}
l_commitdate = {{ access = "filter" }}
l_receiptdate = {{ access = "filter" }}
l_shipmode = {{ public_values = ["AIR", "MAIL", "SHIP", "TRUCK", "RAIL"] }}
"""


def policy_text(with_links: bool | None = None) -> str:
    """The corpus policy. ``with_links=None``: include ``lineitem`` (reached through a
    ``privacy_link``) exactly when dpsql's policy parser accepts that key."""
    nations = _quoted(list(range(25)))
    cities = _quoted(list(range(1, 21)))
    linked = _POLICY.format(nations=nations, cities=cities, lineitem=_LINEITEM.format())
    if with_links is None:
        from dpsql.errors import PolicyError
        from dpsql.policy import parse_policy

        try:
            parse_policy(linked)
            with_links = True
        except PolicyError:
            with_links = False
    return linked if with_links else _POLICY.format(nations=nations, cities=cities, lineitem="")

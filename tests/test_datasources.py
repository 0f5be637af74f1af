"""Declared sources on DuckDB: Parquet/CSV/JSON files, globs, Hive folders, a table of
another DuckDB file, DataFrames and Arrow tables; exactly those readable, nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.datasources import open_sources, source_kind

VISITS = pa.table({"user_id": [1, 2, 2, 3], "region": ["north", "south", "south", "east"],
                   "income": [10.0, 20.0, None, float("nan")]})


@pytest.fixture
def files(tmp_path: Path) -> Path:
    pq.write_table(VISITS.slice(0, 2), tmp_path / "visits_a.parquet")
    pq.write_table(VISITS.slice(2, 2), tmp_path / "visits_b.parquet")
    VISITS.to_pandas().to_csv(tmp_path / "visits.csv", index=False)
    VISITS.to_pandas().to_json(tmp_path / "visits.json", orient="records", lines=True)
    hive = tmp_path / "hive" / "region=north"
    hive.mkdir(parents=True)
    pq.write_table(VISITS.select(["user_id", "income"]), hive / "part-0.parquet")
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    with duckdb.connect(str(tmp_path / "app.duckdb")) as con:
        con.execute("CREATE TABLE visits AS SELECT * FROM VISITS")
        con.execute("CREATE TABLE secrets AS SELECT 'hunter2' AS password")
    return tmp_path


def _count(opened, table: str = "visits") -> int:
    return opened.connection.sql(f'SELECT COUNT(*) FROM "{table}"').fetchall()[0][0]


@pytest.mark.parametrize(("source", "rows"), [
    ("visits_a.parquet", 2), ("visits_*.parquet", 4), ("visits.csv", 4), ("visits.json", 4),
    ("hive", 4), ("app.duckdb:visits", 4),
])
def test_each_kind_of_source_reads(files: Path, source: str, rows: int) -> None:
    opened = open_sources({"visits": os.path.join(files, source)})
    assert _count(opened) == rows
    opened.connection.close()


def test_hive_folders_become_columns(files: Path) -> None:
    opened = open_sources({"visits": files / "hive"})
    assert opened.connection.sql('SELECT DISTINCT region FROM "visits"').fetchall() == [("north",)]


@pytest.mark.parametrize("frame", [VISITS, VISITS.to_pandas()], ids=["arrow", "pandas"])
def test_frames_are_sources(frame) -> None:
    opened = open_sources({"visits": frame})
    assert _count(opened) == 4
    assert opened.data_version != open_sources({"visits": frame}).data_version  # a new snapshot each open


def test_polars_frames_are_sources() -> None:
    pl = pytest.importorskip("polars")
    assert _count(open_sources({"visits": pl.from_arrow(VISITS)})) == 4


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('{d}/secret.csv')",
    "SELECT * FROM '{d}/secret.csv'",
    "SELECT * FROM read_parquet('{d}/visits_b.parquet')",
    "COPY (SELECT 1) TO '{d}/out.csv'",
    "ATTACH '{d}/app.duckdb' AS other",
    "SET enable_external_access = true",
    "SELECT * FROM frame_in_python",
    "INSTALL httpfs",
])
def test_nothing_but_the_declared_files_is_reachable(files: Path, sql: str) -> None:
    frame_in_python = VISITS  # noqa: F841 - a replacement scan would find it
    opened = open_sources({"visits": files / "visits_a.parquet"})
    with pytest.raises(duckdb.Error):
        opened.connection.sql(sql.format(d=files)).fetchall()


def test_a_duckdb_source_exposes_only_its_table(files: Path) -> None:
    opened = open_sources({"visits": f"{files}/app.duckdb:visits"})
    names = {r[0] for r in opened.connection.sql("SELECT table_name FROM duckdb_tables() UNION ALL "
                                                 "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert "visits" in names
    assert names <= {"visits", "secrets"}  # the attached file is listed; only "visits" is a view of main
    schema_main = opened.connection.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                                        "AND database_name = current_database()").fetchall()
    assert schema_main == [("visits",)]


@pytest.mark.parametrize(("source", "message"), [
    ("missing.parquet", "names no readable file"),
    ("nothing_*.parquet", "names no readable file"),
    ("data.txt", "cannot tell the format"),
    ("missing.duckdb:visits", "does not exist"),
    ("app.duckdb:nope", "cannot open table 'nope'"),
])
def test_bad_sources_are_clear_policy_errors(files: Path, source: str, message: str) -> None:
    (files / "data.txt").write_text("x")
    with pytest.raises(dpsql.PolicyError, match=message):
        open_sources({"visits": os.path.join(files, source)})


def test_not_a_source_is_a_clear_policy_error() -> None:
    with pytest.raises(dpsql.PolicyError, match="pandas or polars DataFrame or a pyarrow Table"):
        open_sources({"visits": 42})


def test_data_version_follows_the_files(files: Path) -> None:
    path = files / "visits_a.parquet"
    first = open_sources({"visits": path}).data_version
    assert open_sources({"visits": path}).data_version == first
    pq.write_table(VISITS, path)
    assert open_sources({"visits": path}).data_version != first


def test_source_kinds() -> None:
    assert [source_kind(s) for s in ("a.parquet", "d/*.csv", "x.ndjson", "f.duckdb:t", VISITS)] == [
        "parquet", "csv", "json", "duckdb", "frame"]


def test_the_pipeline_answers_over_sources(files: Path) -> None:
    from dpsql.datasources import SourcesEngine
    from dpsql.policy import parse_policy

    policy = parse_policy("""
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100.0, delta = 0.1 }
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.visits.columns]
region = { public_values = ["north", "south", "east"] }
income = { bounds = [0, 100] }
""")
    engine = SourcesEngine({"visits": files / "visits_*.parquet"})
    conn = dpsql.Connection(engine, policy, "t", dpsql.Ledger(None, accountant=policy.accountant))
    rows = conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region", epsilon=5.0).fetchall()
    assert sorted(r[0] for r in rows) == ["east", "north", "south"]
    assert engine.data_version().startswith("sources:")
    conn.close()
    with pytest.raises(duckdb.Error):
        engine.run("SELECT 1")  # closed with the connection


CONNECT_POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100.0, delta = 0.1 }
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.visits.columns]
region = { public_values = ["north", "south", "east"] }
income = { bounds = [0, 100] }
"""


def _policy():
    from dpsql.policy import parse_policy

    return parse_policy(CONNECT_POLICY)


@pytest.mark.parametrize("kind", ["parquet glob", "csv", "arrow", "pandas", "polars"])
def test_connect_with_tables(files: Path, kind: str) -> None:
    if kind == "polars":
        pytest.importorskip("polars", reason="polars is in the test extra: pip install -e '.[test]'")
    source = {"parquet glob": str(files / "visits_*.parquet"), "csv": str(files / "visits.csv"),
              "arrow": VISITS, "pandas": VISITS.to_pandas(), "polars": "polars"}[kind]
    if kind == "polars":
        import polars as pl

        source = pl.from_arrow(VISITS)
    with dpsql.connect(tables={"visits": source}, policy=_policy()) as conn:
        rows = conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region", epsilon=5.0).fetchall()
    assert sorted(r[0] for r in rows) == ["east", "north", "south"]


@pytest.mark.parametrize("kind", ["arrow", "pandas", "polars"])
def test_dataframe_rows_are_what_is_counted(kind: str) -> None:
    """The frame's rows are the data read (not an empty or stale table): 1,000 units north and
    200 south, one row each (cap 1); Laplace noise of scale 1/10 per count, so a count more
    than 5 off has probability e^-50."""
    table = pa.table({"user_id": list(range(1200)), "region": ["north"] * 1000 + ["south"] * 200,
                      "income": [1.0] * 1200})
    if kind == "polars":
        pl = pytest.importorskip("polars", reason="polars is in the test extra: pip install -e '.[test]'")
        frame: object = pl.from_arrow(table)
    else:
        frame = table if kind == "arrow" else table.to_pandas()
    with dpsql.connect(tables={"visits": frame}, policy=_policy()) as conn:
        rows = dict(conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region", epsilon=10.0).fetchall())
    assert abs(rows["north"] - 1000) < 5 and abs(rows["south"] - 200) < 5 and abs(rows["east"]) < 5


def test_a_parquet_file_as_the_database_is_a_clear_error(files: Path) -> None:
    with pytest.raises(dpsql.Error, match="is a PARQUET file, not a DuckDB database.*tables="):
        dpsql.connect(str(files / "visits_a.parquet"), policy=_policy())


def test_nothing_to_read_is_a_clear_error() -> None:
    with pytest.raises(dpsql.Error, match="needs the data"):
        dpsql.connect(policy=_policy())
    with pytest.raises(dpsql.Error, match="needs policy="):
        dpsql.connect(tables={"visits": VISITS})


def test_a_registered_dataframe_is_a_clear_error_not_silently_missing() -> None:
    con = duckdb.connect()
    con.register("visits", VISITS)
    with pytest.raises(dpsql.PolicyError, match="registered on the DuckDB connection.*tables="):
        dpsql.connect(con, policy=_policy())
    con.close()


def test_sources_with_a_wrapped_connection_are_refused() -> None:
    con = duckdb.connect()
    with pytest.raises(dpsql.Error, match="cannot be added to a connection you pass in"):
        dpsql.connect(con, policy=_policy(), tables={"visits": VISITS})
    con.close()


def test_a_duckdb_file_and_sources_together(files: Path, tmp_path: Path) -> None:
    """Tables with a source come from it; the others from the DuckDB file."""
    policy_text = CONNECT_POLICY + """
[tables.extra]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.extra.columns]
income = { bounds = [0, 100] }
"""
    from dpsql.policy import parse_policy

    db = tmp_path / "extra.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE extra AS SELECT * FROM range(50) t(user_id), (SELECT 1.0 AS income)")
    with dpsql.connect(str(db), policy=parse_policy(policy_text), tables={"visits": VISITS}) as conn:
        assert set(conn._engine.schema()) == {"visits", "extra"}


def test_policy_sources_are_read_relative_to_the_policy(files: Path) -> None:
    policy_file = files / "policy.toml"
    policy_file.write_text(CONNECT_POLICY.replace('[tables.visits]\n', '[tables.visits]\nsource = "visits_*.parquet"\n'))
    loaded = dpsql.load_policy(policy_file)
    assert loaded.tables["visits"].source == "visits_*.parquet"
    elsewhere = os.getcwd()
    try:
        os.chdir("/")
        with dpsql.connect(policy=str(policy_file)) as conn:
            assert conn.execute("SELECT COUNT(*) AS n FROM visits", epsilon=5.0).fetchall()[0][0] > 0
    finally:
        os.chdir(elsewhere)


@pytest.mark.parametrize("value", ["42", '""', "['a.parquet']"])
def test_a_bad_source_in_the_policy_is_a_policy_error(value: str) -> None:
    from dpsql.policy import parse_policy

    with pytest.raises(dpsql.PolicyError, match="source must be a path"):
        parse_policy(CONNECT_POLICY.replace("[tables.visits]\n", f"[tables.visits]\nsource = {value}\n"))


def test_a_missing_policy_source_is_a_policy_error(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(CONNECT_POLICY.replace('[tables.visits]\n', '[tables.visits]\nsource = "nope/*.parquet"\n'))
    with pytest.raises(dpsql.PolicyError, match="table 'visits': its source .*nope.* names no readable file"):
        dpsql.connect(policy=str(policy_file))


def _policy_file(files: Path) -> Path:
    path = files / "policy.toml"
    path.write_text(CONNECT_POLICY.replace('[tables.visits]\n', '[tables.visits]\nsource = "visits_*.parquet"\n'))
    return path


def test_cli_query_reads_the_policy_sources(files: Path, capsys) -> None:
    from dpsql.cli import main

    assert main(["query", "--policy", str(_policy_file(files)), "--epsilon", "5",
                 "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"]) == 0
    assert "north" in capsys.readouterr().out


def test_cli_policy_check_sources(files: Path, capsys) -> None:
    from dpsql.cli import main

    assert main(["policy", "check", str(_policy_file(files)), "--sources"]) == 0
    assert "matches its sources" in capsys.readouterr().out
    (files / "visits_a.parquet").unlink()
    (files / "visits_b.parquet").unlink()
    assert main(["policy", "check", str(_policy_file(files)), "--sources"]) != 0
    assert "names no readable file" in capsys.readouterr().err


def test_cli_query_with_a_parquet_file_as_db_is_a_clear_error(files: Path, capsys) -> None:
    from dpsql.cli import main

    policy = files / "plain.toml"
    policy.write_text(CONNECT_POLICY)
    assert main(["query", "--db", str(files / "visits_a.parquet"), "--policy", str(policy),
                 "SELECT COUNT(*) FROM visits"]) != 0
    err = capsys.readouterr().err
    assert "not a DuckDB database" in err and "Traceback" not in err


def test_cli_demo_on_parquet(tmp_path: Path, capsys) -> None:
    from dpsql.cli import main

    assert main(["demo", "--source", "parquet", "--dir", str(tmp_path), "--rows", "20000", "--units", "2000"]) == 0
    out = capsys.readouterr().out
    assert "visits = " in out and ".parquet" in out
    assert list(tmp_path.glob("*-parquet/visits.parquet"))

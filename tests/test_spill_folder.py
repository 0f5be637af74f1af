"""dpsql's own DuckDB spills to a private folder of its own (mode 0700, removed afterwards),
not to DuckDB's default ``.tmp`` in the working directory, and spilling works under the
locked configuration (external access off)."""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsql.datasources import open_sources
from dpsql.engine import DuckDBEngine
from dpsql.hardened import lock, open_for_data, open_private


def _folder(con) -> str:  # noqa: ANN001 - a DuckDB connection
    return str(con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0])


def _private(folder: str) -> bool:
    info = os.stat(folder)
    return os.path.isabs(folder) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()


def test_a_query_larger_than_memory_spills_to_the_private_folder_and_completes() -> None:
    con = lock(open_for_data(memory_limit="48MB", threads=1))
    folder = _folder(con)
    assert _private(folder)
    assert not folder.startswith(os.getcwd())
    con.execute("CREATE TABLE big AS SELECT range AS i, range * 2 AS j FROM range(10000000)")  # ~160 MB
    spilled = con.sql("SELECT path, size FROM duckdb_temporary_files()").fetchall()
    assert spilled and all(str(path).startswith(folder + os.sep) for path, _ in spilled)
    assert con.sql("SELECT count(*), sum(j) FROM big").fetchall() == [(10_000_000, 99_999_990_000_000)]
    con.close()
    del con
    gc.collect()
    assert not os.path.exists(folder)


def test_scratch_instances_get_no_spill_folder() -> None:
    con = open_private()
    assert _folder(con) == ".tmp"  # DuckDB's default: nothing of dpsql's to clean up
    con.close()


@pytest.mark.parametrize("kind", ["sources", "file"])
def test_data_engines_spill_privately(tmp_path: Path, kind: str) -> None:
    table = pa.table({"user_id": [1, 2], "income": [1.0, 2.0]})
    if kind == "sources":
        pq.write_table(table, tmp_path / "visits.parquet")
        con = open_sources({"visits": tmp_path / "visits.parquet"}).connection
    else:
        import duckdb

        with duckdb.connect(str(tmp_path / "app.duckdb")) as owner:
            owner.register("frame", table)
            owner.execute("CREATE TABLE visits AS SELECT * FROM frame")
        engine = DuckDBEngine(str(tmp_path / "app.duckdb"))
        con = engine._con
    assert _private(_folder(con))
    con.close()

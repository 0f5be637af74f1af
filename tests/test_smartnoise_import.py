"""SmartNoise metadata -> dpsql policy (issue 14): every mapping of the table in
:mod:`dpsql.smartnoise_import`, the notes for what has no equivalent, and a translated
policy answering a query end to end.

The YAML here is written for these tests in SmartNoise's documented metadata format
(``sql/docs/source/metadata.rst`` of opendp/smartnoise-sdk).
"""

from __future__ import annotations

import duckdb
import pytest

pytest.importorskip("yaml", reason="PyYAML (the smartnoise extra) reads SmartNoise metadata")

import dpsql
from dpsql.policy import parse_policy
from dpsql.smartnoise_import import translate, translate_file

PUMS_PID = """
"":
  PUMS:
    PUMS:
      rows: 1000
      max_ids: 3
      age: {type: int, lower: 0, upper: 100}
      sex: {type: string}
      income: {type: float, lower: 0.5, upper: 500000}
      married: {type: boolean}
      weight: {type: float}
      notes: {type: unknown}
      pid: {type: int, private_id: True}
"""


def test_private_id_table_maps_unit_caps_and_columns() -> None:
    t = translate(PUMS_PID)
    table = parse_policy(t.policy).table("PUMS")
    assert table is not None
    assert (table.privacy_unit, table.max_rows_per_unit, table.max_groups_per_unit) == ("pid", 3, 3)
    assert table.column("age").bounds == (0, 100)
    assert table.column("income").bounds == (0.5, 500000)
    assert table.column("sex").access == "group"
    assert table.column("married").public_values == (True, False)
    assert table.column("weight").access == "filter"
    assert table.column("notes") is None  # unknown type: denied
    assert any("rows = 1000 not mapped" in n for n in t.notes)
    assert any("PUMS.PUMS.notes: type unknown" in n for n in t.notes)
    assert "# Not mapped:" in t.policy and "rows = 1000" in t.policy  # the notes are in the file too


def test_row_privacy_table_has_no_unit() -> None:
    t = translate('"":\n  S:\n    T:\n      row_privacy: true\n      x: {type: int, lower: 0, upper: 9}\n')
    table = parse_policy(t.policy).table("T")
    assert table.privacy_unit is None and table.max_rows_per_unit == 1


@pytest.mark.parametrize(
    ("body", "note"),
    [
        ("      a: {type: int, private_id: true}\n      b: {type: int, private_id: true}\n", "composite private_id"),
        ("      a: {type: int}\n", "no column has private_id"),
    ],
)
def test_tables_whose_unit_is_unknown_are_left_out_with_a_note(body: str, note: str) -> None:
    text = '"":\n  S:\n    Keep:\n      row_privacy: true\n      x: {type: int}\n    Drop:\n' + body
    t = translate(text)
    assert parse_policy(t.policy).table("Drop") is None
    assert any(note in n and "S.Drop" in n for n in t.notes)


def test_options_without_equivalent_are_reported() -> None:
    t = translate(
        '"":\n  S:\n    T:\n      censor_dims: false\n      clamp_columns: false\n      sample_max_ids: false\n'
        '      clamp_counts: true\n      use_dpsu: true\n      uid: {type: int, private_id: true}\n'
        '      x: {type: int, lower: 0, upper: 9, sensitivity: 3, missing_value: 0}\n      y: {type: int, lower: 5}\n'
    )
    text = "\n".join(t.notes)
    for option in ("censor_dims", "clamp_columns", "sample_max_ids", "clamp_counts", "use_dpsu", "sensitivity",
                   "missing_value", "only one usable bound"):
        assert option in text, option
    assert parse_policy(t.policy).table("T").column("y").access == "group"


def test_escaped_identifiers_and_odd_names() -> None:
    t = translate('"":\n  Sales:\n    \'"Backlog-Orders"\':\n      row_privacy: true\n      \'"Sale-Amount"\': {type: int, lower: 0, upper: 100000}\n')
    table = parse_policy(t.policy).table("Backlog-Orders")
    assert table.column("Sale-Amount").bounds == (0, 100000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [1, 2", "not valid YAML"),
        ("a: 1\n", "no table found"),
        ('"":\n  A:\n    T:\n      row_privacy: true\n      x: {type: int}\n  B:\n    T:\n      row_privacy: true\n'
         '      x: {type: int}\n', "same name"),
    ],
)
def test_bad_metadata_is_a_policy_error(text: str, message: str) -> None:
    with pytest.raises(dpsql.PolicyError, match=message):
        translate(text)


def test_missing_file_is_a_policy_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(dpsql.PolicyError, match="not found"):
        translate_file(tmp_path / "nope.yaml")


def test_translated_policy_answers_a_query(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pums.yaml").write_text(PUMS_PID)
    (tmp_path / "policy.toml").write_text(translate_file(tmp_path / "pums.yaml").policy)
    con = duckdb.connect(str(tmp_path / "d.duckdb"))
    con.execute("CREATE TABLE PUMS AS SELECT i % 50 AS pid, i % 90 AS age, (i % 2)::VARCHAR AS sex, "
                "i * 10.0 AS income, i % 3 = 0 AS married, 1.0 AS weight, 'x' AS notes FROM range(200) t(i)")
    con.close()
    with dpsql.connect(str(tmp_path / "d.duckdb"), policy=str(tmp_path / "policy.toml"), analyst="a") as conn:
        res = conn.execute("SELECT married, COUNT(*) AS n, AVG(age) AS a FROM PUMS GROUP BY married", epsilon=0.5)
        assert sorted(r[0] for r in res.fetchall()) == [False, True]
        with pytest.raises(dpsql.PolicyViolation, match="notes"):
            conn.execute("SELECT COUNT(*) FROM PUMS WHERE notes = 'x'", epsilon=0.5)


def test_cli_prints_the_policy_and_the_notes(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from dpsql.cli import main

    (tmp_path / "pums.yaml").write_text(PUMS_PID)
    assert main(["policy", "import", str(tmp_path / "pums.yaml")]) == 0
    out, err = capsys.readouterr()
    assert parse_policy(out).table("PUMS").privacy_unit == "pid"
    assert "not mapped" in err and "rows = 1000" in err

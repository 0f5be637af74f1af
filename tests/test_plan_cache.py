"""The plan cache by template (issue 16, :mod:`dpsql.plancache`): a question that differs
from one planned before only in constants or output aliases gets the old plan rebound,
and that plan is exactly the one the analyzer gives it.

- Over the peer corpus and the totality generator's queries: each query is planned (and
  learned), then variants with other constants (of the same signature, so the cache is
  hit, and of another, so it is not) and other aliases (their references in ORDER BY /
  HAVING renamed along, mostly) are planned through the cache and compared field by field
  with a fresh connection's analysis; a refusal must be the same refusal.
- Every distinct question is its own charge and its own answer: two queries differing in
  one constant are two charges and two fresh answers (never a free repeat of each other),
  embedded; explain's bounded SQL is the fresh plan's.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import sqlglot.expressions as exp
from hypothesis import HealthCheck, given, settings

import dpsql
from dpsql.demo import demo_database
from dpsql.plan import QueryPlan
from dpsql.plancache import _signature
from dpsql.policy import parse_policy

from totality_cases import POLICY, make_tables, queries

sys.path.insert(0, str(Path(__file__).parent / "corpus"))
from corpus_queries import CASES  # noqa: E402
from corpus_schema import build_database, policy_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _variant(sql: str, conn: dpsql.Connection, rng: random.Random, same: bool, dialect: str | None = None) -> str | None:
    """``sql`` as normalized, with its constants changed (keeping each signature when
    ``same``) and its aliases renamed; ``None`` if it has neither."""
    normalized = conn._normalize(sql, dialect)  # type: ignore[attr-defined]
    if normalized is None:
        return None
    tree = normalized.select.copy()
    changed = False
    for node in list(tree.find_all(exp.Literal)):
        text = node.this
        signature = _signature(node)
        if node.is_string:
            if signature is not None:
                node.set("this", text + ("zz" if same else "1"))
                changed = True
            continue
        if text.isdigit() and int(text) > 0:
            for _ in range(50):
                other = str(max(int(text) + rng.randint(-30, 30), 1) if same else int(text) * 1000 + 7)
                if other != text and (not same or _signature(exp.Literal(this=other, is_string=False)) == signature):
                    node.set("this", other)
                    changed = True
                    break
    for alias in tree.expressions:
        if isinstance(alias, exp.Alias) and rng.random() < 0.5:
            name = alias.alias
            for column in list(tree.find_all(exp.Column)):  # ORDER BY n, HAVING n > 1: renamed along
                if not column.table and column.name == name and rng.random() < 0.9:
                    column.this.set("this", name + "_v")
            alias.args["alias"].set("this", name + "_v")
            changed = True
    return tree.sql(dialect="duckdb") if changed else None


def _outcome(conn: dpsql.Connection, sql: str) -> QueryPlan | str:
    try:
        return conn.plan(sql, epsilon=1.0, delta=1e-6)
    except dpsql.Error as e:
        return f"{type(e).__name__}: {e}"


def _fresh(conn: dpsql.Connection, sql: str) -> QueryPlan | str:
    conn._templates.clear()  # type: ignore[attr-defined]
    conn._plans.clear()  # type: ignore[attr-defined]
    return _outcome(conn, sql)


def _same(cached: QueryPlan | str, fresh: QueryPlan | str, sql: str) -> None:
    if isinstance(fresh, str) or isinstance(cached, str):
        assert cached == fresh, sql
        return
    for f in dataclasses.fields(QueryPlan):
        assert getattr(cached, f.name) == getattr(fresh, f.name), (f.name, sql)
        assert repr(getattr(cached, f.name)) == repr(getattr(fresh, f.name)), (f.name, sql)


def _check(conn: dpsql.Connection, fresh_conn: dpsql.Connection, sql: str, rng: random.Random,
           counts: dict[str, int], dialect: str | None = None) -> None:
    if isinstance(_outcome(conn, sql), str):
        return
    counts["learned"] += 1
    for same in (True, True, False):
        variant = _variant(sql, conn, rng, same, dialect)
        if variant is None:
            continue
        hits_before = _hits(conn)
        cached = _outcome(conn, variant)
        counts["hits"] += _hits(conn) - hits_before
        counts["variants"] += 1
        _same(cached, _fresh(fresh_conn, variant), variant)


def _hits(conn: dpsql.Connection) -> int:
    return conn._templates.hits  # type: ignore[attr-defined,no-any-return]


def test_rebound_plans_are_the_analyzers_over_the_corpus(tmp_path: Path) -> None:
    db = build_database(tmp_path / "corpus.duckdb")
    policy = tmp_path / "corpus.toml"
    policy.write_text(policy_text())
    rng = random.Random(16)
    counts = {"learned": 0, "variants": 0, "hits": 0}
    with dpsql.connect(str(db), policy=str(policy), analyst="c") as conn, \
            dpsql.connect(str(db), policy=str(policy), analyst="c") as fresh:
        for case in CASES:
            if case.ok:
                _check(conn, fresh, case.sql, rng, counts, case.options.get("dialect"))  # type: ignore[arg-type]
    assert counts["learned"] > 150 and counts["variants"] > 100 and counts["hits"] > 50, counts
    print(counts)


def test_rebound_plans_are_the_analyzers_over_generated_queries(tmp_path: Path) -> None:
    path = make_tables(tmp_path / "extremes.duckdb")
    policy = parse_policy(POLICY, source="<totality>")
    rng = random.Random(61)
    counts = {"learned": 0, "variants": 0, "hits": 0}
    with dpsql.connect(path, policy=policy, analyst="a") as conn, dpsql.connect(path, policy=policy, analyst="a") as fresh:

        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(queries())
        def check(sql: str) -> None:
            _check(conn, fresh, sql, rng, counts)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check()
    assert counts["learned"] > 50 and counts["hits"] >= 15, counts


@pytest.fixture()
def demo(tmp_path: Path) -> Any:
    db = demo_database(tmp_path / "demo.duckdb", rows=300, units=30)
    with dpsql.connect(str(db), policy=str(ROOT / "policies" / "demo.toml"), analyst="a",
                       ledger=str(tmp_path / "ledger.db")) as conn:
        yield conn


def test_each_constant_is_its_own_charge_and_answer(demo: dpsql.Connection) -> None:
    query = "SELECT region, COUNT(*) AS n FROM visits WHERE income > {} GROUP BY region"
    spent = demo.budget().epsilon_spent
    results = [demo.execute(query.format(v), epsilon=0.25) for v in (40, 41, 40, 42)]
    assert _hits(demo) >= 2  # 41 and 42 were rebound, not analyzed
    assert [r.cached for r in results] == [False, False, True, False]
    assert demo.budget().epsilon_spent == pytest.approx(spent + 0.75)
    plans = [demo.plan(query.format(v), epsilon=0.25) for v in (40, 41)]
    assert plans[0].normalized != plans[1].normalized and "41" in plans[1].normalized
    assert "> TRY_CAST('41' AS DOUBLE)" in demo.explain(query.format(41), epsilon=0.25).bounded_sql


def test_an_alias_named_in_order_by_is_rebound(demo: dpsql.Connection) -> None:
    query = "SELECT region, COUNT(*) AS {0} FROM visits WHERE age > {1} GROUP BY region ORDER BY {0} DESC"
    demo.plan(query.format("n", 30), epsilon=1.0, delta=1e-6)
    hits = _hits(demo)
    plan = demo.plan(query.format("visits_n", 31), epsilon=1.0, delta=1e-6)
    assert _hits(demo) == hits + 1 and plan.output_names == ("region", "visits_n")
    _same(plan, _fresh(demo, query.format("visits_n", 31)), "")


def test_a_refused_constant_stays_refused_and_free(demo: dpsql.Connection) -> None:
    demo.plan("SELECT COUNT(*) FROM visits WHERE age > 30 AND region = 'North'", epsilon=0.25)
    spent = demo.budget().epsilon_spent
    with pytest.raises(dpsql.Error):
        demo.execute("SELECT COUNT(*) FROM visits WHERE age > 1e999 AND region = 'North'", epsilon=0.25)
    assert demo.budget().epsilon_spent == spent

"""The bounding key (issue 16, :mod:`dpsql.rewrite.key`): plans that differ only in what the
bounded query never reads share one bounded query, and plans that share a key always have
the same bounded query.

- Over the peer corpus (every answerable query, at three budgets): equal keys, equal
  bounded SQL, salt parameters and bound lists; and many plans do share a key.
- Each field the key leaves out (:data:`~dpsql.rewrite.key.UNREAD`), perturbed: the key and
  the bounded SQL stay the same (so leaving it out is sound).
- Each field it keeps, perturbed: the key changes; literals keep their Python type.
- Through the pipeline: a new alias, epsilon or WHERE constant (a literal parameter,
  ``tests/test_literal_parameters.py``) reuses the engine's prepared statement, a constant
  of another decided type does not, and what runs is what ``bounded_query`` writes for
  that plan's parameterized form.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import sqlglot.expressions as exp

import dpsql
from dpsql.demo import demo_database
from dpsql.plan import GaussianParams, GroupKey, LaplaceParams, Measurement, QueryPlan, Selection
from dpsql.rewrite import bounded_query
from dpsql.rewrite.key import UNREAD, Key, KeyMemo, bounding_key, keyed, parameterized

sys.path.insert(0, str(Path(__file__).parent / "corpus"))
from corpus_queries import CASES  # noqa: E402
from corpus_schema import build_database, policy_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = ((1.0, 1e-6), (0.3, 1e-6), (2.0, 0.0))


def _bounded(plan: QueryPlan) -> tuple[str, tuple[str, ...], dict[str, list[object]]]:
    """Everything a run takes from the bounded query: its text, salt names and lists (its
    literal parameters are the plan's own)."""
    bounded = bounded_query(parameterized(plan), list_parameters=True)
    return bounded.query.sql(dialect="duckdb"), bounded.parameters, dict(bounded.lists)


@pytest.fixture(scope="module")
def corpus_plans(tmp_path_factory: pytest.TempPathFactory) -> list[QueryPlan]:
    directory = tmp_path_factory.mktemp("bounding_key")
    db = build_database(directory / "corpus.duckdb")
    policy = directory / "corpus.toml"
    policy.write_text(policy_text())
    plans = []
    with dpsql.connect(str(db), policy=str(policy), analyst="key") as conn:
        for case in CASES:
            if not case.ok:
                continue
            dialect = case.options.get("dialect")
            for epsilon, delta in BUDGETS:
                try:
                    plans.append(conn.plan(case.sql, epsilon=epsilon, delta=delta, dialect=dialect))  # type: ignore[arg-type]
                except dpsql.Error:
                    continue
    return plans


def test_plans_with_one_key_have_one_bounded_query(corpus_plans: list[QueryPlan]) -> None:
    seen: dict[object, tuple[str, tuple[str, ...], dict[str, list[object]]]] = {}
    shared = 0
    for plan in corpus_plans:
        key = bounding_key(plan)
        assert key is not None, plan.sql
        bounded = _bounded(plan)
        if key in seen:
            assert seen[key] == bounded, plan.sql
            shared += 1
        else:
            seen[key] = bounded
    assert len(corpus_plans) > 600
    # the budgets change the noise, and the shift of only some measurements: most share
    assert shared > len(corpus_plans) // 3


def _perturbed(value: object) -> object:
    """A different value of the same field."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 3 + 7
    if isinstance(value, float):
        return value * 3 + 0.125
    if isinstance(value, str):
        return value + "_other"
    if isinstance(value, LaplaceParams):
        return LaplaceParams(t=value.t * 2 + 1, s=value.s + 3)
    if isinstance(value, GaussianParams):
        return GaussianParams(t=value.t * 2 + 1, m=value.m + 3)
    if isinstance(value, Selection):
        return dataclasses.replace(value, name=value.name + "_other")
    if isinstance(value, exp.Select):
        return exp.select(exp.Literal.number(42)).from_("elsewhere")
    if isinstance(value, tuple):
        return () if value else ("note",)
    raise AssertionError(f"no perturbation for {type(value).__name__}")


def _with(plan: QueryPlan, owner: type, name: str) -> QueryPlan:
    if owner is QueryPlan:
        return dataclasses.replace(plan, **{name: _perturbed(getattr(plan, name))})
    if owner is Measurement:
        return dataclasses.replace(plan, measurements=tuple(
            dataclasses.replace(m, **{name: _perturbed(getattr(m, name))}) for m in plan.measurements))
    assert owner is Selection and plan.selection is not None
    return dataclasses.replace(plan, selection=dataclasses.replace(
        plan.selection, **{name: _perturbed(getattr(plan.selection, name))}))


def test_the_unread_fields_exist() -> None:
    for owner, names in UNREAD.items():
        assert names <= {f.name for f in dataclasses.fields(owner)}, owner


def test_a_field_left_out_of_the_key_changes_nothing_in_the_bounded_query(corpus_plans: list[QueryPlan]) -> None:
    sample = [p for p in corpus_plans if p.measurements][::25]
    sample += [p for p in corpus_plans if p.selection is not None][::10]
    sample += [p for p in corpus_plans if p.value_releases][::5]
    assert len(sample) > 20 and any(p.selection for p in sample) and any(p.value_releases for p in sample)
    checked = 0
    for plan in sample:
        key, bounded = bounding_key(plan), _bounded(plan)
        for owner, names in UNREAD.items():
            if owner is Selection and plan.selection is None:
                continue
            for name in sorted(names):
                other = _with(plan, owner, name)
                assert other != plan or owner is Measurement and not plan.measurements
                assert bounding_key(other) == key, (owner.__name__, name)
                assert _bounded(other) == bounded, (owner.__name__, name, plan.sql)
                checked += 1
    assert checked > 300


def test_a_field_in_the_key_changes_it(corpus_plans: list[QueryPlan]) -> None:
    plan = next(p for p in corpus_plans if p.where is not None and p.group_keys and p.measurements)
    key = bounding_key(plan)
    changed = 0
    for f in dataclasses.fields(QueryPlan):
        value = getattr(plan, f.name)
        if f.name in UNREAD[QueryPlan] or value is None or (isinstance(value, tuple) and not value):
            continue
        if isinstance(value, exp.Expr):
            other = dataclasses.replace(plan, **{f.name: exp.and_(value, exp.column("x").eq(1))})
        else:
            other = dataclasses.replace(plan, **{f.name: _perturbed(value)})
        assert bounding_key(other) != key, f.name
        changed += 1
    assert changed >= 8
    m = plan.measurements[0]
    for name in ("shift", "frac_bits", "row_bound", "kind", "name"):
        other = dataclasses.replace(plan, measurements=(dataclasses.replace(m, **{name: _perturbed(getattr(m, name))}),
                                                        *plan.measurements[1:]))
        assert bounding_key(other) != key, name


def test_the_key_memo_gives_the_walks_key_and_misses_on_any_new_field(corpus_plans: list[QueryPlan]) -> None:
    """:class:`KeyMemo` serves a plan whose read fields are the very objects of one seen, and
    walks again for anything else: a new field object (even an equal one), in or out of the
    memo's size."""
    memo = KeyMemo(size=8)
    for plan in corpus_plans[:40]:
        assert memo.keyed(plan) == keyed(plan)
        renamed = dataclasses.replace(plan, sql=plan.sql + " ", output_names=tuple(n + "_x" for n in plan.output_names))
        assert memo.keyed(renamed) is memo.keyed(plan)  # shared fields: served, not walked
    plan = next(p for p in corpus_plans if p.where is not None and p.measurements)
    memo.keyed(plan)
    other = dataclasses.replace(plan, where=exp.and_(plan.where, exp.column("x").eq(1)))
    assert memo.keyed(other) == keyed(other) != keyed(plan)
    copied = dataclasses.replace(plan, measurements=tuple(dataclasses.replace(m) for m in plan.measurements))
    before = memo.keyed(plan)
    assert memo.keyed(copied) == before and memo.keyed(copied) is not before  # equal, but walked afresh


def test_literals_keep_their_type_and_case() -> None:
    assert len({bounding_key(_tiny_plan((1,))), bounding_key(_tiny_plan((1.0,))), bounding_key(_tiny_plan((True,)))}) == 3
    assert bounding_key(_tiny_plan(("North",))) != bounding_key(_tiny_plan(("north",)))
    assert bounding_key(_tiny_plan(("north",))) == bounding_key(_tiny_plan(("north",)))
    upper, lower = (bounding_key(_tiny_plan((), where)) for where in ("North", "north"))
    assert upper != lower  # sqlglot's own == folds the case of strings: not used here


def test_listed_values_keep_each_ones_type_in_any_position() -> None:
    """A key's public values are keyed as their types and themselves (no tuple per value):
    still exact item by item, a mixed list (a plain value next to a tree) still keyed, and
    a list apart from a tuple of the same items."""
    assert bounding_key(_tiny_plan(("a", 1, None))) != bounding_key(_tiny_plan(("a", True, None)))
    assert bounding_key(_tiny_plan(("a", 1, 2.0))) != bounding_key(_tiny_plan(("a", 1, 2)))
    assert bounding_key(_tiny_plan(("a", 1, 2.0))) == bounding_key(_tiny_plan(("a", 1, 2.0)))
    assert bounding_key(_tiny_plan((1, 2))) != bounding_key(_tiny_plan((1, 2, 3)))
    mixed = (1, exp.Literal.number(1))
    assert bounding_key(_tiny_plan(mixed)) == bounding_key(_tiny_plan((1, exp.Literal.number(1))))
    assert bounding_key(_tiny_plan(mixed)) != bounding_key(_tiny_plan((1, exp.Literal.number(2))))
    assert bounding_key(_tiny_plan([1, 2])) != bounding_key(_tiny_plan((1, 2)))  # type: ignore[arg-type]


def test_a_key_hashes_its_value_once() -> None:
    """A plan's key holds its keys' public values (100,000 of them hashed again on every
    look of the reader's cache took 2.7 ms, twice a query): :class:`Key` keeps its hash."""

    class Counted:
        calls = 0

        def __hash__(self) -> int:
            Counted.calls += 1
            return 7

    key = Key(Counted())
    assert {key: 1}[key] == 1 and hash(key) == hash(key)
    assert Counted.calls == 1
    found = keyed(_tiny_plan(tuple(f"{i:05d}" for i in range(1000))))
    assert found is not None and isinstance(found[0], Key)
    again = keyed(_tiny_plan(tuple(f"{i:05d}" for i in range(1000))))
    assert again is not None and again[0] == found[0] and again[0] is not found[0]
    assert keyed(_tiny_plan(tuple(f"{i:05d}" for i in range(1001)))) != found


def _tiny_plan(values: tuple[object, ...], where: str | None = None) -> QueryPlan:
    """A plan grouped by a key listing ``values``, filtered by ``region = where``."""
    column = exp.column("region", table="__t", quoted=True)
    condition = None if where is None else exp.EQ(this=column.copy(), expression=exp.Literal.string(where))
    key = GroupKey(name="__g0", column="region", expression=column, public_values=values, filters=((column, values),))
    return QueryPlan(
        sql="", table="t", unit_column="u", where=condition, group_keys=(key,), max_rows_per_unit=1,
        max_groups_per_unit=1, sample_groups=False, measurements=(), aggregates=(), output=exp.select("1"),
        output_names=(), epsilon=1.0, delta=0.0, mechanism="laplace",
    )


def test_the_pipeline_reuses_a_bounded_query_across_aliases_and_budgets(tmp_path: Path) -> None:
    db = demo_database(tmp_path / "demo.duckdb", rows=300, units=30)
    query = "SELECT region, COUNT(*), AVG(income) FROM visits GROUP BY region"
    with dpsql.connect(str(db), policy=str(ROOT / "policies" / "demo.toml"), analyst="a") as conn:
        engine = conn._engine
        for sql, epsilon in ((query, 0.5), (query.replace("COUNT(*)", "COUNT(*) AS n"), 0.5),
                             (query + " ORDER BY region LIMIT 2", 0.5)):
            res = conn.execute(sql, epsilon=epsilon)
            assert res.fetchall()
        assert len(engine._statements) == 1  # type: ignore[attr-defined]
        for literal in (10, 20):
            sql = query.replace("GROUP BY", f"WHERE age > {literal} GROUP BY")
            conn.execute(sql, epsilon=0.5).fetchall()
            plan = conn.plan(sql, epsilon=0.5)
            assert engine.prepare(bounded_query(parameterized(plan), list_parameters=True).query) in engine._statements  # type: ignore[attr-defined]
        assert len(engine._statements) == 2  # type: ignore[attr-defined]
        conn.execute(query.replace("GROUP BY", "WHERE age > 20.5 GROUP BY"), epsilon=0.5).fetchall()
        assert len(engine._statements) == 3  # type: ignore[attr-defined]
        # a plan at another epsilon: the text it runs is the one bounded_query writes for it
        plan = conn.plan(query.replace("COUNT(*)", "COUNT(*) AS m"), epsilon=0.25)
        prepared, _, literals = conn._reader._bounded(plan)  # type: ignore[attr-defined]
        assert prepared == engine.prepare(bounded_query(plan, list_parameters=True).query) and not literals

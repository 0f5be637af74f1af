"""Group-key pass: each GROUP BY key, whether its values are public (listed by the policy,
or read from a joined public table) or need partition selection, and the L0 cap."""

from __future__ import annotations

import math

import sqlglot.expressions as exp

from dpsql.analyze import predicates, public_values
from dpsql.analyze.clauses import _column, _resolver
from dpsql.analyze.context import Context
from dpsql.analyze.parse import DIALECT, point_at, reject
from dpsql.analyze.scope import Resolved, resolve
from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.plan import GroupKey

# -- group keys ------------------------------------------------------------------------


def _plan_group_keys(ctx: Context, select: exp.Select) -> None:
    group = select.args.get("group")
    if group is None:
        return
    if any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup", "all")):
        raise reject("GROUPING SETS, CUBE, ROLLUP and GROUP BY ALL are not supported.", ctx.sql, group)
    projections = select.expressions
    for item in group.expressions:
        node = item
        if isinstance(item, exp.Literal) and not item.is_string:
            if not item.this.isdigit():
                raise reject(f"GROUP BY {item.this} is not a column position; write 1, 2, ... or a column.", ctx.sql, item)
            index = int(item.this) - 1
            if not 0 <= index < len(projections):
                raise reject(f"GROUP BY {item.this} is out of range.", ctx.sql, item)
            node = projections[index].unalias()
        elif isinstance(item, exp.Column) and not item.table and not _is_source_column(ctx, item):
            node = _select_alias(projections, item.name) or item  # a name no table has: an alias
        if isinstance(node, exp.Column):
            _add_column_key(ctx, node)
        else:
            _add_expression_key(ctx, node)


def _is_source_column(ctx: Context, column: exp.Column) -> bool:
    """Whether a GROUP BY name is a column of a source table (it then means the column,
    as in DuckDB and standard SQL, even when an output alias has the same name)."""
    try:
        resolve(ctx.scope, column)
    except (QueryRejected, PolicyViolation):
        return False
    return True


def _select_alias(projections: list[exp.Expression], name: str) -> exp.Expression | None:
    for p in projections:
        if isinstance(p, exp.Alias) and p.alias.casefold() == name.casefold():
            aliased: exp.Expression = p.this
            return aliased
    return None


def _groupable(ctx: Context, column: exp.Column) -> Resolved:
    resolved = _column(ctx, column)
    if resolved.is_unit:
        raise PolicyViolation(
            f"the privacy unit column {column.name!r} may not be grouped by: that would release "
            f"one row per person.\n{point_at(ctx.sql, column)}"
        )
    if not resolved.policy.can_group:
        raise PolicyViolation(
            f"column {column.name!r} is {resolved.policy.access}-only in the policy and may not be a "
            f"GROUP BY key; use it in WHERE only.\n{point_at(ctx.sql, column)}"
        )
    return resolved


def _key_identity(resolved: Resolved) -> str:
    return f"{resolved.entry.canonical}.{resolved.policy.name.casefold()}"


def _listed_values(ctx: Context, resolved: Resolved) -> tuple[object, ...] | None:
    """Values known without looking at private data: listed by the policy, or read from a
    public table."""
    if resolved.policy.is_public_key:
        return public_values.check_public_values(resolved.entry.table.name, resolved.policy, resolved.dtype)
    if resolved.entry.table.public and ctx.public_values is not None:
        return ctx.public_values(resolved.entry.table.name, resolved.policy.name)
    return None


def _add_column_key(ctx: Context, column: exp.Column) -> None:
    resolved = _groupable(ctx, column)
    identity = _key_identity(resolved)
    if identity in ctx.keys:
        return
    values = _listed_values(ctx, resolved)
    policy_listed = resolved.policy.is_public_key
    filters = ((resolved.ref.copy(), values),) if values is not None and policy_listed else ()
    family = predicates.family(resolved.dtype)
    if family == "other":
        raise reject(f"column {column.name!r} of type {resolved.dtype} cannot be a GROUP BY key; group by "
                     "numbers, strings, booleans, dates or timestamps.", ctx.sql, column)
    ctx.keys[identity] = GroupKey(f"__g{len(ctx.keys)}", resolved.policy.name, resolved.ref.copy(), values, filters, family)


def _add_expression_key(ctx: Context, node: exp.Expression) -> None:
    identity = _shape(node)
    if identity in ctx.keys:
        return
    canonical, family = predicates.check_key(ctx.sql, node, _resolver(ctx))
    inputs: dict[str, tuple[exp.Column, tuple[object, ...]]] = {}
    listed: list[tuple[exp.Column, tuple[object, ...]]] = []
    private = False
    for column in node.find_all(exp.Column):
        resolved = _groupable(ctx, column)
        values = _listed_values(ctx, resolved)
        if values is None:
            private = True
            continue
        inputs[resolved.ref.sql()] = (resolved.ref, values)
        if resolved.policy.is_public_key:
            listed.append((resolved.ref.copy(), values))
    enumerable = not private and inputs
    values = public_values.enumerate_key(ctx.sql, node, canonical, list(inputs.values())) if enumerable else None
    filters = tuple(listed) if values is not None else ()
    ctx.keys[identity] = GroupKey(f"__g{len(ctx.keys)}", None, canonical, values, filters, family)


#: How the identity of an expression key starts (a column key's is ``table.column``, no colon).
_SHAPED = "expr:"


def _shape(node: exp.Expression) -> str:
    """An expression's text with table qualifiers dropped, to match keys in the select list."""
    bare = node.transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n)
    return _SHAPED + bare.sql(dialect=DIALECT).casefold()


def _effective_l0(ctx: Context) -> tuple[int, bool]:
    """The L0 bound used for sensitivity, and whether the rewrite must enforce it."""
    if ctx.primary.privacy_unit is None and not ctx.scope.joined:
        return 1, False
    cap = ctx.scope.max_groups_per_unit
    if any(not k.is_public for k in ctx.keys.values()):
        return cap, True
    groups = math.prod(len(k.public_values or ()) for k in ctx.keys.values())
    return (groups, False) if groups <= cap else (cap, True)

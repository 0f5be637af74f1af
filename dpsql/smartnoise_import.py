"""SmartNoise SQL metadata (YAML) -> a dpsql policy (TOML), saying what could not be mapped.

``dpsql policy import smartnoise.yaml > policy.toml`` runs :func:`translate_file`. SmartNoise
describes each table as ``collection -> schema -> table -> column`` with table options and
column options; dpsql's policy (DESIGN §3) is per table. The mapping, and why:

=========================  =================================================================
SmartNoise                 dpsql
=========================  =================================================================
``private_id: true``       ``privacy_unit`` (one column; a composite id is refused)
``row_privacy: true``      no ``privacy_unit``: each row is its own unit
neither                    the table is left out: dpsql cannot guess whom a row is about
``max_ids: n``             ``max_rows_per_unit = n`` and ``max_groups_per_unit = n``: a
                           SmartNoise unit has at most n rows in the whole table, so at
                           most n rows in one group and at most n groups (default 1)
``lower``/``upper``        ``bounds = [lower, upper]`` (summable, averageable, groupable)
``type: boolean``          ``public_values = [true, false]`` (the values are known)
``type: string``,          ``access = "group"``: keys are released through DP partition
``datetime``, ``int``      selection, which is what SmartNoise's default ``censor_dims``
without bounds             does
``type: float`` unbounded  ``access = "filter"`` (WHERE only)
``type: unknown``          not listed: denied (dpsql fails closed)
=========================  =================================================================

Options with no dpsql equivalent are reported, never silently dropped: ``censor_dims:
false`` (list the key values as ``public_values`` to release every group), ``clamp_columns:
false`` and ``sample_max_ids: false`` (dpsql always clips and caps), ``sensitivity`` (dpsql
derives it from the bounds), ``missing_value``, ``clamp_counts`` and ``use_dpsu``
(post-processing and selection choices dpsql makes itself), ``rows``. The privacy and
budget sections are dpsql defaults for the data owner to review: SmartNoise keeps them in
code (``Privacy(epsilon=...)``), not in the metadata.

>>> t = translate('''
... "":
...   PUMS:
...     PUMS:
...       max_ids: 2
...       pid: {type: int, private_id: true}
...       age: {type: int, lower: 0, upper: 100}
...       sex: {type: string}
... ''')
>>> print(t.policy.split("[tables.PUMS]")[1].strip())
privacy_unit = "pid"
max_groups_per_unit = 2
max_rows_per_unit = 2
<BLANKLINE>
[tables.PUMS.columns]
age = { bounds = [0, 100] }
sex = { access = "group" }
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dpsql.errors import PolicyError

__all__ = ["Translation", "translate", "translate_file"]

_TABLE_OPTIONS = {
    "max_ids", "row_privacy", "sample_max_ids", "censor_dims", "clamp_counts", "clamp_columns", "use_dpsu", "rows",
}
_IGNORED_TABLE_OPTIONS = {
    "clamp_counts": "clamping negative counts is post-processing; dpsql leaves noisy counts unclamped",
    "use_dpsu": "dpsql picks its own partition selection",
    "rows": "dpsql does not need a row count (declared_rows, for server deadlines, must be an upper bound)",
}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

_HEADER = """\
# dpsql policy translated from SmartNoise metadata ({source}) by `dpsql policy import`.
# Review it before use: the [privacy] and [budget] sections are dpsql defaults (SmartNoise
# keeps epsilon and delta in code, not in its metadata), and the notes below list what
# could not be mapped.
{notes}
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5
accountant = "basic"

[budget]
default = {{ epsilon = 5.0, delta = 1e-5 }}
"""


@dataclass(frozen=True)
class Translation:
    """A translated policy and what the translation could not carry over.

    Attributes:
        policy: the dpsql policy, TOML text (the notes are in it as comments too).
        notes: one sentence per SmartNoise setting that has no dpsql equivalent, or that
            made a table or column be left out; each names the table and column.
    """

    policy: str
    notes: tuple[str, ...]


def translate_file(path: str | os.PathLike[str]) -> Translation:
    """Translate the SmartNoise metadata file at ``path`` (see :func:`translate`)."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        raise PolicyError(f"{source}: SmartNoise metadata file not found; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{source}: cannot read the SmartNoise metadata file: {exc}") from exc
    return translate(text, source=source)


def translate(text: str, source: str = "<string>") -> Translation:
    """Translate SmartNoise SQL metadata (its YAML format) into a dpsql policy.

    Raises:
        PolicyError: the text is not YAML, has no table, or names a table twice (in two
            schemas: dpsql table names are unqualified).
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - depends on the installation
        raise PolicyError("reading SmartNoise metadata needs PyYAML: pip install 'dpsql[smartnoise]'") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from None
    tables = list(_find_tables(raw, ()))
    if not tables:
        raise PolicyError(
            f"{source}: no table found; SmartNoise metadata nests collection -> schema -> table -> "
            "columns, each column a mapping with a 'type'."
        )
    notes: list[str] = []
    blocks: list[str] = []
    seen: dict[str, str] = {}
    for path, body in tables:
        name = _unquote(path[-1])
        where = ".".join(_unquote(p) for p in path if p)
        if name.casefold() in seen:
            raise PolicyError(
                f"{source}: tables {seen[name.casefold()]!r} and {where!r} have the same name; dpsql table "
                "names are not qualified by schema. Translate them from separate files."
            )
        seen[name.casefold()] = where
        block = _table(name, where, body, notes)
        if block is not None:
            blocks.append(block)
    if not blocks:
        raise PolicyError(f"{source}: no table could be translated:\n" + "\n".join(notes))
    comment = "".join(f"#   - {n}\n" for n in notes) if notes else "#   (nothing: every setting was mapped)\n"
    header = _HEADER.format(source=os.path.basename(source), notes="#\n# Not mapped:\n" + comment)
    return Translation(header + "".join(blocks), tuple(notes))


def _find_tables(node: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Mapping[Any, Any]]]:
    """(path, body) of every mapping whose children include a column (a mapping with a
    'type' key)."""
    if not isinstance(node, Mapping):
        return
    if any(isinstance(v, Mapping) and "type" in v for v in node.values()):
        yield path, node
        return
    for key, value in node.items():
        if key == "engine":
            continue
        yield from _find_tables(value, (*path, str(key)))


def _unquote(name: str) -> str:
    """SmartNoise lets metadata escape identifiers the way the engine does: "a", `a`, [a]."""
    name = str(name)
    if len(name) >= 2 and (name[0], name[-1]) in (('"', '"'), ("`", "`"), ("[", "]")):
        return name[1:-1]
    return name


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _table(name: str, where: str, body: Mapping[str, Any], notes: list[str]) -> str | None:
    columns = {k: v for k, v in body.items() if isinstance(v, Mapping)}
    options = {k: v for k, v in body.items() if not isinstance(v, Mapping)}
    for key in sorted(set(options) - _TABLE_OPTIONS):
        notes.append(f"{where}: unknown table option {key!r} ignored")
    for key, why in _IGNORED_TABLE_OPTIONS.items():
        if key in options:
            notes.append(f"{where}: {key} = {options[key]!r} not mapped ({why})")
    if options.get("clamp_columns") is False:
        notes.append(f"{where}: clamp_columns = false not mapped: dpsql always clips values into their bounds")
    if options.get("sample_max_ids") is False:
        notes.append(f"{where}: sample_max_ids = false not mapped: dpsql always enforces the per-unit caps")
    ids = [c for c, v in columns.items() if v.get("private_id") is True]
    row_privacy = options.get("row_privacy") is True
    lines = [f"\n[tables.{_key(name)}]\n"]
    if len(ids) > 1:
        notes.append(f"{where}: left out: a composite private_id ({', '.join(ids)}) has no dpsql equivalent; "
                     "add a column that identifies the person and name it privacy_unit")
        return None
    if ids and row_privacy:
        notes.append(f"{where}: row_privacy = true with a private_id {ids[0]!r}: the private_id is used")
    if ids:
        max_ids = options.get("max_ids", 1)
        if isinstance(max_ids, bool) or not isinstance(max_ids, int) or max_ids < 1:
            notes.append(f"{where}: max_ids = {max_ids!r} is not a positive integer; 1 used")
            max_ids = 1
        lines += [f'privacy_unit = "{_unquote(ids[0])}"\n', f"max_groups_per_unit = {max_ids}\n",
                  f"max_rows_per_unit = {max_ids}\n"]
    elif not row_privacy:
        notes.append(f"{where}: left out: no column has private_id and row_privacy is not true, so whom a row "
                     "is about is unknown; add privacy_unit (or leave it out for row-level privacy) by hand")
        return None
    elif options.get("max_ids", 1) != 1:
        notes.append(f"{where}: max_ids = {options['max_ids']!r} ignored: with row_privacy each row is one unit")
    censor = options.get("censor_dims", True) is not False
    if not censor:
        notes.append(f"{where}: censor_dims = false not mapped: dpsql releases a private key only through partition "
                     "selection; list the values of each key column as public_values to release every group")
    entries = []
    for column, spec in columns.items():
        if column in ids:
            continue
        entry = _column(where, _unquote(column), spec, notes)
        if entry is not None:
            entries.append(f"{_key(_unquote(column))} = {{ {entry} }}\n")
    lines.append(f"\n[tables.{_key(name)}.columns]\n")
    lines += entries
    return "".join(lines)


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _column(where: str, column: str, spec: Mapping[str, Any], notes: list[str]) -> str | None:
    kind = str(spec.get("type", "unknown")).lower()
    here = f"{where}.{column}"
    for key in ("sensitivity", "missing_value"):
        if spec.get(key) is not None:
            notes.append(f"{here}: {key} = {spec[key]!r} not mapped (dpsql derives sensitivity from the bounds and "
                         "skips NULLs)")
    if kind == "unknown":
        notes.append(f"{here}: type unknown: not listed, so denied")
        return None
    lower, upper = _number(spec.get("lower")), _number(spec.get("upper"))
    if kind in ("int", "float") and lower is not None and upper is not None:
        if lower < upper:
            return f"bounds = [{lower!r}, {upper!r}]"
        notes.append(f"{here}: lower {lower!r} is not below upper {upper!r}; the column may be filtered and grouped "
                     "but not summed")
    elif ("lower" in spec) != ("upper" in spec) or (kind in ("int", "float") and ("lower" in spec) and lower is None):
        notes.append(f"{here}: only one usable bound given; the column may not be summed")
    if kind == "boolean":
        return "public_values = [true, false]"
    if kind == "float":
        return 'access = "filter"'
    if kind in ("int", "string", "datetime"):
        return 'access = "group"'
    notes.append(f"{here}: type {kind!r} is not a SmartNoise type dpsql knows; not listed, so denied")
    return None

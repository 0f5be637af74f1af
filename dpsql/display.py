"""How a result looks: the CLI's text table, a notebook's HTML, ``repr``, and 95% intervals as
columns.

Numbers are shown with the precision their noise allows and no more: an integer column
(COUNT, an integer SUM) as an integer, ``17633 ± 240``; a float with two decimals, or as
many as it takes to show two significant digits of a small half-width (``0.2500 ±
0.0031``, never ``0.25 ± 0.00``).

>>> cell_text(17633, 239.6, integer=True), cell_text(0.25, 0.0031, integer=False)
('17633 ± 240', '0.2500 ± 0.0031')
>>> cell_text(61570.284, 5085.49, integer=False), cell_text("north", 0.0, integer=False)
('61,570.28 ± 5,085.49', 'north')
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from dpsql.result import Result

__all__ = ["cell_text", "explanation_text", "html_table", "result_repr", "text_table", "with_bias_columns",
           "with_intervals"]

#: Rows shown by ``repr`` and in a notebook before "... N more rows".
SHOWN_ROWS = 20
#: Decimals shown at most.
_MAX_DECIMALS = 8


def _decimals(half_width: float | None) -> int:
    """Two decimals, or enough for two significant digits of ``half_width``."""
    if not half_width or not math.isfinite(half_width) or half_width >= 0.1:
        return 2
    return min(_MAX_DECIMALS, 1 - math.floor(math.log10(half_width)))


def cell_text(value: Any, half_width: float | None, *, integer: bool) -> str:
    """One cell: the value, and ``± half-width`` when the cell carries noise."""
    if value is None:
        text = "NULL"
    elif isinstance(value, bool):
        text = str(value)
    elif isinstance(value, int) or (integer and isinstance(value, float) and value.is_integer()):
        text = str(int(value))
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= 1e15:
            text = f"{value:.4g}"
        else:
            text = f"{value:,.{_decimals(half_width)}f}"
    else:
        text = str(value)
    if half_width and math.isfinite(half_width) and not (isinstance(value, str)):
        if half_width >= 1e15:
            text += f" ± {half_width:.3g}"
        elif integer and half_width >= 1:
            text += f" ± {round(half_width):,}"
        else:
            text += f" ± {half_width:,.{_decimals(half_width)}f}"
    return text


def _is_integer(table: pa.Table, name: str) -> bool:
    return bool(pa.types.is_integer(table.schema.field(name).type))


def _rows(result: Result, limit: int | None) -> tuple[list[str], list[list[str]]]:
    table = result.arrow()
    header = list(table.column_names)
    count = table.num_rows if limit is None else min(limit, table.num_rows)
    columns = {name: table[name].to_pylist()[:count] for name in header}
    cells = {name: result.accuracy.cells(name)[:count] if name in result.accuracy else [None] * count
             for name in header}
    rows = [[cell_text(columns[n][i], cells[n][i], integer=_is_integer(table, n)) for n in header]
            for i in range(count)]
    return header, rows


#: What the bias table under an answer is (``bias=True``: :mod:`dpsql.release.bias`).
BIAS_TITLE = ("bias estimate per cell (differentially private, ± its 95% noise; rows the caps dropped "
              "and values clipped into their bounds, which the ± above does not cover):")


def _bias_rows(result: Result, limit: int | None) -> tuple[list[str], list[list[str]]] | None:
    """The answer's shape with each aggregate cell's bias estimates, keys as they are."""
    bias = getattr(result, "bias", None)
    if bias is None or not bias.cells:
        return None
    table = result.arrow()
    header = list(table.column_names)
    count = table.num_rows if limit is None else min(limit, table.num_rows)
    rows = []
    for i in range(count):
        row = []
        for name in header:
            cell = bias.cells.get(name, [None] * table.num_rows)[i]
            row.append(cell.text() if cell is not None
                       else cell_text(table[name][i].as_py(), None, integer=_is_integer(table, name)))
        rows.append(row)
    return header, rows


def _aligned(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def text_table(result: Result, limit: int | None = None) -> str:
    """A plain-text table with ± half-widths (what the CLI prints), and under it, when the
    query asked for them, each cell's bias estimates."""
    header, rows = _rows(result, limit)
    lines = _aligned(header, rows)
    hidden = len(result) - len(rows)
    if hidden > 0:
        lines.append(f"... {hidden} more row{'s' if hidden != 1 else ''}")
    bias = _bias_rows(result, limit)
    if bias is not None:
        lines += ["", BIAS_TITLE, *_aligned(*bias)]
    return "\n".join(lines)


def _charge_line(result: Result) -> str:
    privacy = result.privacy
    free = " (a free repeat: nothing charged now)" if getattr(result, "cached", False) else ""
    return f"charged epsilon={privacy.epsilon:g}, delta={privacy.delta:g}{free}"


def _mechanism_lines(result: Result) -> list[str]:
    lines = []
    for name, column in result.privacy.columns.items():
        std = f", noise std {column.noise_std:.4g}" if column.noise_std is not None else ""
        lines.append(f"{name}: {column.mechanism}{std}")
    return lines


def result_repr(result: Result) -> str:
    """``repr(result)``: the rows with ±, what was charged, each column's mechanism, notes."""
    rows = len(result)
    lines = [f"<dpsql Result: {rows} row{'s' if rows != 1 else ''}, {_charge_line(result)}>",
             text_table(result, SHOWN_ROWS)]
    lines += [f"  {line}" for line in _mechanism_lines(result)]
    lines += [f"  note: {note}" for note in result.privacy.notes]
    return "\n".join(lines)


def html_table(result: Result) -> str:
    """A notebook's view (``_repr_html_``): the table with ±, then the charge, mechanisms, notes."""
    header, rows = _rows(result, SHOWN_ROWS)
    table = result.arrow()
    align = ["right" if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
             else "left" for f in table.schema]
    e = html.escape
    parts = ['<div class="dpsql-result">', "<table>", "<thead><tr>"]
    parts += [f'<th style="text-align:{a}">{e(h)}</th>' for h, a in zip(header, align)]
    parts.append("</tr></thead><tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(f'<td style="text-align:{a}">{e(c)}</td>' for c, a in zip(row, align)) + "</tr>")
    parts.append("</tbody></table>")
    hidden = len(result) - len(rows)
    if hidden > 0:
        parts.append(f"<p>… {hidden} more row{'s' if hidden != 1 else ''} (<code>res.df()</code> has them all)</p>")
    bias = _bias_rows(result, SHOWN_ROWS)
    if bias is not None:
        parts.append(f"<p><small>{e(BIAS_TITLE)}</small></p><table><thead><tr>")
        parts += [f'<th style="text-align:left">{e(h)}</th>' for h in bias[0]]
        parts.append("</tr></thead><tbody>")
        parts += ["<tr>" + "".join(f'<td style="text-align:left">{e(c)}</td>' for c in row) + "</tr>" for row in bias[1]]
        parts.append("</tbody></table>")
    parts.append(f"<p><small>{e(_charge_line(result))}; ± is the 95% half-width of the noise.<br>")
    parts.append("<br>".join(e(line) for line in _mechanism_lines(result)))
    parts += [f"<br>note: {e(note)}" for note in result.privacy.notes]
    parts.append("</small></p></div>")
    return "".join(parts)


def with_intervals(result: Result) -> pa.Table:
    """The answer with a ``<column>_ci95`` column (the 95% half-width) after each noisy
    column; public keys get none."""
    table = result.arrow()
    columns, names = [], []
    for name in table.column_names:
        columns.append(table[name])
        names.append(name)
        protection = result.privacy.columns.get(name)
        if protection is not None and protection.mechanism != "public" and name in result.accuracy:
            cells = [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
                     for v in result.accuracy.cells(name)]
            columns.append(pa.array(cells, pa.float64()))
            names.append(f"{name}_ci95")
    return pa.Table.from_arrays(columns, names=names)


def with_bias_columns(result: Result, table: pa.Table | None = None) -> pa.Table:
    """``table`` (default: the answer) with a ``<column>_bias`` text column (the cell's bias
    estimates, :mod:`dpsql.release.bias`) after each aggregate column, as the Postgres
    front's ``SET dpsql.bias = on`` gives."""
    table = result.arrow() if table is None else table
    bias = result.bias
    if bias is None or not bias.cells:
        return table
    columns, names = [], []
    for name in table.column_names:
        columns.append(table[name])
        names.append(name)
        cells = bias.cells.get(name)
        if cells is not None and any(c is not None for c in cells):
            columns.append(pa.array([None if c is None else c.text() for c in cells], pa.string()))
            names.append(f"{name}_bias")
    return pa.Table.from_arrays(columns, names=names)


# ---------------------------------------------------------------- explain


def _short(value: float) -> str:
    return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.3g}"


def explanation_text(
    epsilon: float,
    delta: float,
    mechanism: str,
    columns: Mapping[str, Mapping[str, Any]],
    composition: Mapping[str, Any] | None = None,
    mechanisms: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """What ``explain`` shows, from plain data: the embedded
    :class:`~dpsql.explain.Explanation`, the client's remote one and ``dpsql query
    --explain`` all print this. Every output column, labelled by its name in the answer
    (the alias), with its mechanism, clipping bounds and expected 95% half-width."""
    lines = [f"would charge epsilon={epsilon:g}, delta={delta:g} ({mechanism} noise); "
             "explain reads no data and charges nothing"]
    if composition is not None:
        before, after, budget = composition["before"], composition["after"], composition["budget"]
        fits = after[0] <= budget[0] * (1 + 1e-12) and after[1] <= budget[1] * (1 + 1e-12)
        lines.append(f"  {composition['accountant']} accountant: spent epsilon={before[0]:g}, delta={before[1]:g} -> "
                     f"epsilon={after[0]:g}, delta={after[1]:g} of ({budget[0]:g}, {budget[1]:g})"
                     + ("" if fits else "  OVER BUDGET"))
    lines.append("per output column (95% half-width of the noise):")
    for name, col in columns.items():
        parts = [str(col.get("mechanism", ""))]
        if col.get("noise_std") is not None:
            parts.append(f"noise std {_short(float(col['noise_std']))}")
        bounds = col.get("bounds")
        if bounds is not None:
            parts.append(f"bounds [{bounds[0]:g}, {bounds[1]:g}]")
        half_width, depends = col.get("half_width"), col.get("depends_on", "")
        if half_width is not None:
            accuracy = "exact (no noise)" if half_width == 0 else f"±{_short(float(half_width))}"
        elif col.get("typical") is not None:
            accuracy = f"±{_short(float(col['typical']))} {col.get('typical_note', '')}".rstrip()
        elif depends == "count":
            accuracy = "± depends on the count: half_width_for(column, count=...)"
        else:
            accuracy = "± depends on the data (an expression over noisy aggregates)"
        lines.append(f"  {name}: {', '.join(p for p in parts if p)}: {accuracy}")
    if mechanisms:
        lines.append("measurements:")
        for key, described in mechanisms.items():
            fields = [f"{k}={_short(v) if isinstance(v, float) else v}" for k, v in described.items()
                      if k not in ("why", "decided") and v is not None]
            lines.append(f"  {key}: {', '.join(fields)}")
    return "\n".join(lines)

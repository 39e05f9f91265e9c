"""Views printed in a terminal (`vitsee show`): Rich renderables, no Textual, nothing printed here. One drawing per
view shape (engine/analyses/contract.py Shape), so an analysis of an existing shape needs none of its own.

Matrix views (layer x layer matrices, token ratios, one token's map) become heatmaps of upper-half blocks: each text
row holds two matrix sub-rows, the upper cell in the foreground colour of '▀' and the lower one in its
background, so a cell one character wide is about square. Small matrices are magnified (a cell k
characters wide and k sub-rows tall); wide ones are pooled (block means). Row 0 is at the top, as in the
terminal app; the PNG figures put layer 0 at the bottom like the paper (see figures.py).

Without colour (NO_COLOR, TERM=dumb, --color none) everything is plain ASCII: one matrix row per text
row in density characters ' .:-=+*#%@', ASCII table borders, no escape codes. Per-head values by block,
curves over depth and the measures' rank correlations are tables of numbers.
"""

from __future__ import annotations

import math
import shutil
import warnings

import numpy as np
from rich import box
from rich.style import Style
from rich.table import Table
from rich.text import Text

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import (
    ASCII_RAMP,
    DEFAULT_LEVELS,
    MISSING,
    ColorMode,
    ColorScale,
    Palette,
    detect_color_mode,
)
from vitsee.output.labels import display_labels, fit_labels
from vitsee.analyses.views import View, best_cell, uniform_text

UPPER_HALF = "\u2580"  # ▀
FULL_BLOCK = "\u2588"  # █
SPARKS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # ▁▂▃▄▅▆▇█
MISSING_COLOR = "grey42"  # a cell not computed yet (NaN)
NONFINITE_COLOR = "red3"  # a cell computed from NaN/Inf inputs (View.nonfinite)
NONFINITE_CHAR = "!"
NONFINITE = MISSING - 1  # its level
MAX_LABEL = 14
MAX_MAGNIFY = 4
TOKEN_MARK = "<>"  # the token's own cell in a spatial map


def render_view(
    view: View,
    color: str | ColorMode = "auto",
    cmap: str = "viridis",
    width: int | None = None,
    selection: tuple[int, int] | None = None,
) -> list:
    """Returns the Rich renderables that show `view` in a terminal `width` columns wide (default: this one).

    `color` is auto (NO_COLOR, COLORTERM and TERM decide), truecolor, 256, 16 or none; `selection` picks the
    token of a spatial view (its row; default the centre token).
    """
    mode = detect_color_mode(override=None if str(color) == "auto" else color)
    width = width or shutil.get_terminal_size((100, 24)).columns
    out: list = [_title(view, mode)]
    out += DRAWINGS[view.shape](view, mode, cmap, width, selection)
    return out + _best_interval(view, mode, selection)


def prints_numbers(view: View) -> bool:
    """Returns whether `render_view` prints the view's numbers as a table (so a pipe needs no CSV after it)."""
    return view.shape in TABLES


def _best_interval(view: View, mode: ColorMode, selection: tuple[int, int] | None) -> list:
    """Returns the line naming the selected (else the best) cell with its interval and p-value, [] without them."""
    hint = view.analysis.no_interval(view)  # a measure without an interval says so, and how to get one
    if view.shape not in BEST_CELL or (view.ci_low is None and view.p_value is None and not hint):
        return []  # a table per head and the ratio curves have no "best" cell to speak of
    cell = selection if selection is not None else best_cell(view)
    if cell is None:
        return []
    r, c = cell
    which = "selected" if selection is not None else "best"
    line = (
        f"{which}: {view.name(view.rows[r])} x {view.name(view.cols[c])}  {view.value_name} {_fmt(view.value(r, c))}"
        f"{view.interval_or_hint(r, c)}"
    )
    caption = view.interval_caption()
    return [Text(line), *([Text(caption, style=_style(mode, "dim"))] if caption else [])]


def _heads_by_layer(view: View, mode: ColorMode, cmap: str, width: int, selection=None) -> list:
    """Returns the heads x layers heatmap, each head labelled with its mean attention distance."""
    distance = np.asarray(view.extra["distance_px"], dtype=float)
    rows = [f"{r} {d:.0f}px" if np.isfinite(d) else r for r, d in zip(view.rows, distance)]
    scale = ColorScale.for_matrix(view.matrix, vmin=view.vmin, vmax=view.vmax, levels=_levels(mode), cmap=cmap)
    plot = Heatmap(view.matrix, rows, view.cols, scale, mode, width)
    where = (
        f"rows: {view.name(view.models[0])} heads with their mean attention distance; "
        f"columns: {view.name(view.models[-1])} layers"
    )
    return [*plot.lines(), plot.legend(view.value_name), *plot.column_key(), Text(where, style=_style(mode, "dim"))]


def _pixel_map(view: View, mode: ColorMode, cmap: str, width: int, selection=None) -> list:
    """Returns the ERF map on a log colour scale (ERFs span decades), row 0 at the top like the image."""
    if view.extra.get("no_field"):  # rounding noise, not a map (analyses/erf.py)
        return [Text(f"{view.params.get('layer')}: {view.extra['no_field']}")]
    vmax = float(view.vmax or 1.0)
    vmin = max(float(view.extra.get("min_positive") or 0.0), vmax * 1e-6)
    values = np.log10(np.where(view.matrix > 0, view.matrix, vmin))
    scale = ColorScale(math.log10(vmin), math.log10(vmax) if vmax > vmin else math.log10(vmin) + 1, _levels(mode), cmap)
    plot = Heatmap(values, view.rows, view.cols, scale, mode, width)
    return [
        *plot.lines(),
        plot.legend("ERF", transform=lambda v: 10**v, note="log colour scale"),
        Text("rows and columns: input pixels", style=_style(mode, "dim")),
    ]


# --- the views --------------------------------------------------------------------------------------


def _title(view: View, mode: ColorMode) -> Text:
    text = Text()
    text.append(view.title, style=_style(mode, "bold"))
    if view.subtitle:
        text.append("\n" + view.subtitle, style=_style(mode, "dim"))
    return text


def _layer_matrix(view: View, mode: ColorMode, cmap: str, width: int, selection=None) -> list:
    scale = ColorScale.for_matrix(view.matrix, vmin=view.vmin, vmax=view.vmax, levels=_levels(mode), cmap=cmap)
    model_a, model_b = (view.models + view.models)[:2] if view.models else ("rows", "cols")
    model_a, model_b = view.name(model_a), view.name(model_b)
    plot = Heatmap(view.matrix, view.rows, view.cols, scale, mode, width, nonfinite=view.nonfinite)
    where = f"rows: {model_a} layers, first at the top; columns: {model_b} layers, first at the left"
    where += view.analysis.caption_notes(view)  # what the analysis adds (a measure's image subset, parameters)
    return [
        *plot.lines(),
        plot.legend(view.value_name),
        *plot.column_key(),
        Text(where, style=_style(mode, "dim")),
        *_nonfinite_lines(view, mode),
    ]


def _token_ratios(view: View, mode: ColorMode, cmap: str, width: int, selection=None) -> list:
    vmin, vmax = view.vmin, view.vmax
    log = vmin is not None and vmax is not None and 0 < vmin < vmax  # ratios span decades, as in the PNG
    if log:  # colour by log10 of the ratio; the legend still reads in ratios
        values = np.log10(np.where(view.matrix > 0, view.matrix, np.nan))
        scale = ColorScale(math.log10(vmin), math.log10(vmax), _levels(mode), cmap)
    else:
        values = view.matrix
        scale = ColorScale.for_matrix(values, vmin=vmin, vmax=vmax, levels=_levels(mode), cmap=cmap)
    # many tokens get pooled to fit, but the CLS column is the point of the figure: it keeps its own
    plot = Heatmap(
        values,
        view.rows,
        view.cols,
        scale,
        mode,
        width,
        keep_first_col=view.cols[:1] == ["CLS"],
        pool_rows=False,
        missing="no finite ratio",
        nonfinite=view.nonfinite,
    )
    legend = plot.legend(
        "||z||/||f(z)||", transform=(lambda v: 10**v) if log else None, note="log colour scale" if log else ""
    )
    return [*plot.lines(), legend, *plot.column_key(), *_skip_curves(view, mode), *_nonfinite_lines(view, mode)]


def _token_maps(view: View, mode: ColorMode, cmap: str, width: int, selection) -> list:
    from vitsee.output.figures import spatial_centre_token

    gh, gw = (int(v) for v in view.extra["grid"])
    token = selection[0] if selection else spatial_centre_token(gh, gw)
    token_map = view.matrix[token].reshape(gh, gw)
    scale = ColorScale.for_matrix(view.matrix, vmin=view.vmin, vmax=view.vmax, levels=_levels(mode), cmap=cmap)
    marks = view.nonfinite[token].reshape(gh, gw) if view.nonfinite is not None else None
    plot = Heatmap(
        token_map,
        [f"r{i}" for i in range(gh)],
        [f"c{j}" for j in range(gw)],
        scale,
        mode,
        width,
        magnify="even",
        mark=divmod(token, gw),
        nonfinite=marks,
    )
    caption = (
        f"{view.rows[token]}: CKA of its representation with the pixels of every input patch "
        f"({view.extra.get('pixels', 'the stored input')}); "
        f"{TOKEN_MARK} marks the token's own cell ({view.cell_text(token, token, 3)})"
    )
    return [
        Text(caption, style=_style(mode, "dim")),
        *plot.lines(),
        *plot.column_key(names=False),
        plot.legend(view.value_name),
        *_nonfinite_lines(view, mode),
    ]


def _heads_by_block(view: View, mode: ColorMode, cmap: str = "", width: int = 0, selection=None) -> list:
    """Returns the block x head table of mean distances (sorted per block) and what they are measured against."""
    std = np.asarray(view.extra["std_px"], dtype=float)
    n_heads = view.matrix.shape[1]
    plus = "+-" if mode is ColorMode.NONE else "\u00b1"
    with_std = n_heads <= 6  # wider tables wrap on an 80-column terminal
    table = _table(mode)
    table.add_column("block")
    for h in range(n_heads):
        table.add_column(f"#{h + 1}", justify="right")
    heads = np.asarray(view.extra.get("heads_per_block", np.full(len(view.rows), n_heads)))
    for b, block in enumerate(view.rows):
        cells = [
            f"{m:.1f}{f' {plus}{s:.1f}' if with_std else ''}" if np.isfinite(m) else _short_nonfinite(view, b, h)
            for h, (m, s) in enumerate(zip(view.matrix[b], std[b]))
        ]
        table.add_row(block, *cells[: heads[b]], *[""] * (n_heads - heads[b]))  # Swin: fewer heads in early stages
    caption = (
        f"mean attention distance (px) of each head, sorted nearest first (#1)"
        f"{f', {plus} std over images' if with_std else ''}; {uniform_text(view)}"
    )
    if view.nonfinite is not None and view.nonfinite.any():
        caption += "; non-finite (k/N): k of the N images give that head a NaN/Inf distance (sorted last)"
    return [table, Text(caption, style=_style(mode, "dim")), *_nonfinite_lines(view, mode)]


def _depth_curves(view: View, mode: ColorMode, cmap: str = "", width: int = 0, selection=None) -> list:
    """Returns the layer x readout accuracy table (best per column starred and bold) and depth sparklines."""
    best = _best_rows(view.matrix)
    table = _table(mode)
    table.add_column("layer")
    for readout in view.cols:
        table.add_column(readout, justify="right")
    for r, layer in enumerate(view.rows):
        cells = []
        for c in range(len(view.cols)):
            value = view.matrix[r, c]
            if view.is_nonfinite(r, c):
                cells.append(Text("skipped  "))
            elif r in best[c]:
                cells.append(Text(f"{_fmt(value)} *", style=_style(mode, "bold")))
            else:
                cells.append(Text(f"{_fmt(value)}  "))
        table.add_row(layer, *cells)
    caption = f"test accuracy; * best layer of each readout; chance {_fmt(view.extra.get('chance'))}"
    n_train, n_test = view.params.get("n_train"), view.params.get("n_test")
    if n_train and n_test:
        caption += f"; {n_train} train / {n_test} test images"
    caption += view.analysis.caption_notes(view)
    lines = [Text(caption, style=_style(mode, "dim")), Text("accuracy vs depth (0 to 1, first layer left):")]
    pad = max(map(len, view.cols))
    for c, readout in enumerate(view.cols):
        lines.append(Text(f"  {readout.ljust(pad)}  {sparkline(view.matrix[:, c], 0.0, 1.0, mode)}"))
    return [table, *lines]


def _measures_agree(view: View, mode: ColorMode, cmap: str = "", width: int = 0, selection=None) -> list:
    """Returns the measures x measures table of rank correlations, then each measure's range and most alike pair."""
    table = _table(mode)
    table.add_column("rank corr.", min_width=len("rank corr."))  # kept whole when ten measures share 80 columns
    for label in view.cols:
        table.add_column(label, justify="right")
    for r, label in enumerate(view.rows):
        table.add_row(label, *[_fmt(v, 2) if r != c else "1" for c, v in enumerate(view.matrix[r])])
    rows, cols = list(view.extra["panel_rows"]), list(view.extra["panel_cols"])
    lines = [Text(f"{view.extra['n_pairs']} layer pairs; each measure's values and the pair it finds most alike:")]
    within = len(set(view.models)) == 1
    for label, panel, up in zip(
        view.rows, np.asarray(view.extra["panels"], dtype=float), view.extra["higher_is_better"]
    ):
        values = panel.copy()
        if within:
            np.fill_diagonal(values, np.nan)  # a layer with itself is alike by construction
        if not np.isfinite(values).any():
            lines.append(Text(f"  {label}: not computed"))
            continue
        r, c = np.unravel_index(np.nanargmax(values) if up else np.nanargmin(values), values.shape)
        lines.append(
            Text(
                f"  {label}: {np.nanmin(values):.3f} .. {np.nanmax(values):.3f}, most alike "
                f"{rows[r]} x {cols[c]} ({values[r, c]:.3f}{'' if up else ', a distance: low is alike'})"
            )
        )
    caption = view.analysis.caption_notes(view).removeprefix("; ")
    return [table, *lines, Text(caption, style=_style(mode, "dim"))]


def _skip_curves(view: View, mode: ColorMode) -> list:
    """Returns the paper's Fig. 7 curves as numbers: per sublayer, the CLS ratio and the spatial tokens' mean."""
    cls = np.asarray(view.extra.get("cls", []), dtype=float)
    spatial = np.asarray(view.extra.get("spatial_mean", []), dtype=float)
    table = _table(mode)
    table.add_column("sublayer" if len(view.cols) > 1 else "block")
    has_cls = bool(cls.size) and np.isfinite(cls).any()
    if has_cls:
        table.add_column("CLS", justify="right")
    table.add_column("spatial (mean)" if len(view.cols) > 1 else "ratio", justify="right")
    flagged = view.nonfinite is not None and view.nonfinite.any()
    for r, row in enumerate(view.rows):
        cells = [_fmt(cls[r], 2, flagged)] if has_cls else []
        table.add_row(row, *cells, _fmt(spatial[r], 2, flagged) if r < spatial.size else "-")
    caption = "ratio > 1: the skip connection carries more than the sublayer adds"
    return [table, Text(caption, style=_style(mode, "dim"))]


def _model_matrix(view: View, mode: ColorMode, cmap: str, width: int, selection=None) -> list:
    """Returns the models x models heatmap in the clustering order, each row with its family, the numbers as a
    table where they fit, and each model's most alike other model with its interval."""
    order = [int(i) for i in view.extra["order"]]
    families = list(view.extra["families"])
    names = display_labels(view.rows, view.names, 24)
    shown = view.matrix[np.ix_(order, order)]
    scale = ColorScale.for_matrix(shown, vmin=view.vmin, vmax=view.vmax, levels=_levels(mode), cmap=cmap)
    rows = display_labels(view.rows, view.names, MAX_LABEL)  # the gutter's width: shortened alike rather than cut
    plot = Heatmap(
        shown,
        [rows[i] for i in order],
        [f"{names[i]} [{families[i]}]" for i in order],
        scale,
        mode,
        width,
        nonfinite=view.nonfinite[np.ix_(order, order)] if view.nonfinite is not None else None,
    )
    dim = _style(mode, "dim")
    out = [
        *plot.lines(),
        plot.legend(view.value_name),
        *plot.column_key(),
        Text(
            "rows and columns: the models in the order of a hierarchical clustering of the matrix (average "
            "linkage), [family]",
            style=dim,
        ),
    ]
    gutter = max(len(names[i]) + len(families[i]) for i in order) + 4
    if gutter + 7 * len(order) <= width:  # the numbers, in the same order
        table = _table(mode)
        table.add_column("model")
        table.add_column("family")
        for k in range(len(order)):
            table.add_column(str(k), justify="right")
        for i in order:
            table.add_row(names[i], families[i], *[_fmt(view.matrix[i, j]) for j in order])
        out.append(table)
    calibrated = np.asarray(view.extra.get("calibrated", np.full(view.matrix.shape, np.nan)), dtype=float)
    has_null = bool(np.isfinite(calibrated).any())
    if has_null and gutter + 7 * len(order) <= width:  # the chance-corrected numbers, in the same order
        table = _table(mode)
        table.add_column("calibrated")
        table.add_column("family")
        for k in range(len(order)):
            table.add_column(str(k), justify="right")
        for i in order:
            table.add_row(names[i], families[i], *[_fmt(calibrated[i, j]) for j in order])
        out.append(table)
    best = np.nanargmax if _higher_is_better(view) else np.nanargmin
    lines = []
    for i in order:
        others = np.array([view.matrix[i, j] if j != i else np.nan for j in range(len(order))], dtype=float)
        if np.isfinite(others).any():
            j = int(best(others))
            lines.append(
                f"  {names[i]}: {names[j]}  {_fmt(view.matrix[i, j])}{view.interval_text(i, j)}{_null_text(view, i, j)}"
            )
    if lines:
        out += [Text("most alike other model of each:"), *map(Text, lines)]
    caption = view.interval_caption() or f"intervals: {view.extra.get('interval', 'none')}"
    null = f"null: {view.extra['null']}" + (f"; {view.extra['calibration']}" if has_null else "")
    return out + [Text(caption, style=dim), Text(null, style=dim), *_nonfinite_lines(view, mode)]


def _null_text(view: View, i: int, j: int) -> str:
    """Returns '  calibrated 0.412 (null 0.531, 95% 0.602) p<0.01' for a pair of a zoo with a null, '' without."""
    from vitsee.stats import significance_label

    extra = view.extra
    if "calibrated" not in extra or not np.isfinite(np.asarray(extra["calibrated"], dtype=float)[i, j]):
        return ""
    p = float(np.asarray(extra["p_value"], dtype=float)[i, j])
    return (
        f"  calibrated {_fmt(extra['calibrated'][i, j])} (null {_fmt(extra['null_mean'][i, j])}, 95% "
        f"{_fmt(extra['null_q95'][i, j])}) {significance_label(p, int(extra.get('null_permutations') or 0))}"
    )


def _score_table(view: View, mode: ColorMode, cmap: str = "", width: int = 0, selection=None) -> list:
    """Returns the rows x scores table, each score with its interval and the best row of each column starred
    (higher is better in every column), then the view's note and what the intervals are. Where the scores side by
    side are wider than the terminal, one line per row and score."""
    best = _best_rows(view.matrix)

    def cell(r: int, c: int) -> Text:
        text = _fmt_g(view.matrix[r, c])
        if view.ci_low is not None and np.isfinite(view.ci_low[r, c]):
            text += f" [{_fmt_g(view.ci_low[r, c])}, {_fmt_g(view.ci_high[r, c])}]"
        starred = r in best[c]
        return Text(text + (" *" if starred else "  "), style=_style(mode, "bold") if starred else "")

    cells = [[cell(r, c) for c in range(len(view.cols))] for r in range(len(view.rows))]
    label_width = max(map(len, view.rows))
    widths = [max(len(cells[r][c]) for r in range(len(view.rows))) for c in range(len(view.cols))]
    table = _table(mode)
    if label_width + sum(widths) + 3 * len(widths) + 4 <= (width or 100):
        table.add_column("")
        for col in view.cols:
            table.add_column(col, justify="right")
        for label, row in zip(view.rows, cells):
            table.add_row(label, *row)
    else:  # too wide side by side: a line per row and score
        table.add_column("")
        table.add_column("score")
        table.add_column("value", justify="right")
        for label, row in zip(view.rows, cells):
            for c, col in enumerate(view.cols):
                table.add_row(label if c == 0 else "", col, row[c], end_section=c == len(view.cols) - 1)
    dim = _style(mode, "dim")
    lines = [table, Text("* the best of each score", style=dim)]
    note = view.extra.get("note")
    if note:
        lines.append(Text(str(note), style=dim))
    caption = view.interval_caption()
    return lines + ([Text(caption, style=dim)] if caption else [])


def _fmt_g(value) -> str:
    """Returns a score with 3 significant digits (at most 2 decimals past the point), '-' for none."""
    if value is None or not np.isfinite(value):
        return "-"
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def _curves(view: View, mode: ColorMode, cmap: str = "", width: int = 0, selection=None) -> list:
    """Returns the values against the count as a table (each with its interval and the interval's width), a
    sparkline per series and the view's note."""
    x_label = str(view.extra.get("x_label", "x"))
    table = _table(mode)
    table.add_column(x_label)
    for col in view.cols:
        table.add_column(col, justify="right")
        if view.ci_low is not None:
            table.add_column("width", justify="right")
    for r, row in enumerate(view.rows):
        cells = []
        for c in range(len(view.cols)):
            cells.append(_fmt(view.matrix[r, c], 4) + view.interval_text(r, c).replace(" [", "  ["))
            if view.ci_low is not None:
                cells.append(_fmt(view.ci_high[r, c] - view.ci_low[r, c], 4))
        table.add_row(row, *cells)
    finite = view.matrix[np.isfinite(view.matrix)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    pad = max(map(len, view.cols))
    dim = _style(mode, "dim")
    lines = [table, Text(f"{view.value_name} against {x_label} ({low:.3f} .. {high:.3f}):")]
    for c, name in enumerate(view.cols):
        lines.append(Text(f"  {name.ljust(pad)}  {sparkline(view.matrix[:, c], low, max(high, low + 1e-12), mode)}"))
    note = view.extra.get("note")
    if note:
        lines.append(Text(str(note), style=dim))
    caption = view.interval_caption()
    return lines + ([Text(caption, style=dim)] if caption else [])


def _higher_is_better(view: View) -> bool:
    """Returns whether a larger value of a view of another analysis's numbers (the zoo's measure) is more alike."""
    from vitsee.analyses import REGISTRY

    measure = REGISTRY.get(str(view.extra.get("measure", "")))
    return measure.higher_is_better if measure is not None else view.analysis.higher_is_better


# the drawing of each view shape; the tables print their numbers; the best (or selected) cell is reported for these
DRAWINGS = {
    Shape.LAYER_MATRIX: _layer_matrix,
    Shape.HEADS_BY_BLOCK: _heads_by_block,
    Shape.DEPTH_CURVES: _depth_curves,
    Shape.TOKEN_RATIOS: _token_ratios,
    Shape.TOKEN_MAPS: _token_maps,
    Shape.HEADS_BY_LAYER: _heads_by_layer,
    Shape.PIXEL_MAP: _pixel_map,
    Shape.MODEL_MATRIX: _model_matrix,
    Shape.MEASURES_AGREE: _measures_agree,
    Shape.SCORE_TABLE: _score_table,
    Shape.CURVES: _curves,
}
TABLES = frozenset({Shape.HEADS_BY_BLOCK, Shape.DEPTH_CURVES, Shape.MEASURES_AGREE, Shape.SCORE_TABLE, Shape.CURVES})
BEST_CELL = frozenset({Shape.LAYER_MATRIX, Shape.DEPTH_CURVES})


# --- the heatmap ------------------------------------------------------------------------------------


class Heatmap:
    """A matrix laid out for a terminal `width` wide: pooled or magnified, coloured by `scale` in `mode`.

    `lines()` are the grid rows (label gutter + cells), `legend()` the colour ramp with its range,
    `column_key()` which column is which. `mark` (row, col) draws TOKEN_MARK on one cell (needs whole cells
    per line: magnify=2 in colour, any in ASCII).
    """

    def __init__(
        self,
        matrix: np.ndarray,
        rows: list[str],
        cols: list[str],
        scale: ColorScale,
        mode: ColorMode,
        width: int,
        magnify: str | None = None,
        keep_first_col: bool = False,
        pool_rows: bool = True,
        mark: tuple[int, int] | None = None,
        missing: str = "not computed",
        nonfinite: np.ndarray | None = None,
    ):
        self.mode, self.scale, self.mark, self.missing = mode, scale, mark, missing
        self.palette: Palette = scale.palette(mode)
        self.ascii = mode is ColorMode.NONE
        labels = fit_labels(rows, MAX_LABEL)
        self.gutter = max(map(len, labels)) + 1
        room = max(8, width - self.gutter - 1)
        chars_per_cell = 2 if self.ascii else 1  # an ASCII cell is one line tall: two characters keep it square
        n_rows, n_cols = matrix.shape
        pool = max(1, math.ceil(n_cols * chars_per_cell / room))
        if pool > 1 and self.ascii:  # pool less by giving up square ASCII cells first
            chars_per_cell, pool = 1, max(1, math.ceil(n_cols / room))
        self.pool, self.pools_rows = pool, pool_rows
        self.keep_first = keep_first_col and pool > 1
        self.matrix = _pool(matrix, pool if pool_rows else 1, pool, self.keep_first)
        self.row_labels = labels[:: pool if pool_rows else 1]
        self.cols = cols
        self.col_starts = ([0] if self.keep_first else []) + list(range(1 if self.keep_first else 0, n_cols, pool))
        # magnify small matrices in colour (an ASCII cell stays one line): a cell k characters wide and k
        # sub-rows tall, at most ~32 lines in all; `magnify="even"` keeps whole cells on each line
        fit = room // (self.matrix.shape[1] * chars_per_cell)
        k = 1 if self.ascii or pool > 1 else max(1, min(MAX_MAGNIFY, fit, 64 // self.matrix.shape[0]))
        if magnify == "even" and not self.ascii:
            k = max(2, k - k % 2)
        self.k = k
        self.cell_w = k * chars_per_cell
        self.levels = scale.quantize(self.matrix)
        if nonfinite is not None and nonfinite.any():  # a shown cell with nothing finite, and NaN/Inf behind it
            flagged = _pool(np.asarray(nonfinite, dtype=float), pool if pool_rows else 1, pool, self.keep_first) > 0
            self.levels[flagged & np.isnan(self.matrix)] = NONFINITE

    # the grid

    def lines(self) -> list[Text]:
        """Returns the grid, one Text per terminal row."""
        return self._ascii_lines() if self.ascii else self._block_lines()

    def _block_lines(self) -> list[Text]:
        # every matrix row spans k sub-rows; each text row shows two of them: y (upper half) and y + 1 (lower)
        sub_rows = np.repeat(np.arange(self.matrix.shape[0]), self.k)
        out = []
        for y in range(0, len(sub_rows), 2):
            upper = sub_rows[y]
            lower = sub_rows[y + 1] if y + 1 < len(sub_rows) else None
            # label the row that starts on this line (the upper one if both do)
            starts = [s for s in (y, y + 1) if s < len(sub_rows) and (s == 0 or sub_rows[s - 1] != sub_rows[s])]
            cells = []
            for c in range(self.matrix.shape[1]):
                top = self._color(self.levels[upper, c])
                bottom = self._color(self.levels[lower, c]) if lower is not None else None
                if self.mark == (upper, c) and lower == upper and y in starts:  # once, on the cell's first line
                    fg = "black" if self.palette.is_light(max(int(self.levels[upper, c]), 0)) else "white"
                    cells.append(
                        (TOKEN_MARK.center(self.cell_w)[: self.cell_w], Style(color=fg, bgcolor=top, bold=True))
                    )
                else:
                    cells.append((UPPER_HALF * self.cell_w, Style(color=top, bgcolor=bottom)))
            out.append(_line(self._label(self.row_labels[sub_rows[starts[0]]] if starts else ""), cells))
        return out

    def _ascii_lines(self) -> list[Text]:
        out = []
        for r in range(self.matrix.shape[0]):
            cells = []
            for c in range(self.matrix.shape[1]):
                level = int(self.levels[r, c])
                if self.mark == (r, c):
                    cells.append(TOKEN_MARK.center(self.cell_w)[: self.cell_w])
                else:
                    char = {MISSING: self.palette.missing_char, NONFINITE: NONFINITE_CHAR}.get(level)
                    cells.append((char or self.palette.chars[level]) * self.cell_w)
            out.append(Text(self._label(self.row_labels[r]) + "".join(cells)))
        return out

    def _label(self, label: str) -> str:
        return label.rjust(self.gutter - 1) + " "

    def _color(self, level) -> str:
        return {MISSING: MISSING_COLOR, NONFINITE: NONFINITE_COLOR}.get(int(level)) or self.palette.colors[int(level)]

    # what the grid means

    def legend(self, value_name: str, transform=None, note: str = "") -> Text:
        """Returns 'vmin <ramp> vmax  value_name' plus how the grid was scaled and what '?' means."""
        show = transform or (lambda v: v)
        text = Text(" " * self.gutter + f"{show(self.scale.vmin):.3g} ")
        if self.ascii:
            text.append("[" + "".join(self.palette.chars) + "]")
        else:
            for color in self.palette.colors:
                text.append(FULL_BLOCK, Style(color=color))
        notes = [n for n in (note, self._scaling(), self._missing()) if n]
        text.append(f" {show(self.scale.vmax):.3g}  {value_name}" + (f"  ({'; '.join(notes)})" if notes else ""))
        return text

    def _scaling(self) -> str:
        if self.pool > 1:
            pooled = f"cells pooled {self.pool}x{self.pool}" if self.pools_rows else f"columns pooled by {self.pool}"
            return pooled + (" after the first" if self.keep_first else "")
        if not self.ascii and self.k == 1 and self.matrix.shape[0] > 1:
            return "2 rows per line: the labelled row is the upper half"
        return ""

    def _missing(self) -> str:
        notes = []
        if (self.levels == MISSING).any():
            notes.append(f"{self.palette.missing_char} = {self.missing}" if self.ascii else f"grey = {self.missing}")
        if (self.levels == NONFINITE).any():
            notes.append(
                f"{NONFINITE_CHAR if self.ascii else 'red'} = no value: NaN/Inf inputs, or undefined (see below)"
            )
        return "; ".join(notes)

    def column_key(self, names: bool = True) -> list[Text]:
        """Returns a ruler of column numbers under the grid and (with `names`) which column each number is."""
        ruler = [" "] * (self.matrix.shape[1] * self.cell_w)
        step = max(1, math.ceil(4 / self.cell_w))  # numbers of up to 3 digits and a space
        for shown in range(0, self.matrix.shape[1], step):
            number = str(self.col_starts[shown])
            x = shown * self.cell_w
            if x + len(number) <= len(ruler) and all(ch == " " for ch in ruler[max(0, x - 1) : x + len(number)]):
                ruler[x : x + len(number)] = number
        key = ", ".join(f"{i} {name}" for i, name in enumerate(self.cols))
        if len(self.cols) > 40:
            key = f"0 {self.cols[0]}, 1 {self.cols[1]}, ..., {len(self.cols) - 1} {self.cols[-1]}"
        ruler_line = Text(" " * self.gutter + "".join(ruler).rstrip())
        return [ruler_line, Text("columns: " + key, style=_style(self.mode, "dim"))] if names else [ruler_line]


def _line(label: str, cells: list[tuple[str, Style]]) -> Text:
    """Returns label + cells as one Text, neighbouring cells that look the same merged into one run."""
    line = Text(label)
    run, run_style = "", None
    for chars, style in cells:
        if style == run_style:
            run += chars
            continue
        if run:
            line.append(run, run_style)
        run, run_style = chars, style
    if run:
        line.append(run, run_style)
    return line


def _pool(matrix: np.ndarray, pool_r: int, pool_c: int, keep_first_col: bool) -> np.ndarray:
    """Returns block means (pool_r x pool_c; NaN ignored) of the matrix, column 0 left alone if asked."""
    if keep_first_col and pool_c > 1:
        return np.hstack([_pool(matrix[:, :1], pool_r, 1, False), _pool(matrix[:, 1:], pool_r, pool_c, False)])
    rows, cols = matrix.shape
    shown_r, shown_c = -(-rows // pool_r), -(-cols // pool_c)
    padded = np.full((shown_r * pool_r, shown_c * pool_c), np.nan)
    padded[:rows, :cols] = matrix
    with warnings.catch_warnings():  # a block with no computed cell stays NaN
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return np.nanmean(padded.reshape(shown_r, pool_r, shown_c, pool_c), axis=(1, 3))


# --- pieces -----------------------------------------------------------------------------------------


def sparkline(values: np.ndarray, vmin: float, vmax: float, mode: ColorMode) -> str:
    """Returns one character per value, taller for larger ('▁'..'█'; the ASCII ramp without colour; ' ' for NaN)."""
    ramp = ASCII_RAMP[1:] if mode is ColorMode.NONE else SPARKS
    out = []
    for v in np.asarray(values, dtype=float):
        if not np.isfinite(v):
            out.append(" ")
            continue
        frac = min(1.0, max(0.0, (v - vmin) / (vmax - vmin) if vmax > vmin else 0.0))
        out.append(ramp[min(len(ramp) - 1, int(frac * len(ramp)))])
    return "".join(out)


def _best_rows(matrix: np.ndarray) -> list[set[int]]:
    """Returns, per column, the rows that hold its largest finite value (all of them on a tie)."""
    best = []
    for column in matrix.T:
        finite = np.isfinite(column)
        best.append(set(np.flatnonzero(finite & (column == np.max(column[finite])))) if finite.any() else set())
    return best


def _table(mode: ColorMode) -> Table:
    if mode is ColorMode.NONE:  # plain ASCII and no styles: what a dumb terminal or a log file can show
        return Table(box=box.ASCII, header_style=Style.null(), pad_edge=False)
    return Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)


def _style(mode: ColorMode, style: str) -> Style:
    return Style.null() if mode is ColorMode.NONE else Style.parse(style)


def _levels(mode: ColorMode) -> int:
    # without colour one level per density character, so each character means one range
    return len(ASCII_RAMP) if mode is ColorMode.NONE else DEFAULT_LEVELS


def _fmt(value, digits: int = 3, nonfinite: bool = False) -> str:
    """Returns the value with `digits` decimals; '-' for none, 'non-finite' for NaN/Inf where inputs were."""
    if value is not None and np.isfinite(value):
        return f"{value:.{digits}f}"
    return "non-finite" if nonfinite and value is not None else "-"


def _short_nonfinite(view: View, row: int, col: int) -> str:
    """Returns a table cell for a non-finite value: 'non-finite (3/48)', or 'non-finite'."""
    count = int(view.nonfinite_images[row, col]) if view.nonfinite_images is not None else -1
    return f"non-finite ({count}/{view.n_images})" if count > 0 else "non-finite"


def _nonfinite_lines(view: View, mode: ColorMode) -> list:
    """Returns the line that says which cells are non-finite, or nothing."""
    note = view.nonfinite_note()
    return [Text(note, style=_style(mode, "yellow"))] if note else []

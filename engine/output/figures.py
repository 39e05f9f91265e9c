"""Figures of views, fit for a paper: matplotlib's object API on an Agg canvas (no pyplot, no global state).

One figure per view shape (engine/analyses/contract.py Shape), drawn from the view's numbers only (nothing is
recomputed), with the view's colour range and the colormap asked for; an analysis names its shape, so a new one of
an existing shape is drawn here without code of its own:

- layer x layer matrix (CKA, paper Fig. 1, 2): the heatmap, a colour bar labelled with the value's name.
- per-head values by block (attention, Fig. 3): per block, every head's value as a dot with its spread over
  images, and the reference (uniform attention) as a dashed line; beside it, the histogram of one block.
- curves over depth (probes, Fig. 11, 13): one line per series, chance dotted, the best layer of each starred;
  beside it, the per-token map of one layer when the view has one.
- sublayer x token values (skip, Fig. 7): the heatmap on a log colour scale, and the CLS vs spatial-token curves.
- a map per token (spatial, Fig. 9, 10): one token's map over the input patches with the token's own cell
  outlined, and a few other tokens' maps for comparison.
- per-head values x layers (heads, Fig. 5): value against each head's distance, beside the heatmap.
- a map over the input (ERF, Fig. 6): a few depths' maps side by side on one log scale.
- measures side by side ("do the measures agree?"): each layer x layer measure's matrix of one pair of models with
  the same axes, and their rank correlations as an annotated matrix.

Orientation: heatmaps whose rows are layers (layer matrices, token ratios, heads) put row 0 at the bottom left, as
the paper does, so depth grows up and to the right. The terminal (`vitsee show`, the TUI) draws row 0 at the top
because text is read top-down; both name every layer on the axis, and the figure's caption says which way up it
is (ORIENTATION). Spatial maps are pictures of the input: grid row 0 is at the top everywhere.

Every text lies inside the figure, whatever the names: titles, subtitles and captions are wrapped to the
figure's width as the renderer measures them, and axes titles and axis labels longer than their axes are
wrapped once the layout has placed the axes (`_fit_axes_texts`).

A selection (row, col) is a cell of `view.matrix`: it is outlined (gid "selection") and its value written
beside it; for attention the row picks the block of the histogram, for probes the layer of the token map,
for spatial the token whose map is drawn.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap, LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import check_colormap
from vitsee.errors import VitseeError
from vitsee.analyses.views import View

TITLE_PT, SUBTITLE_PT, TICK_PT = 11, 8, 7
CAPTION_PT = 7  # what the intervals are, under the figure
MARK = "#e8112d"  # the selection: a red that stands out on viridis, magma and cividis alike
BAD = "0.85"  # cells not computed (NaN)
NONFINITE = "#b2182b"  # cells computed from NaN/Inf inputs (View.nonfinite): drawn over the grey
LINE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")  # readouts: categorical, unlike the heatmaps
MARGIN_PT = 8  # kept clear at the left and right edges by the figure's own lines of text
PNG_DPI = 150  # what `vitsee export` draws at, and what the texts are measured at
NOTEBOOK_DPI = 100  # what a notebook shows a figure at
ORIENTATION = "layer 0 at the bottom, as in the paper; the app draws it at the top"
WORD_BREAKS = "_.@:-/,;"  # where a name too long for a line is cut
TICK_ROOM_PT = TICK_PT * 1.45  # along its axis, a layer's tick label needs this much room to stay apart
MAX_LEGEND_BLOCKS = 12  # more blocks than this: a colour bar says which colour is which block
# the layer labels each axis was given (_layer_ticks), thinned again once the layout has sized the axes
_LAYER_LABELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ShownFigure(Figure):
    """A Figure that a notebook shows as itself: the last line of a cell, `result.plot()`, draws the figure in a
    fresh kernel. Jupyter shows a matplotlib Figure only once pyplot or `%matplotlib inline` has registered its
    display; these figures are made without pyplot (no global state), so they say how to show themselves."""

    def _repr_png_(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=NOTEBOOK_DPI)
        return buffer.getvalue()


def figure_for(view: View, selection: tuple[int, int] | None = None, cmap: str = "viridis") -> Figure:
    """Returns the figure of `view` (an Agg-backed Figure), with `selection` (row, col) marked if given."""
    selection = _check_selection(view, selection)
    fig = DRAWINGS[view.shape](view, selection, _colormap(cmap))
    note = view.nonfinite_note() if view.shape not in MARKS_OWN_NONFINITE else ""
    if note:  # under the axes: which cells are non-finite, in the figure itself
        lines = wrap_to_width(fig, note, TICK_PT)
        fig.text(
            MARGIN_PT / 72 / fig.get_figwidth(),
            0.005,
            "\n".join(lines),
            fontsize=TICK_PT,
            color=NONFINITE,
            ha="left",
            va="bottom",
            gid="nonfinite-note",
        )
        engine = fig.get_layout_engine()
        left, bottom, width, height = engine.get()["rect"]
        room = (len(lines) * TICK_PT * 1.3 + 4) / (fig.get_figheight() * 72)
        engine.set(rect=(left, bottom + room, width, height - room))
    _fit_axes_texts(fig)
    return fig


def save_png(
    view: View, path: str | Path, selection: tuple[int, int] | None = None, cmap: str = "viridis", dpi: int = PNG_DPI
) -> Path:
    """Returns the path of the PNG of `view` written there (see `figure_for`)."""
    path = Path(path)
    fig = figure_for(view, selection=selection, cmap=cmap)
    fig.savefig(path, dpi=dpi, metadata={"Software": "vitsee", "Title": view.title})
    return path


# --- the figures, one per shape -------------------------------------------------------------------------------


def _layer_matrix(view: View, selection, cmap: Colormap) -> Figure:
    """Returns the CKA heatmap: rows = model A's layers (up from the bottom), cols = model B's (rightwards)."""
    n_rows, n_cols = view.matrix.shape
    fig = _new_figure(view, (6.6, 6.0))
    ax = fig.add_subplot(label="heatmap")
    vmin, vmax = _value_range(view)
    image = ax.imshow(
        view.matrix,
        origin="lower",
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        interpolation="nearest",
        aspect="equal" if n_rows == n_cols else "auto",
    )
    _layer_ticks(ax.yaxis, view.rows, room_in=4.6)
    _layer_ticks(ax.xaxis, view.cols, room_in=4.6, rotate=True)
    model_a, model_b = (view.models + view.models)[:2] if view.models else ("", "")
    ax.set_ylabel(f"{view.name(model_a)} layer")
    ax.set_xlabel(f"{view.name(model_b)} layer")
    fig.colorbar(image, ax=ax, label=view.value_name, shrink=0.85)
    _overlay_nonfinite(ax, view.nonfinite, origin="lower", aspect="equal" if n_rows == n_cols else "auto")
    weak = view.not_significant()
    if weak is not None:  # hatch, not colour: the cell's value stays readable under the hatching
        for r, c in zip(*np.nonzero(weak)):
            ax.add_patch(
                Rectangle(
                    (c - 0.5, r - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.85", lw=0, gid="not-significant"
                )
            )
    if selection:
        r, c = selection
        _mark_cell(
            ax,
            r,
            c,
            f"{view.rows[r]} x {view.cols[c]}\n{view.value_name} {view.cell_text(r, c, 3)}{view.interval_text(r, c)}",
            toward=(n_cols / 2 - c, n_rows / 2 - r),
            cell_pt=330 / max(n_rows, n_cols),
        )
    notes = [
        f"hatched: {view.significance_words()}" if weak is not None and weak.any() else "",
        view.analysis.caption_notes(view).removeprefix("; "),
    ]  # a measure's image subset and parameters
    _caption(fig, view, "; ".join(n for n in notes if n), orientation=True)
    return fig


def _caption(fig: Figure, view: View, note: str = "", orientation: bool = False) -> None:
    """Writes under the figure which way up its layers are (heatmaps of layers), what its intervals and
    p-values are, and `note`; nothing when there is nothing to say."""
    text = "; ".join(t for t in (ORIENTATION if orientation else "", view.interval_caption(), note) if t)
    if text:
        caption = fig.supxlabel("\n".join(wrap_to_width(fig, text, CAPTION_PT)), fontsize=CAPTION_PT, color="0.3")
        caption.set_gid("caption")


def _heads_by_block(view: View, selection, cmap: Colormap) -> Figure:
    """Returns per-block head distances (dots, std bars, uniform line) and one block's histogram."""
    mean = view.matrix
    uniform = float(view.extra["uniform_px"])
    n_blocks, n_heads = mean.shape
    vmin, vmax = _value_range(view)
    fig = _new_figure(view, (9.0, 4.6))
    grid = fig.add_gridspec(1, 2, width_ratios=[2.0, 1.0])
    ax = fig.add_subplot(grid[0], label="distances")
    hist = fig.add_subplot(grid[1], label="histogram")

    # heads of a block sit side by side (sorted, nearest first) so their error bars do not hide each other
    spread = np.linspace(-0.28, 0.28, n_heads) if n_heads > 1 else np.zeros(1)
    x = np.arange(n_blocks)[:, None] + spread[None, :]
    _head_dots(ax, view, x, cmap, (vmin, vmax))
    uniform = _uniform_lines(ax, view, uniform, selection)
    _block_axes(ax, view, x, (vmin, vmax))

    block = selection[0] if selection else 0  # the first block mixes local and global heads (paper Fig. 3)
    ax.axvspan(block - 0.45, block + 0.45, color="0.93", zorder=0)
    if selection:
        _mark_head(ax, view, x, selection, vmax)
    _block_histogram(hist, view, block, uniform, cmap)
    _caption(fig, view)
    return fig


def _head_dots(ax, view: View, x: np.ndarray, cmap: Colormap, limits: tuple[float, float]) -> None:
    """Draws each head's mean distance at `x` (a dot coloured by it), its std over images (grey bars) and, where the
    view has them, the intervals of the means (dark whiskers)."""
    mean, std = view.matrix, np.asarray(view.extra["std_px"], dtype=float)
    spread_bars = ax.errorbar(
        x.ravel(),
        mean.ravel(),
        yerr=std.ravel(),
        fmt="none",
        ecolor="0.65",
        elinewidth=0.8,
        zorder=1,
        label="std over images",
    )
    spread_bars.lines[2][0].set_gid("spread")
    if view.ci_low is not None:  # whiskers: the interval of each head's mean, inside the spread of single images
        low, high = np.asarray(view.ci_low, dtype=float), np.asarray(view.ci_high, dtype=float)
        whiskers = ax.errorbar(
            x.ravel(),
            mean.ravel(),
            yerr=[(mean - low).ravel(), (high - mean).ravel()],
            fmt="none",
            ecolor="0.1",
            elinewidth=1.1,
            capsize=2.0,
            zorder=1.5,
            label=f"{view.ci_level:.0%} interval of the mean",
        )
        whiskers.lines[2][0].set_gid("interval")
    ax.scatter(
        x.ravel(),
        mean.ravel(),
        c=mean.ravel(),
        cmap=cmap,
        vmin=limits[0],
        vmax=limits[1],
        s=22,
        edgecolors="0.15",
        linewidths=0.5,
        zorder=2,
        label="head (mean over images)",
        gid="heads",
    )


def _uniform_lines(ax, view: View, uniform: float, selection) -> float:
    """Returns the distance of uniform attention the histogram marks (the selected block's, in a Swin), having drawn
    it on `ax`: one dashed line, or one per block where blocks' windows differ."""
    n_blocks = view.matrix.shape[0]
    per_block = np.asarray(view.extra.get("uniform_px_per_block", np.full(n_blocks, uniform)), dtype=float)
    if np.allclose(per_block, uniform):
        ax.axhline(uniform, ls="--", color="0.25", lw=1, label=f"uniform attention ({uniform:.1f} px)")
    else:  # Swin: uniform attention inside a window of each block's stage
        ax.hlines(
            per_block,
            np.arange(n_blocks) - 0.45,
            np.arange(n_blocks) + 0.45,
            ls="--",
            color="0.25",
            lw=1,
            label="uniform attention in a window",
        )
        uniform = float(per_block[selection[0] if selection else 0])
    return uniform


def _block_axes(ax, view: View, x: np.ndarray, limits: tuple[float, float]) -> None:
    """Draws a cross at the top for each head without a finite distance, then the blocks' ticks, the limits, the
    labels and the legend of the distances' axes."""
    n_blocks = view.matrix.shape[0]
    vmin, vmax = limits
    if view.nonfinite is not None and view.nonfinite.any():  # no distance to plot: a cross at the top instead
        rows, cols = np.nonzero(view.nonfinite)
        ax.scatter(
            x[rows, cols],
            np.full(len(rows), vmax),
            marker="x",
            color=NONFINITE,
            s=30,
            clip_on=False,
            zorder=3,
            label="head with a NaN/Inf distance",
            gid="nonfinite",
        )
    ax.set_xticks(
        np.arange(n_blocks),
        labels=view.rows,
        rotation=45 if n_blocks > 8 else 0,
        ha="right" if n_blocks > 8 else "center",
        fontsize=TICK_PT,
    )
    ax.set_xlim(-0.6, n_blocks - 0.4)
    ax.set_ylim(vmin, vmax)
    ax.set_xlabel("block")
    ax.set_ylabel("mean attention distance (px)")
    ax.legend(fontsize=TICK_PT, loc="upper left")


def _mark_head(ax, view: View, x: np.ndarray, selection: tuple[int, int], vmax: float) -> None:
    """Draws a ring round the selected head and writes its block, rank and distance (mean ± std) beside it."""
    mean, std = view.matrix, np.asarray(view.extra["std_px"], dtype=float)
    n_blocks, n_heads = mean.shape
    r, c = selection
    _ring(ax, x[r, c], mean[r, c], size=110, zorder=3)
    value = f"{_fmt(mean[r, c], 1)} ± {_fmt(std[r, c], 1)} px" if np.isfinite(mean[r, c]) else view.cell_text(r, c)
    ax.annotate(
        f"{view.rows[r]}, head {c + 1} of {n_heads} (sorted)\n{value}",
        xy=(x[r, c], mean[r, c] if np.isfinite(mean[r, c]) else vmax),
        xytext=(14 if r < n_blocks / 2 else -14, 14),
        textcoords="offset points",
        ha="left" if r < n_blocks / 2 else "right",
        fontsize=TICK_PT,
        bbox=_BOX,
        arrowprops={"arrowstyle": "-", "color": MARK},
    )


def _block_histogram(hist, view: View, block: int, uniform: float, cmap: Colormap) -> None:
    """Draws the histogram of one block's distances over heads x images on `hist`, uniform attention dashed, titled
    with the block and how many NaN/Inf distances it leaves out."""
    counts, edges = np.asarray(view.extra["hist_counts"]), np.asarray(view.extra["hist_edges"], dtype=float)
    n_heads = view.matrix.shape[1]
    hist.stairs(counts[block], edges, fill=True, color=cmap(0.35), alpha=0.85)
    hist.axvline(uniform, ls="--", color="0.25", lw=1)
    hist.set_xlim(edges[0], edges[-1])
    left_out = view.n_images * n_heads - int(counts[block].sum()) if view.n_images else 0
    hist.set_title(
        f"{view.rows[block]}: heads x images" + (f"\n({left_out} NaN/Inf left out)" if left_out > 0 else ""), fontsize=9
    )
    hist.set_xlabel("mean attention distance (px)")
    hist.set_ylabel("count")


def _depth_curves(view: View, selection, cmap: Colormap) -> Figure:
    """Returns accuracy vs depth per readout (chance dotted, best starred) and one layer's token map."""
    chance = view.extra.get("chance")
    n_layers = len(view.rows)
    layer = _probe_map_layer(view, selection)
    fig = _new_figure(view, (9.0, 4.6) if layer else (6.8, 4.6))
    grid = fig.add_gridspec(1, 2 if layer else 1, width_ratios=[2.2, 1.0] if layer else [1.0])
    ax = fig.add_subplot(grid[0], label="accuracy")
    vmin, vmax = _value_range(view)

    x = np.arange(n_layers)
    _readout_curves(ax, view, x)
    if chance is not None:
        ax.axhline(chance, ls=":", color="0.3", lw=1.2, label=f"chance ({chance:.2f})", gid="chance")
    ax.set_xticks(
        x,
        labels=view.rows,
        rotation=45 if n_layers > 6 else 0,
        ha="right" if n_layers > 6 else "center",
        fontsize=TICK_PT,
    )
    ax.set_ylim(vmin, vmax + 0.05 * (vmax - vmin))  # room for the best values' labels
    ax.set_xlabel("layer")
    ax.set_ylabel("test accuracy")
    _skipped_readouts(ax, view, vmin)
    ax.legend(fontsize=TICK_PT, loc="best")
    if selection:
        r, c = selection
        ax.axvspan(r - 0.4, r + 0.4, color="0.93", zorder=0)
        _ring(ax, r, view.matrix[r, c], size=110, zorder=5)

    if layer:
        _probe_token_map(fig, grid[1], view, layer, cmap, (vmin, vmax))
    _caption(fig, view)
    return fig


def _readout_curves(ax, view: View, x: np.ndarray) -> None:
    """Draws each readout's accuracy against depth `x` on `ax`: a line, its interval as a band where the view has
    intervals, and a star on every layer that ties for its best, the best value written above the last."""
    for j, readout in enumerate(view.cols):
        acc = view.matrix[:, j]
        color = LINE_COLORS[j % len(LINE_COLORS)]
        ax.plot(x, acc, marker="o", ms=3.5, lw=1.4, color=color, label=readout, gid=f"readout:{readout}")
        if view.ci_low is not None:
            ax.fill_between(
                x, view.ci_low[:, j], view.ci_high[:, j], color=color, alpha=0.16, lw=0, gid=f"band:{readout}"
            )
        if np.isfinite(acc).any():
            best = np.flatnonzero(acc == np.nanmax(acc))  # every layer that ties for best (small test splits tie)
            ax.plot(
                best,
                acc[best],
                marker="*",
                ms=13,
                color=color,
                mec="0.1",
                mew=0.6,
                ls="none",
                zorder=4,
                gid=f"best:{readout}",
            )
            ax.annotate(
                _fmt(acc[best[-1]], 2),
                (best[-1], acc[best[-1]]),
                xytext=(0, 8),
                textcoords="offset points",
                ha="center",
                fontsize=TICK_PT,
                color=color,
            )


def _skipped_readouts(ax, view: View, vmin: float) -> None:
    """Draws a cross at the bottom of `ax` for each layer whose readout was not fitted (its features hold NaN/Inf)."""
    for j, readout in enumerate(view.cols):  # readouts not fitted: their features hold NaN/Inf
        skipped = np.flatnonzero(view.nonfinite[:, j]) if view.nonfinite is not None else []
        if len(skipped):
            ax.scatter(
                skipped,
                np.full(len(skipped), vmin),
                marker="x",
                color=NONFINITE,
                s=30,
                clip_on=False,
                zorder=4,
                label=f"{readout}: not fitted (NaN/Inf)",
                gid=f"skipped:{readout}",
            )


def _probe_token_map(fig: Figure, cell, view: View, layer: str, cmap: Colormap, limits: tuple[float, float]) -> None:
    """Draws in the grid cell `cell` of `fig` the per-token probes' accuracy of `layer` on the patch grid (the CLS
    token's in the title), with its colour bar."""
    accuracy = np.asarray(view.extra["token_maps"][layer], dtype=float)
    prefix = view.extra.get("token_prefix", {}).get(layer)
    grid_size = tuple(view.extra.get("grid") or ())
    if prefix is not None and len(grid_size) == 2 and len(accuracy) - prefix == grid_size[0] * grid_size[1]:
        gh, gw = grid_size
    else:  # a view without the layout: infer it from the token count
        prefix, (gh, gw) = token_grid(len(accuracy), has_cls="CLS" in view.cols)
    tokens = fig.add_subplot(cell, label="token map")
    image = tokens.imshow(
        accuracy[prefix:].reshape(gh, gw), cmap=cmap, vmin=limits[0], vmax=limits[1], interpolation="nearest"
    )
    title = f"{layer}: per-token probes"
    if prefix:
        title += f"\nCLS token {_fmt(accuracy[0], 2)}"
    tokens.set_title(title, fontsize=9)
    tokens.set_xlabel("patch column")
    tokens.set_ylabel("patch row")
    _integer_ticks(tokens, gh, gw)
    fig.colorbar(image, ax=tokens, label="accuracy", shrink=0.8)


def _token_ratios(view: View, selection, cmap: Colormap) -> Figure:
    """Returns the sublayer x token ratio heatmap (log scale) and CLS vs spatial-token ratios over depth."""
    n_rows, n_cols = view.matrix.shape
    vmin, vmax = _value_range(view)
    log = 0 < vmin < vmax  # ratios span decades; a range that reaches 0 (or is empty) cannot be logarithmic
    fig = _new_figure(view, (10.0, 5.2))
    # a ResNet has one ratio per block: its heatmap is a single column and needs little room
    grid = fig.add_gridspec(1, 2, width_ratios=[min(1.5, max(0.4, n_cols / 10)), 1.0])
    ax = fig.add_subplot(grid[0], label="heatmap")
    norm = LogNorm(vmin, vmax) if log else Normalize(vmin, vmax)
    image = ax.imshow(view.matrix, origin="lower", cmap=cmap, norm=norm, interpolation="nearest", aspect="auto")
    _layer_ticks(ax.yaxis, view.rows, room_in=3.8)
    _layer_ticks(ax.xaxis, view.cols, room_in=4.0, rotate=True)
    ax.set_ylabel("sublayer" if n_cols > 1 else "block")
    ax.set_xlabel("token" if n_cols > 1 else "")
    bar = fig.colorbar(image, ax=ax, label="||z|| / ||f(z)||" + (" (log scale)" if log else ""), shrink=0.85)
    if log:
        _plain_log_labels(bar.ax.yaxis)
    _overlay_nonfinite(ax, view.nonfinite, origin="lower", aspect="auto")
    if selection:
        r, c = selection
        _mark_cell(
            ax,
            r,
            c,
            f"{view.rows[r]}, {view.cols[c]}\nratio {view.cell_text(r, c, 2, 'no finite ratio')}",
            toward=(n_cols / 2 - c, n_rows / 2 - r),
            cell_pt=280 / max(n_rows, n_cols),
        )

    curves = fig.add_subplot(grid[1], label="curves")
    x = np.arange(n_rows)
    cls = np.asarray(view.extra.get("cls", np.full(n_rows, np.nan)), dtype=float)
    spatial = np.asarray(view.extra.get("spatial_mean", np.full(n_rows, np.nan)), dtype=float)
    drawn = False
    if np.isfinite(cls).any():
        curves.plot(x, cls, marker="o", ms=3, color=LINE_COLORS[1], label="CLS token", gid="cls")
        drawn = True
    if np.isfinite(spatial).any():
        label = "spatial tokens (mean)" if n_cols > 1 else "whole map"
        curves.plot(x, spatial, marker="o", ms=3, color=LINE_COLORS[0], label=label, gid="spatial")
        drawn = True
    if drawn:
        curves.axhline(1.0, ls=":", color="0.4", lw=1, label="equal norms")
        if log:
            curves.set_yscale("log")
            _plain_log_labels(curves.yaxis)
        curves.legend(fontsize=TICK_PT)
    else:
        curves.text(
            0.5,
            0.5,
            "no finite ratios\n(a residual branch that adds zero)",
            ha="center",
            va="center",
            transform=curves.transAxes,
            fontsize=9,
            color="0.35",
        )
        curves.set_yticks([])
    _layer_ticks(curves.xaxis, view.rows, room_in=2.6, rotate=True)
    curves.set_xlim(-0.5, n_rows - 0.5)
    curves.set_xlabel("sublayer" if n_cols > 1 else "block")
    curves.set_ylabel("||z|| / ||f(z)||")
    _caption(fig, view, orientation=True)
    return fig


def _token_maps(view: View, selection, cmap: Colormap) -> Figure:
    """Returns the selected (default: centre) token's CKA map over input patches and a few others' maps."""
    gh, gw = (int(v) for v in view.extra["grid"])
    token = selection[0] if selection else spatial_centre_token(gh, gw)
    vmin, vmax = _value_range(view)
    others = _spread_tokens(gh, gw)
    fig = _new_figure(view, (9.6, 5.0))
    grid = fig.add_gridspec(1, 2, width_ratios=[1.3, 1.0])
    ax = fig.add_subplot(grid[0], label="map")
    image = _token_map(ax, view, token, gh, gw, cmap, vmin, vmax, lw=2.2)
    ax.set_title(f"{view.rows[token]} vs every input patch", fontsize=9)
    ax.set_xlabel("patch column")
    ax.set_ylabel("patch row")
    _integer_ticks(ax, gh, gw)
    fig.colorbar(image, ax=ax, label=view.value_name, shrink=0.85)
    if selection:
        r, c = selection
        pi, pj = divmod(c, gw)
        ax.add_patch(
            Rectangle((pj - 0.5, pi - 0.5), 1, 1, fill=False, edgecolor=MARK, lw=1.6, ls="--", gid="selection")
        )
        ax.annotate(
            f"{view.cols[c]}: {view.value_name} {view.cell_text(r, c, 3)}",
            (pj, pi),
            xytext=(12 if pj < gw / 2 else -12, -14 if pi < gh / 2 else 14),
            textcoords="offset points",
            ha="left" if pj < gw / 2 else "right",
            fontsize=TICK_PT,
            bbox=_BOX,
            arrowprops={"arrowstyle": "-", "color": MARK},
        )

    rows_k, cols_k = len(others[0]), len(others[1])
    small = grid[1].subgridspec(rows_k, cols_k)
    for a, i in enumerate(others[0]):
        for b, j in enumerate(others[1]):
            sub = fig.add_subplot(small[a, b], label=f"token {i * gw + j}")
            _token_map(sub, view, i * gw + j, gh, gw, cmap, vmin, vmax, lw=1.2)
            sub.set_title(view.rows[i * gw + j].removeprefix("token "), fontsize=TICK_PT, pad=2)
            sub.set_xticks([])
            sub.set_yticks([])
    _caption(fig, view, view.extra.get("pixels", ""))
    return fig


# --- pieces -----------------------------------------------------------------------------------------

_BOX = {"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.6", "alpha": 0.9}


def spatial_centre_token(gh: int, gw: int) -> int:
    """Returns the index of the token at the centre of a gh x gw grid (row-major; lower-right of the middle)."""
    return (gh // 2) * gw + gw // 2


def token_grid(n_tokens: int, has_cls: bool) -> tuple[int, tuple[int, int]]:
    """Returns (prefix tokens, (gh, gw)) of a per-token vector: the fewest prefix tokens that leave a square.

    Probe views keep every token of a layer, prefix tokens first (CLS, registers), but not the grid;
    a square grid after at most 8 prefix tokens is how every ViT in timm lays them out. With no square
    the tokens are drawn as one row.
    """
    for prefix in range(1 if has_cls else 0, min(n_tokens, 9)):
        side = math.isqrt(n_tokens - prefix)
        if side > 0 and side * side == n_tokens - prefix:
            return prefix, (side, side)
    prefix = 1 if has_cls and n_tokens > 1 else 0
    return prefix, (1, n_tokens - prefix)


def _token_map(ax, view: View, token: int, gh: int, gw: int, cmap, vmin, vmax, lw: float):
    """Draws token's map on ax with its own cell outlined (gid "token"); returns the AxesImage."""
    image = ax.imshow(view.matrix[token].reshape(gh, gw), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    if view.nonfinite is not None:
        _overlay_nonfinite(ax, view.nonfinite[token].reshape(gh, gw), origin="upper", aspect="equal")
    ti, tj = divmod(token, gw)
    ax.add_patch(Rectangle((tj - 0.5, ti - 0.5), 1, 1, fill=False, edgecolor="white", lw=lw, gid="token"))
    ax.add_patch(Rectangle((tj - 0.5, ti - 0.5), 1, 1, fill=False, edgecolor="black", lw=lw / 3))
    return image


def _overlay_nonfinite(ax, mask: np.ndarray | None, origin: str, aspect: str) -> None:
    """Paints the non-finite cells of an imshow grid in NONFINITE (gid "nonfinite"), the others untouched."""
    if mask is None or not np.asarray(mask).any():
        return
    from matplotlib.colors import ListedColormap

    cells = np.ma.masked_where(~np.asarray(mask, dtype=bool), np.ones(np.shape(mask)))
    ax.imshow(
        cells,
        cmap=ListedColormap([NONFINITE]),
        vmin=0,
        vmax=1,
        origin=origin,
        aspect=aspect,
        interpolation="nearest",
        gid="nonfinite",
    )


def _spread_tokens(gh: int, gw: int) -> tuple[list[int], list[int]]:
    """Returns up to 3 grid rows and 3 grid columns spread over the grid (corners, edges, centre)."""

    def pick(n: int) -> list[int]:
        return sorted({0, (n - 1) // 2, n - 1}) if n > 1 else [0]

    return pick(gh), pick(gw)


def _probe_map_layer(view: View, selection) -> str | None:
    """Returns the layer whose token map is drawn: the selected one, else the last layer that has one."""
    token_maps = view.extra.get("token_maps") or {}
    if selection:
        layer = view.rows[selection[0]]
        return layer if layer in token_maps else None
    with_maps = [layer for layer in view.rows if layer in token_maps]
    return with_maps[-1] if with_maps else None


# --- head-level CKA and effective receptive fields (engine/analyses/heads.py, erf.py) ------------------


def heads_scatter_col(view: View, selection) -> int:
    """Returns the other model's layer the heads scatter plots: the selection's column, else the most similar."""
    return selection[1] if selection else int(view.extra["scatter_col"])


def _heads_by_layer(view: View, selection, cmap: Colormap) -> Figure:
    """Returns the paper's Fig. 5 scatter (x: head's mean attention distance, y: CKA with one layer of the other
    model, colour: block) and beside it the heads x layers heatmap."""
    col = heads_scatter_col(view, selection)
    distance = np.asarray(view.extra["distance_px"], dtype=float)
    block = np.asarray(view.extra["block"], dtype=int)
    values = view.matrix[:, col]
    fig = _new_figure(view, (11.0, 5.2))
    grid = fig.add_gridspec(1, 2, width_ratios=[1.2, 1.0])
    ax = fig.add_subplot(grid[0], label="scatter")
    blocks = sorted(set(block.tolist()))
    colours = cmap(np.linspace(0.0, 0.9, max(len(blocks), 1)))
    for i, b in enumerate(blocks):
        mine = block == b
        ax.scatter(
            distance[mine],
            values[mine],
            s=26,
            color=colours[i],
            edgecolors="0.15",
            linewidths=0.5,
            label=f"block {b}",
            gid=f"block-{b}",
        )
    if selection:
        r = selection[0]
        _ring(ax, distance[r], values[r], size=120, zorder=3)
    ax.set_xlabel("mean attention distance (px)")
    ax.set_ylabel(f"CKA with {view.name(view.models[-1])} {view.cols[col]}")
    _block_legend(fig, ax, blocks, colours)
    if not np.isfinite(distance).any():
        ax.text(0.5, 0.5, "no attention distances recorded", ha="center", va="center", transform=ax.transAxes)

    _heads_heatmap(fig, grid[1], view, col, selection, cmap)
    _caption(fig, view, orientation=True)
    return fig


def _block_legend(fig: Figure, ax, blocks: list[int], colours: np.ndarray) -> None:
    """Says which colour is which block: a legend, or where that would be taller than the plot a bar of block
    numbers beside `ax`."""
    if len(blocks) <= MAX_LEGEND_BLOCKS:
        ax.legend(fontsize=TICK_PT, ncol=2 if len(blocks) > 6 else 1)
    else:  # a legend of 24 blocks is taller than the plot: the blocks' colours as a bar of block numbers
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import ListedColormap

        bar = fig.colorbar(
            ScalarMappable(Normalize(-0.5, len(blocks) - 0.5), ListedColormap(colours)),
            ax=ax,
            label="block",
            shrink=0.85,
            pad=0.01,
        )
        ticks = np.arange(0, len(blocks), math.ceil(len(blocks) / 12))
        bar.set_ticks(ticks, labels=[str(blocks[i]) for i in ticks])
        bar.ax.tick_params(labelsize=TICK_PT)


def _heads_heatmap(fig: Figure, cell, view: View, col: int, selection, cmap: Colormap) -> None:
    """Draws in the grid cell `cell` of `fig` the heads x layers CKA heatmap, the scatter's layer `col` outlined
    dashed and the selected cell marked, with its colour bar."""
    heat = fig.add_subplot(cell, label="heatmap")
    vmin, vmax = _value_range(view)
    image = heat.imshow(
        view.matrix, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto"
    )
    _layer_ticks(heat.yaxis, view.rows, room_in=3.8)
    _layer_ticks(heat.xaxis, view.cols, room_in=3.6, rotate=True)
    heat.set_ylabel(f"{view.name(view.models[0])} head")
    heat.set_xlabel(f"{view.name(view.models[-1])} layer")
    heat.axvspan(col - 0.5, col + 0.5, fill=False, edgecolor="0.2", lw=1, ls="--", gid="scatter-layer")
    fig.colorbar(image, ax=heat, label=view.value_name, shrink=0.85)
    if selection:
        r, c = selection
        n_rows, n_cols = view.matrix.shape
        _mark_cell(
            heat,
            r,
            c,
            f"{view.rows[r]} x {view.cols[c]}\nCKA {_fmt(view.value(r, c))}",
            toward=(n_cols / 2 - c, n_rows / 2 - r),
            cell_pt=280 / max(n_rows, n_cols),
        )


def _pixel_map(view: View, selection, cmap: Colormap) -> Figure:
    """Returns the ERFs of a few depths side by side (paper Fig. 6) on one log colour scale."""
    layers = list(view.extra["depth_layers"])
    maps = [np.asarray(view.extra["depth_maps"][layer], dtype=float) for layer in layers]
    positive = np.concatenate([m[np.isfinite(m) & (m > 0)] for m in maps] or [np.zeros(0)])
    vmax = float(positive.max()) if positive.size else 1.0
    vmin = max(float(positive.min()) if positive.size else vmax * 1e-6, vmax * 1e-6)  # six decades at most
    fig = _new_figure(view, (3.0 * len(layers) + 1.2, 3.9))
    grid = fig.add_gridspec(1, len(layers))
    image = None
    for i, (layer, m) in enumerate(zip(layers, maps)):
        ax = fig.add_subplot(grid[i], label=f"erf-{layer}")
        if layer in view.extra.get("no_field_layers", ()):  # rounding noise, not a map (analyses/erf.py)
            ax.set_title(layer, fontsize=9)
            ax.set_axis_off()
            ax.text(
                0.5,
                0.5,
                "no receptive field:\nthe centre sum does not\ndepend on the input",
                ha="center",
                va="center",
                fontsize=TICK_PT,
                transform=ax.transAxes,
                gid="no-field",
            )
            continue
        shown = np.where(m > 0, m, vmin)  # a zero share sits at the bottom of the log scale
        image = ax.imshow(
            shown, cmap=cmap, norm=LogNorm(vmin, vmax) if vmax > vmin else Normalize(0, vmax), interpolation="nearest"
        )
        ax.set_title(layer, fontsize=9)
        ax.tick_params(labelsize=TICK_PT)
        if selection and layer == view.params.get("layer"):
            r, c = selection
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=MARK, lw=1.5, gid="selection"))
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label="share of |d centre / d input| (log scale)", shrink=0.85)
    return fig


CURVE_MARKERS = ("o", "s", "^", "D", "v", "P")
CURVE_DASHES = ("-", "--", "-.", ":")
FAMILY_COLORS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#999999")  # Okabe-Ito


def _model_matrix(view: View, selection, cmap: Colormap) -> Figure:
    """Returns the zoo: the models x models heatmap in the clustering order (model names coloured by family, a
    legend of the families) and, beside it, every model's layers matched onto one reference model's, relative depth
    against relative depth (the reference: the selected row's model, else the first in the order)."""
    from vitsee.output.labels import display_labels

    order = [int(i) for i in view.extra["order"]]
    families = list(view.extra["families"])
    names = display_labels(view.rows, view.names, 40)
    shown_families = dict.fromkeys(families[i] for i in order)
    palette = {f: FAMILY_COLORS[k % len(FAMILY_COLORS)] for k, f in enumerate(shown_families)}
    n = len(order)
    fig = _new_figure(view, (12.0, 6.2))
    ax, curves = fig.subplots(1, 2, width_ratios=[1.15, 1.0])
    _zoo_heatmap(fig, ax, view, order, names, palette, cmap)
    reference = order[0]
    if selection:
        r, c = selection
        reference = r
        i, j = order.index(r), order.index(c)
        _mark_cell(
            ax,
            i,
            j,
            f"{names[r]} x {names[c]}\n{view.value_name} {view.cell_text(r, c, 3)}{view.interval_text(r, c)}",
            toward=(n / 2 - j, i - n / 2),
            cell_pt=300 / max(n, 1),
        )
    _depth_matches(curves, view, order, names, reference)
    note = "order: hierarchical clustering (average linkage)"
    if view.ci_low is None:
        note += f"; intervals {view.extra.get('interval', 'none')}"
    _caption(fig, view, note)
    return fig


def _zoo_heatmap(
    fig: Figure, ax, view: View, order: list[int], names: list[str], palette: dict[str, str], cmap: Colormap
) -> None:
    """Draws on `ax` the models x models matrix in `order`: names coloured by family (`palette`, its legend above),
    a colour bar, non-finite cells painted, and each value written in where there are at most 10 models."""
    families = list(view.extra["families"])
    n = len(order)
    vmin, vmax = _value_range(view)
    shown = view.matrix[np.ix_(order, order)]
    image = ax.imshow(shown, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="equal")
    shown_names = [names[i] for i in order]
    _layer_ticks(ax.yaxis, shown_names, room_in=4.2)
    _layer_ticks(ax.xaxis, shown_names, room_in=4.2, rotate=True)
    for axis in (ax.xaxis, ax.yaxis):
        for tick in axis.get_ticklabels():
            if tick.get_text() in shown_names:
                tick.set_color(palette[families[order[shown_names.index(tick.get_text())]]])
    fig.colorbar(image, ax=ax, label=view.value_name, shrink=0.8)
    _overlay_nonfinite(
        ax, view.nonfinite[np.ix_(order, order)] if view.nonfinite is not None else None, origin="upper", aspect="equal"
    )
    ax.legend(
        handles=[Rectangle((0, 0), 1, 1, color=c, label=f) for f, c in palette.items()],
        fontsize=TICK_PT,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncols=min(6, len(palette)),
        frameon=False,
        title="family (the names' colour)",
        title_fontsize=TICK_PT,
        alignment="left",
    )
    if n <= 10:  # few enough cells to write each value in
        for i in range(n):
            for j in range(n):
                value = shown[i, j]
                if np.isfinite(value):
                    light = (value - vmin) / (vmax - vmin) > 0.6 if vmax > vmin else False
                    ax.text(
                        j,
                        i,
                        f"{value:.2f}",
                        ha="center",
                        va="center",
                        fontsize=TICK_PT + 1,
                        color="black" if light else "white",
                    )


def _depth_matches(curves, view: View, order: list[int], names: list[str], reference: int) -> None:
    """Draws on `curves` every other model's layers matched onto model `reference`'s (relative depth against
    relative depth, the diagonal dotted), curves that coincide told apart by dash, marker and width."""
    ref = view.rows[reference]
    pairs = {(c["a"], c["b"]): c for c in view.extra.get("correspondences", [])}
    curves.plot([0, 1], [0, 1], ls=":", color="0.6", lw=1, label="same relative depth")
    drawn: list[tuple[list, list, str]] = []
    for k, i in enumerate(i for i in order if i != reference):
        c = pairs.get((view.rows[i], ref))
        if c is not None:
            xs, ys = list(c["depth_a"]), list(c["depth_b_path"])
            # curves that coincide hide one another: each its own dash and marker, the later ones drawn wider
            # underneath, and the legend says which lies on which
            under = next((name for x, y, name in drawn if _same_curve(x, y, xs, ys)), None)
            drawn.append((xs, ys, names[i]))
            curves.plot(
                xs,
                ys,
                marker=CURVE_MARKERS[k % len(CURVE_MARKERS)],
                ms=3 + k,
                ls=CURVE_DASHES[k % len(CURVE_DASHES)],
                lw=1.4 + 0.9 * k,
                zorder=2 - 0.01 * k,
                label=names[i] + (f" (the same as {under})" if under else ""),
                color=LINE_COLORS[k % len(LINE_COLORS)] if len(order) <= len(LINE_COLORS) + 1 else None,
                gid="correspondence",
            )
    curves.set_xlim(-0.02, 1.02)
    curves.set_ylim(-0.02, 1.02)
    curves.set_aspect("equal")
    curves.set_xlabel("relative depth of each model's layer (0 first, 1 last)")
    curves.set_ylabel(f"relative depth of its match in {names[reference]}")
    curves.set_title(f"layers matched onto {names[reference]} (monotone path)", fontsize=9)
    curves.tick_params(labelsize=TICK_PT)
    curves.legend(fontsize=TICK_PT, loc="upper left", frameon=False)


def _same_curve(x0, y0, x1, y1) -> bool:
    """Returns whether two curves are drawn over one another (the same points)."""
    return len(x0) == len(x1) and np.allclose(x0, x1) and np.allclose(y0, y1)


def _measures_agree(view: View, selection, cmap: Colormap) -> Figure:
    """Returns each measure's layer x layer matrix side by side with the same axes, its colours over its own range
    (the patterns compare, whatever each measure's scale; a distance's reversed, so the alike pairs are bright in
    every panel), and beside them the rank correlations between the measures."""
    panels = np.asarray(view.extra["panels"], dtype=float)
    rows, cols = list(view.extra["panel_rows"]), list(view.extra["panel_cols"])
    m = len(panels)
    per_row = min(m, 4)
    lines = math.ceil(m / per_row)
    fig = _new_figure(view, (2.55 * per_row + 4.4, 2.75 * lines + 1.9))
    outer = fig.add_gridspec(1, 2, width_ratios=[2.55 * per_row, 4.0])
    grid = outer[0].subgridspec(lines, per_row)
    first = None
    for i, (panel, label, up) in enumerate(zip(panels, view.rows, view.extra["higher_is_better"])):
        r, c = divmod(i, per_row)
        ax = fig.add_subplot(grid[r, c], label=f"panel-{view.extra['measures'][i]}", sharex=first, sharey=first)
        first = first or ax
        finite = panel[np.isfinite(panel)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        image = ax.imshow(
            panel,
            origin="lower",
            cmap=cmap if up else cmap.reversed(),
            vmin=low,
            vmax=high if high > low else low + 1.0,
            interpolation="nearest",
            aspect="auto",
        )
        ax.set_title(label if up else f"{label} (low: alike)", fontsize=9)
        bar = fig.colorbar(image, ax=ax, shrink=0.85, pad=0.03)
        bar.ax.tick_params(labelsize=TICK_PT - 1)
        if c == 0:
            _layer_ticks(ax.yaxis, rows, room_in=2.0)
            ax.set_ylabel(f"{view.name(view.models[0])} layer", fontsize=TICK_PT)
        else:
            ax.tick_params(axis="y", labelleft=False)
        if i + per_row >= m:  # the lowest panel of its column
            _layer_ticks(ax.xaxis, cols, room_in=1.9, rotate=True)
            ax.set_xlabel(f"{view.name(view.models[-1])} layer", fontsize=TICK_PT)
        else:
            ax.tick_params(axis="x", labelbottom=False)
    ax = fig.add_subplot(outer[1], label="rank-correlations")
    finite = view.matrix[np.isfinite(view.matrix)]
    low = 0.0 if finite.size and finite.min() >= 0 else -1.0  # no disagreement in sign: 0 to 1 shows more
    image = ax.imshow(view.matrix, cmap=cmap, vmin=low, vmax=1.0, interpolation="nearest", aspect="equal")
    for (r, c), value in np.ndenumerate(view.matrix):
        if np.isfinite(value):
            shade = cmap((value - low) / (1.0 - low))
            ink = "black" if 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] > 0.5 else "white"
            ax.text(
                c,
                r,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=TICK_PT + (1 if m <= 5 else 0),
                color=ink,
                gid="rank-correlation",
            )
    ax.set_xticks(np.arange(m), labels=view.cols, fontsize=TICK_PT, rotation=45, ha="right")
    ax.set_yticks(np.arange(m), labels=view.rows, fontsize=TICK_PT)
    ax.set_title(f"rank correlation over {view.extra['n_pairs']} layer pairs", fontsize=9)
    fig.colorbar(image, ax=ax, label="Spearman", shrink=0.55)
    if selection:
        r, c = selection
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=MARK, lw=2, gid="selection"))
    colours = "each panel's colours span its own values" + (
        ", a distance's reversed: bright is alike everywhere" if not all(view.extra["higher_is_better"]) else ""
    )
    _caption(fig, view, f"{colours}; {view.analysis.caption_notes(view).removeprefix('; ')}", orientation=True)
    return fig


def _score_table(view: View, selection, cmap: Colormap) -> Figure:
    """Returns one panel per score (column): each row's value as a dot with its interval, the best starred, and,
    when the view has one, its models x models panel beside (the separability's consensus zoo)."""
    n_rows, n_cols = view.matrix.shape
    panel = view.extra.get("panel")
    panel = None if panel is None else np.asarray(panel, dtype=float)
    height = max(3.6, 0.32 * n_rows + 2.2)
    fig = _new_figure(view, (3.1 * n_cols + (4.2 if panel is not None else 0.4), height))
    grid = fig.add_gridspec(
        1, n_cols + (1 if panel is not None else 0), width_ratios=[3.0] * n_cols + ([4.0] if panel is not None else [])
    )
    y = np.arange(n_rows)[::-1]  # the first row at the top, as the table reads
    first = None
    for c, name in enumerate(view.cols):
        ax = fig.add_subplot(grid[c], label=f"score-{c}", sharey=first)
        first = first or ax
        values = view.matrix[:, c]
        _score_intervals(ax, view, c, name, values, y)
        _score_dots(ax, view, c, name, values, y, selection)
    if panel is not None:
        _score_panel(fig.add_subplot(grid[-1], label="panel"), fig, view, panel, cmap)
    _caption(fig, view, "dotted: chance (0; AUC 0.5); * the best of each score; " + str(view.extra.get("note", "")))
    return fig


def _score_intervals(ax, view: View, c: int, name: str, values: np.ndarray, y: np.ndarray) -> None:
    """Draws score column c's intervals as error bars, an interval far past every value cut at the axis's edge."""
    if view.ci_low is not None:
        low, high = view.ci_low[:, c], view.ci_high[:, c]
        ok = np.isfinite(low) & np.isfinite(high) & np.isfinite(values)
        ax.errorbar(
            values[ok],
            y[ok],
            xerr=np.vstack([values[ok] - low[ok], high[ok] - values[ok]]).clip(0),
            fmt="none",
            ecolor="0.55",
            elinewidth=1.2,
            capsize=2.5,
            gid=f"interval:{name}",
        )
    finite = values[np.isfinite(values)]
    if finite.size and view.ci_high is not None:  # an interval far past every value (d-prime of a few pairs
        # whose spread is near 0) is cut at the axis's edge, its end written there
        edge = max(float(finite.max()), 0.0) + 2.0 * max(float(np.ptp(finite)), float(np.abs(finite).max()), 0.5)
        highs = view.ci_high[:, c]
        cut = np.isfinite(highs) & (highs > edge)
        if cut.any():
            left = min(float(np.nanmin(view.ci_low[:, c])), float(finite.min()), 0.0)
            ax.set_xlim(left - 0.04 * (edge - left), edge)
            for r in np.flatnonzero(cut):
                ax.annotate(
                    f"\u2192 {_fmt(highs[r], 0)}",
                    (edge, y[r]),
                    xytext=(-2, -9),
                    textcoords="offset points",
                    ha="right",
                    fontsize=TICK_PT - 1,
                    color="0.35",
                    gid=f"cut:{name}",
                )


def _score_dots(ax, view: View, c: int, name: str, values: np.ndarray, y: np.ndarray, selection) -> None:
    """Draws score column c's values as dots with their numbers, the best starred, chance dotted, the selection
    ringed."""
    ax.plot(values, y, "o", color=LINE_COLORS[0], ms=5, gid=f"score:{name}")
    if np.isfinite(values).any():
        best = np.flatnonzero(values == np.nanmax(values))
        ax.plot(values[best], y[best], "*", ms=13, color=LINE_COLORS[1], mec="0.1", mew=0.6, gid=f"best:{name}")
    for r, value in enumerate(values):
        if np.isfinite(value):
            ax.annotate(
                _fmt(value, 2),
                (value, y[r]),
                xytext=(0, 5),
                textcoords="offset points",
                ha="center",
                fontsize=TICK_PT - 1,
                color="0.25",
            )
    ax.set_title(name, fontsize=9)
    ax.axvline({"ROC-AUC": 0.5}.get(name, 0.0), ls=":", color="0.4", lw=1.0, gid=f"chance:{name}")
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.tick_params(labelsize=TICK_PT)
    if c == 0:
        ax.set_yticks(y, labels=view.rows, fontsize=TICK_PT)
    else:
        ax.tick_params(axis="y", labelleft=False)
    if selection and selection[1] == c:
        r = selection[0]
        _ring(ax, values[r], y[r], size=110, zorder=5)


def _score_panel(ax, fig: Figure, view: View, panel: np.ndarray, cmap: Colormap) -> None:
    """Draws the view's models x models panel (one group's models side by side) with its colour bar."""
    labels = [view.name(str(k)) for k in view.extra.get("panel_labels") or range(len(panel))]  # display names
    groups = list(view.extra.get("panel_groups") or [""] * len(panel))
    order = np.argsort(np.array(groups), kind="stable")  # one group's models side by side
    shown = panel[np.ix_(order, order)]
    image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
    names = [f"{labels[i]} [{groups[i]}]" for i in order]
    ax.set_xticks(np.arange(len(order)), labels=names, fontsize=TICK_PT - 1, rotation=45, ha="right")
    ax.set_yticks(np.arange(len(order)), labels=names, fontsize=TICK_PT - 1)
    ax.set_title(str(view.extra.get("panel_title", "")), fontsize=9)
    bar = fig.colorbar(image, ax=ax, shrink=0.7)
    bar.set_label("rank of the pair (1: most alike)", fontsize=TICK_PT)
    bar.ax.tick_params(labelsize=TICK_PT - 1)


def _curves(view: View, selection, cmap: Colormap) -> Figure:
    """Returns each series against the count on the rows (a log axis where the view says), its interval as a band,
    each point marked and labelled with its interval's width."""
    x = np.asarray(view.extra.get("x", np.arange(len(view.rows))), dtype=float)
    fig = _new_figure(view, (7.2, 4.6))
    ax = fig.add_subplot(label="curves")
    for c, name in enumerate(view.cols):
        color = LINE_COLORS[c % len(LINE_COLORS)]
        values = view.matrix[:, c]
        ax.plot(x, values, marker="o", ms=4, lw=1.5, color=color, label=name, gid=f"curve:{name}")
        if view.ci_low is not None:
            ax.fill_between(x, view.ci_low[:, c], view.ci_high[:, c], color=color, alpha=0.18, lw=0, gid=f"band:{name}")
            ax.errorbar(
                x,
                values,
                yerr=np.vstack([values - view.ci_low[:, c], view.ci_high[:, c] - values]).clip(0),
                fmt="none",
                ecolor=color,
                elinewidth=0.9,
                capsize=3,
            )
    if view.extra.get("log_x"):
        ax.set_xscale("log", base=2)
    ax.set_xticks(x, labels=view.rows, fontsize=TICK_PT)
    ax.minorticks_off()
    ax.tick_params(labelsize=TICK_PT)
    ax.set_xlabel(str(view.extra.get("x_label", "")), fontsize=TICK_PT + 1)
    ax.set_ylabel(view.value_name, fontsize=TICK_PT + 1)
    ax.grid(color="0.92", lw=0.6)
    if len(view.cols) > 1 or view.ci_low is not None:
        ax.legend(fontsize=TICK_PT, loc="best")
    if selection:
        r, c = selection
        _ring(ax, x[r], view.matrix[r, c], size=110, zorder=5)
    _caption(fig, view, str(view.extra.get("note", "")))
    return fig


def _new_figure(view: View, size: tuple[float, float]) -> Figure:
    """Returns an empty Agg figure with the view's title and subtitle across the top."""
    # laid out at the PNG's resolution: Agg's hinted text is some 4% wider at 150 dpi than at 100, enough to push a
    # title wrapped to fit at 100 dpi past both edges of the PNG
    fig = ShownFigure(figsize=size, layout="constrained", dpi=PNG_DPI)
    FigureCanvasAgg(fig)
    title = wrap_to_width(fig, view.title, TITLE_PT, weight="bold") or [""]
    subtitle = wrap_to_width(fig, view.subtitle, SUBTITLE_PT)
    top_pt = 6
    for line in title:
        fig.text(
            0.5,
            1 - (top_pt + TITLE_PT) / (size[1] * 72),
            line,
            ha="center",
            va="baseline",
            fontsize=TITLE_PT,
            weight="bold",
        )
        top_pt += TITLE_PT * 1.3
    for line in subtitle:
        fig.text(
            0.5,
            1 - (top_pt + SUBTITLE_PT) / (size[1] * 72),
            line,
            ha="center",
            va="baseline",
            fontsize=SUBTITLE_PT,
            color="0.3",
        )
        top_pt += SUBTITLE_PT * 1.3
    fig.get_layout_engine().set(rect=(0, 0, 1, 1 - (top_pt + 6) / (size[1] * 72)))
    return fig


def wrap_to_width(
    fig: Figure, text: str, fontsize: float, width_px: float | None = None, weight: str = "normal"
) -> list[str]:
    """Returns `text` cut into lines that each measure at most width_px (default: the figure's width less
    MARGIN_PT on each side) in fig's renderer: at spaces, or inside a word too long for a line of its own.

    Measured, not counted: a character count per line clipped subtitles of wide glyphs at both edges.
    """
    if width_px is None:
        width_px = fig.bbox.width - 2 * MARGIN_PT * fig.dpi / 72
    renderer = fig.canvas.get_renderer()
    font = FontProperties(size=fontsize, weight=weight)

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0] <= width_px

    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}" if line else word
            if fits(candidate):
                line = candidate
                continue
            if line:
                lines.append(line)
            while not fits(word) and len(word) > 1:  # a word wider than a line (a model name): cut it
                cut = max(1, next(i for i in range(1, len(word) + 1) if not fits(word[:i])) - 1)
                # after its last '_', '.', '@', ... that fits, so that 'augreg_in21k' breaks as 'augreg_' 'in21k'
                seps = [i + 1 for i, ch in enumerate(word[:cut]) if ch in WORD_BREAKS and i + 1 < cut]
                cut = seps[-1] if seps and seps[-1] > cut // 3 else cut
                lines.append(word[:cut])
                word = word[cut:]
            line = word
        if line:
            lines.append(line)
    return lines


def _fit_axes_texts(fig: Figure) -> None:
    """Wraps every axes title and axis label that is longer than its axes (as laid out) onto more lines.

    Runs the layout once to know each axes' size (lengths of texts need no positions, so nothing is drawn);
    saving the figure lays it out again with the new lines.
    """
    fig.get_layout_engine().execute(fig)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for axis, length_px in ((ax.xaxis, box.width), (ax.yaxis, box.height)):
            if axis in _LAYER_LABELS:  # the first guess at the axis's length was too long: fewer labels
                labels, rotate = _LAYER_LABELS[axis]
                step = _tick_step(len(labels), length_px * 72 / fig.dpi)
                ticks = axis.get_ticklocs()
                if len(ticks) > 1 and step > ticks[1] - ticks[0]:
                    _set_layer_ticks(axis, labels, rotate, step)
        for text, room in ((ax.title, box.width), (ax.xaxis.label, box.width), (ax.yaxis.label, box.height)):
            if not text.get_visible() or not text.get_text():
                continue
            extent = text.get_window_extent(renderer)
            length = extent.height if text is ax.yaxis.label else extent.width
            if length > room:
                props = text.get_fontproperties()
                text.set_text(
                    "\n".join(
                        wrap_to_width(fig, text.get_text(), props.get_size_in_points(), room, weight=props.get_weight())
                    )
                )


def _layer_ticks(axis, labels: list[str], room_in: float, rotate: bool = False) -> None:
    """Labels every cell of an axis with its name, or every Nth when too many to read (first always).

    `room_in` is a first guess at the axis's length; `_fit_axes_texts` thins again at its laid-out length."""
    _LAYER_LABELS[axis] = (labels, rotate)
    _set_layer_ticks(axis, labels, rotate, step=_tick_step(len(labels), room_in * 72))


def _tick_step(n_labels: int, length_pt: float) -> int:
    """Returns every how many cells a label goes on an axis length_pt long."""
    return max(1, math.ceil(n_labels / max(2, int(length_pt / TICK_ROOM_PT))))


def _set_layer_ticks(axis, labels: list[str], rotate: bool, step: int) -> None:
    ticks = np.arange(0, len(labels), step)
    axis.set_ticks(ticks, labels=[labels[i] for i in ticks], fontsize=TICK_PT)
    if rotate:
        for text in axis.get_ticklabels():
            text.set_rotation(90)


def _plain_log_labels(axis) -> None:
    """Writes a log axis's tick labels as plain numbers (2, 5, 10, 20) instead of powers of ten."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))


def _integer_ticks(ax, gh: int, gw: int) -> None:
    step_r, step_c = max(1, math.ceil(gh / 8)), max(1, math.ceil(gw / 8))
    ax.set_yticks(np.arange(0, gh, step_r))
    ax.set_xticks(np.arange(0, gw, step_c))
    ax.tick_params(labelsize=TICK_PT)


def _mark_cell(ax, row: int, col: int, text: str, toward: tuple[float, float], cell_pt: float) -> None:
    """Outlines cell (row, col) (gid "selection") and writes `text` beside it, offset towards the middle."""
    ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor=MARK, lw=2, gid="selection", zorder=5))
    dx, dy = (1 if toward[0] >= 0 else -1), (1 if toward[1] >= 0 else -1)
    if ax.yaxis_inverted():
        dy = -dy
    away = 10 + 0.5 * cell_pt  # from the cell's centre to just past its edge
    ax.annotate(
        text,
        (col, row),
        xytext=(away * dx, away * dy),
        textcoords="offset points",
        fontsize=TICK_PT,
        ha="left" if dx > 0 else "right",
        va="bottom" if dy > 0 else "top",
        bbox=_BOX,
        zorder=6,
        arrowprops={"arrowstyle": "-", "color": MARK, "lw": 1.2},
        gid="selection-label",
    )


def _ring(ax, x: float, y: float, size: float, zorder: float) -> None:
    """Draws the selection's ring (gid "selection") around the point (x, y) of a line or scatter plot."""
    ax.scatter([x], [y], s=size, facecolors="none", edgecolors=MARK, linewidths=1.6, zorder=zorder, gid="selection")


def _check_selection(view: View, selection) -> tuple[int, int] | None:
    """Returns the selection as (row, col) ints, or raises when it is not a cell of the view's matrix."""
    if selection is None:
        return None
    n_rows, n_cols = view.matrix.shape
    row, col = (int(v) for v in selection)
    if not (0 <= row < n_rows and 0 <= col < n_cols):
        raise VitseeError(
            f"selection ({row}, {col}) is outside the {n_rows}x{n_cols} matrix of {view.spec}: "
            f"pick a row in 0..{n_rows - 1} and a column in 0..{n_cols - 1}"
        )
    return row, col


def _colormap(name: str) -> Colormap:
    """Returns matplotlib's colormap `name` with NaN cells drawn light grey."""
    return colormaps[check_colormap(name)].with_extremes(bad=BAD)


def _value_range(view: View) -> tuple[float, float]:
    """Returns the view's (vmin, vmax), filling a missing bound from the finite values of its matrix."""
    finite = view.matrix[np.isfinite(view.matrix)]
    vmin = view.vmin if view.vmin is not None else (float(finite.min()) if finite.size else 0.0)
    vmax = view.vmax if view.vmax is not None else (float(finite.max()) if finite.size else 1.0)
    if vmax <= vmin:  # a constant matrix still needs a range to place its one value in
        vmax = vmin + 1.0
    return float(vmin), float(vmax)


def _fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if np.isfinite(value) else "not computed"


# the figure of each view shape; curves over depth mark their own non-finite points (a cross per series)
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
MARKS_OWN_NONFINITE = frozenset({Shape.DEPTH_CURVES})

"""The details Enter opens from a view: one head's distances per image, a probe's per-token accuracy map, a token's
skip ratios across blocks, a spatial or ERF map at full size with its values, a head's CKA with every layer.

Each detail reads only what its view holds, except the head's distances per image (the attention view keeps
their means and a block histogram): those are read from the store's per-image statistics in a worker, with
the task bar saying so. Esc, Enter or q closes a detail.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static
from textual.worker import get_current_worker

from vitsee.output.colormap import ColorMode
from vitsee.tui.results import LoadedView, read_head_distances
from vitsee.tui.widgets.heatmap import Heatmap, short_label
from vitsee.tui.widgets.histogram import VALUE_LINE, Histogram
from vitsee.tui.widgets.line_plot import LinePlot, Series
from vitsee.tui.widgets.task_bar import TaskBar

CLOSE_HINT = "Esc, Enter or q closes"


def number(value: float, digits: int = 4) -> str:
    """Returns a value as the details print it ('n/a' for NaN/Inf)."""
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


class DetailScreen(ModalScreen[None]):
    """A framed detail over the view: a title naming what is shown, a few facts, the body, the closing hint."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # priority: Enter closes even when the detail's own map or table has the focus
        Binding("escape,enter,q", "dismiss", "Close", id="detail.close", tooltip="Close this detail", priority=True),
        # a modal screen hides the app's keys: the help must be asked for here
        Binding(
            "question_mark", "app.help", "Help", id="detail.help", tooltip="List the keys and marks of this detail"
        ),
    ]

    DEFAULT_CSS = """
    DetailScreen {
        align: center middle;
        & > #detail {
            width: 90%;
            max-width: 110;
            height: auto;
            max-height: 95%;
            border: round $accent;
            background: $surface;
            padding: 0 1;
        }
        & .detail--title { text-style: bold; width: 1fr; }
        & .detail--facts { width: 1fr; height: auto; color: $text; }
        & .detail--caption { color: $text-muted; width: 1fr; }
        & LinePlot { height: 9; }
        & Histogram { height: 10; }
        & Heatmap { max-height: 60vh; }  /* a 64x64 ERF scrolls inside; the frame's hint stays on screen at 80x24 */
        & .detail--hint { color: $text-muted; text-align: right; width: 1fr; }
    }
    """

    help_text: ClassVar[str] = "A detail of the view"

    def __init__(
        self, loaded: LoadedView, title: str, color_mode: ColorMode = ColorMode.TRUECOLOR, cmap: str = "viridis"
    ) -> None:
        super().__init__()
        self.loaded, self.title_text = loaded, title
        self.color_mode, self.cmap = color_mode, cmap

    @property
    def view(self):
        return self.loaded.view

    def compose(self) -> ComposeResult:
        with Vertical(id="detail"):
            yield Label(self.title_text, classes="detail--title", markup=False)
            yield Static(self.facts(), classes="detail--facts", markup=False)
            yield from self.compose_body()
            yield Label(CLOSE_HINT, classes="detail--hint")

    def facts(self) -> str:
        """Returns the lines of numbers under the title (subclasses)."""
        return ""

    def compose_body(self) -> ComposeResult:
        yield from ()

    def help_context(self) -> tuple[str, dict[str, str], list[tuple[str, str]]]:
        """Returns what the help screen says here: its title, key descriptions by binding id, the glyph legend."""
        return f"{self.help_text}: {self.title_text}", {}, self.legend()

    def legend(self) -> list[tuple[str, str]]:
        return []


# --- attention: one head's distance per image --------------------------------------------------------------


class HeadDistanceDetail(DetailScreen):
    """The histogram over images of one head's mean attention distance, its mean and uniform attention marked."""

    help_text = "Distance of one head, per image"

    def __init__(self, loaded: LoadedView, block: int, head: int, **kwargs) -> None:
        view = loaded.view
        self.block, self.head = block, head  # head: its place in the block sorted by distance, as the view shows it
        self.model_head = int(np.asarray(view.extra["head_order"])[block, head])  # its index in the model
        self.distances: np.ndarray | None = None  # (N,) px, once read
        uniform = np.asarray(
            view.extra.get("uniform_px_per_block", [view.extra["uniform_px"]] * (block + 1)), dtype=float
        )
        self.uniform_px = float(uniform[block])
        title = f"{view.rows[block]} head {self.model_head + 1}: mean attention distance per image"
        super().__init__(loaded, title, **kwargs)

    def facts(self) -> str:
        view = self.view
        return (
            f"the view's mean {number(float(view.matrix[self.block, self.head]), 1)} px over "
            f"{view.n_images} images; uniform attention {self.uniform_px:.1f} px"
        )

    def compose_body(self) -> ComposeResult:
        yield TaskBar(id="detail-task")
        yield Histogram(id="detail-histogram")
        yield Static("", id="detail-legend", classes="detail--caption", markup=False)

    def on_mount(self) -> None:
        self.query_one(TaskBar).start(
            f"reading the distances of {self.view.rows[self.block]} head {self.model_head + 1} per image"
        )
        self._read()

    @work(thread=True, exit_on_error=False)
    def _read(self) -> None:
        worker = get_current_worker()
        try:
            distances = read_head_distances(self.loaded.path, self.view.models[0], self.block, self.model_head)
        except Exception as exc:  # a store replaced under the app: say it, keep the detail open
            self.app.call_from_thread(self._failed, str(exc))
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._show, distances)

    def _failed(self, error: str) -> None:
        if not self.is_attached:  # closed while the worker read
            return
        self.query_one(TaskBar).stop()
        self.query_one("#detail-legend", Static).update(f"cannot read the distances per image: {error}")

    def _show(self, distances: np.ndarray) -> None:
        if not self.is_attached:
            return
        self.query_one(TaskBar).stop()
        self.distances = np.asarray(distances, dtype=np.float64)
        finite = self.distances[np.isfinite(self.distances)]
        edges = np.asarray(self.view.extra["hist_edges"], dtype=float)  # the view's bins: the same axis
        counts = np.histogram(finite, bins=edges)[0]
        mean = float(finite.mean()) if finite.size else float("nan")
        self.query_one(Histogram).show(
            counts,
            edges,
            marker=self.uniform_px,
            marker_name=f"uniform {self.uniform_px:.1f} px",
            unit="px",
            caption="images per bin",
            lines=[mean] if finite.size else [],
        )
        left_out = len(self.distances) - len(finite)
        spread = f"std {finite.std():.1f}, min {finite.min():.1f}, max {finite.max():.1f} px" if finite.size else ""
        self.query_one("#detail-legend", Static).update(
            f"{VALUE_LINE} mean {number(mean, 1)} px over {len(finite)} images; {spread}"
            + (f"; {left_out} non-finite left out" if left_out else "")
        )

    def legend(self) -> list[tuple[str, str]]:
        return [
            ("\u2581\u2583\u2588", "images whose head distance falls in the bin"),
            (VALUE_LINE, "the head's mean distance over the images"),
            ("\u2502 \u25b2", "the distance of uniform attention over the grid"),
        ]


# --- maps: probes per token, spatial, ERF --------------------------------------------------------------------


def token_layout(n_tokens: int, grid: list[int] | tuple[int, ...], prefix: int | None) -> tuple[int, int, int]:
    """Returns (prefix tokens, grid rows, grid columns) of a per-token vector: the view's grid when it fits,
    else the fewest prefix tokens that leave a square (how every ViT in timm lays its tokens out), else a row."""
    if prefix is not None and len(grid) == 2 and n_tokens - prefix == grid[0] * grid[1]:
        return prefix, int(grid[0]), int(grid[1])
    for lead in range(min(n_tokens, 9)):
        side = math.isqrt(n_tokens - lead)
        if side > 0 and side * side == n_tokens - lead:
            return lead, side, side
    return 0, 1, n_tokens


class MapDetail(DetailScreen):
    """A map at 'detail' zoom: every cell with its value, the cell the view was on under the cursor."""

    def __init__(
        self,
        loaded: LoadedView,
        title: str,
        matrix: np.ndarray,
        cursor: tuple[int, int],
        *,
        value_name: str,
        vmin: float | None = None,
        vmax: float | None = None,
        facts: str = "",
        caption: str = "",
        help_text: str = "A map at full size",
        marks: dict | None = None,
        **kwargs,
    ) -> None:
        super().__init__(loaded, title, **kwargs)
        self.marks = marks or {}  # Heatmap's nonfinite / nonfinite_text: cells computed from NaN/Inf, not missing
        self.matrix = np.asarray(matrix, dtype=float)
        self.cursor, self.value_name, self.vmin, self.vmax = cursor, value_name, vmin, vmax
        self.facts_text, self.caption, self.help_text = facts, caption, help_text

    def facts(self) -> str:
        return self.facts_text

    def compose_body(self) -> ComposeResult:
        if self.caption:
            yield Label(self.caption, classes="detail--caption", markup=False)
        rows, cols = self.matrix.shape
        heatmap = Heatmap(
            self.matrix,
            [f"r{i}" for i in range(rows)],
            [f"c{j}" for j in range(cols)],
            vmin=self.vmin,
            vmax=self.vmax,
            cmap=self.cmap,
            color_mode=self.color_mode,
            value_name=self.value_name,
            zoom="detail",
            id="detail-map",
            **self.marks,
        )
        heatmap.set_reactive(Heatmap.cursor, self.cursor)
        heatmap.styles.height = rows + 2  # one line per row at this zoom, the labels and the legend
        yield heatmap

    def legend(self) -> list[tuple[str, str]]:
        return [
            ("0.123", "each cell's value, on its colour"),
            ("[ ]", "the cell the view's cursor was on (arrows move here; z: pooled / 1:1)"),
        ]


def readouts_text(view, row: int) -> str:
    """Returns a probe row's readouts as the status line words them: 'CLS 0.5000 [0.31, 0.69]  GAP ...'."""

    def one(c: int) -> str:
        interval = view.interval_text(row, c) if math.isfinite(view.matrix[row, c]) else ""
        return f"{view.cols[c]} {view.cell_text(row, c)}{interval}"

    return "  ".join(one(c) for c in range(len(view.cols)))


def probe_token_detail(loaded: LoadedView, row: int, **kwargs) -> DetailScreen:
    """Returns the detail of a probe row: its readouts, and the accuracy of the probe of every token as a map."""
    view = loaded.view
    layer = view.rows[row]
    chance = view.extra.get("chance")
    facts = readouts_text(view, row) + (f"\nchance {float(chance):.3f}" if chance is not None else "")
    maps = view.extra.get("token_maps") or {}
    if layer not in maps:
        why = (
            f"no per-token probes: {layer} is wider than {view.params.get('max_token_dim')} channels "
            "(vitsee analyze --probes --probe-max-dim N)"
            if layer in view.extra.get("tokens_too_wide", [])
            else f"no per-token probes for {layer}: they are fitted for the token layers of ViT-like models"
        )
        return TextDetail(loaded, f"{layer}: linear probe accuracy", facts + "\n\n" + why, **kwargs)
    accuracy = np.asarray(maps[layer], dtype=float)
    prefix, gh, gw = token_layout(
        len(accuracy), view.extra.get("grid") or [], view.extra.get("token_prefix", {}).get(layer)
    )
    grid = accuracy[prefix:].reshape(gh, gw)
    if prefix:
        facts += "\nprefix tokens (CLS first): " + ", ".join(number(float(a), 3) for a in accuracy[:prefix])
    if np.isfinite(grid).any():
        best = int(np.nanargmax(grid))
        facts += (
            f"\nspatial tokens: mean {number(float(np.nanmean(grid)), 4)}, "
            f"best r{best // gw}c{best % gw} {number(float(grid.flat[best]), 3)}"
        )
    return MapDetail(
        loaded,
        f"{layer}: test accuracy of a probe on each token",
        grid,
        (0, 0),
        value_name="accuracy",
        vmin=0.0,
        vmax=1.0,
        facts=facts,
        caption=f"{gh}x{gw} token grid, one linear probe per position",
        help_text="Per-token probe accuracy",
        **kwargs,
    )


class TextDetail(DetailScreen):
    """A detail that has only facts to show (a probe row without a token map)."""

    def __init__(self, loaded: LoadedView, title: str, facts: str, **kwargs) -> None:
        super().__init__(loaded, title, **kwargs)
        self.facts_text = facts

    def facts(self) -> str:
        return self.facts_text


# --- curves: a token's skip ratios, a head's CKA with every layer ------------------------------------------


class CurveDetail(DetailScreen):
    """One curve against the rows of a view, the view's row marked, with every value listed under it."""

    DEFAULT_CSS = """
    CurveDetail {
        & #detail-values { height: auto; max-height: 10; }
    }
    """

    def __init__(
        self,
        loaded: LoadedView,
        title: str,
        series: list[Series],
        labels: list[str],
        values: np.ndarray,
        mark: int,
        *,
        facts: str = "",
        hline: float | None = None,
        hline_name: str = "",
        ymin: float | None = None,
        ymax: float | None = None,
        help_text: str = "A curve",
        **kwargs,
    ) -> None:
        super().__init__(loaded, title, **kwargs)
        self.series, self.labels, self.values, self.mark = series, labels, np.asarray(values, dtype=float), mark
        self.facts_text, self.help_text = facts, help_text
        self.hline, self.hline_name, self.ymin, self.ymax = hline, hline_name, ymin, ymax

    def facts(self) -> str:
        return self.facts_text

    def compose_body(self) -> ComposeResult:
        yield LinePlot(id="detail-curve", monochrome=self.color_mode is ColorMode.NONE)
        with VerticalScroll(id="detail-values"):
            yield Static(self.values_text(), markup=False)

    def values_text(self) -> Text:
        """Returns every label with its value, in columns, the marked one bold."""
        cells = [f"{label} {number(float(v), 3)}" for label, v in zip(self.labels, self.values)]
        width = max(map(len, cells)) + 3
        text = Text()
        for i, cell in enumerate(cells):
            text.append(cell.ljust(width), "bold reverse" if i == self.mark else "")
        return text

    def on_mount(self) -> None:
        self.query_one(LinePlot).plot(
            self.series,
            [short_label(label) for label in self.labels],
            mark=self.mark,
            hline=self.hline,
            hline_name=self.hline_name,
            ymin=self.ymin,
            ymax=self.ymax,
        )

    def legend(self) -> list[tuple[str, str]]:
        return [
            ("\u2812\u2812 \u2824\u2824", "the curves (the legend under the plot names them)"),
            ("\u25b2", "the row the view's cursor was on"),
            ("\u2508\u2508", self.hline_name or "a reference value"),
        ]


def skip_token_detail(loaded: LoadedView, row: int, col: int, **kwargs) -> DetailScreen:
    """Returns the ratio curve of the token under the cursor across the sublayers, beside the spatial mean."""
    view = loaded.view
    token = view.cols[col] if view.cols[col].startswith("token") else f"token {view.cols[col]}"  # 'CLS', 'token 3'
    values = np.asarray(view.matrix[:, col], dtype=float)
    series = [
        Series(
            token,
            values,
            None if view.ci_low is None else view.ci_low[:, col],
            None if view.ci_high is None else view.ci_high[:, col],
        )
    ]
    spatial = np.asarray(view.extra.get("spatial_mean", []), dtype=float)
    if len(spatial) == len(values):  # the reference the view's own plot draws
        series.append(Series("spatial tokens (mean)", spatial))
    finite = np.isfinite(values)
    facts = f"{view.rows[row]}: {view.cell_text(row, col)}{view.interval_text(row, col) if finite[row] else ''}"
    if finite.any():
        top = int(np.nanargmax(values))
        facts += f"; largest {number(float(values[top]), 3)} at {view.rows[top]}"
    return CurveDetail(
        loaded,
        f"{token}: ||z||/||f(z)|| across the sublayers",
        series,
        list(view.rows),
        values,
        row,
        facts=facts,
        hline=1.0,
        hline_name="ratio 1",
        help_text="Skip ratio of one token",
        **kwargs,
    )


def heads_layer_detail(loaded: LoadedView, row: int, col: int, **kwargs) -> DetailScreen:
    """Returns the CKA of one head with every layer of the other model, the plotted layer marked."""
    view = loaded.view
    values = np.asarray(view.matrix[row], dtype=float)
    distance = float(np.asarray(view.extra["distance_px"], dtype=float)[row])
    best = int(np.nanargmax(values)) if np.isfinite(values).any() else col
    facts = (
        f"mean attention distance {number(distance, 1)} px; CKA with {view.cols[col]} {number(float(values[col]))}; "
        f"highest with {view.cols[best]} {number(float(values[best]))}"
    )
    return CurveDetail(
        loaded,
        f"{view.rows[row]}: CKA with every layer of {view.models[-1]}",
        [Series(f"CKA({view.rows[row]}, layer)", values)],
        list(view.cols),
        values,
        col,
        facts=facts,
        ymin=0.0,
        ymax=1.0,
        help_text="CKA of one head",
        **kwargs,
    )


def spatial_token_detail(loaded: LoadedView, token: int, grid: tuple[int, int], **kwargs) -> DetailScreen:
    """Returns the map of one token position at full size: its CKA with the pixels of every input patch."""
    view = loaded.view
    gh, gw = grid
    values = np.asarray(view.matrix[token], dtype=float)
    name = f"r{token // gw}c{token % gw}"
    interval = view.interval_text(token, token) if math.isfinite(values[token]) else ""
    facts = f"own patch {name}: CKA {view.cell_text(token, token)}{interval}"
    marks = (
        {}
        if view.nonfinite is None
        else {
            "nonfinite": view.nonfinite[token].reshape(gh, gw),
            "nonfinite_text": lambda i, j: view.nonfinite_text(token, i * gw + j),
        }
    )
    if np.isfinite(values).any():
        peak = int(np.nanargmax(values))
        facts += f"; peak patch r{peak // gw}c{peak % gw} {values[peak]:.4f}"
    return MapDetail(
        loaded,
        f"token {name} of {view.params.get('layer')}: CKA with each input patch",
        values.reshape(gh, gw),
        (token // gw, token % gw),
        value_name="CKA",
        vmin=view.vmin,
        vmax=view.vmax,
        facts=facts,
        caption=f"{gh}x{gw} patches of {view.extra.get('patch_px')} px",
        help_text="Spatial map of one token",
        marks=marks,
        **kwargs,
    )


def erf_detail(
    loaded: LoadedView, cursor: tuple[int, int], log_scale: bool, floor_decades: int, **kwargs
) -> DetailScreen:
    """Returns the ERF at full size with its values: log10 of each pixel's share when the view is in log colours,
    else the share in percent (shares of a whole map are too small to read as fractions)."""
    view = loaded.view
    shares = np.asarray(view.matrix, dtype=float)
    peak = float(np.nanmax(shares)) if np.isfinite(shares).any() and np.nanmax(shares) > 0 else 1.0
    if log_scale:
        floor = peak * 10.0**-floor_decades
        matrix = np.log10(np.maximum(np.nan_to_num(shares, nan=floor), floor))
        name, vmin, vmax = "log10 share", float(np.log10(floor)), float(np.log10(peak))
    else:
        matrix, name, vmin, vmax = shares * 100.0, "% of the total", 0.0, peak * 100.0
    r, c = cursor
    at = np.unravel_index(int(np.nanargmax(shares)), shares.shape) if np.isfinite(shares).any() else (r, c)
    facts = (
        f"pixel row {r} col {c}: {shares[r, c]:.3g} of the total ({shares[r, c] * 100:.3f}%); "
        f"peak at row {at[0]} col {at[1]}: {shares[at]:.3g}; {view.params.get('erf_images')} images"
    )
    return MapDetail(
        loaded,
        f"{view.params.get('layer')}: effective receptive field per input pixel",
        matrix,
        (r, c),
        value_name=name,
        vmin=vmin,
        vmax=vmax,
        facts=facts,
        caption=("log10 of each pixel's share" if log_scale else "each pixel's share in percent")
        + " (g in the view switches)",
        help_text="Effective receptive field",
        **kwargs,
    )

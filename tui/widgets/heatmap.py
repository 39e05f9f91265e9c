"""The matrix heatmap (CKA layer x layer and friends): a line-API view with a cell cursor.

Two matrix rows share a terminal row: the upper cell is the foreground of an upper-half block and the
lower cell its background, so a 24-line terminal shows 44 layers. Without colour, each matrix row
gets a line of ASCII density characters instead. Row labels sit in a fixed gutter on the left; the
column labels and a legend sit in two fixed lines below the grid; only the grid scrolls.

Lines are rendered into an LRU cache of Strips keyed by what makes a line different, and a cursor
move repaints just the cells and labels it left and entered, which keeps a move under a kilobyte on
the wire even on a 200 x 200 matrix over SSH (benchmarks/tui.py measures it).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from vitsee.output.colormap import DEFAULT_LEVELS, MISSING, ColorMode, ColorScale, Palette, detect_color_mode
from vitsee.tui.widgets.axis_labels import (
    AxisLabels,
    abbreviate_label,
    fit_labels,
    layout_axis_labels,
    shared_line_labels,
    short_label,
)

ZOOMS = ("fit", "1:1", "detail")
UPPER_HALF = "\u2580"  # ▀
FULL_BLOCK = "\u2588"  # █
MISSING_GLYPH = "\u00b7"  # · a cell not computed yet
NONFINITE_GLYPH = "\u00d7"  # × a cell computed from NaN/Inf inputs
NONFINITE_ASCII = "!"
NONFINITE = MISSING - 2  # its level (MISSING - 1 is "below the last row")
FOOTER_LINES = 2  # column labels (more lines when they stand upright), legend
MAX_ROW_LABEL = 12
MARKED = MISSING - 3  # the level of a marked cell (MISSING - 1 is "below the last row", - 2 non-finite)
MARK_CHAR = "x"  # a marked cell without colour: not in the ASCII density ramp


def cursor_mark(width: int) -> str:
    """Return the glyphs drawn over the cursor cell: corner marks no value's half block looks like."""
    return "+" if width == 1 else "[" + " " * (width - 2) + "]"


@dataclass(frozen=True)
class _Layout:
    """Where matrix cells land on the terminal for one zoom, size and colour mode.

    The matrix is first pooled by (pool_rows, pool_cols) into `shown` cells; each shown cell covers
    cell_h sub-rows (half lines with half blocks, whole lines without) and cell_w characters.
    Grid coordinates are virtual (before scrolling) and exclude the label gutter.
    """

    zoom: str
    half_blocks: bool
    pool_rows: int
    pool_cols: int
    cell_h: int
    cell_w: int
    shown_rows: int
    shown_cols: int
    gutter: int  # row label width, including one blank column before the grid
    view_lines: int  # grid lines that fit on screen
    view_width: int  # grid characters that fit on screen

    @property
    def sub_rows_per_line(self) -> int:
        return 2 if self.half_blocks else 1

    @property
    def grid_lines(self) -> int:
        return -(-self.shown_rows * self.cell_h // self.sub_rows_per_line)

    @property
    def grid_width(self) -> int:
        return self.shown_cols * self.cell_w

    def shown_row_at(self, sub_row: int) -> int | None:
        """Return the shown row drawn in a sub-row, or None below the matrix."""
        row = sub_row // self.cell_h
        return row if row < self.shown_rows else None

    def cell_lines(self, row: int) -> tuple[int, int]:
        """Return the first and last grid line (virtual) that matrix row `row` is drawn on."""
        shown = row // self.pool_rows
        per_line = self.sub_rows_per_line
        return shown * self.cell_h // per_line, ((shown + 1) * self.cell_h - 1) // per_line

    def cell_span(self, col: int) -> tuple[int, int]:
        """Return the first and one-past-last grid character (virtual) of matrix column `col`."""
        shown = col // self.pool_cols
        return shown * self.cell_w, (shown + 1) * self.cell_w


class Heatmap(ScrollView, can_focus=True, inherit_bindings=False):
    """A matrix as a heatmap with labelled rows and columns, a legend and a cell cursor.

    Args:
        matrix: 2-D values; NaN marks cells not computed yet, unless `nonfinite` marks them.
        nonfinite: 2-D bool, the cells that were computed and are NaN/Inf (drawn apart, with their own legend).
        nonfinite_text: (row, col) -> what the status line says of such a cell ('non-finite (3 of 48 images)').
        row_labels / col_labels: one name per row / column (layer names); default: indices.
        vmin / vmax: the value range of the colour scale; default: the matrix's finite min / max.
        cmap: 'viridis', 'magma' or 'cividis'.
        color_mode: what the terminal can show; default: detected from the environment.
        value_name: what the values are, for the legend and status ('CKA').
        title: shown at the end of the legend line.
        levels: number of colour levels (16-32 reads well).
        label_chars: the widest a row label may be (a quarter of the width at most), and a column label.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1, 0)", "Up", show=False, id="heatmap.up", tooltip="Move the cursor up one row"),
        Binding("down,j", "move(1, 0)", "Down", show=False, id="heatmap.down", tooltip="Move the cursor down one row"),
        Binding(
            "left,h", "move(0, -1)", "Left", show=False, id="heatmap.left", tooltip="Move the cursor left one column"
        ),
        Binding(
            "right,l", "move(0, 1)", "Right", show=False, id="heatmap.right", tooltip="Move the cursor right one column"
        ),
        Binding(
            "pageup", "page(-1)", "Page up", show=False, id="heatmap.page_up", tooltip="Move the cursor up a screenful"
        ),
        Binding(
            "pagedown",
            "page(1)",
            "Page down",
            show=False,
            id="heatmap.page_down",
            tooltip="Move the cursor down a screenful",
        ),
        Binding(
            "home", "jump_row(0)", "First row", show=False, id="heatmap.first_row", tooltip="Jump to the first row"
        ),
        Binding("end", "jump_row(-1)", "Last row", show=False, id="heatmap.last_row", tooltip="Jump to the last row"),
        Binding(
            "shift+home",
            "jump_col(0)",
            "First column",
            show=False,
            id="heatmap.first_col",
            tooltip="Jump to the first column",
        ),
        Binding(
            "shift+end",
            "jump_col(-1)",
            "Last column",
            show=False,
            id="heatmap.last_col",
            tooltip="Jump to the last column",
        ),
        Binding(
            "z", "cycle_zoom", "Zoom", id="heatmap.zoom", tooltip="Cycle zoom: fit (pooled) / 1:1 / detail with values"
        ),
        Binding(
            "enter", "select_cell", "Select", id="heatmap.select", tooltip="Select the layer pair under the cursor"
        ),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "heatmap--label",
        "heatmap--label-cursor",
        "heatmap--legend",
        "heatmap--missing",
        "heatmap--nonfinite",
        "heatmap--cursor",
        "heatmap--ink-on-dark",
        "heatmap--ink-on-light",
    }
    """
| Class | Used for |
| :- | :- |
| `heatmap--label` | Row and column labels. |
| `heatmap--label-cursor` | The labels of the cursor's row and column. |
| `heatmap--legend` | The legend text. |
| `heatmap--missing` | Cells not computed yet (colour = glyph, background = the hole). |
| `heatmap--nonfinite` | Cells computed from NaN/Inf inputs (colour = glyph and half block). |
| `heatmap--cursor` | The cursor where it is drawn with text attributes (values, ASCII). |
| `heatmap--ink-on-dark` / `heatmap--ink-on-light` | Text and the cursor's corner marks drawn on a dark / light level. |
    """

    DEFAULT_CSS = """
    Heatmap {
        background: $surface;
        color: $foreground;
        /* The labels and the legend already say which rows and columns are in view. Scrollbars would
           also be repainted on every layout of the screen (any status line update), some 8 KB a move. */
        scrollbar-size: 0 0;
        & > .heatmap--label { color: $text-muted; }
        & > .heatmap--label-cursor { color: $foreground; text-style: bold reverse; }
        & > .heatmap--legend { color: $text-muted; }
        & > .heatmap--missing { color: $text-muted; background: $panel; }
        & > .heatmap--nonfinite { color: $error; background: $panel; }
        & > .heatmap--cursor { text-style: bold reverse; }
        & > .heatmap--ink-on-dark { color: #ffffff; }
        & > .heatmap--ink-on-light { color: #000000; }
    }
    """

    cursor: reactive[tuple[int, int]] = reactive((0, 0), repaint=False, init=False)
    """(row, col) of the selected cell, in matrix coordinates whatever the zoom."""
    zoom: reactive[str] = reactive("fit", init=False)
    """'fit' (pooled to the window), '1:1' (one square cell per matrix cell) or 'detail' (values)."""
    color_mode: reactive[ColorMode] = reactive(ColorMode.TRUECOLOR, init=False)

    class CursorMoved(Message):
        """The cursor moved to another cell (also sent once on mount and after `set_data`)."""

        def __init__(self, heatmap: Heatmap, row: int, col: int, row_label: str, col_label: str, value: float) -> None:
            super().__init__()
            self.heatmap = heatmap
            self.row, self.col = row, col
            self.row_label, self.col_label = row_label, col_label
            self.value = value

        @property
        def control(self) -> Heatmap:
            return self.heatmap

        @property
        def summary(self) -> str:
            """Return the status line text, e.g. 'blocks.3 x blocks.7  CKA 0.8123'."""
            value = self.heatmap.describe(self.row, self.col)
            return f"{self.row_label} x {self.col_label}  {self.heatmap.value_name} {value}"

    class CellSelected(Message):
        """Enter was pressed on a cell."""

        def __init__(self, heatmap: Heatmap, row: int, col: int, value: float) -> None:
            super().__init__()
            self.heatmap = heatmap
            self.row, self.col, self.value = row, col, value

        @property
        def control(self) -> Heatmap:
            return self.heatmap

    def __init__(
        self,
        matrix: np.ndarray,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        *,
        vmin: float | None = None,
        vmax: float | None = None,
        cmap: str = "viridis",
        color_mode: ColorMode | str | None = None,
        value_name: str = "CKA",
        title: str | None = None,
        levels: int = DEFAULT_LEVELS,
        zoom: str = "fit",
        nonfinite: np.ndarray | None = None,
        nonfinite_text: Callable[[int, int], str] | None = None,
        label_chars: int = MAX_ROW_LABEL,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.label_chars = label_chars
        self._nonfinite, self._nonfinite_text = nonfinite, nonfinite_text
        self.value_name = value_name
        self.title = title
        self._cmap, self._levels_count = cmap, levels
        self._vmin, self._vmax = vmin, vmax
        self._line_cache: LRUCache[tuple, Strip] = LRUCache(maxsize=1024)
        self._looks: dict[tuple, tuple[str, Style]] = {}
        self._component_rich_styles: dict[str, Style] = {}
        self._layout: _Layout | None = None
        self._layout_key: tuple | None = None
        self._generation = 0  # bumped by every new matrix
        self._marks: np.ndarray | None = None  # bool, like the matrix: cells drawn as marked (e.g. not significant)
        self._load(matrix, row_labels, col_labels)
        self.set_reactive(
            Heatmap.color_mode, detect_color_mode() if color_mode is None else ColorMode.parse(color_mode)
        )
        self.set_reactive(Heatmap.zoom, self.validate_zoom(zoom))

    # --- Data -----------------------------------------------------------------------------------------

    def _load(self, matrix: np.ndarray, row_labels: Sequence[str] | None, col_labels: Sequence[str] | None) -> None:
        matrix = np.asarray(matrix, dtype=np.float64)
        if matrix.ndim != 2 or 0 in matrix.shape:
            raise ValueError(f"Heatmap needs a non-empty 2-D matrix, got shape {matrix.shape}")
        rows, cols = matrix.shape
        row_labels = [str(i) for i in range(rows)] if row_labels is None else [str(label) for label in row_labels]
        col_labels = [str(i) for i in range(cols)] if col_labels is None else [str(label) for label in col_labels]
        if len(row_labels) != rows or len(col_labels) != cols:
            raise ValueError(f"{len(row_labels)} row / {len(col_labels)} column labels for a {rows} x {cols} matrix")
        self._matrix = matrix
        self.row_labels, self.col_labels = row_labels, col_labels
        self.scale = ColorScale.for_matrix(
            matrix, vmin=self._vmin, vmax=self._vmax, levels=self._levels_count, cmap=self._cmap
        )
        finite = np.abs(matrix[np.isfinite(matrix)])
        largest = float(finite.max()) if finite.size else 1.0
        self._value_format = "{:.3f}" if largest < 10 else "{:.2f}" if largest < 1000 else "{:.3g}"
        self._value_width = max(len(self._value_format.format(v)) for v in (largest, -largest))
        self._generation += 1
        self._layout_key = None

    def set_scale(self, vmin: float | None, vmax: float | None, value_name: str) -> None:
        """Set the value range (None: from the data) and the values' name for the next set_data, which draws them:
        for a pane whose view changes what it measures (the zoo's measure: 0-1 CKA, then a distance)."""
        self._vmin, self._vmax, self.value_name = vmin, vmax, value_name

    def set_data(
        self,
        matrix: np.ndarray,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        *,
        vmin: float | None = None,
        vmax: float | None = None,
        nonfinite: np.ndarray | None = None,
        nonfinite_text: Callable[[int, int], str] | None = None,
    ) -> None:
        """Show a new matrix (e.g. more cells computed); labels and value range are kept unless given
        (the non-finite marks belong to the matrix: none unless given).

        Call it on the app's thread: from a thread worker, through `app.call_from_thread`.
        """
        matrix = np.asarray(matrix, dtype=np.float64)
        if row_labels is None and matrix.shape[0] == len(self.row_labels):
            row_labels = self.row_labels
        if col_labels is None and matrix.ndim == 2 and matrix.shape[1] == len(self.col_labels):
            col_labels = self.col_labels
        self._vmin = self._vmin if vmin is None else vmin
        self._vmax = self._vmax if vmax is None else vmax
        self._nonfinite, self._nonfinite_text = nonfinite, nonfinite_text
        self._load(matrix, row_labels, col_labels)
        self._invalidate()
        self.set_reactive(Heatmap.cursor, self.validate_cursor(self.cursor))
        if self.is_mounted:
            self._ensure_layout()
            self._post_cursor_moved()

    @property
    def matrix(self) -> np.ndarray:
        return self._matrix

    @property
    def cmap(self) -> str:
        return self._cmap

    def set_cmap(self, cmap: str) -> None:
        """Redraw with another colormap ('viridis', 'magma', 'cividis'); data and cursor stay."""
        if cmap != self._cmap:
            self._cmap = cmap
            self._load(self._matrix, self.row_labels, self.col_labels)
            self._invalidate()

    def value_at(self, row: int, col: int) -> float:
        """Return the value of a matrix cell (NaN when not computed or non-finite)."""
        return float(self._matrix[row, col])

    def is_nonfinite(self, row: int, col: int) -> bool:
        """Return whether a cell was computed and is NaN/Inf."""
        return (
            self._nonfinite is not None
            and bool(self._nonfinite[row, col])
            and not math.isfinite(self._matrix[row, col])
        )

    def describe(self, row: int, col: int) -> str:
        """Return a cell's value as the status line says it: '0.8123', 'non-finite (...)' or 'not computed'."""
        value = self.value_at(row, col)
        if math.isfinite(value):
            return f"{value:.4f}"
        if self.is_nonfinite(row, col):
            return self._nonfinite_text(row, col) if self._nonfinite_text else "non-finite"
        return "not computed"

    # --- Reactives ------------------------------------------------------------------------------------

    def validate_cursor(self, cursor: tuple[int, int]) -> tuple[int, int]:
        rows, cols = self._matrix.shape
        row, col = cursor
        return (min(max(int(row), 0), rows - 1), min(max(int(col), 0), cols - 1))

    def validate_zoom(self, zoom: str) -> str:
        if zoom not in ZOOMS:
            raise ValueError(f"zoom must be one of {ZOOMS}, got {zoom!r}")
        return zoom

    def validate_color_mode(self, mode: ColorMode | str) -> ColorMode:
        return ColorMode.parse(mode)

    def watch_cursor(self, old: tuple[int, int], new: tuple[int, int]) -> None:
        if self._ensure_layout() is None:
            return
        self.refresh(*{*self._cursor_regions(old), *self._cursor_regions(new)})
        self._scroll_to_cursor()
        self._post_cursor_moved()

    def watch_zoom(self) -> None:
        self._invalidate()
        if self._ensure_layout() is not None:
            self._scroll_to_cursor(center=True)

    def watch_color_mode(self) -> None:
        self._invalidate()

    def _invalidate(self) -> None:
        """Forget every rendered line and look, and repaint."""
        self._line_cache.clear()
        self._looks.clear()
        self._component_rich_styles.clear()
        self._layout_key = None
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._line_cache.clear()
        self._looks.clear()
        self._component_rich_styles.clear()

    def on_mount(self) -> None:
        self._ensure_layout()
        self._post_cursor_moved()

    def on_resize(self) -> None:
        self._line_cache.clear()
        if self._ensure_layout() is not None:
            self._scroll_to_cursor(center=True)

    # --- Layout ---------------------------------------------------------------------------------------

    @property
    def palette(self) -> Palette:
        return self.scale.palette(self.color_mode)

    def _ensure_layout(self) -> _Layout | None:
        """Return the layout for the current size, zoom and data, recomputing it when they changed."""
        outer = self.content_size
        if outer.width <= 0 or outer.height <= 0:
            return None
        inner = self.scrollable_content_region.size
        key = (self.zoom, self.color_mode, outer, inner, self._generation)
        if key != self._layout_key:
            layout = self._compute_layout(outer, inner)
            shared = self._shared_row_labels(layout, outer)
            if shared is not None and (gutter := max(len("".join(p)) for p in shared) + 1) > layout.gutter:
                layout = self._compute_layout(outer, inner, gutter=gutter)  # two rows a line: a gutter naming both
                if self._shared_row_labels(layout, outer) is None:
                    shared = None
            self._layout, self._layout_key = layout, key
            self._row_texts = fit_labels(self.row_labels, layout.gutter - 1)
            self._row_lines = self._place_row_labels(layout, shared)
            self._shown_levels, self._shown_values = self._pool(layout)
            self._col_axes: dict[int, AxisLabels] = {}
            self._label_lines = self._col_axis(layout, self.cursor[1]).lines
            self._line_cache.clear()
            self.virtual_size = Size(
                layout.gutter + layout.grid_width, layout.grid_lines + self._label_lines + FOOTER_LINES - 1
            )
        return self._layout

    def _row_label_width(self, outer: Size) -> int:
        return min(self.label_chars, max(outer.width // 4, 3))

    def _compute_layout(self, outer: Size, inner: Size, gutter: int | None = None) -> _Layout:
        rows, cols = self._matrix.shape
        zoom = self.zoom
        half_blocks = zoom != "detail" and self.color_mode is not ColorMode.NONE
        per_line = 2 if half_blocks else 1
        unit_w = 1 if half_blocks else 2  # characters per square cell: a character is about twice as tall as wide
        if gutter is None:
            gutter = max(map(len, fit_labels(self.row_labels, self._row_label_width(outer)))) + 1
        view_lines = max(inner.height - FOOTER_LINES, 1)
        view_width = max(inner.width - gutter, 1)
        pool_rows = pool_cols = cell_h = 1
        cell_w = unit_w
        if zoom == "detail":
            cell_w = self._value_width + 1
        elif zoom == "fit":
            # Fit the window without scrollbars: size from the whole content area.
            fit_v = max(outer.height - FOOTER_LINES, 1) * per_line  # square units down
            fit_h = max((outer.width - gutter) // unit_w, 1)  # square units across
            if rows <= fit_v and cols <= fit_h:
                scale = min(fit_v // rows, fit_h // cols)  # same factor both ways keeps cells square
                cell_h, cell_w = scale, scale * unit_w
            else:  # too big: average blocks of cells
                pool_rows, pool_cols = math.ceil(rows / fit_v), math.ceil(cols / fit_h)
                if pool_rows > 1 and pool_cols > 1:  # both axes pooled: one factor keeps cells square
                    pool_rows = pool_cols = max(pool_rows, pool_cols)
        return _Layout(
            zoom=zoom,
            half_blocks=half_blocks,
            pool_rows=pool_rows,
            pool_cols=pool_cols,
            cell_h=cell_h,
            cell_w=cell_w,
            shown_rows=math.ceil(rows / pool_rows),
            shown_cols=math.ceil(cols / pool_cols),
            gutter=gutter,
            view_lines=view_lines,
            view_width=view_width,
        )

    def set_marks(self, marks: np.ndarray | None) -> None:
        """Draw the cells where marks (bool, the matrix's shape) is True as marked: grey, or 'x' without colour."""
        marks = None if marks is None else np.asarray(marks, dtype=bool)
        if marks is not None and marks.shape != self._matrix.shape:
            raise ValueError(f"marks of shape {marks.shape} for a {self._matrix.shape} matrix")
        if (marks is None) != (self._marks is None) or (marks is not None and not np.array_equal(marks, self._marks)):
            self._marks = marks
            self._invalidate()

    def _pool(self, layout: _Layout) -> tuple[np.ndarray, np.ndarray]:
        """Return the levels and values of the shown cells: block means of the matrix when pooled."""
        values = self._matrix
        marks = self._marks
        pr, pc = layout.pool_rows, layout.pool_cols
        if pr > 1 or pc > 1:
            rows, cols = values.shape
            padded = np.full((layout.shown_rows * pr, layout.shown_cols * pc), np.nan)
            padded[:rows, :cols] = values
            blocks = padded.reshape(layout.shown_rows, pr, layout.shown_cols, pc)
            with warnings.catch_warnings():  # a block with no computed cell stays NaN
                warnings.simplefilter("ignore", category=RuntimeWarning)
                values = np.nanmean(blocks, axis=(1, 3))
            if marks is not None:  # a pooled cell is marked when every cell in it is
                full = np.ones(padded.shape, dtype=bool)
                full[:rows, :cols] = marks
                marks = full.reshape(blocks.shape).all(axis=(1, 3))
        levels = self.scale.quantize(values)
        if self._nonfinite is not None and self._nonfinite.any():  # nothing finite to show, NaN/Inf behind it
            flagged = np.zeros((layout.shown_rows * pr, layout.shown_cols * pc), dtype=bool)
            flagged[: self._matrix.shape[0], : self._matrix.shape[1]] = self._nonfinite
            flagged = flagged.reshape(layout.shown_rows, pr, layout.shown_cols, pc).any(axis=(1, 3))
            levels[flagged & np.isnan(values)] = NONFINITE
        if marks is not None:
            levels = np.where(marks & (levels != MISSING) & (levels != NONFINITE), MARKED, levels)
        return levels, values

    def _shared_row_labels(self, layout: _Layout, outer: Size) -> list[tuple[str, str, str]] | None:
        """Return one label per grid line naming both rows drawn on it, or None (rows have lines of their own,
        or the pairs do not fit the gutter)."""
        rows = len(self.row_labels)
        if not layout.half_blocks or layout.cell_h != 1 or layout.pool_rows != 1 or rows < 2:
            return None
        upper, lower = self.row_labels[0::2], self.row_labels[1::2]
        shared = shared_line_labels(upper[: len(lower)], lower, self._row_label_width(outer))
        if shared is not None and len(upper) > len(lower):  # an odd last row has its line to itself
            shared.append(("", abbreviate_label(short_label(self.row_labels[-1]), self._row_label_width(outer)), ""))
        return shared

    def _place_row_labels(
        self, layout: _Layout, shared: list[tuple[str, str, str]] | None
    ) -> dict[int, list[tuple[int | None, str]]]:
        """Return, per grid line, its label as pieces (matrix row or None, text): the cursor's piece is the
        one highlighted; a line without the cursor's piece shows the cursor's label instead, on its line."""
        if shared is not None:
            return {
                line: [(None, p), (2 * line, a)] + ([(None, "/"), (2 * line + 1, b[1:])] if b else [])
                for line, (p, a, b) in enumerate(shared)
            }
        texts = self._row_texts
        lines: dict[int, list[tuple[int | None, str]]] = {}
        for row in range(0, len(self.row_labels), layout.pool_rows):  # a pooled cell: its first row names it
            lines.setdefault(layout.cell_lines(row)[0], [(row, texts[row])])
        return lines

    def _col_axis(self, layout: _Layout, cursor_col: int) -> AxisLabels:
        """Return the column labels for a cursor column: none overlaps another, the cursor's always shown."""
        axis = self._col_axes.get(cursor_col)
        if axis is None:
            positions = [layout.cell_span(col)[0] for col in range(len(self.col_labels))]
            # upright labels only where the grid leaves lines free below it (a fitted grid rarely does)
            free = layout.view_lines + 1 - layout.grid_lines
            axis = self._col_axes[cursor_col] = layout_axis_labels(
                self.col_labels,
                positions,
                layout.grid_width,
                cursor_col,
                max_chars=self.label_chars,
                max_lines=free if self._label_lines_allowed(layout) else 1,
            )
        return axis

    def _label_lines_allowed(self, layout: _Layout) -> bool:
        # every cursor must get the same number of label lines: vertical labels are only ever chosen when
        # they show every label (then the choice does not depend on the cursor)
        return layout.grid_lines <= layout.view_lines

    # --- Rendering ------------------------------------------------------------------------------------

    def _style(self, component: str) -> Style:
        """Return a component style; in NONE mode only its attributes (bold, reverse), never a colour."""
        try:
            return self._component_rich_styles[component]
        except KeyError:
            style = self.get_component_rich_style(component)
            if self.color_mode is ColorMode.NONE:
                style = style.without_color
            self._component_rich_styles[component] = style
            return style

    @property
    def _base_style(self) -> Style:
        return Style() if self.color_mode is ColorMode.NONE else self.rich_style

    def render_lines(self, crop: Region) -> list[Strip]:
        self._ensure_layout()
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        layout = self._ensure_layout()
        if layout is None:
            return Strip.blank(self.size.width)
        scroll_x, scroll_y = self.scroll_offset
        grid_y = y + scroll_y
        label_y = min(layout.grid_lines - scroll_y, layout.view_lines)
        cursor_row, cursor_col = self.cursor
        if y < label_y:
            first, last = layout.cell_lines(cursor_row)
            on_line = first <= grid_y <= last
            key = ("grid", grid_y, scroll_x, layout.zoom, self.color_mode, self.cursor if on_line else None)
            render = lambda: self._render_grid_line(layout, grid_y, scroll_x, on_line)  # noqa: E731
        elif y < label_y + self._label_lines:
            line = y - label_y
            key = ("labels", line, scroll_x, layout.zoom, self.color_mode, cursor_col)
            render = lambda: self._render_col_labels(layout, scroll_x, line)  # noqa: E731
        elif y == label_y + self._label_lines:
            key = ("legend", layout.zoom, self.color_mode, self.size.width, scroll_x, scroll_y)
            render = lambda: self._render_legend(layout)  # noqa: E731
        else:
            return Strip.blank(self.size.width, self._base_style)
        strip = self._line_cache.get(key)
        if strip is None:
            strip = self._line_cache[key] = render()
        return strip

    def _render_grid_line(self, layout: _Layout, grid_y: int, scroll_x: int, on_cursor_line: bool) -> Strip:
        cursor_row, cursor_col = self.cursor
        per_line = layout.sub_rows_per_line
        sub_rows = [layout.shown_row_at(grid_y * per_line + i) for i in range(per_line)]
        cursor_shown = (cursor_row // layout.pool_rows, cursor_col // layout.pool_cols)

        # Row label: the rows that start on this line; on the cursor's line, the cursor's piece highlighted
        # (or the cursor's label alone, when this line's label does not name its row).
        plain, highlight = self._style("heatmap--label"), self._style("heatmap--label-cursor")
        pieces = self._row_lines.get(grid_y, [])
        first_line = layout.cell_lines(cursor_row)[0]
        if on_cursor_line and not any(row == cursor_row for row, _ in self._row_lines.get(first_line, [])):
            # the cursor's row has no label of its own (pooled, or thinned): it takes its first line's
            pieces = [(cursor_row, self._row_texts[cursor_row])] if grid_y == first_line else []
        pad = layout.gutter - 1 - sum(len(text) for _, text in pieces)
        segments = [Segment(" " * pad, plain)] if pad > 0 else []
        segments += [
            Segment(text, highlight if on_cursor_line and row == cursor_row else plain) for row, text in pieces if text
        ]
        segments.append(Segment(" ", self._base_style))

        # Grid cells in view, one run per shown cell, merged when neighbours look the same.
        end_x = min(scroll_x + layout.view_width, layout.grid_width)
        text_run, style_run = "", None
        for shown_col in range(scroll_x // layout.cell_w, -(-end_x // layout.cell_w)):
            left, right = shown_col * layout.cell_w, (shown_col + 1) * layout.cell_w
            cursor_here = tuple(
                shown is not None and on_cursor_line and (shown, shown_col) == cursor_shown for shown in sub_rows
            )
            text, style = self._cell_look(layout, sub_rows, shown_col, cursor_here)
            text = text[max(scroll_x, left) - left : min(end_x, right) - left]
            if style == style_run:
                text_run += text
            else:
                if text_run:
                    segments.append(Segment(text_run, style_run))
                text_run, style_run = text, style
        if text_run:
            segments.append(Segment(text_run, style_run))
        return Strip(segments)

    def _cell_look(
        self, layout: _Layout, sub_rows: list[int | None], shown_col: int, cursor_here: tuple[bool, ...]
    ) -> tuple[str, Style]:
        """Return the characters and style of one shown cell column on one line."""
        levels = tuple(MISSING - 1 if row is None else int(self._shown_levels[row, shown_col]) for row in sub_rows)
        if layout.zoom == "detail":
            row = sub_rows[0]
            if row is None:
                return " " * layout.cell_w, self._base_style
            value = self._shown_values[row, shown_col]
            glyph = NONFINITE_GLYPH if levels[0] == NONFINITE else MISSING_GLYPH
            text = glyph if np.isnan(value) else self._value_format.format(value)
            if levels[0] == MARKED:  # readable without colour too
                text += MARK_CHAR
            text = text.rjust(layout.cell_w)[-layout.cell_w :]
            key = ("detail", levels[0], cursor_here[0])
            return text, self._look(key, lambda: self._detail_look(levels[0], cursor_here[0]))[1]
        key = (levels, cursor_here, layout.cell_w)
        return self._look(key, lambda: self._block_look(levels, cursor_here, layout.cell_w))

    def _look(self, key: tuple, make) -> tuple[str, Style]:
        look = self._looks.get(key)
        if look is None:
            look = self._looks[key] = make()
        return look

    def _block_look(self, levels: tuple[int, ...], cursor: tuple[bool, ...], width: int) -> tuple[str, Style]:
        """Return (text, style) for one shown cell: half blocks in colour, density characters without."""
        palette = self.palette
        beyond = MISSING - 1  # below the last matrix row
        if self.color_mode is ColorMode.NONE:
            level = levels[0]
            if level == beyond:
                return " " * width, Style()
            char = {MISSING: palette.missing_char, NONFINITE: NONFINITE_ASCII, MARKED: MARK_CHAR}.get(
                level
            ) or palette.chars[level]
            return char * width, self._style("heatmap--cursor") if cursor[0] else Style()

        missing = self._style("heatmap--missing")
        nonfinite = self._style("heatmap--nonfinite")
        if all(level == MISSING for level in levels) and not any(cursor):
            return MISSING_GLYPH * width, Style(color=missing.color, bgcolor=missing.bgcolor)
        if all(level == NONFINITE for level in levels) and not any(cursor):
            return NONFINITE_GLYPH * width, Style(color=nonfinite.color, bgcolor=nonfinite.bgcolor)

        def color(level: int):
            if level in (MISSING, MARKED):  # a marked cell reads as a grey hole; the legend says which
                return missing.bgcolor
            if level == NONFINITE:
                return nonfinite.color
            if level == beyond:
                return self.rich_style.bgcolor
            return palette.colors[level]

        if any(cursor):
            # The cursor cell keeps its own colour as background under corner marks: a solid ink block read as a
            # value (black is viridis' lowest). The other half-row on this text line yields to it for this cell.
            level = levels[cursor.index(True)]
            light = palette.is_light(level) if level >= 0 else False  # grey panel, red: both dark
            ink = self._style("heatmap--ink-on-light" if light else "heatmap--ink-on-dark")
            return cursor_mark(width), Style(color=ink.color, bgcolor=color(level), bold=True)
        upper, lower = levels
        return UPPER_HALF * width, Style(color=color(upper), bgcolor=color(lower))

    def _detail_look(self, level: int, is_cursor: bool) -> tuple[str, Style]:
        """Return ('', style) for a value cell: its level as background, readable ink on top."""
        palette = self.palette
        if self.color_mode is ColorMode.NONE:
            return "", self._style("heatmap--cursor") if is_cursor else Style()
        if level in (MISSING, NONFINITE, MARKED):
            style = self._style("heatmap--nonfinite" if level == NONFINITE else "heatmap--missing")
        else:
            ink = self._style("heatmap--ink-on-light" if palette.is_light(level) else "heatmap--ink-on-dark")
            style = Style(color=ink.color, bgcolor=palette.colors[level])
        return "", (style + self._style("heatmap--cursor")) if is_cursor else style

    def _render_col_labels(self, layout: _Layout, scroll_x: int, line: int) -> Strip:
        """Return one column label line; the cursor column's label is highlighted in its own slot."""
        width = min(layout.view_width, layout.grid_width - scroll_x)
        axis = self._col_axis(layout, self.cursor[1])
        text = axis.line_text(line, layout.grid_width)[scroll_x : scroll_x + width]
        start = end = 0
        for index, x, label in axis.placed:
            if index == self.cursor[1] and (not axis.vertical or line < len(label)):
                start, end = x - scroll_x, x - scroll_x + (1 if axis.vertical else len(label))
        start, end = max(0, start), max(0, min(end, width))
        plain = self._style("heatmap--label")
        return Strip(
            [
                Segment(" " * layout.gutter, self._base_style),
                Segment(text[:start], plain),
                Segment(text[start:end], self._style("heatmap--label-cursor")),
                Segment(text[end:], plain),
            ]
        )

    def _render_legend(self, layout: _Layout) -> Strip:
        """Return the legend line: zoom, min, the colour ramp, max, what the values are."""
        palette, scale = self.palette, self.scale
        legend = self._style("heatmap--legend")
        fmt = self._value_format
        segments = [Segment(f"{layout.zoom:>{layout.gutter - 1}} {fmt.format(scale.vmin)} ", legend)]
        if self.color_mode is ColorMode.NONE:
            segments.append(Segment("[" + "".join(palette.chars) + "]", legend))
        else:
            segments += [Segment(FULL_BLOCK, Style(color=color)) for color in palette.colors]
        segments.append(Segment(f" {fmt.format(scale.vmax)}  {self.value_name}", legend))
        if layout.grid_lines > layout.view_lines or layout.grid_width > layout.view_width:
            segments.append(Segment(f"  {self._view_extent(layout)}", legend))  # no scrollbars: say where we are
        flagged = self._nonfinite if self._nonfinite is not None else np.zeros(self._matrix.shape, dtype=bool)
        nan = np.isnan(self._matrix)
        if (nan & ~flagged).any():
            glyph = palette.missing_char if self.color_mode is ColorMode.NONE else MISSING_GLYPH
            segments.append(Segment(f"  {glyph} not computed", legend))
        if (nan & flagged).any():
            glyph = NONFINITE_ASCII if self.color_mode is ColorMode.NONE else NONFINITE_GLYPH
            segments.append(Segment(f"  {glyph} non-finite ({int((nan & flagged).sum())} cells)", legend))
        if self._marks is not None and self._marks.any():
            if self.color_mode is ColorMode.NONE:
                segments.append(Segment(f"  {MARK_CHAR} not significant (BH q > 0.05)", legend))
            else:
                segments += [
                    Segment("  "),
                    Segment(FULL_BLOCK, Style(color=self._style("heatmap--missing").bgcolor)),
                    Segment(" not significant (BH q > 0.05)", legend),
                ]
        if self.title:
            segments.append(Segment(f"  {self.title}", legend))
        return Strip(segments).crop(0, self.size.width)

    def _view_extent(self, layout: _Layout) -> str:
        """Return which matrix rows and columns are in view, e.g. 'rows 41-132/200 cols 1-148/200'."""
        rows, cols = self._matrix.shape
        scroll_x, scroll_y = self.scroll_offset
        per_line = layout.sub_rows_per_line
        top = scroll_y * per_line // layout.cell_h * layout.pool_rows
        bottom = min(rows, (scroll_y + layout.view_lines) * per_line // layout.cell_h * layout.pool_rows)
        left = scroll_x // layout.cell_w * layout.pool_cols
        right = min(cols, (scroll_x + layout.view_width) // layout.cell_w * layout.pool_cols)
        return f"rows {top + 1}-{bottom}/{rows} cols {left + 1}-{right}/{cols}"

    # --- Cursor ---------------------------------------------------------------------------------------

    def _cursor_regions(self, cell: tuple[int, int]) -> list[Region]:
        """Return what shows the cursor at `cell`: its characters, its row label, the column label line."""
        layout = self._layout
        scroll_x, scroll_y = self.scroll_offset
        first, last = layout.cell_lines(cell[0])
        left, right = layout.cell_span(cell[1])
        top, height = first - scroll_y, last - first + 1
        label_y = min(layout.grid_lines - scroll_y, layout.view_lines)
        # upright labels only change in the cursor's column; labels along a line may move along the line
        labels = (
            Region(layout.gutter + left - scroll_x, label_y, 1, self._label_lines)
            if self._label_lines > 1
            else Region(0, label_y, self.size.width, 1)
        )
        return [
            Region(layout.gutter + left - scroll_x, top, right - left, height),
            Region(0, top, layout.gutter, height),
            labels,
        ]

    def _scroll_to_cursor(self, center: bool = False) -> None:
        """Scroll so the cursor's cell is in view; a cursor that left the view is brought to the middle."""
        layout = self._layout
        if layout is None:
            return
        scroll_x, scroll_y = self.scroll_offset
        first, last = layout.cell_lines(self.cursor[0])
        left, right = layout.cell_span(self.cursor[1])
        x = y = None
        if center or first < scroll_y or last >= scroll_y + layout.view_lines:
            y = (first + last) // 2 - layout.view_lines // 2
        if center or left < scroll_x or right > scroll_x + layout.view_width:
            x = (left + right) // 2 - layout.view_width // 2
        if x is not None or y is not None:
            self.scroll_to(x=x, y=y, animate=False)

    def _post_cursor_moved(self) -> None:
        row, col = self.cursor
        self.post_message(
            self.CursorMoved(self, row, col, self.row_labels[row], self.col_labels[col], self.value_at(row, col))
        )

    def _rows_per_page(self) -> int:
        layout = self._ensure_layout()
        if layout is None:
            return 1
        return max(1, layout.view_lines * layout.sub_rows_per_line // layout.cell_h * layout.pool_rows)

    def action_move(self, rows: int, cols: int) -> None:
        row, col = self.cursor
        self.cursor = (row + rows, col + cols)

    def action_page(self, pages: int) -> None:
        self.action_move(pages * self._rows_per_page(), 0)

    def action_jump_row(self, row: int) -> None:
        self.cursor = (row % self._matrix.shape[0], self.cursor[1])

    def action_jump_col(self, col: int) -> None:
        self.cursor = (self.cursor[0], col % self._matrix.shape[1])

    def action_cycle_zoom(self) -> None:
        self.zoom = ZOOMS[(ZOOMS.index(self.zoom) + 1) % len(ZOOMS)]

    def action_select_cell(self) -> None:
        row, col = self.cursor
        self.post_message(self.CellSelected(self, row, col, self.value_at(row, col)))

    def on_click(self, event: events.Click) -> None:
        """Move the cursor to the clicked cell; a click on the cursor selects it."""
        layout = self._ensure_layout()
        offset = event.get_content_offset(self)
        if layout is None or offset is None:
            return
        scroll_x, scroll_y = self.scroll_offset
        grid_x = offset.x - layout.gutter + scroll_x
        sub_row = (offset.y + scroll_y) * layout.sub_rows_per_line
        shown_row = layout.shown_row_at(sub_row)
        if grid_x < 0 or grid_x >= layout.grid_width or shown_row is None or offset.y >= layout.view_lines:
            return
        cell = self.validate_cursor((shown_row * layout.pool_rows, grid_x // layout.cell_w * layout.pool_cols))
        if cell == self.cursor:
            self.action_select_cell()
        else:
            self.cursor = cell

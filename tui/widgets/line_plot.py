"""A small line plot drawn with braille dots: a few series against an index, one position marked.

Each character cell holds 2 x 4 dots, so a 40 x 6 plot has 80 x 24 points of resolution. Used for a CKA
row and column in the pair detail, accuracy against depth for the probes, CLS against spatial tokens for
the skip ratios. Each series has its own colour (a colour-blind-safe set, fixed: the theme's accent and
warning are the same orange in textual-dark); without colour the series after the first are drawn as a
glyph of their own at each sample (o, x, +), so the curves can still be told apart, and the legend
shows each one's glyph. The y axis has a tick every few lines; the x labels are laid out by
`layout_axis_labels`, the marked position's label highlighted in its own slot. A series with an interval per sample
(a probe's binomial interval, a skip ratio's t interval) gets a band: a column of BAND glyphs from its low to its high
end at each sample, behind the curve, and a caption line saying what the interval is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from vitsee.tui.widgets.axis_labels import layout_axis_labels
from vitsee.tui.widgets.fit import fit_caption

BRAILLE = 0x2800
# bit of the dot at (x in 0..1, y in 0..3, from the top) of a braille cell
DOT_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
AXIS_WIDTH = 6
MARKERS = ("o", "x", "+")  # series 1, 2, 3 without colour: ASCII, so no terminal draws them double width
TICK_EVERY = 3  # lines between y ticks
SERIES_CLASSES = ("line-plot--series-0", "line-plot--series-1", "line-plot--series-2")
BAND_CLASSES = ("line-plot--band-0", "line-plot--band-1", "line-plot--band-2")
BAND = "\u2506"  # ┆ unlike the braille curves and the ┈ reference line, so it reads without colour


@dataclass
class Series:
    """One curve: a name for the legend, one value per x position (NaN: no point), and optionally the
    low and high ends of an interval per x position (NaN: none there)."""

    name: str
    values: Sequence[float]
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None

    @property
    def has_band(self) -> bool:
        """Returns whether the series carries an interval at some x position."""
        if self.low is None or self.high is None:
            return False
        return bool(
            (np.isfinite(np.asarray(self.low, dtype=float)) & np.isfinite(np.asarray(self.high, dtype=float))).any()
        )


def format_tick(value: float) -> str:
    """Return a y tick label of at most AXIS_WIDTH - 1 characters."""
    if not math.isfinite(value):
        return ""
    for digits in (3, 2, 1, 0):
        text = f"{value:.{digits}f}"
        if len(text) < AXIS_WIDTH:
            return text
    return f"{value:.0e}"


class LinePlot(Widget):
    """Series as braille lines over a shared x axis, with y ticks, x labels at both ends, a legend.

    `mark` draws a column across the plot at one x position (the selected layer); `hline` a dotted
    reference line (chance accuracy, a ratio of 1); `caption` says what the series' intervals are.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *SERIES_CLASSES,
        *BAND_CLASSES,
        "line-plot--axis",
        "line-plot--mark",
        "line-plot--hline",
        "line-plot--mark-label",
    }

    DEFAULT_CSS = """
    LinePlot {
        height: 8;
        /* Okabe-Ito sky blue, orange, bluish green: apart for every kind of colour vision */
        & > .line-plot--series-0 { color: #56b4e9; }
        & > .line-plot--series-1 { color: #e69f00; }
        & > .line-plot--series-2 { color: #009e73; }
        & > .line-plot--band-0 { color: #56b4e9 60%; }
        & > .line-plot--band-1 { color: #e69f00 60%; }
        & > .line-plot--band-2 { color: #009e73 60%; }
        & > .line-plot--axis { color: $text-muted; }
        & > .line-plot--mark { background: $boost; text-style: bold; }
        & > .line-plot--hline { color: $text-muted; }
        & > .line-plot--mark-label { color: $foreground; text-style: bold reverse; }
    }
    """

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None, monochrome: bool = False
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.series: list[Series] = []
        self.x_labels: list[str] = []
        self.ymin: float | None = None
        self.ymax: float | None = None
        self.mark: int | None = None
        self.hline: float | None = None
        self.hline_name = ""
        self.caption = ""
        self.monochrome = monochrome

    def plot(
        self,
        series: Sequence[Series],
        x_labels: Sequence[str],
        *,
        ymin: float | None = None,
        ymax: float | None = None,
        mark: int | None = None,
        hline: float | None = None,
        hline_name: str = "",
        caption: str = "",
    ) -> None:
        """Show new data (a length-0 series list clears the plot); `caption` names the intervals, if any."""
        self.series = list(series)
        self.x_labels = list(x_labels)
        self.ymin, self.ymax, self.mark, self.hline, self.hline_name = ymin, ymax, mark, hline, hline_name
        self.caption = caption
        self.refresh()

    @property
    def has_bands(self) -> bool:
        """Returns whether any series has an interval to draw (then a caption line sits under the legend)."""
        return any(s.has_band for s in self.series)

    def set_mark(self, mark: int | None) -> None:
        if mark != self.mark:
            self.mark = mark
            self.refresh()

    # --- drawing ----------------------------------------------------------------------------------------

    def _y_range(self) -> tuple[float, float]:
        # the bands too, so an interval is not cut off where the axis is not fixed (skip ratios)
        arrays = [np.asarray(a, dtype=float) for s in self.series for a in (s.values, s.low, s.high) if a is not None]
        values = np.concatenate(arrays or [np.zeros(0)])
        if self.hline is not None:
            values = np.append(values, self.hline)
        finite = values[np.isfinite(values)]
        lo = self.ymin if self.ymin is not None else (float(finite.min()) if finite.size else 0.0)
        hi = self.ymax if self.ymax is not None else (float(finite.max()) if finite.size else 1.0)
        if hi <= lo:
            hi = lo + 1.0
        return lo, hi

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        n = max((len(s.values) for s in self.series), default=0)
        bands = self.has_bands
        plot_w, plot_h = width - AXIS_WIDTH, height - (3 if bands else 2)  # x labels, legend, caption below
        if n == 0 or plot_w < 4 or plot_h < 1:
            return Text("")
        lo, hi = self._y_range()
        dots_w, dots_h = plot_w * 2, plot_h * 4

        def x_of(i: int) -> int:
            return 0 if n == 1 else round(i * (dots_w - 1) / (n - 1))

        def y_of(v: float) -> int:  # dot row from the top
            return round((hi - min(max(v, lo), hi)) / (hi - lo) * (dots_h - 1))

        cells, owner, markers = self._curve_cells(plot_h, plot_w, x_of, y_of)
        band = self._band_cells(plot_h, plot_w, n, x_of, y_of)

        hline_row = None
        if self.hline is not None and math.isfinite(self.hline) and lo <= self.hline <= hi:
            hline_row = y_of(self.hline) // 4
        mark_col = x_of(self.mark) // 2 if self.mark is not None and 0 <= self.mark < n else None

        axis = self.get_component_rich_style("line-plot--axis")
        mark = self.get_component_rich_style("line-plot--mark")
        mark_style = Style(bgcolor=mark.bgcolor, bold=mark.bold)  # the curves keep their colours across the mark
        hline_style = self.get_component_rich_style("line-plot--hline")
        series_styles = [
            self.get_component_rich_style(SERIES_CLASSES[i % len(SERIES_CLASSES)]) for i in range(len(self.series))
        ]
        band_styles = [
            self.get_component_rich_style(BAND_CLASSES[i % len(BAND_CLASSES)]) for i in range(len(self.series))
        ]
        text = Text(no_wrap=True, overflow="crop")
        ticks = self._y_ticks(plot_h, lo, hi)
        for row in range(plot_h):
            tick = ticks.get(row)
            text.append(
                f"{format_tick(tick):>{AXIS_WIDTH - 1}}\u2524"
                if tick is not None
                else " " * (AXIS_WIDTH - 1) + "\u2502",
                axis,
            )
            for col in range(plot_w):
                bits = int(cells[row, col])
                if (row, col) in markers:
                    index = markers[(row, col)]
                    char, style = MARKERS[(index - 1) % len(MARKERS)], series_styles[index]
                elif bits:
                    char, style = chr(BRAILLE + bits), series_styles[owner[row, col]]
                elif band[row, col] >= 0:  # an interval covers the reference line: the interval shows
                    char, style = BAND, band_styles[band[row, col]]
                elif row == hline_row:
                    char, style = "\u2508", hline_style  # ┈
                else:
                    char, style = " ", Style()
                if col == mark_col:
                    style = style + mark_style
                text.append(char, style)
            text.append("\n")
        text.append_text(self._x_axis_line(plot_w, n, axis))
        text.append("\n")
        text.append_text(self._legend(series_styles, hline_style, width))
        if bands:
            text.append("\n")
            text.append_text(self._caption(band_styles, width))
        return text

    def _curve_cells(self, plot_h: int, plot_w: int, x_of, y_of) -> tuple[np.ndarray, np.ndarray, dict]:
        """Returns the curves drawn in Braille dots: per character cell its dot bits (plot_h, plot_w), the series whose
        colour it takes (-1: none), and (row, col) -> series for the cells drawn as a marker glyph instead (the
        series after the first, without colour)."""
        cells = np.zeros((plot_h, plot_w), dtype=np.int32)
        owner = np.full((plot_h, plot_w), -1, dtype=np.int8)  # the series whose colour a cell takes
        markers: dict[tuple[int, int], int] = {}  # (row, col) -> series drawn there as a glyph (no colour)
        for index, series in enumerate(self.series):
            values = np.asarray(series.values, dtype=float)
            points = [(x_of(i), y_of(v)) for i, v in enumerate(values) if math.isfinite(v)]
            if self.monochrome and index > 0:
                markers.update({(y // 4, x // 2): index for x, y in points})
                continue
            dots: list[tuple[int, int]] = []
            for k, (x, y) in enumerate(points):
                dots.append((x, y))
                if k + 1 < len(points):
                    x2, y2 = points[k + 1]
                    steps = max(x2 - x, abs(y2 - y), 1)
                    dots += [
                        (round(x + (x2 - x) * t / steps), round(y + (y2 - y) * t / steps)) for t in range(1, steps)
                    ]
            for x, y in dots:
                row, col = y // 4, x // 2
                cells[row, col] |= DOT_BITS[x % 2][y % 4]
                owner[row, col] = index
        return cells, owner, markers

    def _band_cells(self, plot_h: int, plot_w: int, n: int, x_of, y_of) -> np.ndarray:
        """Returns, per character cell, the series whose interval covers it (-1: none).

        At each sample a band fills one column from the row of the high end to the row of the low end.
        The series share their x positions, so where the samples lie far enough apart each banded series
        takes its own column, in legend order from the sample's column rightwards; else all take the
        sample's column and the later series is drawn, as its curve is.
        """
        band = np.full((plot_h, plot_w), -1, dtype=np.int8)
        banded = [index for index, series in enumerate(self.series) if series.has_band]
        side_by_side = n == 1 or (plot_w - 1) / (n - 1) >= len(banded) + 1
        for k, index in enumerate(banded):
            series = self.series[index]
            low, high = np.asarray(series.low, dtype=float), np.asarray(series.high, dtype=float)
            for i, (lo, hi) in enumerate(zip(low, high)):
                if not (math.isfinite(lo) and math.isfinite(hi)):
                    continue
                col = x_of(i) // 2
                if side_by_side:  # at the right edge the group moves left to stay inside
                    col = col + k - max(0, col + len(banded) - plot_w)
                band[y_of(hi) // 4 : y_of(lo) // 4 + 1, col] = index
        return band

    def _caption(self, band_styles: list[Style], width: int) -> Text:
        """Returns the caption line: the band glyph in each banded series' colour, then what the interval is."""
        caption = Text(" " * AXIS_WIDTH, no_wrap=True, overflow="crop")
        for index, series in enumerate(self.series):
            if series.has_band:
                caption.append(BAND, band_styles[index])
        caption.append(" " + fit_caption(self.caption or "interval", width - caption.cell_len - 1))
        caption.truncate(width, overflow="ellipsis")
        return caption

    def _y_ticks(self, plot_h: int, lo: float, hi: float) -> dict[int, float]:
        """Returns the value at each ticked line: the top (hi), the bottom (lo), and one every TICK_EVERY
        lines between, each the value at its line's middle."""
        ticks = {0: hi, plot_h - 1: lo}
        dots_h = plot_h * 4
        for row in range(TICK_EVERY, plot_h - 2, TICK_EVERY):
            ticks[row] = hi - (4 * row + 1.5) / (dots_h - 1) * (hi - lo)
        return ticks

    def _x_axis_line(self, plot_w: int, n: int, axis: Style) -> Text:
        """Return the x labels line: the first, the last, every k-th between as fits, and the marked one
        highlighted in its own slot; no label is written over another."""
        line = Text(" " * AXIS_WIDTH, no_wrap=True, overflow="crop")
        labels = self.x_labels[:n]
        if not labels:
            return line
        positions = [(0 if n == 1 else round(i * (plot_w * 2 - 1) / (n - 1))) // 2 for i in range(len(labels))]
        mark = self.mark if self.mark is not None and 0 <= self.mark < len(labels) else None
        layout = layout_axis_labels(labels, positions, plot_w, mark, centred=True, keep_ends=True, max_chars=12)
        text = layout.line_text(0, plot_w)
        start = end = 0
        for index, x, label in layout.placed:
            if index == mark:
                start, end = x, x + len(label)
        line.append(text[:start], axis)
        line.append(text[start:end], self.get_component_rich_style("line-plot--mark-label"))
        line.append(text[end:], axis)
        return line

    def _legend(self, styles: list[Style], hline_style: Style, width: int) -> Text:
        legend = Text(" " * AXIS_WIDTH, no_wrap=True, overflow="crop")
        for index, (series, style) in enumerate(zip(self.series, styles)):
            glyph = (
                MARKERS[(index - 1) % len(MARKERS)] if self.monochrome and index > 0 else "\u2812\u2812"
            )  # ⠒⠒ a line
            legend.append(f"{glyph} ", style)
            legend.append(f"{series.name}  ")
        if self.hline is not None and self.hline_name:
            legend.append("\u2508\u2508 ", hline_style)
            legend.append(self.hline_name)
        legend.truncate(width)
        return legend

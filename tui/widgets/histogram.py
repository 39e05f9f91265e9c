"""A histogram drawn with eighth blocks, with one value marked on its axis (the uniform-attention distance)
and, optionally, more values drawn as heavy lines (a head's mean in its detail)."""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from vitsee.tui.widgets.fit import fit_line

EIGHTHS = " \u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # ' ▁▂▃▄▅▆▇█'
MARKER_LINE = "\u2502"  # │ the marked value, through the empty space above the bars
VALUE_LINE = "\u2503"  # ┃ another value (a mean): heavier, so the two read apart without colour
AXIS_WIDTH = 6


class Histogram(Widget):
    """Bar heights from bin counts over bin edges; `marker` puts a ▲ and its name under the axis."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "histogram--bar",
        "histogram--axis",
        "histogram--marker",
        "histogram--line",
    }

    DEFAULT_CSS = """
    Histogram {
        height: 9;
        & > .histogram--bar { color: $accent; }
        & > .histogram--axis { color: $text-muted; }
        & > .histogram--marker { color: $warning; text-style: bold; }
        & > .histogram--line { color: $success; text-style: bold; }
    }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.counts = np.zeros(0)
        self.edges = np.zeros(0)
        self.marker: float | None = None
        self.marker_name = ""
        self.unit = ""
        self.caption = ""
        self.lines: list[float] = []

    def show(
        self,
        counts: Sequence[float],
        edges: Sequence[float],
        *,
        marker: float | None = None,
        marker_name: str = "",
        unit: str = "",
        caption: str = "",
        lines: Sequence[float] = (),
    ) -> None:
        """Show bin counts over edges; `marker` gets a │ and a ▲ with its name, each of `lines` a ┃."""
        self.counts, self.edges = np.asarray(counts, dtype=float), np.asarray(edges, dtype=float)
        self.marker, self.marker_name, self.unit, self.caption = marker, marker_name, unit, caption
        self.lines = [float(v) for v in lines]
        self.refresh()

    def column_of(self, value: float | None, cell_w: int) -> int | None:
        """Returns the character column of a value on the bars' axis (None outside the edges)."""
        lo, hi = float(self.edges[0]), float(self.edges[-1])
        bins = len(self.counts)
        if value is None or not np.isfinite(value) or not lo <= value <= hi or hi <= lo:
            return None
        return min(int((value - lo) / (hi - lo) * bins * cell_w), bins * cell_w - 1)

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        bins = len(self.counts)
        plot_h = height - 2  # axis labels, caption
        plot_w = width - AXIS_WIDTH
        if bins == 0 or plot_h < 1 or plot_w < bins:
            return Text(self.caption)
        cell_w = max(1, plot_w // bins)
        top = float(self.counts.max()) or 1.0
        eighths = np.round(self.counts / top * plot_h * 8).astype(int)  # bar height in eighths of a line
        bar = self.get_component_rich_style("histogram--bar")
        axis = self.get_component_rich_style("histogram--axis")
        marker = self.get_component_rich_style("histogram--marker")
        line_style = self.get_component_rich_style("histogram--line")
        lo, hi = float(self.edges[0]), float(self.edges[-1])
        marker_x = self.column_of(self.marker, cell_w)
        line_xs = {x for v in self.lines if (x := self.column_of(v, cell_w)) is not None}
        text = Text(no_wrap=True, overflow="crop")
        for row in range(plot_h):
            level_below = (plot_h - 1 - row) * 8  # eighths under this line
            label = f"{int(top)}" if row == 0 else "0" if row == plot_h - 1 else ""
            text.append(f"{label:>{AXIS_WIDTH - 1}}\u2502", axis)
            line = "".join(EIGHTHS[min(max(e - level_below, 0), 8)] * cell_w for e in eighths)
            for x, char in enumerate(line):
                style = bar if char != " " else Style()
                if x in line_xs and char == " ":
                    char, style = VALUE_LINE, line_style
                elif x == marker_x and char == " ":
                    char, style = MARKER_LINE, marker
                text.append(char, style)
            text.append("\n")
        axis_line = [" "] * (bins * cell_w)
        lo_text, hi_text = f"{lo:g}", f"{hi:.0f} {self.unit}".strip()
        axis_line[: len(lo_text)] = lo_text
        axis_line[len(axis_line) - len(hi_text) :] = hi_text
        for x in line_xs:  # also under the bars: a value inside the tallest bar would show nowhere else
            axis_line[x] = VALUE_LINE
        text.append(" " * AXIS_WIDTH + "".join(axis_line)[:plot_w], axis)
        text.append("\n")
        caption = Text(" " * AXIS_WIDTH, no_wrap=True, overflow="crop")
        if marker_x is not None:
            caption.append(" " * marker_x)
            caption.append(f"\u25b2 {self.marker_name}", marker)  # ▲
            # the caption after the marker, or its head ('blocks.0' of 'blocks.0: every head and image'), or
            # nothing: a caption cut mid-word reads as a different one
            room = width - caption.cell_len - 3
            for words in (self.caption, self.caption.split(":")[0]):
                if words and len(words) <= room:
                    caption.append(f"   {words}")
                    break
        else:
            caption.append(fit_line(self.caption, width - caption.cell_len, sep=": "))
        caption.truncate(width)
        text.append_text(caption)
        return text

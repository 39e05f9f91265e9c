"""Mean attention distance per head, one row per block (the paper's Fig. 3 turned on its side).

Each head is a dot at its mean distance (a digit where several share a character), the uniform-attention
distance is a dotted column, and a cursor picks a block (up/down) and one of its heads (left/right, in
sorted order, as the paper plots them). With intervals of the mean over images, the head under the cursor
gets a whisker ├──┤ from its low to its high end on its row (one whisker only: a block's heads share a row,
their whiskers would run into one line), and a caption line says what the interval is. Enter posts
HeadSelected for the head under the cursor (the attention view opens its distance per image).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from vitsee.tui.widgets.fit import fit_caption
from vitsee.tui.widgets.heatmap import fit_labels

DOT = "\u25cf"  # ●
NONFINITE = "\u00d7"  # × a head whose distance is NaN/Inf: at the right end, where no distance reaches
UNIFORM = "\u250a"  # ┊
WHISKER_LOW, WHISKER, WHISKER_HIGH = "\u251c", "\u2500", "\u2524"  # ├ ─ ┤
MAX_LABEL = 10


class DistancePlot(Widget, can_focus=True):
    """Heads' mean distances (blocks x heads, sorted per block) on a shared distance axis."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1, 0)", "Block up", show=False, id="attention.up", tooltip="Previous block"),
        Binding("down,j", "move(1, 0)", "Block down", show=False, id="attention.down", tooltip="Next block"),
        Binding(
            "left,h",
            "move(0, -1)",
            "Nearer head",
            show=False,
            id="attention.left",
            tooltip="Head with the next shorter distance",
        ),
        Binding(
            "right,l",
            "move(0, 1)",
            "Farther head",
            show=False,
            id="attention.right",
            tooltip="Head with the next longer distance",
        ),
        Binding("home", "jump(0)", "First block", show=False, id="attention.first", tooltip="Jump to the first block"),
        Binding("end", "jump(-1)", "Last block", show=False, id="attention.last", tooltip="Jump to the last block"),
        Binding(
            "enter",
            "select",
            "Select",
            id="attention.select",
            tooltip="Open the distance per image of the head under the cursor",
        ),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "distance-plot--dot",
        "distance-plot--cursor",
        "distance-plot--row-cursor",
        "distance-plot--label",
        "distance-plot--uniform",
        "distance-plot--axis",
        "distance-plot--nonfinite",
        "distance-plot--whisker",
    }

    DEFAULT_CSS = """
    DistancePlot {
        height: 1fr;
        min-height: 5;
        max-height: 65%;
        & > .distance-plot--dot { color: $accent; }
        & > .distance-plot--cursor { text-style: bold reverse; }
        & > .distance-plot--row-cursor { background: $boost; }
        & > .distance-plot--label { color: $text-muted; }
        & > .distance-plot--uniform { color: $warning; }
        & > .distance-plot--axis { color: $text-muted; }
        & > .distance-plot--nonfinite { color: $error; text-style: bold; }
        & > .distance-plot--whisker { color: $accent; text-style: bold; }
    }
    DistancePlot:focus > .distance-plot--row-cursor { background: $accent 20%; }
    """

    cursor: reactive[tuple[int, int]] = reactive((0, 0), init=False)

    class CursorMoved(Message):
        """A block or head was picked."""

        def __init__(self, plot: DistancePlot, block: int, head: int) -> None:
            super().__init__()
            self.plot, self.block, self.head = plot, block, head

        @property
        def control(self) -> DistancePlot:
            return self.plot

    class HeadSelected(Message):
        """Enter was pressed on a head."""

        def __init__(self, plot: DistancePlot, block: int, head: int) -> None:
            super().__init__()
            self.plot, self.block, self.head = plot, block, head

        @property
        def control(self) -> DistancePlot:
            return self.plot

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.distances = np.zeros((0, 0))
        self.nonfinite: np.ndarray | None = None
        self.blocks: list[str] = []
        self.max_px = 1.0
        self.uniform_px: float | None = None
        self.low: np.ndarray | None = None
        self.high: np.ndarray | None = None
        self.caption = ""

    def show(
        self,
        distances: np.ndarray,
        blocks: list[str],
        max_px: float,
        uniform_px: float | None,
        nonfinite: np.ndarray | None = None,
        low: np.ndarray | None = None,
        high: np.ndarray | None = None,
        caption: str = "",
    ) -> None:
        """Show (blocks, heads) distances in px, each row sorted ascending; `nonfinite` marks the heads whose
        distance is NaN/Inf (a Swin stage's missing heads are NaN too, but no values, so not marked);
        `low` / `high` are the ends of each head's interval in the same order, `caption` says what they are."""
        self.distances = np.asarray(distances, dtype=float)
        self.nonfinite = None if nonfinite is None else np.asarray(nonfinite, dtype=bool)
        self.blocks, self.max_px, self.uniform_px = list(blocks), float(max_px) or 1.0, uniform_px
        self.low = None if low is None or high is None else np.asarray(low, dtype=float)
        self.high = None if self.low is None else np.asarray(high, dtype=float)
        self.caption = caption
        # as tall as the blocks need (and the caption); max-height keeps room below
        self.styles.height = len(self.blocks) + 2 + self.caption_lines
        self.set_reactive(DistancePlot.cursor, self.validate_cursor(self.cursor))
        self.refresh()
        self.post_message(self.CursorMoved(self, *self.cursor))

    @property
    def caption_lines(self) -> int:
        """Returns 1 when the plot has intervals to draw (their caption takes a line under the axis), else 0."""
        return int(self.low is not None and bool((np.isfinite(self.low) & np.isfinite(self.high)).any()))

    def whisker(self, block: int, head: int, x_of) -> dict[int, str]:
        """Returns the whisker of one head as {column: glyph}, empty when it has no finite interval."""
        if self.low is None:
            return {}
        low, high = float(self.low[block, head]), float(self.high[block, head])
        if not (np.isfinite(low) and np.isfinite(high)):
            return {}
        start, end = x_of(low), x_of(high)
        glyphs = {x: WHISKER for x in range(start + 1, end)}
        if end > start:  # an interval narrower than a column is the dot alone
            glyphs[start], glyphs[end] = WHISKER_LOW, WHISKER_HIGH
        return glyphs

    def validate_cursor(self, cursor: tuple[int, int]) -> tuple[int, int]:
        rows, cols = self.distances.shape if self.distances.size else (1, 1)
        return (min(max(cursor[0], 0), rows - 1), min(max(cursor[1], 0), cols - 1))

    def watch_cursor(self) -> None:
        self.refresh()
        self.post_message(self.CursorMoved(self, *self.cursor))

    def action_move(self, blocks: int, heads: int) -> None:
        self.cursor = (self.cursor[0] + blocks, self.cursor[1] + heads)

    def action_jump(self, block: int) -> None:
        if self.distances.size:
            self.cursor = (block % self.distances.shape[0], self.cursor[1])

    def action_select(self) -> None:
        if self.distances.size:
            self.post_message(self.HeadSelected(self, *self.cursor))

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        if not self.distances.size or height < 3:
            return Text("")
        labels = fit_labels(self.blocks, MAX_LABEL)
        gutter = max(map(len, labels)) + 1
        plot_w = max(width - gutter - 1, 8)
        caption_lines = self.caption_lines
        if height < 3 + caption_lines:
            return Text("")
        rows = height - 2 - caption_lines  # axis, its labels, the caption
        n_blocks = len(self.blocks)
        top = min(max(self.cursor[0] - rows // 2, 0), max(n_blocks - rows, 0))

        def x_of(px: float) -> int:
            if not np.isfinite(px):
                return plot_w - 1
            return min(max(round(px / self.max_px * (plot_w - 1)), 0), plot_w - 1)

        dot = self.get_component_rich_style("distance-plot--dot")
        cursor_style = self.get_component_rich_style("distance-plot--cursor")
        row_cursor = self.get_component_rich_style("distance-plot--row-cursor")
        label_style = self.get_component_rich_style("distance-plot--label")
        uniform_style = self.get_component_rich_style("distance-plot--uniform")
        axis = self.get_component_rich_style("distance-plot--axis")
        nonfinite = self.get_component_rich_style("distance-plot--nonfinite")
        whisker_style = self.get_component_rich_style("distance-plot--whisker")
        uniform_x = x_of(self.uniform_px) if self.uniform_px is not None else None
        text = Text(no_wrap=True, overflow="crop")
        for block in range(top, min(top + rows, n_blocks)):
            on_row = block == self.cursor[0]
            base = row_cursor if on_row else Style()
            text.append(f"{labels[block]:>{gutter - 1}} ", (label_style + cursor_style) if on_row else label_style)
            # a Swin block of an early stage has fewer heads than the widest: its missing ones are NaN, not dots
            xs = [x_of(px) if np.isfinite(px) else None for px in self.distances[block]]
            cursor_x = xs[self.cursor[1]] if on_row else None
            whisker = self.whisker(block, self.cursor[1], x_of) if on_row else {}
            counts: dict[int, int] = {}
            for x in xs:
                if x is not None:
                    counts[x] = counts.get(x, 0) + 1
            bad = self.nonfinite is not None and bool(self.nonfinite[block].any())
            for x in range(plot_w):
                if bad and x == plot_w - 1:
                    style = base + nonfinite + (cursor_style if x == cursor_x else Style())
                    char = NONFINITE
                elif x in counts:
                    char = DOT if counts[x] == 1 else str(min(counts[x], 9))
                    style = base + dot + (cursor_style if x == cursor_x else Style())
                elif x in whisker:  # over the uniform column: the interval is what the cursor asks about
                    char, style = whisker[x], base + whisker_style
                elif x == uniform_x:
                    char, style = UNIFORM, base + uniform_style
                else:
                    char, style = " ", base
                text.append(char, style)
            text.append("\n")
        for _ in range(rows - (min(top + rows, n_blocks) - top)):
            text.append("\n")
        text.append(" " * gutter + "\u2514" + "\u2500" * (plot_w - 1) + "\n", axis)  # └───
        text.append(" " * gutter)
        text.append_text(self._axis_labels(plot_w, uniform_x, axis, uniform_style))
        if caption_lines:
            line = Text(" " * gutter, no_wrap=True, overflow="crop")
            line.append(WHISKER_LOW + WHISKER + WHISKER_HIGH, whisker_style)
            room = width - line.cell_len - 1
            line.append(" " + fit_caption(self.caption or "interval", room, "head under the cursor: "))
            line.truncate(width, overflow="ellipsis")
            text.append("\n")
            text.append_text(line)
        return text

    def _axis_labels(self, plot_w: int, uniform_x: int | None, axis: Style, uniform_style: Style) -> Text:
        """Return '0 ... ▲uniform 116.5 ... 311 px' with the ▲ under the uniform column."""
        right = f"{self.max_px:.0f} px"
        line = Text("0".ljust(plot_w - len(right)) + right, style=axis, no_wrap=True, overflow="crop")
        if uniform_x is not None and self.uniform_px is not None:
            name = f"uniform {self.uniform_px:.1f}"
            if uniform_x + 1 + len(name) < plot_w - len(right):
                start, end = uniform_x, uniform_x + 1 + len(name)
                label = "\u25b2" + name
            elif uniform_x - len(name) > 1:
                start, end = uniform_x - len(name), uniform_x + 1
                label = name + "\u25b2"
            else:
                start, end, label = uniform_x, uniform_x + 1, "\u25b2"
            plain = line.plain
            line = Text(plain[:start], style=axis, no_wrap=True, overflow="crop")
            line.append(label, uniform_style)
            line.append(plain[end:], axis)
        return line

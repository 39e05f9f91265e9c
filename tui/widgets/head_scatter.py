"""The paper's Fig. 5 in the terminal: every ViT head as a point at (mean attention distance, CKA with one layer of
the other model), drawn as its block's digit so blocks read apart without colour; the cursor walks over heads."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

BLOCK_MARKS = "0123456789abcdefghijklmnopqrstuvwxyz"
GUTTER = 6  # '0.62 ┤'


def block_mark(block: int) -> str:
    """Returns the character a head of this block is drawn with (0-9, then a-z, then +)."""
    return BLOCK_MARKS[block] if 0 <= block < len(BLOCK_MARKS) else "+"


class HeadScatter(Widget, can_focus=True):
    """Heads as points: x their mean distance in px, y their CKA with the chosen column (layer)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "right,l",
            "step(1)",
            "Farther head",
            show=False,
            id="heads.right",
            tooltip="Head with the next longer distance",
        ),
        Binding(
            "left,h",
            "step(-1)",
            "Nearer head",
            show=False,
            id="heads.left",
            tooltip="Head with the next shorter distance",
        ),
        Binding("down,j", "row(1)", "Next head", show=False, id="heads.down", tooltip="Next head in block order"),
        Binding("up,k", "row(-1)", "Previous head", show=False, id="heads.up", tooltip="Previous head in block order"),
        Binding(
            "]",
            "layer(1)",
            "Next layer",
            id="heads.next_layer",
            tooltip="Plot the CKA with the other model's next layer",
        ),
        Binding(
            "[",
            "layer(-1)",
            "Prev layer",
            show=False,
            id="heads.prev_layer",
            tooltip="Plot the CKA with the other model's previous layer",
        ),
        Binding(
            "enter",
            "select",
            "Select",
            id="heads.select",
            tooltip="Open the CKA of the head under the cursor with every layer of the other model",
        ),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {"head-scatter--point", "head-scatter--cursor", "head-scatter--axis"}

    DEFAULT_CSS = """
    HeadScatter {
        height: 1fr;
        min-height: 8;
        & > .head-scatter--point { color: $accent; }
        & > .head-scatter--cursor { text-style: bold reverse; }
        & > .head-scatter--axis { color: $text-muted; }
    }
    """

    cursor: reactive[int] = reactive(0, init=False)  # a row of the view: blocks.B.head.H
    column: reactive[int] = reactive(0, init=False)  # the other model's layer plotted

    class CursorMoved(Message):
        """A head or the plotted layer was picked."""

        def __init__(self, plot: HeadScatter, row: int, column: int) -> None:
            super().__init__()
            self.plot, self.row, self.column = plot, row, column

        @property
        def control(self) -> HeadScatter:
            return self.plot

    class HeadSelected(Message):
        """Enter was pressed on a head."""

        def __init__(self, plot: HeadScatter, row: int, column: int) -> None:
            super().__init__()
            self.plot, self.row, self.column = plot, row, column

        @property
        def control(self) -> HeadScatter:
            return self.plot

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.matrix = np.zeros((0, 0))
        self.distance = np.zeros(0)
        self.block = np.zeros(0, dtype=int)

    def show(self, matrix: np.ndarray, distance: np.ndarray, block: np.ndarray, column: int) -> None:
        """Plot heads (rows of matrix) against column `column` of matrix."""
        self.matrix = np.asarray(matrix, dtype=float)
        self.distance = np.asarray(distance, dtype=float)
        self.block = np.asarray(block, dtype=int)
        self.set_reactive(HeadScatter.cursor, min(self.cursor, max(len(self.matrix) - 1, 0)))
        self.set_reactive(HeadScatter.column, min(max(column, 0), max(self.matrix.shape[1] - 1, 0)))
        self.refresh()
        self.post_message(self.CursorMoved(self, self.cursor, self.column))

    def watch_cursor(self) -> None:
        self.refresh()
        self.post_message(self.CursorMoved(self, self.cursor, self.column))

    def watch_column(self) -> None:
        self.watch_cursor()

    def by_distance(self) -> list[int]:
        """Returns the rows ordered by mean distance (nearest first; rows without one last)."""
        key = np.where(np.isfinite(self.distance), self.distance, np.inf)
        return list(np.argsort(key, kind="stable"))

    def action_step(self, step: int) -> None:
        order = self.by_distance()
        if order:
            self.cursor = int(order[(order.index(self.cursor) + step) % len(order)])

    def action_row(self, step: int) -> None:
        if len(self.matrix):
            self.cursor = (self.cursor + step) % len(self.matrix)

    def action_layer(self, step: int) -> None:
        if self.matrix.size:
            self.column = (self.column + step) % self.matrix.shape[1]

    def action_select(self) -> None:
        if self.matrix.size:
            self.post_message(self.HeadSelected(self, self.cursor, self.column))

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        if not self.matrix.size or height < 4 or width < GUTTER + 10:
            return Text("")
        plot_w, plot_h = width - GUTTER, height - 2  # x axis and its labels below
        values = self.matrix[:, self.column]
        finite = values[np.isfinite(values)]
        lo = min(0.0, float(finite.min())) if finite.size else 0.0
        hi = max(lo + 1e-9, float(finite.max())) if finite.size else 1.0
        max_px = float(np.nanmax(self.distance)) * 1.05 if np.isfinite(self.distance).any() else 1.0
        grid: dict[tuple[int, int], list[int]] = {}
        for row, (x, y) in enumerate(zip(self.distance, values)):
            if np.isfinite(x) and np.isfinite(y):
                cx = min(plot_w - 1, int(x / max_px * (plot_w - 1) + 0.5))
                cy = min(plot_h - 1, int((hi - y) / (hi - lo) * (plot_h - 1) + 0.5))
                grid.setdefault((cy, cx), []).append(row)
        point = self.get_component_rich_style("head-scatter--point")
        cursor = self.get_component_rich_style("head-scatter--cursor")
        axis = self.get_component_rich_style("head-scatter--axis")
        text = Text(no_wrap=True, overflow="crop")
        for cy in range(plot_h):
            label = f"{hi - cy * (hi - lo) / max(plot_h - 1, 1):.2f}" if cy in (0, plot_h - 1, plot_h // 2) else ""
            text.append(f"{label:>{GUTTER - 2}} \u2524" if label else " " * (GUTTER - 1) + "\u2502", axis)
            for cx in range(plot_w):
                rows = grid.get((cy, cx))
                if not rows:
                    text.append(" ")
                elif self.cursor in rows:
                    text.append(block_mark(int(self.block[self.cursor])), point + cursor)
                else:
                    text.append(block_mark(int(self.block[rows[0]])), point)
            text.append("\n")
        text.append(" " * (GUTTER - 1) + "\u2514" + "\u2500" * plot_w + "\n", axis)
        right = f"{max_px:.0f} px"
        middle = "mean attention distance; digits: block"
        line = "0" + middle.center(max(plot_w - 1 - len(right), 0)) + right
        text.append(" " * GUTTER + line[:plot_w], axis)
        return text

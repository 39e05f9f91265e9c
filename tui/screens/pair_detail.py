"""The detail of one CKA cell: both layers and their shapes, the value, its row and its column as lines."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import short_label
from vitsee.tui.widgets.line_plot import LinePlot, Series


def shape_text(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "?"
    return " x ".join(str(s) for s in shape)


class PairDetailScreen(ModalScreen[None]):
    """CKA of a layer pair, with the row layer against every column layer and the column layer against
    every row layer, the pair marked in both plots."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "dismiss", "Close", id="detail.close", tooltip="Close the pair detail"),
        Binding("question_mark", "app.help", "Help", id="detail.help", tooltip="List the keys and marks of this detail"),
    ]

    DEFAULT_CSS = """
    PairDetailScreen {
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
        & .detail--facts { width: 1fr; height: auto; color: $text; margin-bottom: 1; }
        & .detail--caption { color: $text-muted; }
        & LinePlot { height: 7; }
        & .detail--hint { color: $text-muted; text-align: right; width: 1fr; }
    }
    """

    def __init__(self, loaded: LoadedView, row: int, col: int) -> None:
        super().__init__()
        self.loaded, self.row, self.col = loaded, row, col

    def compose(self) -> ComposeResult:
        view = self.loaded.view
        model_a, model_b = view.models[0], view.models[-1]
        row_layer, col_layer = view.rows[self.row], view.cols[self.col]
        value = float(view.matrix[self.row, self.col])
        shape_a = self.loaded.shapes.get(model_a, {}).get(row_layer)
        shape_b = self.loaded.shapes.get(model_b, {}).get(col_layer)
        shown = view.cell_text(self.row, self.col)
        with Vertical(id="detail"):
            yield Label(f"{row_layer} x {col_layer}  CKA {shown}", classes="detail--title")
            yield Static(
                f"row     {row_layer} of {model_a}: {shape_text(shape_a)} per image\n"
                f"column  {col_layer} of {model_b}: {shape_text(shape_b)} per image\n"
                f"{view.params.get('n_images', '?')} images, minibatches of {view.params.get('batch_size', '?')}, "
                f"{view.params.get('shuffles', '?')} shuffle(s)",
                classes="detail--facts", markup=False,
            )
            yield Label(f"{row_layer} against every column layer ({model_b})", classes="detail--caption")
            yield LinePlot(id="detail-row")
            yield Label(f"{col_layer} against every row layer ({model_a})", classes="detail--caption")
            yield LinePlot(id="detail-col")
            yield Label("Esc closes", classes="detail--hint")

    def help_context(self) -> tuple[str, dict[str, str], list[tuple[str, str]]]:
        """Returns what the help screen says here: its title, key descriptions, the glyph legend."""
        view = self.loaded.view
        return (f"CKA of one layer pair: {view.rows[self.row]} x {view.cols[self.col]}", {},
                [("\u2812\u2812", "the CKA of the row layer with every column layer, and of the column layer with every row layer"),
                 ("\u25b2", "the other layer of the pair")])

    def on_mount(self) -> None:
        view = self.loaded.view
        self.query_one("#detail-row", LinePlot).plot(
            [Series(f"CKA({view.rows[self.row]}, column)", view.matrix[self.row, :])],
            [short_label(c) for c in view.cols], ymin=0.0, ymax=1.0, mark=self.col,
        )
        self.query_one("#detail-col", LinePlot).plot(
            [Series(f"CKA(row, {view.cols[self.col]})", view.matrix[:, self.col])],
            [short_label(r) for r in view.rows], ymin=0.0, ymax=1.0, mark=self.row,
        )

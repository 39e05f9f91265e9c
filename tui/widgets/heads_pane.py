"""Head-level CKA (paper Fig. 5): each ViT head's CKA with one layer of another model against its mean attention
distance; local heads resemble a ResNet's lower layers, global ones do not."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Label

from vitsee.analyses.contract import Shape
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.head_scatter import HeadScatter
from vitsee.tui.widgets.view_pane import Place, ViewPane


class HeadsPane(ViewPane):
    """The heads scatter; ] and [ (or the side panel) pick the other model's layer it plots."""

    shape = Shape.HEADS_BY_LAYER
    key_help: ClassVar[dict[str, str]] = {
        "heads.select": "Open the head under the cursor: its CKA with every layer of the other model",
    }

    DEFAULT_CSS = """
    HeadsPane {
        & .heads--note { height: 1; color: $text-muted; padding: 0 1; }
    }
    """

    def compose_body(self) -> ComposeResult:
        yield Label("", classes="heads--note")
        yield HeadScatter(id=f"{self.kind}-scatter")

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        plot = self.query_one(HeadScatter)
        column = plot.column if plot.matrix.shape == view.matrix.shape else int(view.extra["scatter_col"])
        plot.show(view.matrix, view.extra["distance_px"], view.extra["block"], column)
        self._note()

    def _note(self) -> None:
        view = self.view
        if view is None:
            return
        layer = view.cols[self.query_one(HeadScatter).column]
        self.query_one(".heads--note", Label).update(
            f"y: CKA of each {view.models[0]} head with {view.models[-1]} {layer} (] [ pick the layer)"
        )

    def on_head_scatter_cursor_moved(self, message: HeadScatter.CursorMoved) -> None:
        message.stop()
        self._note()
        self.post_status()

    def legend(self) -> list[tuple[str, str]]:
        return [
            ("0-9 a-z", "a head, drawn as its block's number: x its mean attention distance, y its CKA with the layer"),
            ("reversed", "the head under the cursor (the status line names it)"),
        ]

    def on_head_scatter_head_selected(self, message: HeadScatter.HeadSelected) -> None:
        message.stop()
        from vitsee.tui.screens.view_detail import heads_layer_detail

        self.push_detail(heads_layer_detail, message.row, message.column)

    @property
    def selection(self) -> tuple[int, int] | None:
        plot = self.query_one(HeadScatter)
        return (plot.cursor, plot.column) if self.view is not None else None

    def status_text(self) -> str:
        view = self.view
        if view is None:
            return ""
        plot = self.query_one(HeadScatter)
        row, col = plot.cursor, plot.column
        distance = float(np.asarray(view.extra["distance_px"], dtype=float)[row])
        where = f"distance {distance:.1f} px" if np.isfinite(distance) else "distance not recorded"
        return f"{view.rows[row]}  {where}  CKA vs {view.cols[col]} {view.matrix[row, col]:.2f}"

    def main_widget(self) -> Widget | None:
        return self.query_one(HeadScatter)

    def layer_choices(self) -> list[str]:
        view = self.view
        return list(view.cols) if view is not None else []

    def jump_to_layer(self, layer: str) -> bool:
        view = self.view
        if view is None or layer not in view.cols:
            return False
        self.query_one(HeadScatter).column = view.cols.index(layer)
        return True

    def places(self) -> list[Place]:
        """Returns the heads (blocks.B.head.H), then the other model's layers the scatter can plot against."""
        view = self.view
        if view is None:
            return []
        return [Place(r) for r in view.rows] + [Place(c, "col") for c in view.cols]

    def go_to(self, place: Place) -> bool:
        view = self.view
        if place.axis == "col" or view is None:
            return self.jump_to_layer(place.name)
        if place.name not in view.rows:
            return False
        self.query_one(HeadScatter).cursor = view.rows.index(place.name)
        return True

"""The pane of a layer x layer matrix (Shape.LAYER_MATRIX): CKA between layers within a model (paper Fig. 1) or
model A's rows x model B's columns (Fig. 2), and any other measure of how alike two layers are."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from vitsee.analyses.contract import Shape
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import MARK_CHAR, Heatmap
from vitsee.tui.widgets.view_pane import HeatmapPane, Place


class LayerMatrixPane(HeatmapPane):
    """A layer x layer heatmap (CKA's, a measure's); Enter on a cell opens the pair's detail."""

    shape = Shape.LAYER_MATRIX
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "n",
            "toggle_marks",
            "Mark n.s.",
            id="cka.marks",
            show=False,  # the help screen lists it; the
            # footer at 80 columns has no room left (Help would drop off)
            tooltip="Mark the cells whose permutation p-value is above 0.05 (not significant)",
        ),
    ]
    marks_on = False
    lists_model_layers = True
    key_help: ClassVar[dict[str, str]] = {
        "heatmap.select": "Open the layer pair under the cursor: its value, both layers' shapes, its row and column",
    }

    def compose_body(self) -> ComposeResult:
        yield from ()

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        heatmap = self.show_matrix(
            view.matrix,
            view.rows,
            view.cols,
            vmin=view.vmin,
            vmax=view.vmax,
            value_name=view.value_name,
            nonfinite=view.nonfinite,
            nonfinite_text=view.nonfinite_text,
        )
        heatmap.set_marks(view.not_significant() if self.marks_on else None)

    def action_toggle_marks(self) -> None:
        """Toggle the mark on cells not significant at 0.05 after Benjamini-Hochberg; says so when the result has no
        p-values."""
        view, heatmap = self.view, self.heatmap
        if view is None or heatmap is None:
            return
        if view.p_value is None:
            option = getattr(view.analysis, "permutations_option", "permutations")
            self.notify(
                f"this {self.label} result has no p-values: vitsee analyze STORE --{self.kind} --{option} 99",
                severity="warning",
            )
            return
        self.marks_on = not self.marks_on
        heatmap.set_marks(view.not_significant() if self.marks_on else None)

    def legend(self) -> list[tuple[str, str]]:
        return super().legend() + [
            (
                MARK_CHAR,
                "not significant: Benjamini-Hochberg q > 0.05 over the view's cells' permutation p (n shows or hides)",
            )
        ]

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        message.stop()
        self.tell_status(self.status_text() or message.summary)  # with its interval

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        message.stop()
        if self.loaded is not None:
            from vitsee.tui.screens.pair_detail import PairDetailScreen

            self.app.push_screen(PairDetailScreen(self.loaded, message.row, message.col))

    def status_text(self) -> str:
        heatmap = self.heatmap
        if heatmap is None or self.loaded is None:
            return ""
        row, col = heatmap.cursor
        view = self.loaded.view
        value = heatmap.value_at(row, col)
        interval = view.interval_or_hint(row, col) if value == value else ""  # or how to get one
        return (
            f"{heatmap.row_labels[row]} x {heatmap.col_labels[col]}  "
            f"{view.value_name} {heatmap.describe(row, col)}{interval}"
        )

    def places(self) -> list[Place]:
        """Returns model A's row layers, then, across two models, model B's column layers."""
        view = self.view
        if view is None:
            return []
        rows = [Place(r) for r in view.rows]
        # within one model the columns are the rows again: a second stop on each would only repeat it
        return rows + [Place(c, "col") for c in view.cols] if len(set(view.models)) > 1 else rows

    def go_to(self, place: Place) -> bool:
        heatmap, view = self.heatmap, self.view
        if place.axis != "col":
            return self.jump_to_layer(place.name)
        if heatmap is None or view is None or place.name not in view.cols:
            return False
        heatmap.cursor = (heatmap.cursor[0], view.cols.index(place.name))
        return True

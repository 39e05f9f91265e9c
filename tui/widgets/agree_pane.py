"""The pane of the measures' comparison (Shape.MEASURES_AGREE): how alike the layer x layer measures cached for a
pair of models rank the layer pairs (a rank correlation per pair of measures); Enter opens the measure of the row."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.widgets import Static

from vitsee.analyses.contract import Shape
from vitsee.tui.messages import ViewWanted
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import Heatmap
from vitsee.tui.widgets.view_pane import HeatmapPane


class MeasuresAgreePane(HeatmapPane):
    """The measures x measures heatmap of rank correlations, what they are computed over under it."""

    shape = Shape.MEASURES_AGREE
    key_help: ClassVar[dict[str, str]] = {
        "heatmap.select": "Open the measure of the row under the cursor: its layer x layer heatmap of these models",
    }

    DEFAULT_CSS = """
    MeasuresAgreePane {
        & .agree--note { width: 1fr; height: auto; color: $text-muted; padding: 0 1; }
    }
    """

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="agree--note", markup=False)

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        self.show_matrix(view.matrix, view.rows, view.cols, vmin=-1.0, vmax=1.0, value_name="rank corr.", first=True)
        self.query_one(".agree--note", Static).update(view.analysis.caption_notes(view).removeprefix("; "))

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        message.stop()
        self.tell_status(self.status_text() or message.summary)

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        message.stop()
        view = self.view
        if view is not None:
            self.post_message(ViewWanted(view.extra["measures"][message.row]))

    def status_text(self) -> str:
        heatmap, view = self.heatmap, self.view
        if heatmap is None or view is None:
            return ""
        row, col = heatmap.cursor
        return (
            f"{view.rows[row]} x {view.cols[col]}  rank correlation {heatmap.describe(row, col)} over "
            f"{view.extra['n_pairs']} layer pairs"
        )

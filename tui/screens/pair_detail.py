"""The detail of one CKA cell: both layers and their shapes, the value, its row and its column as lines."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Label

from vitsee.tui.results import LoadedView
from vitsee.tui.screens.view_detail import DetailScreen
from vitsee.tui.widgets.heatmap import short_label
from vitsee.tui.widgets.line_plot import LinePlot, Series


def shape_text(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "?"
    return " x ".join(str(s) for s in shape)


class PairDetailScreen(DetailScreen):
    """CKA of a layer pair, with the row layer against every column layer and the column layer against
    every row layer, the pair marked in both plots (the frame, keys and help of every view's detail)."""

    help_text = "CKA of one layer pair"

    def __init__(self, loaded: LoadedView, row: int, col: int) -> None:
        view = loaded.view
        self.row, self.col = row, col
        super().__init__(loaded, f"{view.rows[row]} x {view.cols[col]}  CKA {view.cell_text(row, col)}")

    def facts(self) -> str:
        view = self.view
        model_a, model_b = view.models[0], view.models[-1]
        row_layer, col_layer = view.rows[self.row], view.cols[self.col]
        shape_a = self.loaded.shapes.get(model_a, {}).get(row_layer)
        shape_b = self.loaded.shapes.get(model_b, {}).get(col_layer)
        return (f"row     {row_layer} of {model_a}: {shape_text(shape_a)} per image\n"
                f"column  {col_layer} of {model_b}: {shape_text(shape_b)} per image\n"
                f"{view.params.get('n_images', '?')} images, minibatches of {view.params.get('batch_size', '?')}, "
                f"{view.params.get('shuffles', '?')} shuffle(s)")

    def compose_body(self) -> ComposeResult:
        view = self.view
        yield Label(f"{view.rows[self.row]} against every column layer ({view.models[-1]})", classes="detail--caption")
        yield LinePlot(id="detail-row")
        yield Label(f"{view.cols[self.col]} against every row layer ({view.models[0]})", classes="detail--caption")
        yield LinePlot(id="detail-col")

    def help_context(self) -> tuple[str, dict[str, str], list[tuple[str, str]]]:
        view = self.view
        return f"{self.help_text}: {view.rows[self.row]} x {view.cols[self.col]}", {}, self.legend()

    def legend(self) -> list[tuple[str, str]]:
        return [("\u2812\u2812", "the CKA of the row layer with every column layer, and of the column layer with every row layer"),
                ("\u25b2", "the other layer of the pair")]

    def on_mount(self) -> None:
        view = self.view
        self.query_one("#detail-row", LinePlot).plot(
            [Series(f"CKA({view.rows[self.row]}, column)", view.matrix[self.row, :])],
            [short_label(c) for c in view.cols], ymin=0.0, ymax=1.0, mark=self.col,
        )
        self.query_one("#detail-col", LinePlot).plot(
            [Series(f"CKA(row, {view.cols[self.col]})", view.matrix[:, self.col])],
            [short_label(r) for r in view.rows], ymin=0.0, ymax=1.0, mark=self.row,
        )

"""The detail of one cell of a layer x layer view (CKA, another measure): both layers and their shapes, the value,
its row and its column as lines."""

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
    """The value of a layer pair, with the row layer against every column layer and the column layer against
    every row layer, the pair marked in both plots (the frame, keys and help of every view's detail)."""

    def __init__(self, loaded: LoadedView, row: int, col: int) -> None:
        view = loaded.view
        self.row, self.col = row, col
        self.help_text = f"{view.value_name} of one layer pair"
        super().__init__(loaded, f"{view.rows[row]} x {view.cols[col]}  {view.value_name} {view.cell_text(row, col)}")

    def facts(self) -> str:
        view = self.view
        model_a, model_b = view.models[0], view.models[-1]
        row_layer, col_layer = view.rows[self.row], view.cols[self.col]
        shape_a = self.loaded.shapes.get(model_a, {}).get(row_layer)
        shape_b = self.loaded.shapes.get(model_b, {}).get(col_layer)
        params = view.params
        how = (
            f", minibatches of {params['batch_size']}, {params.get('shuffles', '?')} shuffle(s)"
            if "batch_size" in params
            else f", on {params['max_images']} of them"
            if "max_images" in params
            else ""
        )
        return (
            f"row     {row_layer} of {model_a}: {shape_text(shape_a)} per image\n"
            f"column  {col_layer} of {model_b}: {shape_text(shape_b)} per image\n"
            f"{params.get('n_images', '?')} images{how}"
        )

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
        name = self.view.value_name
        return [
            (
                "\u2812\u2812",
                f"the {name} of the row layer with every column layer, and of the column layer with every row layer",
            ),
            ("\u25b2", "the other layer of the pair"),
        ]

    def on_mount(self) -> None:
        view = self.view
        name, low, high = view.value_name, view.vmin, view.vmax
        self.query_one("#detail-row", LinePlot).plot(
            [Series(f"{name}({view.rows[self.row]}, column)", view.matrix[self.row, :])],
            [short_label(c) for c in view.cols],
            ymin=low,
            ymax=high,
            mark=self.col,
        )
        self.query_one("#detail-col", LinePlot).plot(
            [Series(f"{name}(row, {view.cols[self.col]})", view.matrix[:, self.col])],
            [short_label(r) for r in view.rows],
            ymin=low,
            ymax=high,
            mark=self.row,
        )

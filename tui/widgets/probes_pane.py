"""Linear probe test accuracy per layer and readout (paper Fig. 11, 13): a table and accuracy vs depth."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import DataTable

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import ColorMode
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import short_label
from vitsee.tui.widgets.line_plot import BAND, LinePlot, Series
from vitsee.tui.widgets.probe_table import ProbeTable
from vitsee.tui.widgets.view_pane import TablePane

BEST = "\u2605"  # ★


def best_rows(matrix: np.ndarray) -> list[int | None]:
    """Returns, per column, the row with the highest accuracy (None for a column with no value)."""
    out: list[int | None] = []
    for col in matrix.T:
        finite = np.isfinite(col)
        out.append(int(np.nanargmax(np.where(finite, col, -np.inf))) if finite.any() else None)
    return out


class ProbesPane(TablePane):
    """A table of accuracy per layer x readout with each column's best marked ★, and the same numbers
    as lines against depth, chance level dotted."""

    shape = Shape.DEPTH_CURVES
    key_help: ClassVar[dict[str, str]] = {
        "probes.select": "Open the layer under the cursor: its readouts and the accuracy of a probe on each token",
    }

    DEFAULT_CSS = """
    ProbesPane {
        & DataTable { height: auto; max-height: 70%; min-height: 4; }
        & LinePlot { height: 1fr; min-height: 7; }
    }
    """

    def compose_body(self) -> ComposeResult:
        table: DataTable = ProbeTable(id=f"{self.kind}-table", cursor_type="cell", zebra_stripes=True)
        yield table
        yield LinePlot(id=f"{self.kind}-plot", monochrome=self.color_mode is ColorMode.NONE)

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        table = self.query_one(DataTable)
        table.clear(columns=True)
        best = best_rows(view.matrix)
        for col in view.cols:
            table.add_column(col, width=max(len(col), 7))
        for r, layer in enumerate(view.rows):
            cells = []
            for c, value in enumerate(view.matrix[r]):
                if view.is_nonfinite(r, c):
                    cells.append(Text("skipped", style="red"))  # not fitted: its features hold NaN/Inf
                elif not math.isfinite(value):
                    cells.append(Text("  \u2013"))  # –
                elif best[c] == r:
                    cells.append(
                        Text(f"{value:.3f}{BEST}", style="bold")
                    )  # same width numbers: left-aligned they line up
                else:
                    cells.append(Text(f"{value:.3f}"))
            table.add_row(*cells, label=layer, key=layer)
        plot = self.query_one(LinePlot)
        low, high = view.ci_low, view.ci_high  # None for a result computed with --ci 0: no bands
        plot.plot(
            [
                Series(
                    name, view.matrix[:, c], None if low is None else low[:, c], None if high is None else high[:, c]
                )
                for c, name in enumerate(view.cols)
            ],
            [short_label(r) for r in view.rows],
            ymin=0.0,
            ymax=1.0,
            mark=0,
            hline=float(view.extra.get("chance", float("nan"))),
            hline_name="chance",
            caption=view.interval_caption(),
        )
        self.post_status()

    def on_data_table_cell_highlighted(self, message: DataTable.CellHighlighted) -> None:
        message.stop()
        self.query_one(LinePlot).set_mark(message.coordinate.row)
        self.post_status()

    def legend(self) -> list[tuple[str, str]]:
        return [
            (BEST, "the best layer of the readout (column)"),
            ("skipped", "not fitted: the layer's features hold NaN/Inf"),
            ("\u2013", "no such readout for this layer"),
            ("\u2812\u2812 \u2824\u2824", "below: each readout's accuracy against depth (the legend names them)"),
            (BAND, "band: the exact binomial interval of an accuracy on the test images"),
            ("\u2508\u2508", "chance level"),
            ("\u25b2", "the layer under the cursor"),
        ]

    def on_data_table_cell_selected(self, message: DataTable.CellSelected) -> None:
        message.stop()
        from vitsee.tui.screens.view_detail import probe_token_detail

        self.push_detail(probe_token_detail, message.coordinate.row)

    def status_text(self) -> str:
        view = self.view
        if view is None:
            return ""
        row, col = self.selection or (0, 0)
        value = float(view.matrix[row, col])
        best = best_rows(view.matrix)[col]
        shown = f"{value:.4f}" if math.isfinite(value) else "n/a (no such readout here)"
        if view.is_nonfinite(row, col):
            shown = f"not fitted: features {view.nonfinite_text(row, col)}"
        text = f"{view.rows[row]} {view.cols[col]}  accuracy {shown}"
        if math.isfinite(value):
            text += view.interval_text(row, col)  # the exact binomial interval on the test images
        if best is not None:
            text += f"  best {view.rows[best]} {view.matrix[best, col]:.4f}"
        chance = view.extra.get("chance")
        if chance is not None:
            text += f"  chance {float(chance):.3f}"
        if view.rows[row] in view.extra.get("tokens_too_wide", []):
            text += (
                f"  no token map: wider than {view.params.get('max_token_dim')} channels "
                "(vitsee analyze --probes --probe-max-dim N)"
            )
        return text

    def main_widget(self) -> Widget | None:
        return self.query_one(DataTable)

    def jump_to_layer(self, layer: str) -> bool:
        view = self.view
        if view is None or layer not in view.rows:
            return False
        table = self.query_one(DataTable)
        table.move_cursor(row=view.rows.index(layer))
        return True

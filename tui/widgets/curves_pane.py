"""The pane of values against a count (Shape.CURVES): a measure against the number of images (an n-curve) or against
k (a k-curve), each value with its interval, as a table and as a line with its band; Enter opens nothing, it says
what a settled value looks like."""

from __future__ import annotations

import math
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import DataTable

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import ColorMode
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.line_plot import BAND, LinePlot, Series
from vitsee.tui.widgets.probe_table import ProbeTable  # a DataTable whose keys have binding ids
from vitsee.tui.widgets.view_pane import ViewPane


class CurvesPane(ViewPane):
    """Each point's value, interval and the interval's width in a table, the same numbers as curves below."""

    shape = Shape.CURVES
    key_help: ClassVar[dict[str, str]] = {"probes.select": "Say how to read the point under the cursor"}

    DEFAULT_CSS = """
    CurvesPane {
        & DataTable { height: auto; max-height: 50%; min-height: 4; }
        & LinePlot { height: 1fr; min-height: 7; }
    }
    """

    def compose_body(self) -> ComposeResult:
        yield ProbeTable(id=f"{self.kind}-table", cursor_type="row", zebra_stripes=True)
        yield LinePlot(id=f"{self.kind}-plot", monochrome=self.color_mode is ColorMode.NONE)

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_column(str(view.extra.get("x_label", "x")))
        for col in view.cols:
            table.add_column(col, width=max(len(col), 24 if view.ci_low is not None else 8))
        for r, x in enumerate(view.rows):
            cells = []
            for c in range(len(view.cols)):
                value = float(view.matrix[r, c])
                text = f"{value:.4f}" if math.isfinite(value) else "\u2013"
                if view.ci_low is not None and math.isfinite(float(view.ci_low[r, c])):
                    text += f" [{view.ci_low[r, c]:.3f}, {view.ci_high[r, c]:.3f}]"
                cells.append(Text(text))
            table.add_row(Text(x), *cells, key=str(r))
        low, high = view.ci_low, view.ci_high
        self.query_one(LinePlot).plot(
            [
                Series(
                    name, view.matrix[:, c], None if low is None else low[:, c], None if high is None else high[:, c]
                )
                for c, name in enumerate(view.cols)
            ],
            list(view.rows),
            mark=len(view.rows) - 1,
            caption=view.interval_caption(),
        )
        self.post_status()

    def on_data_table_row_highlighted(self, message: DataTable.RowHighlighted) -> None:
        message.stop()
        self.query_one(LinePlot).set_mark(message.cursor_row)
        self.post_status()

    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        message.stop()
        self.app.notify(
            "a value has settled where the next point's value lies inside this one's interval and the intervals "
            "narrow (about as 1/sqrt(n))",
            timeout=6,
        )

    @property
    def selection(self) -> tuple[int, int] | None:
        if self.view is None:
            return None
        return (self.query_one(DataTable).cursor_row, 0)

    def status_text(self) -> str:
        view = self.view
        if view is None:
            return ""
        row = self.selection[0] if self.selection else 0
        value = float(view.matrix[row, 0])
        text = f"{view.extra.get('x_label', 'x')} {view.rows[row]}  {view.value_name} "
        text += f"{value:.4f}" if math.isfinite(value) else "n/a"
        text += view.interval_text(row, 0)
        if row > 0 and view.ci_low is not None:
            before = float(view.matrix[row - 1, 0])
            inside = float(view.ci_low[row, 0]) <= before <= float(view.ci_high[row, 0])
            text += f"  previous point {'inside' if inside else 'outside'} this interval"
        return text

    def legend(self) -> list[tuple[str, str]]:
        return [
            ("\u2812\u2812", "the value at each point of the x axis"),
            (BAND, "band: the interval at each point (under the plot, what it resamples)"),
            ("\u25b2", "the point under the cursor"),
        ]

    def main_widget(self) -> Widget | None:
        return self.query_one(DataTable)

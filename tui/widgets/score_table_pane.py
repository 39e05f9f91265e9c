"""The pane of a table of scores with intervals (Shape.SCORE_TABLE): the separability of the model families by each
measure's zoo (d-prime, silhouette, ROC-AUC), each column's best marked; Enter says how to open that measure's zoo."""

from __future__ import annotations

import math
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import DataTable, Static

from vitsee.analyses.contract import Shape
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.probes_pane import BEST, best_rows
from vitsee.tui.widgets.probe_table import ProbeTable  # a DataTable whose keys have binding ids
from vitsee.tui.widgets.view_pane import TablePane


def score_text(value: float, low: float | None, high: float | None) -> str:
    """Returns '0.89 [0.73, 1.00]' (the interval where there is one), '–' for no value."""
    if not math.isfinite(value):
        return "\u2013"
    text = f"{value:.2f}"
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        text += f" [{low:.2f}, {high:.2f}]"
    return text


class ScoreTablePane(TablePane):
    """Rows (measures) x scores, each with its interval, the best of each column ★; the view's note under it."""

    shape = Shape.SCORE_TABLE
    key_help: ClassVar[dict[str, str]] = {
        "probes.select": "Say how to open the zoo of the measure under the cursor",
    }

    DEFAULT_CSS = """
    ScoreTablePane {
        & DataTable { height: auto; max-height: 80%; min-height: 4; }
        & .scores--note { width: 1fr; height: auto; color: $text-muted; padding: 0 1; }
    }
    """

    def compose_body(self) -> ComposeResult:
        yield ProbeTable(id=f"{self.kind}-table", cursor_type="cell", zebra_stripes=True)
        yield Static("", classes="scores--note", markup=False)

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        table = self.query_one(DataTable)
        table.clear(columns=True)
        best = best_rows(view.matrix)
        for col in view.cols:
            table.add_column(col, width=max(len(col), 20 if view.ci_low is not None else 7))
        for r, label in enumerate(view.rows):
            cells = []
            for c, value in enumerate(view.matrix[r]):
                low = None if view.ci_low is None else float(view.ci_low[r, c])
                high = None if view.ci_high is None else float(view.ci_high[r, c])
                text = score_text(float(value), low, high)
                cells.append(Text(text + BEST, style="bold") if best[c] == r else Text(text))
            table.add_row(*cells, label=label, key=str(r))
        caption = view.interval_caption()
        note = str(view.extra.get("note", ""))
        self.query_one(".scores--note", Static).update("\n".join(t for t in (note, caption) if t))
        self.post_status()

    def on_data_table_cell_highlighted(self, message: DataTable.CellHighlighted) -> None:
        message.stop()
        self.post_status()

    def on_data_table_cell_selected(self, message: DataTable.CellSelected) -> None:
        message.stop()
        view = self.view
        if view is None:
            return
        measures = list(view.extra.get("measures", []))
        row = message.coordinate.row
        name = measures[row] if row < len(measures) else ""
        if name and name != "consensus":
            self.app.notify(
                f"the zoo of {view.rows[row]}: press the Zoo tab's key, then m until it shows {view.rows[row]}",
                timeout=5,
            )
        else:
            self.app.notify("the consensus zoo is drawn beside the scores in `vitsee export` (PNG)", timeout=5)

    def status_text(self) -> str:
        view = self.view
        if view is None:
            return ""
        row, col = self.selection or (0, 0)
        low = None if view.ci_low is None else float(view.ci_low[row, col])
        high = None if view.ci_high is None else float(view.ci_high[row, col])
        text = f"{view.rows[row]}  {view.cols[col]} {score_text(float(view.matrix[row, col]), low, high)}"
        best = best_rows(view.matrix)[col]
        if best is not None:
            text += f"  best {view.rows[best]} {view.matrix[best, col]:.2f}"
        return text

    def legend(self) -> list[tuple[str, str]]:
        return [
            (BEST, "the best row of the column (higher is better in every column)"),
            ("[a, b]", "the interval: under the table, what it resamples"),
            ("\u2013", "no value: too few pairs to score"),
        ]

    def main_widget(self) -> Widget | None:
        return self.query_one(DataTable)

    def jump_to_layer(self, layer: str) -> bool:
        view = self.view
        if view is None or layer not in view.rows:
            return False
        self.query_one(DataTable).move_cursor(row=view.rows.index(layer))
        return True

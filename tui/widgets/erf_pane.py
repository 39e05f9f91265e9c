"""Effective receptive fields (paper Fig. 6): the share of |d centre / d input| of each input pixel for one layer,
picked in the side panel; g switches to a log colour scale, since ERFs span decades."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Label

from vitsee.analyses.contract import Shape
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import Heatmap
from vitsee.tui.widgets.view_pane import HeatmapPane

DECADES = 6  # the log scale's range below the peak


class ErfPane(HeatmapPane):
    """An input-sized heatmap of one layer's ERF; the cursor is a pixel."""

    shape = Shape.PIXEL_MAP

    key_help: ClassVar[dict[str, str]] = {
        "heatmap.select": "Open the ERF at full size with each pixel's value (log10 or percent, as coloured)",
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "g",
            "toggle_log",
            "Log scale",
            id="erf.log",
            tooltip="Colour the ERF by log10 (it spans decades) or linearly",
        ),
    ]

    DEFAULT_CSS = """
    ErfPane {
        & Heatmap { height: 1fr; }
        & .erf--note { height: 1; color: $text-muted; padding: 0 1; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log_scale = True

    def compose_body(self) -> ComposeResult:
        yield Label("", classes="erf--note")

    def shown(self) -> tuple[np.ndarray, float, float]:
        """Returns the matrix as coloured (log10 of the shares, or the shares) and its colour range."""
        view = self.view
        matrix = np.asarray(view.matrix, dtype=float)
        peak = float(np.nanmax(matrix)) if np.isfinite(matrix).any() and np.nanmax(matrix) > 0 else 1.0
        if not self.log_scale:
            return matrix, 0.0, peak
        floor = peak * 10.0**-DECADES
        return (
            np.log10(np.maximum(np.nan_to_num(matrix, nan=floor), floor)),
            float(np.log10(floor)),
            float(np.log10(peak)),
        )

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        matrix, vmin, vmax = self.shown()
        name = "log10 ERF" if self.log_scale else "ERF"
        self.show_matrix(matrix, view.rows, view.cols, vmin=vmin, vmax=vmax, value_name=name)
        self.query_one(".erf--note", Label).update(
            f"{view.params.get('layer')}: {view.extra['no_field']}"
            if view.extra.get("no_field")
            else f"{view.params.get('layer')}: share of |d centre / d input| per pixel over "
            f"{view.params.get('erf_images')} images; {'log' if self.log_scale else 'linear'} colours (g switches)"
        )
        self.post_status()

    def action_toggle_log(self) -> None:
        self.log_scale = not self.log_scale
        if self.loaded is not None:
            self.populate(self.loaded)

    def legend(self) -> list[tuple[str, str]]:
        marks = super().legend()
        marks[1] = ("[ ]  +", "the input pixel under the cursor (the status line gives its share)")
        scale = (
            f"log colours: log10 of each pixel's share, down to {DECADES} decades below the peak"
            if self.log_scale
            else "linear colours: each pixel's share of the total"
        )
        return marks + [("g", scale + " (g switches)")]

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        message.stop()
        from vitsee.tui.screens.view_detail import erf_detail

        self.push_detail(erf_detail, (message.row, message.col), self.log_scale, DECADES)

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        message.stop()
        self.tell_status(self.status_text())

    def status_text(self) -> str:
        view, heatmap = self.view, self.heatmap
        if view is None or heatmap is None:
            return ""
        r, c = heatmap.cursor
        value = float(view.matrix[r, c])
        return f"{view.params.get('layer')}  pixel row {r} col {c}  ERF {value:.3g} ({value * 100:.3f}% of the total)"

    def layer_choices(self) -> list[str]:
        view = self.view
        return list(view.extra["layers"]) if view is not None else []

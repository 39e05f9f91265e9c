"""Skip-connection norm ratios ||z|| / ||f(z)|| (paper Fig. 7): sublayer x token, and CLS vs spatial."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.widgets import Label

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import ColorMode
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import Heatmap, short_label
from vitsee.tui.widgets.line_plot import BAND, LinePlot, Series
from vitsee.tui.widgets.view_pane import HeatmapPane


class SkipPane(HeatmapPane):
    """A heatmap of the ratio per sublayer (rows) and token (columns), and below it the CLS token's
    ratio against the mean over spatial tokens, row by row (the phase transition of the paper)."""

    shape = Shape.TOKEN_RATIOS
    key_help: ClassVar[dict[str, str]] = {
        "heatmap.select": "Open the ratio curve of the token under the cursor across the sublayers",
    }

    DEFAULT_CSS = """
    SkipPane {
        & Heatmap { height: 2fr; min-height: 6; }
        & LinePlot { height: 1fr; min-height: 7; }
        & .skip--note { width: 1fr; height: auto; padding: 0 1; color: $warning; }
    }
    """

    def compose_body(self) -> ComposeResult:
        yield Label("", id=f"{self.kind}-note", classes="skip--note")
        yield LinePlot(id=f"{self.kind}-plot", monochrome=self.color_mode is ColorMode.NONE)

    @property
    def init_note(self) -> str:
        """Returns why model A's random init makes these ratios degenerate ('' when it does not)."""
        loaded = self.loaded
        return loaded.init_notes.get(loaded.view.models[0], "") if loaded is not None else ""

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        heatmap = self.show_matrix(
            view.matrix,
            view.rows,
            view.cols,
            vmin=view.vmin,
            vmax=view.vmax,
            value_name="ratio",
            nonfinite=view.nonfinite,
            nonfinite_text=view.nonfinite_text,
            first=True,
        )
        note = self.query_one(".skip--note", Label)
        note.update(self.init_note)
        note.display = bool(self.init_note)  # said where the "no finite ratio" cells show
        cls = np.asarray(view.extra["cls"], dtype=float)
        spatial = np.asarray(view.extra["spatial_mean"], dtype=float)
        extra = view.extra  # the intervals over images, absent for a result computed with --ci 0
        series = (
            [Series("CLS token", cls, extra.get("cls_ci_low"), extra.get("cls_ci_high"))]
            if np.isfinite(cls).any()
            else []
        )
        series.append(
            Series(
                "spatial tokens (mean)" if series else "whole map",
                spatial,
                extra.get("spatial_ci_low"),
                extra.get("spatial_ci_high"),
            )
        )
        self.query_one(LinePlot).plot(
            series,
            [short_label(r) for r in view.rows],
            mark=heatmap.cursor[0],
            hline=1.0,
            hline_name="ratio 1",
            caption=view.interval_caption(),
        )

    def legend(self) -> list[tuple[str, str]]:
        return super().legend() + [
            (
                "\u2812\u2812 \u2824\u2824",
                "below: the CLS token and the mean over spatial tokens, sublayer by sublayer",
            ),
            ("\u2508\u2508", "a ratio of 1: the skip and the branch are equally large"),
            (BAND, "the interval of the mean over images (the caption gives its level)"),
            ("\u25b2", "the sublayer under the cursor"),
        ]

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        message.stop()
        from vitsee.tui.screens.view_detail import skip_token_detail

        self.push_detail(skip_token_detail, message.row, message.col)

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        message.stop()
        self.query_one(LinePlot).set_mark(message.row)
        self.tell_status(self.status_text() or message.summary)

    def status_text(self) -> str:
        heatmap = self.heatmap
        if heatmap is None or self.loaded is None:
            return ""
        row, col = heatmap.cursor
        view = self.loaded.view
        value = heatmap.value_at(row, col)
        interval = view.interval_text(row, col) if value == value else ""
        text = f"{heatmap.row_labels[row]} x {heatmap.col_labels[col]}  ratio {heatmap.describe(row, col)}{interval}"
        if self.init_note and not (value == value and abs(value) < 1e4):  # the cell the note explains
            text += "  " + self.init_note.partition(" (")[0].partition(",")[0]
        return text

    def jump_to_layer(self, layer: str) -> bool:
        heatmap, view = self.heatmap, self.view
        if heatmap is None or view is None:
            return False
        rows = [i for i, r in enumerate(view.rows) if r == layer or r.startswith(layer + ".")]
        if not rows:
            return False
        heatmap.cursor = (rows[0], heatmap.cursor[1])
        return True

    def layer_choices(self) -> list[str]:
        view = self.view
        if view is None:
            return []
        # rows are sublayers (blocks.3.attn, blocks.3.mlp): offer each block once
        return list(dict.fromkeys(r.rsplit(".", 1)[0] if r.endswith((".attn", ".mlp")) else r for r in view.rows))

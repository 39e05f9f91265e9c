"""Mean attention distances (paper Fig. 3, 4): heads per block, and the selected block's histogram."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.widget import Widget

from vitsee.analyses.contract import Shape
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.distance_plot import DOT, NONFINITE, UNIFORM, WHISKER, WHISKER_HIGH, WHISKER_LOW, DistancePlot
from vitsee.tui.widgets.histogram import Histogram
from vitsee.tui.widgets.view_pane import ViewPane


class AttentionPane(ViewPane):
    """Per block the heads' sorted mean distances; below, the distances of every head and image of the
    selected block as a histogram, with the distance of uniform attention marked in both."""

    shape = Shape.HEADS_BY_BLOCK
    key_help: ClassVar[dict[str, str]] = {
        "attention.select": "Open the head under the cursor: its distance per image as a histogram, with its mean",
    }

    DEFAULT_CSS = """
    AttentionPane {
        & Histogram { height: 1fr; min-height: 6; max-height: 24; }
    }
    """

    def compose_body(self) -> ComposeResult:
        yield DistancePlot(id=f"{self.kind}-plot")
        yield Histogram(id=f"{self.kind}-histogram")

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        plot = self.query_one(DistancePlot)
        # the intervals are None for a result computed with --ci 0: no whiskers
        plot.show(
            view.matrix,
            list(view.rows),
            float(np.asarray(view.extra["hist_edges"])[-1]),
            view.extra["uniform_px"],
            view.nonfinite,
            view.ci_low,
            view.ci_high,
            view.interval_caption(),
        )

    def on_distance_plot_cursor_moved(self, message: DistancePlot.CursorMoved) -> None:
        message.stop()
        view = self.view
        if view is None:
            return
        counts = np.asarray(view.extra["hist_counts"])[message.block]
        edges = np.asarray(view.extra["hist_edges"])
        left_out = view.n_images * view.matrix.shape[1] - int(counts.sum()) if view.n_images else 0
        self.query_one(Histogram).show(
            counts,
            edges,
            marker=view.extra["uniform_px"],
            marker_name=f"uniform {view.extra['uniform_px']:.1f} px",
            unit="px",
            caption=f"{view.rows[message.block]}: every head and image"
            + (f" ({left_out} non-finite left out)" if left_out > 0 else ""),
        )
        self.post_status()

    def legend(self) -> list[tuple[str, str]]:
        view = self.view
        uniform = f" ({view.extra['uniform_px']:.1f} px here)" if view is not None else ""
        return [
            (DOT, "one head at its mean attention distance (over spatial queries and images); a row is a block"),
            ("2-9", "that many heads fall on one character"),
            (f"{UNIFORM}  \u25b2", f"the distance of uniform attention over the grid{uniform}: left of it is local"),
            (
                WHISKER_LOW + WHISKER + WHISKER_HIGH,
                "whisker: the interval of the mean over images, for the head under the cursor",
            ),
            (NONFINITE, "a head whose distance is NaN/Inf (non-finite activations), at the right end"),
            ("reversed", "the head under the cursor; the highlighted row is its block"),
            (
                "\u2581\u2583\u2588",
                "below: every head and image of the block, binned by distance; \u2502\u25b2 uniform attention",
            ),
        ]

    def on_distance_plot_head_selected(self, message: DistancePlot.HeadSelected) -> None:
        message.stop()
        from vitsee.tui.screens.view_detail import HeadDistanceDetail

        self.push_detail(HeadDistanceDetail, message.block, message.head)

    @property
    def selection(self) -> tuple[int, int] | None:
        return self.query_one(DistancePlot).cursor if self.view is not None else None

    def status_text(self) -> str:
        view = self.view
        if view is None:
            return ""
        block, head = self.query_one(DistancePlot).cursor
        heads = view.matrix.shape[1]
        original = int(np.asarray(view.extra["head_order"])[block, head]) + 1
        std = float(np.asarray(view.extra["std_px"])[block, head])
        # Swin: uniform attention inside a window of this block's stage
        uniform = float(
            np.asarray(view.extra.get("uniform_px_per_block", [view.extra["uniform_px"]] * (block + 1)))[block]
        )
        distance = view.matrix[block, head]
        shown = f"{distance:.1f} px \u00b1 {std:.1f}" if np.isfinite(distance) else view.cell_text(block, head)
        interval = ""
        if view.ci_low is not None and np.isfinite(view.ci_low[block, head]):  # of the mean over images
            interval = f"  mean in [{view.ci_low[block, head]:.1f}, {view.ci_high[block, head]:.1f}]"
        return (
            f"{view.rows[block]} head {original} ({head + 1}/{heads} by distance)  "
            f"distance {shown}{interval}  uniform {uniform:.1f} px"
        )

    def main_widget(self) -> Widget | None:
        return self.query_one(DistancePlot)

    def jump_to_layer(self, layer: str) -> bool:
        view = self.view
        if view is None or layer not in view.rows:
            return False
        plot = self.query_one(DistancePlot)
        plot.cursor = (view.rows.index(layer), plot.cursor[1])
        return True

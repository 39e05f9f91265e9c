"""The pane of a models x models matrix (Shape.MODEL_MATRIX, the zoo): which model of the store is like which.

Above, the heatmap of every pair's summary in the clustering order: rows name the models (shortened alike), the
columns are the same models in the same order, marked by their family (ViT, ResNet, ...). Enter on a cell opens
that pair's layer x layer view (the measure the zoo summarises), models A and B set to the pair. Below, every
model's layers matched onto one reference model's, relative depth against relative depth (the monotone path of
the pair's matrix), one curve per model; r makes the next model the reference. v switches the heatmap between the raw
summaries and the calibrated ones (against the zoo's permutation null: 0 at chance, 1 for a model with itself); the
status line always says both, with the pair's p-value.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Label

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import ColorMode
from vitsee.output.labels import display_labels
from vitsee.tui.messages import PairOpened
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import Heatmap
from vitsee.tui.widgets.line_plot import LinePlot, Series
from vitsee.tui.widgets.view_pane import HeatmapPane, Place

DEPTHS = 21  # the curves' x axis: relative depth in steps of 0.05; each layer sits at the nearest step
LABEL_CHARS = 16  # model names in the heatmap's gutter ('vit_tiny init'): wider than a layer's 12


def depth_series(depth_a, depth_b) -> np.ndarray:
    """Returns (DEPTHS,) the curve of one model: at the step nearest each of its layers' relative depth, the relative
    depth of its match; NaN between (the plot joins its points)."""
    values = np.full(DEPTHS, np.nan)
    for x, y in zip(depth_a, depth_b):
        if y is not None and np.isfinite(y):
            values[int(round(float(x) * (DEPTHS - 1)))] = float(y)
    return values


class ModelMatrixPane(HeatmapPane):
    """The zoo: a models x models heatmap in the clustering order, and each model's layer correspondence with a
    reference model."""

    shape = Shape.MODEL_MATRIX
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "r",
            "next_reference",
            "Reference",
            id="zoo.reference",
            tooltip="Match every model's layers onto the next model's (the reference of the curves below)",
        ),
        Binding(
            "v",
            "toggle_calibrated",
            "Raw/calibrated",
            id="zoo.calibrated",
            tooltip="Show the raw summaries or the calibrated ones (against the permutation null)",
        ),
    ]
    key_help: ClassVar[dict[str, str]] = {
        "heatmap.select": "Open the layer x layer view of the pair under the cursor (models A and B set to the pair)",
        "zoo.reference": "Make the next model (in the heatmap's order) the reference the curves match layers onto",
        "zoo.calibrated": "Switch the heatmap between the raw summaries and the calibrated ones (against chance)",
    }
    lists_model_layers = False

    DEFAULT_CSS = """
    ModelMatrixPane {
        & Heatmap { height: 1fr; min-height: 6; }
        & .zoo--curves { width: 1fr; height: 1; padding: 0 1; color: $text-muted; text-wrap: nowrap;
                         text-overflow: ellipsis; }
        & LinePlot { height: 9; }
    }
    """

    reference = 0  # the store index of the model the curves match the others onto
    calibrated = False  # the heatmap shows the calibrated summaries (v), not the raw ones
    _drawn: tuple[list[str], list[int]] | None = None  # the models and the order the heatmap draws them in

    def compose_body(self) -> ComposeResult:
        yield Label("", classes="zoo--curves")
        yield LinePlot(id=f"{self.kind}-curves", monochrome=self.color_mode is ColorMode.NONE)

    # --- what is shown ----------------------------------------------------------------------------------------

    @property
    def order(self) -> list[int]:
        """Returns the store indices of the models in the heatmap's order (the clustering's)."""
        view = self.view
        return [int(i) for i in view.extra["order"]] if view is not None else []

    def names(self, width: int = LABEL_CHARS) -> list[str]:
        """Returns the models' names shortened alike, in the store's order (one form everywhere in the pane: the
        heatmap's rows, the curves, the side panel and the status line)."""
        view = self.view
        return display_labels(view.rows, view.names, width) if view is not None else []

    def calibrated_matrix(self) -> np.ndarray | None:
        """Returns the view's calibrated summaries (store order), None when its zoo has no null."""
        view = self.view
        values = None if view is None else view.extra.get("calibrated")
        if values is None:
            return None
        values = np.asarray(values, dtype=float)
        return values if np.isfinite(values).any() else None

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        order = self.order
        calibrated = self.calibrated_matrix() if self.calibrated else None
        self.calibrated = calibrated is not None  # a zoo without a null shows its raw values
        source = view.matrix if calibrated is None else calibrated
        shown = source[np.ix_(order, order)]
        vmin, vmax, value_name = (
            (view.vmin, view.vmax, view.value_name)
            if calibrated is None
            else (None, 1.0, f"calibrated {view.value_name}")
        )
        # the pair under the cursor, by store index: the next view's clustering may order the models otherwise
        kept = self._drawn_pair(view.rows)
        rows = [self.names()[i] for i in order]
        families = [view.extra["families"][i] for i in order]
        nonfinite = view.nonfinite[np.ix_(order, order)] if view.nonfinite is not None else None

        def describe(r: int, c: int) -> str:
            return view.nonfinite_text(order[r], order[c])

        self.show_matrix(
            shown,
            rows,
            families,
            vmin=vmin,
            vmax=vmax,
            value_name=value_name,
            nonfinite=nonfinite,
            nonfinite_text=describe,
            first=True,
            label_chars=LABEL_CHARS,
        )
        if kept is not None:
            self.heatmap.cursor = (order.index(kept[0]), order.index(kept[1]))
        self._drawn = (list(view.rows), order)
        if not 0 <= self.reference < len(view.rows):
            self.reference = 0
        self.plot_curves()

    def plot_curves(self) -> None:
        """Draws every other model's layers matched onto the reference model's."""
        view = self.view
        if view is None:
            return
        reference = view.rows[self.reference]
        names = self.names()
        pairs = {(c["a"], c["b"]): c for c in view.extra.get("correspondences", [])}
        series = []
        for i in self.order:
            c = pairs.get((view.rows[i], reference))
            if c is not None:
                series.append(Series(names[i], depth_series(c["depth_a"], c["depth_b_path"])))
        x_labels = [f"{k / (DEPTHS - 1):g}" for k in range(DEPTHS)]
        self.query_one(LinePlot).plot(series, x_labels, ymin=0.0, ymax=1.0)
        self.query_one(".zoo--curves", Label).update(
            f"each model's layers (x: relative depth) matched onto {names[self.reference]}'s (y), r: next reference"
        )

    def action_toggle_calibrated(self) -> None:
        """Switches the heatmap between the raw and the calibrated summaries; says how to get a null without one."""
        if self.loaded is None:
            return
        if self.calibrated_matrix() is None:
            self.notify(
                "this zoo has no permutation null: vitsee analyze STORE --zoo --zoo-permutations 999",
                severity="warning",
            )
            return
        self.calibrated = not self.calibrated
        self.populate(self.loaded)
        self.post_status()

    def action_next_reference(self) -> None:
        """Makes the next model in the heatmap's order the reference of the curves."""
        order = self.order
        if order:
            at = order.index(self.reference) if self.reference in order else -1
            self.reference = order[(at + 1) % len(order)]
            self.plot_curves()
            self.post_status()

    # --- the cursor -------------------------------------------------------------------------------------------

    def _drawn_pair(self, models: list[str]) -> tuple[int, int] | None:
        """Returns the store indices of the cell under the cursor as the heatmap draws it now, None when it draws
        nothing yet or other models."""
        heatmap, drawn = self.heatmap, self._drawn
        if heatmap is None or drawn is None or drawn[0] != models:
            return None
        row, col = heatmap.cursor
        return drawn[1][row], drawn[1][col]

    def pair(self) -> tuple[int, int] | None:
        """Returns the store indices (row model, column model) of the cell under the cursor."""
        heatmap, order = self.heatmap, self.order
        if heatmap is None or self.loaded is None:
            return None
        row, col = heatmap.cursor
        return order[row], order[col]

    @property
    def selection(self) -> tuple[int, int] | None:
        return self.pair()  # the view's matrix is in the store's order

    def status_text(self) -> str:
        pair, view = self.pair(), self.view
        if pair is None or view is None:
            return ""
        i, j = pair
        names, families = self.names(), view.extra["families"]
        interval = view.interval_text(i, j) if np.isfinite(view.matrix[i, j]) else ""
        # parts the status line drops from the end where it is narrow: the families go first
        return (
            f"{names[i]} x {names[j]}  {view.value_name} {view.cell_text(i, j)}{interval}{self.chance_text(i, j)}  "
            f"{families[i]} x {families[j]}"
        )

    def chance_text(self, i: int, j: int) -> str:
        """Returns '  calibrated 0.412 p<0.01' for a pair of a zoo with a null ('' without one, or on the diagonal)."""
        from vitsee.stats import significance_label

        calibrated, view = self.calibrated_matrix(), self.view
        if calibrated is None or view is None or not np.isfinite(calibrated[i, j]):
            return ""
        p = float(np.asarray(view.extra["p_value"], dtype=float)[i, j])
        label = significance_label(p, int(view.extra.get("null_permutations") or 0))
        return f"  calibrated {calibrated[i, j]:.3f} {label}"

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        message.stop()
        self.tell_status(self.status_text() or message.summary)

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        message.stop()
        pair, view = self.pair(), self.view
        if pair is not None and view is not None:
            self.post_message(PairOpened(str(view.extra["measure"]), view.rows[pair[0]], view.rows[pair[1]]))

    def layer_choices(self) -> list[str]:
        """Returns the models' names, in the heatmap's order (the side panel lists them; Enter moves the cursor
        there)."""
        names = self.names()
        return [names[i] for i in self.order]

    def jump_to_layer(self, layer: str) -> bool:
        """Moves the cursor to the row of a model (its name as the side panel lists it, or its store key)."""
        heatmap, view = self.heatmap, self.view
        if heatmap is None or view is None:
            return False
        names = self.names()
        index = names.index(layer) if layer in names else view.rows.index(layer) if layer in view.rows else None
        if index is None:
            return False
        heatmap.cursor = (self.order.index(index), heatmap.cursor[1])
        return True

    def places(self) -> list[Place]:
        return [Place(model) for model in self.layer_choices()]

    def legend(self) -> list[tuple[str, str]]:
        return super().legend() + [
            ("rows", "the models, in the order of a hierarchical clustering of the matrix"),
            ("columns", "the same models in the same order, labelled with their family (ViT, ResNet, ...)"),
            (
                "\u2812\u2812",
                "below: each model's layers matched onto the reference's, by relative depth (0 first, 1 last)",
            ),
            (
                "v",
                "the heatmap: raw summaries, or calibrated = (raw - null mean) / (best - null mean) against the "
                "permutation null (0: chance, 1: a model with itself); the status line says both and p",
            ),
        ]

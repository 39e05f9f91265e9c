"""Spatial localisation (paper Fig. 9, 10): how much one token position's representation resembles each
input patch; the cursor walks over the image grid and the map is that token's."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.widgets import Label

from vitsee.analyses.contract import Shape
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import Heatmap
from vitsee.tui.widgets.view_pane import HeatmapPane


def cell_name(index: int, grid_w: int) -> str:
    return f"r{index // grid_w}c{index % grid_w}"


class SpatialPane(HeatmapPane):
    """A grid-sized heatmap: the cursor is a token position, the colours its CKA with every input patch."""

    shape = Shape.TOKEN_MAPS
    key_help: ClassVar[dict[str, str]] = {
        "heatmap.select": "Open the map of the token under the cursor at full size, with its values",
        "heatmap.up": "Move to the token one row up (its map is shown)",
        "heatmap.down": "Move to the token one row down (its map is shown)",
        "heatmap.left": "Move to the token one column left (its map is shown)",
        "heatmap.right": "Move to the token one column right (its map is shown)",
    }

    DEFAULT_CSS = """
    SpatialPane {
        & Heatmap { height: 1fr; }
        & .spatial--note { height: 1; color: $text-muted; padding: 0 1; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.token = 0
        self.grid_layers: list[str] = []  # the layers with a grid, offered by the side panel

    def compose_body(self) -> ComposeResult:
        yield Label("", classes="spatial--note")

    @property
    def grid(self) -> tuple[int, int]:
        view = self.view
        gh, gw = view.extra["grid"] if view is not None else (1, 1)
        return int(gh), int(gw)

    def token_map(self, token: int) -> np.ndarray:
        gh, gw = self.grid
        return np.asarray(self.view.matrix[token], dtype=float).reshape(gh, gw)

    def token_marks(self, token: int) -> dict:
        """Returns the Heatmap keywords that mark a token map's non-finite cells."""
        view, (gh, gw) = self.view, self.grid
        if view.nonfinite is None:
            return {}
        return {
            "nonfinite": view.nonfinite[token].reshape(gh, gw),
            "nonfinite_text": lambda i, j: view.nonfinite_text(token, i * gw + j),
        }

    def populate(self, loaded: LoadedView) -> None:
        view = loaded.view
        gh, gw = self.grid
        self.token = min(self.token, gh * gw - 1)
        rows, cols = [f"r{i}" for i in range(gh)], [f"c{j}" for j in range(gw)]
        heatmap = self.show_matrix(
            self.token_map(self.token),
            rows,
            cols,
            vmin=view.vmin,
            vmax=view.vmax,
            value_name="CKA",
            **self.token_marks(self.token),
        )
        heatmap.cursor = (self.token // gw, self.token % gw)
        self.query_one(".spatial--note", Label).update(
            f"CKA of the cursor's token ({view.params.get('layer')}, {gh}x{gw}) with the stored, normalised "
            f"pixels of each {view.extra.get('patch_px')} px patch"
        )

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        message.stop()
        if self.view is None:
            return
        gh, gw = self.grid
        token = message.row * gw + message.col
        if token != self.token:
            self.token = token
            message.heatmap.set_data(self.token_map(token), **self.token_marks(token))
        self.tell_status(self.status_text())

    def legend(self) -> list[tuple[str, str]]:
        marks = super().legend()
        marks[1] = ("[ ]  +", "the token position whose map is shown: its colours are its CKA with each input patch")
        return marks

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        message.stop()
        from vitsee.tui.screens.view_detail import spatial_token_detail

        if self.view is not None:
            self.push_detail(spatial_token_detail, self.token, self.grid)

    @property
    def selection(self) -> tuple[int, int] | None:
        return (self.token, self.token) if self.view is not None else None

    def status_text(self) -> str:
        view = self.view
        if view is None:
            return ""
        gh, gw = self.grid
        values = np.asarray(view.matrix[self.token], dtype=float)
        peak = int(np.nanargmax(values)) if np.isfinite(values).any() else self.token
        own = view.cell_text(self.token, self.token)
        if not np.isfinite(values).any():
            return f"token {cell_name(self.token, gw)} x patch {cell_name(self.token, gw)}  CKA {own}"
        return (
            f"token {cell_name(self.token, gw)} x patch {cell_name(self.token, gw)}  CKA {own}"
            f"  peak patch {cell_name(peak, gw)} {values[peak]:.4f}"
        )

    def layer_choices(self) -> list[str]:
        return list(self.grid_layers)

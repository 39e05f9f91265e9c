"""What every analysis pane shares: a title, a message shown while loading or when there is nothing
to show, the body, and the selection (the cell an export marks and the status line names)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import DataTable, Label, Static

from vitsee.analyses.contract import Shape
from vitsee.output.colormap import ASCII_RAMP, ColorMode
from vitsee.tui.messages import Place, StatusChanged
from vitsee.tui.results import LoadedView
from vitsee.tui.widgets.heatmap import MISSING_GLYPH, NONFINITE_ASCII, NONFINITE_GLYPH, UPPER_HALF, Heatmap

if TYPE_CHECKING:
    from vitsee.analyses.views import View


PANE_CLASSES: dict[Shape, type[ViewPane]] = {}  # view shape -> the pane that draws it; filled as each is defined


class ViewPane(Vertical):
    """A view's pane: `show(loaded)` fills it, `show_message(text)` replaces it with a line of text.

    A subclass names the view shape it draws (`shape`, engine/analyses/contract.py Shape) and so becomes the pane
    of every analysis of that shape: the explorer builds a tab per registered analysis, each with a pane of its
    shape's class, whose `kind` is the analysis's name and `label` its label.
    """

    shape: ClassVar[Shape | None] = None
    key_help: ClassVar[dict[str, str]] = {}  # binding id -> what the key does in this view, for the help screen
    lists_model_layers: ClassVar[bool] = False  # before its view loads, the side panel lists the model's layers

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("shape") is not None:  # HeatmapPane and other bases draw no shape of their own
            PANE_CLASSES[cls.shape] = cls

    DEFAULT_CSS = """
    ViewPane {
        height: 1fr;
        & > .pane--title {
            width: 1fr;
            height: 1;
            color: $text-muted;
            padding: 0 1;
            text-wrap: nowrap;
            text-overflow: ellipsis;
        }
        & > .pane--message { width: 1fr; height: auto; padding: 1 2; color: $text-muted; }
        & > .pane--body { height: 1fr; }
        &.-message > .pane--body { display: none; }
        &.-ready > .pane--message { display: none; }
    }
    """

    def __init__(self, kind: str, color_mode: ColorMode, cmap: str = "viridis", *, id: str | None = None) -> None:
        from vitsee.analyses import REGISTRY

        self.kind = kind  # the analysis it shows
        self.label = REGISTRY[kind].label
        super().__init__(id=id or f"pane-{kind}", classes="-message")
        self.color_mode = color_mode
        self.cmap = cmap
        self.loaded: LoadedView | None = None
        self._early: tuple[str, object] | None = None  # what was asked before the pane's children existed
        self._when_drawn: list[Callable[[], object]] = []  # called once the shown view is on screen

    def when_drawn(self, callback: Callable[[], object]) -> None:
        """Calls callback once the view shown now has been painted and the screen has nothing left to repaint."""
        self._when_drawn.append(callback)
        self.refresh()

    def render_lines(self, crop: Region) -> list[Strip]:
        lines = super().render_lines(crop)
        if self._when_drawn and self.loaded is not None:  # painting the view: the frame is being written
            callbacks, self._when_drawn = self._when_drawn, []
            for callback in callbacks:
                self.call_after_refresh(callback)  # after this frame and any left to paint (a heatmap mounted late)
        return lines

    def compose(self) -> ComposeResult:
        yield Label("", classes="pane--title")
        yield Static("", classes="pane--message")
        with Vertical(classes="pane--body"):
            yield from self.compose_body()

    def compose_body(self) -> ComposeResult:
        yield from ()

    @property
    def view(self) -> View | None:
        return self.loaded.view if self.loaded is not None else None

    def on_mount(self) -> None:
        if self._early is not None:
            what, arg = self._early
            self._early = None
            self.show(arg) if what == "show" else self.show_message(arg)

    def _composed(self) -> bool:
        # the body too: a pane being removed (the app quitting) still has its children, unmounted
        bodies = self.query(".pane--body")
        return bool(self.query(".pane--title")) and bool(bodies) and bodies.first().is_attached

    def show(self, loaded: LoadedView) -> None:
        """Show a view's numbers."""
        if not self._composed():
            self._early = ("show", loaded)
            return
        self.loaded = loaded
        view = loaded.view
        self.query_one(".pane--title", Label).update(view.title)  # the title bar names weights and images
        self.set_class(False, "-message")
        self.set_class(True, "-ready")
        self.populate(loaded)

    def show_message(self, text: str, keep: bool = False) -> None:
        """Show a line of text instead of the view (loading, not applicable, failed)."""
        if keep and self.loaded is not None:
            return
        if not self._composed():
            self._early = ("message", text)
            return
        self.loaded = None
        self.query_one(".pane--title", Label).update("")
        self.query_one(".pane--message", Static).update(text)
        self.set_class(True, "-message")
        self.set_class(False, "-ready")
        self.tell_status(text.splitlines()[0] if text else "")

    def populate(self, loaded: LoadedView) -> None:
        """Fill the body from a view (subclasses)."""

    @property
    def selection(self) -> tuple[int, int] | None:
        """Returns the (row, col) of the view's matrix that is selected, for export."""
        return None

    def status_text(self) -> str:
        return ""

    def post_status(self) -> None:
        self.tell_status(self.status_text())

    def tell_status(self, text: str) -> None:
        """Tells the screen's status line what this pane says now. Posted to the screen itself: a message bubbles up
        no further than the widget whose handler made it, and the panes' container makes some (a view read)."""
        self.screen.post_message(StatusChanged(self.kind, text))

    def main_widget(self) -> Widget | None:
        """Returns the widget that takes the keys of this view (focused when the view opens)."""
        return None

    def jump_to_layer(self, layer: str) -> bool:
        """Moves the selection to a layer picked in the side panel; returns whether it could."""
        return False

    def layer_choices(self) -> list[str]:
        """Returns the layers the side panel offers for this view (default: the view's rows)."""
        view = self.view
        return list(view.rows) if view is not None else []

    def places(self) -> list[Place]:
        """Returns where search can move the cursor, in the order n steps through them (default: the side
        panel's layers)."""
        return [Place(layer) for layer in self.layer_choices()]

    def go_to(self, place: Place) -> bool:
        """Moves the cursor to a place from `places()`; returns whether it could."""
        return self.jump_to_layer(place.name)

    def set_cmap(self, cmap: str) -> None:
        self.cmap = cmap

    def legend(self) -> list[tuple[str, str]]:
        """Returns (glyph, what it means) for each mark this view draws, for the help screen."""
        return []

    def push_detail(self, make, *args) -> None:
        """Opens the detail `make(loaded, *args, ...)` returns, drawn with the pane's colours."""
        if self.loaded is not None:
            self.app.push_screen(make(self.loaded, *args, color_mode=self.color_mode, cmap=self.cmap))

    def toggle_zoom(self) -> bool:
        """Cycles the zoom of the view's heatmap; returns False when the view has none."""
        return False


class HeatmapPane(ViewPane):
    """A pane whose main widget is a Heatmap (CKA, skip ratios, spatial maps): it takes the keys, the colour
    map and the zoom."""

    @property
    def heatmap(self) -> Heatmap | None:
        found = self.query(Heatmap)
        return found.first() if found else None

    def show_matrix(
        self,
        matrix: np.ndarray,
        rows: Sequence[str],
        cols: Sequence[str],
        *,
        vmin: float | None,
        vmax: float | None,
        value_name: str,
        nonfinite: np.ndarray | None = None,
        nonfinite_text: Callable[[int, int], str] | None = None,
        first: bool = False,
        **looks,
    ) -> Heatmap:
        """Returns the pane's heatmap drawing `matrix`: mounted into the body the first time (`first`: above what the
        body holds already), then given the new numbers, scale and colours (its cursor stays). `looks`: the
        Heatmap's other keywords (label_chars)."""
        heatmap = self.heatmap
        if heatmap is None:
            heatmap = Heatmap(
                matrix,
                rows,
                cols,
                vmin=vmin,
                vmax=vmax,
                cmap=self.cmap,
                color_mode=self.color_mode,
                value_name=value_name,
                id=f"{self.kind}-heatmap",
                nonfinite=nonfinite,
                nonfinite_text=nonfinite_text,
                **looks,
            )
            self.query_one(".pane--body").mount(heatmap, before=0 if first else None)
            return heatmap
        heatmap.set_cmap(self.cmap)
        heatmap.set_scale(vmin, vmax, value_name)  # a pane's view may change what it measures (the zoo's `m`)
        heatmap.set_data(matrix, rows, cols, nonfinite=nonfinite, nonfinite_text=nonfinite_text)
        return heatmap

    def main_widget(self) -> Widget | None:
        return self.heatmap

    @property
    def selection(self) -> tuple[int, int] | None:
        heatmap = self.heatmap
        return heatmap.cursor if heatmap is not None and self.loaded is not None else None

    def set_cmap(self, cmap: str) -> None:
        super().set_cmap(cmap)
        if self.heatmap is not None:
            self.heatmap.set_cmap(cmap)

    def legend(self) -> list[tuple[str, str]]:
        plain = self.color_mode is ColorMode.NONE
        marks = [
            ("[ ]  +", "the cell under the cursor: corner marks (+ on a narrow cell), its own colour left visible"),
            (
                NONFINITE_ASCII if plain else NONFINITE_GLYPH,
                "no value: NaN/Inf inputs or undefined (the status line says which, and why)",
            ),
            (MISSING_GLYPH, "not computed yet"),
        ]
        if plain:
            marks.insert(
                0,
                (
                    ASCII_RAMP.strip(),
                    "no colour: a denser character is a higher value (the bottom line gives the range)",
                ),
            )
        else:
            marks.insert(
                0, (UPPER_HALF, "two rows per character when pooled: the upper half one row, the lower half the next")
            )
        marks.append(("bottom line", "the zoom, then the colour ramp from its lowest to its highest value"))
        return marks

    def toggle_zoom(self) -> bool:
        if self.heatmap is None:
            return False
        self.heatmap.action_cycle_zoom()
        return True

    def jump_to_layer(self, layer: str) -> bool:
        """Moves the cursor to the row of that name, keeping its column (a layer x layer matrix's rows are
        layers); returns False where no row is."""
        heatmap, view = self.heatmap, self.view
        if heatmap is None or view is None or layer not in view.rows:
            return False
        heatmap.cursor = (view.rows.index(layer), heatmap.cursor[1])
        return True


class TablePane(ViewPane):
    """A pane whose main widget is a DataTable of the view's matrix (probes, the measures' scores): the cell under
    its cursor is the selection."""

    @property
    def selection(self) -> tuple[int, int] | None:
        if self.view is None:
            return None
        coordinate = self.query_one(DataTable).cursor_coordinate
        return (coordinate.row, coordinate.column)

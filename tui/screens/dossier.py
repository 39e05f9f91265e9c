"""The layer-pair dossier: what vitsee knows about the two layers of a CKA cell, one small section per analysis;
Enter on a section opens its full view at that layer (the screen dismisses with where to go)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.results import LoadedView, StoreSummary
from vitsee.tui.widgets.heatmap import short_label
from vitsee.tui.widgets.line_plot import LinePlot, Series
from vitsee.tui.widgets.view_pane import ViewPane

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.tui.dossier import Dossier, Section

log = logging.getLogger(__name__)


DOSSIER_BINDING = Binding(
    "d",
    "dossier",
    "Dossier",
    show=False,
    id="explorer.dossier",
    tooltip="In the CKA view: everything vitsee knows about the selected pair of layers (CKA, head "
    "distances, probes, skip ratios, spatial maps, ERFs)",
)


@dataclass(frozen=True)
class OpenView:
    """Where the explorer goes when the dossier closes on a section: a view of a model, its cursor at a layer."""

    kind: str
    model: str
    layer: str


class DossierSection(Vertical, can_focus=True):
    """A titled block of the dossier that Enter opens in its full view."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open view", id="dossier.open", tooltip="Open this section's full view at its layer"),
        # here, not on the screen: the scrolling body between would take the arrows to scroll
        Binding("down,j", "app.focus_next", "Next", show=False, id="dossier.next", tooltip="Go to the next section"),
        Binding(
            "up,k",
            "app.focus_previous",
            "Previous",
            show=False,
            id="dossier.previous",
            tooltip="Go to the previous section",
        ),
    ]

    class Opened(Message):
        def __init__(self, target: OpenView) -> None:
            super().__init__()
            self.target = target

    def __init__(self, target: OpenView, *children, available: bool = True, id: str | None = None) -> None:
        super().__init__(*children, classes="" if available else "-missing", id=id)
        self.target = target
        self.available = available

    def action_open(self) -> None:
        self.post_message(self.Opened(self.target))


class DossierScreen(ModalScreen[OpenView | None]):
    """The cell's value (CKA, or another layer x layer measure) with its row and column, then each layer's section
    of every analysis that has one (head distances, probes, skip ratios, spatial map, ERF); dismisses with the view
    to open, or None (Esc)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,d", "dismiss", "Close", id="dossier.close", tooltip="Close the dossier"),
    ]

    DEFAULT_CSS = """
    DossierScreen {
        align: center middle;
        & > #dossier {
            width: 95%;
            max-width: 130;
            height: 95%;
            border: round $accent;
            background: $surface;
            padding: 0 1;
        }
        & .dossier--title { text-style: bold; width: 1fr; }
        & .dossier--hint { color: $text-muted; width: 1fr; }
        & #dossier-body { height: 1fr; }
        & DossierSection { height: auto; padding: 0 1; margin-bottom: 1; border-left: blank; }
        & DossierSection:focus { border-left: thick $accent; background: $boost; }
        & DossierSection > Label { width: 1fr; }  /* a long line wraps inside the box instead of running past it */
        & DossierSection > .section--title { text-style: bold; }
        & DossierSection.-missing > .section--lines { color: $text-muted; }
        & DossierSection LinePlot { height: 6; }
        & .section--caption { color: $text-muted; }
    }
    """

    def __init__(
        self,
        path: Path,
        summary: StoreSummary,
        cka: LoadedView,
        row: int,
        col: int,
        config: Callable[[], AnalyzeConfig],
        known: dict[str, LoadedView],
    ) -> None:
        super().__init__()
        self.path, self.summary, self.cka, self.row, self.col = Path(path), summary, cka, row, col
        self.config = config
        self.known = dict(known)  # a copy taken here: the explorer adds views while the worker reads
        self.dossier: Dossier | None = None

    def compose(self) -> ComposeResult:
        view = self.cka.view
        a, b = view.models[0].partition("@")[0], view.models[-1].partition("@")[0]
        row, col = view.rows[self.row], view.cols[self.col]
        with Vertical(id="dossier"):
            yield Label(f"{row} ({a}) x {col} ({b})", classes="dossier--title")
            with VerticalScroll(id="dossier-body"):
                yield self._cka_section()
                yield Static("reading what the store holds on these layers \u2026", id="dossier-loading")
            yield Label(
                "\u2191\u2193 / Tab: sections  Enter: open the full view there  Esc: close", classes="dossier--hint"
            )

    def _cka_section(self) -> DossierSection:
        """Returns the section of the cell itself: its value with its interval, its row and its column."""
        view = self.cka.view
        r, c = self.row, self.col
        caption = [Label(view.interval_caption(), classes="section--caption")] if view.interval_caption() else []
        return DossierSection(
            OpenView(view.kind, view.models[0], view.rows[r]),
            Label(f"{view.value_name} {view.cell_text(r, c)}{view.interval_text(r, c)}", classes="section--title"),
            *caption,
            Label(f"{view.rows[r]} against every column layer", classes="section--caption"),
            LinePlot(id="dossier-row"),
            Label(f"{view.cols[c]} against every row layer", classes="section--caption"),
            LinePlot(id="dossier-col"),
            id="section-cell",
        )

    def on_mount(self) -> None:
        view = self.cka.view
        name, low, high = view.value_name, view.vmin, view.vmax
        self.query_one("#dossier-row", LinePlot).plot(
            [Series(f"{name}({view.rows[self.row]}, column)", view.matrix[self.row, :])],
            [short_label(x) for x in view.cols],
            ymin=low,
            ymax=high,
            mark=self.col,
        )
        self.query_one("#dossier-col", LinePlot).plot(
            [Series(f"{name}(row, {view.cols[self.col]})", view.matrix[:, self.col])],
            [short_label(x) for x in view.rows],
            ymin=low,
            ymax=high,
            mark=self.row,
        )
        self.query_one("#section-cell").focus()
        self._read()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _read(self) -> None:
        from vitsee.tui.dossier import read_dossier

        try:
            dossier = read_dossier(self.path, self.summary, self.cka, self.row, self.col, self.config, self.known)
        except VitseeError as exc:
            self.app.call_from_thread(self._failed, str(exc))
        except Exception as exc:  # a bug: one line on screen, the traceback in the log
            log.exception("reading the dossier of %s", self.cka.spec)
            self.app.call_from_thread(self._failed, bug_text("cannot read the dossier", exc))
        else:
            self.app.call_from_thread(self._show, dossier)

    def _failed(self, text: str) -> None:
        self.query_one("#dossier-loading", Static).update(text)

    def _show(self, dossier: Dossier) -> None:
        self.dossier = dossier
        body = self.query_one("#dossier-body")
        self.query_one("#dossier-loading").remove()
        body.mount_all([self._section(i, s) for i, s in enumerate(dossier.sections)])

    @staticmethod
    def _section(index: int, section: Section) -> DossierSection:
        return DossierSection(
            OpenView(section.kind, section.model, section.layer),
            Label(section.title, classes="section--title", markup=False),
            Static("\n".join(section.lines), classes="section--lines", markup=False),
            available=section.available,
            id=f"section-{index}",
        )

    def on_dossier_section_opened(self, message: DossierSection.Opened) -> None:
        message.stop()
        self.dismiss(message.target)


def dossier_of(
    pane: ViewPane, path: Path, summary: StoreSummary | None, config: Callable[[], AnalyzeConfig], known: dict
) -> DossierScreen | str:
    """Returns the dossier of the cell under the pane's cursor, or why there is none (one line to show)."""
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.contract import Shape
    from vitsee.tui.widgets.panes import KINDS, VIEW_LABELS

    if REGISTRY[pane.kind].shape is not Shape.LAYER_MATRIX:  # a cell of a layer x layer view names two layers
        first = next((i for i, k in enumerate(KINDS, start=1) if REGISTRY[k].shape is Shape.LAYER_MATRIX), 1)
        return f"the dossier is of a {VIEW_LABELS[KINDS[first - 1]]} cell: press {first}, pick a cell, then d"
    if pane.loaded is None or pane.selection is None or summary is None:
        return f"nothing to show yet: wait for the {pane.label} view to load"
    row, col = pane.selection
    return DossierScreen(path, summary, pane.loaded, row, col, config, known)

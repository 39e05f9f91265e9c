"""The main screen: one store, its views in tabs, a side panel picking models and layers, a status line.

Its state is three reactives: `kind` (the view shown), `models` (A and B) and `loaded` (the numbers the shown pane
holds). A change of view or models refreshes the tabs, the status line and the side panel and asks for the view's
numbers, once per turn of the event loop however many of them changed; numbers arriving put the side panel's layers
right and the keys on the view. Numbers arrive only through thread workers (`read_view`: the cache, or a computation
that caches, its progress in the bar above the panes); the event loop switches panes and repaints.

Everything else is a widget or screen of its own that posts messages, plus a binding here: the search in the side
panel (widgets/search_box.py), `m` (widgets/measure_switcher.py), `e` (widgets/exporter.py), `:` (screens/jump.py),
`d` (screens/dossier.py), the store watch (an extraction in progress, another writer's lock) and the background pass
that caches every view after a new run (widgets/caching_bar.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer, Input, Tabs

from vitsee.tui.messages import AnalysisStep, FirstViewShown, LayerPicked, ModelsPicked, PairOpened, Place
from vitsee.tui.messages import PlaceWanted, StatusChanged, SummaryFailed, SummaryLoaded, ViewOptionsWanted, ViewWanted
from vitsee.tui.options import AppOptions
from vitsee.tui.results import LoadedView, StoreSummary, view_spec
from vitsee.tui.screens.dossier import DOSSIER_BINDING, dossier_of
from vitsee.tui.screens.jump import JUMP_BINDING, JumpScreen, jump_targets
from vitsee.tui.screens.start import STORE_BINDINGS
from vitsee.tui.widgets.caching_bar import CachingBar
from vitsee.tui.widgets.exporter import EXPORT_BINDING, Exporter
from vitsee.tui.widgets.measure_switcher import MEASURE_BINDING, MeasureSwitcher
from vitsee.tui.widgets.namer import ModelNamer
from vitsee.tui.widgets.panes import KINDS, TAB_LABELS, VIEW_LABELS, analysis_of, tab_of, view_bindings
from vitsee.tui.widgets.search_box import SEARCH_BINDINGS, SearchBox
from vitsee.tui.widgets.side_panel import MODEL_BINDINGS, PANEL_BINDING, SidePanel, next_models
from vitsee.tui.widgets.status_line import StatusLine
from vitsee.tui.widgets.store_watch import StoreWatch
from vitsee.tui.widgets.title_bar import TitleBar
from vitsee.tui.widgets.view_pane import ViewPane
from vitsee.tui.widgets.view_panes import CANCEL_BINDING, CMAP_BINDING, ViewPanes
from vitsee.tui.widgets.view_tabs import ViewTabs

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig


class ExplorerScreen(Screen):
    """A store's analyses: CKA, attention distances, probes, skip ratios, spatial maps."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    AUTO_FOCUS = ""  # the view takes the focus once its numbers are in, not the first model picker
    POLL_SECONDS: ClassVar[float] = 1.5  # how often the store watch looks at an extraction or a writer's lock
    BINDINGS: ClassVar[list[BindingType]] = [
        *view_bindings(),
        *MODEL_BINDINGS,
        EXPORT_BINDING,
        CMAP_BINDING,
        PANEL_BINDING,
        *STORE_BINDINGS,
        *SEARCH_BINDINGS,
        JUMP_BINDING,
        MEASURE_BINDING,
        DOSSIER_BINDING,
        CANCEL_BINDING,
    ]

    DEFAULT_CSS = """
    ExplorerScreen {
        & #explorer-body { height: 1fr; }
        & #main { width: 1fr; height: 1fr; }
        &.-narrow SidePanel { width: 22; }
        & ToastRack { margin-bottom: 2; }  /* above the status line and the footer, not over the line's end */
    }
    """

    kind: var[str] = var(KINDS[0], always_update=True, init=False)  # the view shown (its analysis)
    models: var[tuple[str | None, str | None]] = var((None, None), init=False)  # A, and B (None: A with itself)
    loaded: var[LoadedView | None] = var(None, always_update=True, init=False)  # the numbers the shown pane holds

    def __init__(
        self,
        path: Path,
        options: AppOptions,
        *,
        analyse_all: bool = False,
        note: str | None = None,
        analysis: AnalyzeConfig | Callable[[], AnalyzeConfig] | None = None,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.options = options
        self.analysis = analysis  # what computes an uncached view (ViewPanes.config)
        self.analyse_all = analyse_all
        self.note = note
        self.summary: StoreSummary | None = None
        self.keep_model_b = False  # set before opening (a snapshot of cka:A): no A x B on first load
        self.picked_layer: dict[tuple[str, str], str] = {}  # (view, model) -> the layer a one-layer view is of
        self._status: dict[str, str] = {}  # kind -> what its pane last said for the status line
        self._failure: str | None = None  # why the store could not be opened: what every pane says
        # the background pass waits for the first view to be on screen (it would compete for the same cores)
        self._caching_waits = False
        self._refresh_due = False

    @property
    def model_a(self) -> str | None:
        return self.models[0]

    @model_a.setter
    def model_a(self, key: str | None) -> None:
        self.models = (key, self.models[1])

    @property
    def model_b(self) -> str | None:
        return self.models[1]

    @model_b.setter
    def model_b(self, key: str | None) -> None:
        self.models = (self.models[0], key)

    def compose(self) -> ComposeResult:
        yield TitleBar(self.path, id="title-bar")
        with Horizontal(id="explorer-body"):
            yield SidePanel(id="side-panel")
            with Vertical(id="main"):
                yield ViewTabs(TAB_LABELS, active=tab_of(self.kind))  # a snapshot opens on its own view
                yield ViewPanes(self.path, self.options, self.kind, self.spec_for, self.analysis)
        yield CachingBar(id="background-task")
        yield StatusLine(id="status-line")
        yield Footer()
        yield MeasureSwitcher(self.path)
        yield Exporter(self.options)
        yield ModelNamer(self.path)
        yield StoreWatch(self.path, self.POLL_SECONDS)

    def on_mount(self) -> None:
        self.query_one(StoreWatch).read()

    def pane(self, kind: str | None = None) -> ViewPane:
        return self.query_one(ViewPanes).pane(kind or self.kind)

    @property
    def panes(self) -> ViewPanes:
        return self.query_one(ViewPanes)

    # --- the store -----------------------------------------------------------------------------------------

    def on_summary_failed(self, message: SummaryFailed) -> None:
        self._failure = message.error
        self.panes.opened_as(message.error)
        self.query_one(StatusLine).show(message.error)
        self.notify(message.error, severity="error", timeout=10)

    def on_summary_loaded(self, message: SummaryLoaded) -> None:
        first = self.summary is None
        summary = self.summary = message.summary
        self._failure = None
        self.panes.bar.stop()
        self.query_one(TitleBar).show(summary)
        a, b = self.models
        a = a if a in summary.keys or not summary.models else summary.models[0].key
        b = b if b in summary.keys else None
        if first and b is None and not self.keep_model_b:  # two models: the cross-model matrix is the first view
            b = next((k for k in summary.keys if k != a), None)
        self.query_one(SidePanel).set_models(summary, a, b)
        if summary.problem and first:
            self.notify(summary.problem, severity="error", timeout=10)
        if self.note and first:
            self.notify(self.note, title="demo", timeout=8)
        self.query_one(StoreWatch).watch_rows(summary)
        self.models = (a, b)
        self.show_view(self.kind)
        if self.analyse_all and summary.problem is None:
            # the pass reads and computes on the cores and GIL the first view needs: it starts once that is shown
            self._caching_waits = not self.panes.first_shown
            if not self._caching_waits:
                self._analyse_all()

    def on_view_panes_settled(self) -> None:
        self.post_message(FirstViewShown(self.path))  # the app's demo checks wait for it
        if self._caching_waits:
            self._caching_waits = False
            self._analyse_all()

    def on_view_panes_writer_waited(self) -> None:
        self.query_one(StoreWatch).wait_for_writer()

    def on_store_watch_writer_gone(self) -> None:
        self.panes.request(self.kind)  # the view that waited for the other writer (a shown one stays as it is)

    # --- the view shown: state and its watchers --------------------------------------------------------------

    def spec_for(self, kind: str) -> tuple[str | None, str]:
        """Returns (view spec, '') for the pane of `kind` with the picked models, or (None, why not)."""
        if self.summary is None:
            return None, self._failure or f"opening {self.path} \u2026"
        a, b = self.models
        return view_spec(self.summary, kind, a, b, self.picked_layer, self.path)

    def action_show_view(self, kind: str) -> None:
        self.show_view(kind)

    def show_view(self, kind: str) -> None:
        """Switch to a view's pane and load what it should show."""
        self.kind = kind

    def watch_kind(self) -> None:
        self._changed()

    def watch_models(self) -> None:
        self._changed()

    def _changed(self) -> None:
        """Schedules one refresh for the view and models set now (several changes in one handler make one)."""
        if self.is_mounted and not self._refresh_due:
            self._refresh_due = True
            self.call_later(self._refresh)

    def _refresh(self) -> None:
        """Shows the view `kind` of the models: its pane and tab, its status line, the side panel's models; asks for
        its numbers."""
        self._refresh_due = False
        kind = self.kind
        self.panes.switch(kind)
        tabs = self.query_one(ViewTabs)
        tabs.name_tab(tab_of(kind), VIEW_LABELS[kind])  # the CKA tab says which measure it shows
        if tabs.active != f"tab-{tab_of(kind)}":
            tabs.active = f"tab-{tab_of(kind)}"
        panel = self.query_one(SidePanel)
        if self.summary is not None and (panel.model_a, panel.model_b) != self.models:
            panel.set_models(self.summary, *self.models)
        self.panes.request(kind)
        self.query_one(StatusLine).show(self._status.get(kind, ""))
        self.loaded = self.pane().loaded

    def on_view_panes_shown(self, message: ViewPanes.Shown) -> None:
        if message.kind == self.kind:
            self.loaded = message.loaded

    def watch_loaded(self) -> None:
        """The shown pane's numbers changed: the side panel lists its layers, the view takes the keys."""
        panel, a = self.query_one(SidePanel), self.model_a
        if self.summary is not None and a is not None:
            panel.list_layers_of(self.pane(), self.summary.model(a), self.picked_layer.get((self.kind, a)))
        self.panes.focus_view(unless_in=panel)

    @on(Tabs.TabActivated, "#view-tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        kind = (event.tab.id or "").removeprefix("tab-")
        if kind in KINDS and kind != tab_of(self.kind):  # a measure shown in the CKA tab is that tab's view
            self.show_view(kind)

    # --- loading --------------------------------------------------------------------------------------------

    def _analyse_all(self) -> None:
        panes = self.panes
        self.query_one(CachingBar).cache_all(self.path, panes.config, panes.warn, panes)

    def on_analysis_step(self, message: AnalysisStep) -> None:
        """Shows a step of the view being read in its bar, any other (the background pass's) in the bar below."""
        (self.panes if message.spec == self.panes.loading else self.query_one(CachingBar)).step(message)

    def action_cancel(self) -> None:
        if self.panes.cancel() | self.query_one(CachingBar).cancel():
            self.panes.cancelled()
            self.query_one(CachingBar).stop()
            self.notify("analysis cancelled: nothing half-done was cached", timeout=4)
        else:
            self.notify("nothing is being computed", timeout=3)

    # --- what the panes, the side panel and the features ask for -----------------------------------------------

    def on_status_changed(self, message: StatusChanged) -> None:
        self._status[message.kind] = message.text
        if message.kind == self.kind:
            self.query_one(StatusLine).show(message.text)

    def on_models_picked(self, message: ModelsPicked) -> None:
        self.models = (message.model_a, message.model_b)

    def on_pair_opened(self, message: PairOpened) -> None:
        """Shows the view of a pair of models a pane asked for (models A and B set to the pair)."""
        if self.summary is None or message.kind not in KINDS or message.model_a not in self.summary.keys:
            return
        self.models = (message.model_a, message.model_b if message.model_b != message.model_a else None)
        self.show_view(message.kind)

    def on_view_wanted(self, message: ViewWanted) -> None:
        message.stop()
        if message.kind in KINDS:
            if message.places:
                self.panes.pending = (message.kind, message.places)
            self.show_view(message.kind)

    def on_view_options_wanted(self, message: ViewOptionsWanted) -> None:
        self.panes.reread(message.kind, message.options)

    def on_layer_picked(self, message: LayerPicked) -> None:
        if not self._pick_layer(message.layer):
            self.notify(f"{message.layer} is not in this view", severity="warning", timeout=3)
        self.panes.focus_view()

    def on_place_wanted(self, message: PlaceWanted) -> None:
        place = message.place
        if place.axis == "layer":
            self._pick_layer(place.name)
        elif not self.pane().go_to(place):
            self.notify(f"{place.name} is not in this view", severity="warning", timeout=3)
        if message.focus:
            self.panes.focus_view()

    def _pick_layer(self, layer: str) -> bool:
        """Shows the map of `layer` (a view of one layer: spatial, ERF) or moves the view's cursor to it; returns
        whether it could."""
        if analysis_of(self.kind).takes_layer and self.model_a is not None:
            self.picked_layer[(self.kind, self.model_a)] = layer
            self.panes.request(self.kind)
            return True
        return self.pane().jump_to_layer(layer)

    def open_at(self, kind: str, model: str, layer: str) -> None:
        """Shows the view `kind` of `model` (as model A) with its cursor at `layer` (the map of it: spatial, ERF);
        a view of two models (the dossier's own cell) opens as it was."""
        if self.summary is None or model not in self.summary.keys:
            return
        analysis = analysis_of(kind)
        if analysis.models[1] < 2:
            if model != self.model_a:  # B becomes the old A where it was this model: the same two models in CKA
                self.models = (model, self.model_a if self.model_b == model else self.model_b)
            if analysis.takes_layer:
                self.picked_layer[(kind, model)] = layer
            else:
                self.panes.pending = (kind, (Place(layer),))
        self.show_view(kind)

    # --- keys ----------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "step_match":  # n / N belong to the search only while one is open and the box is left
            return bool(self.query_one(SearchBox).query_text) and not isinstance(self.focused, Input)
        if action == "close_search":
            return self.query_one(SidePanel).searching
        return True

    def action_search(self) -> None:
        self.query_one(SidePanel).open_search()

    def action_close_search(self) -> None:
        self.query_one(SidePanel).close_search()
        self.refresh_bindings()
        self.panes.focus_view()

    def action_step_match(self, step: int) -> None:
        self.query_one(SearchBox).step(step)

    def action_jump(self) -> None:
        targets = jump_targets(self.spec_for, self.summary.names if self.summary else {})
        self.app.push_screen(JumpScreen(targets, self.kind), lambda to: to and self.show_view(to))

    def action_cycle_measure(self) -> None:
        self.query_one(MeasureSwitcher).cycle(self.pane(), lambda kind: self.spec_for(kind)[0], self.panes.views)

    def action_dossier(self) -> None:
        dossier = dossier_of(self.pane(), self.path, self.summary, self.panes.config, self.panes.views)
        if isinstance(dossier, str):
            self.notify(dossier, severity="warning", timeout=4)
        else:
            self.app.push_screen(dossier, lambda to: to and self.open_at(to.kind, to.model, to.layer))

    def action_export(self) -> None:
        self.query_one(Exporter).export(self.pane())

    def action_name_model(self) -> None:
        """Asks for a display name for model A (the command palette's "Name model A"), kept in the store."""
        if self.summary is not None and self.model_a is not None:
            self.query_one(ModelNamer).ask(self.model_a, self.summary.names.get(self.model_a, self.model_a))

    def on_model_namer_renamed(self, message: ModelNamer.Renamed) -> None:
        """Gives the views already read the model's new name, shows the current one again, rereads the summary."""
        from vitsee.analyses.views import with_names

        key, old, shown = message.key, message.old, message.shown
        loaded = [*self.panes.views.values(), *(self.pane(kind).loaded for kind in KINDS)]
        for view in {id(item.view): item.view for item in loaded if item is not None}.values():
            if key in view.names:
                view.names = {**view.names, key: shown}
                view.title, view.subtitle = (
                    with_names(view.title, {old: shown}),
                    with_names(view.subtitle, {old: shown}),
                )
        self.notify(f"{key} is now called {shown!r}", title="name", timeout=6)
        self.query_one(StoreWatch).read()
        pane = self.pane()
        if pane.loaded is not None:
            pane.show(pane.loaded)

    def action_cycle_model(self, which: str) -> None:
        if self.summary is not None and self.summary.models:
            self.models = next_models(which, self.summary.keys, *self.models)
            if which == "b" and analysis_of(self.kind).models[1] < 2:  # a view of A alone: the first of two models
                self.show_view(next(k for k in KINDS if analysis_of(k).models[1] > 1))

    def action_toggle_panel(self) -> None:
        self.query_one(SidePanel).toggle_class("-hidden")

    def action_cycle_cmap(self) -> None:
        self.panes.cycle_cmap()

    def action_toggle_zoom(self) -> None:
        if not self.pane().toggle_zoom():
            self.notify("this view has no heatmap to zoom", severity="warning", timeout=3)

    def action_open_store(self) -> None:
        self.app.show_start()

    def action_new_run(self) -> None:
        self.app.new_run()

"""The main screen: one store, its views in tabs, a side panel picking models and layers, a status line.

Numbers arrive only through thread workers (`read_view`: the cache, or a computation that caches); the
event loop switches panes and repaints. A view that is not cached is computed when it is opened, with
its progress in the bar above the panes; after a new run a background pass caches every view in turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Input, Label, Tabs
from textual.worker import get_current_worker

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import (
    AnalysisStep,
    CachingEnded,
    ExportWritten,
    FirstViewShown,
    LayerPicked,
    MeasuresFound,
    ModelsPicked,
    PairOpened,
    ResultCached,
    SearchChanged,
    StatusChanged,
    SummaryFailed,
    SummaryLoaded,
    ViewFailed,
    ViewLoaded,
    ViewWanted,
)
from vitsee.tui.options import COLORMAPS, AppOptions
from vitsee.tui.results import INCOMPLETE_HINT, Cancelled, StoreSummary, export_view, read_summary, read_view
from vitsee.tui.widgets.panes import KINDS, PANES, TAB_LABELS, VIEW_LABELS, tab_of, tooltip
from vitsee.tui.widgets.side_panel import SidePanel, matches_query
from vitsee.tui.widgets.status_line import StatusLine
from vitsee.tui.widgets.task_bar import StepThrottle, TaskBar
from vitsee.tui.widgets.view_pane import Place, ViewPane
from vitsee.tui.widgets.view_tabs import ViewTabs

if TYPE_CHECKING:
    from vitsee.analyses.base import Step
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.analyses.views import View

log = logging.getLogger(__name__)


def view_bindings() -> list[Binding]:
    """Returns a number key per tab, in REGISTRY order: 1 CKA, 2 Attention, ..."""
    return [
        Binding(str(i), f"show_view('{kind}')", label, show=False, id=f"explorer.view_{kind}", tooltip=tooltip(kind))
        for i, (kind, label) in enumerate(TAB_LABELS.items(), start=1)
        if i <= 9
    ]


def analysis_of(kind: str):
    """Returns the registered analysis a pane shows (the engine's registry, imported with the panes)."""
    from vitsee.analyses import REGISTRY

    return REGISTRY[kind]


class ExplorerScreen(Screen):
    """A store's analyses: CKA, attention distances, probes, skip ratios, spatial maps."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    AUTO_FOCUS = ""  # the view takes the focus once its numbers are in, not the first model picker
    BINDINGS: ClassVar[list[BindingType]] = [
        *view_bindings(),
        Binding(
            "a", "cycle_model('a')", "Model A", id="explorer.model_a", tooltip="Show the next model as model A (rows)"
        ),
        Binding(
            "b",
            "cycle_model('b')",
            "Model B",
            id="explorer.model_b",
            tooltip="Compare model A with the next model in the CKA view (columns)",
        ),
        Binding(
            "e",
            "export",
            "Export",
            id="explorer.export",
            tooltip="Export the view to PNG and JSON in the export folder (the cursor's cell marked with "
            "export_marks = true in the config file)",
        ),
        Binding(
            "c",
            "cycle_cmap",
            "Colours",
            show=False,
            id="explorer.cmap",
            tooltip="Cycle the colormap: viridis, magma, cividis",
        ),
        Binding(
            "ctrl+b",
            "toggle_panel",
            "Panel",
            show=False,
            id="explorer.panel",
            tooltip="Show or hide the side panel (models and layers)",
        ),
        Binding("o", "open_store", "Open", show=False, id="explorer.open", tooltip="Open another store"),
        Binding(
            "ctrl+n",
            "new_run",
            "New run",
            show=False,
            id="explorer.new_run",
            tooltip="Extract another store (models, images, layers)",
        ),
        Binding(
            "slash",
            "search",
            "Search",
            show=False,
            id="explorer.search",
            tooltip="Search this view's layers and the models (the side panel lists what matches); Enter moves "
            "the cursor to the first match, n / N to the next / previous, Esc closes",
        ),
        # priority, so that n passes the CKA view's n (mark n.s.) while a search is open; check_action lets the
        # key through to it (and to the search box, as a letter) otherwise
        Binding(
            "n",
            "step_match(1)",
            "Next match",
            show=False,
            priority=True,
            id="explorer.next_match",
            tooltip="Move the cursor to the next match of the search",
        ),
        Binding(
            "N",
            "step_match(-1)",
            "Previous match",
            show=False,
            priority=True,
            id="explorer.previous_match",
            tooltip="Move the cursor to the previous match of the search",
        ),
        Binding(
            "escape",
            "close_search",
            "Close search",
            show=False,
            id="explorer.close_search",
            tooltip="Close the search and list every layer again",
        ),
        Binding(
            "colon",
            "jump",
            "Jump",
            show=False,
            id="explorer.jump",
            tooltip="List every view with what it shows for the current models, and go to the one picked",
        ),
        Binding(
            "m",
            "cycle_measure",
            "Measure",
            show=False,
            id="explorer.measure",
            tooltip="In the CKA view: the next layer x layer measure cached for these models (RBF CKA, "
            "Procrustes, SVCCA, PWCCA, mknn, CKNNA, RSA, then whether they agree), the cursor kept on "
            "its layer pair; in the zoo, the next measure it summarises; with only CKA cached, the "
            "command that computes the others",
        ),
        Binding(
            "d",
            "dossier",
            "Dossier",
            show=False,
            id="explorer.dossier",
            tooltip="In the CKA view: everything vitsee knows about the selected pair of layers (CKA, head "
            "distances, probes, skip ratios, spatial maps, ERFs)",
        ),
        Binding(
            "x",
            "cancel",
            "Cancel",
            show=False,
            id="explorer.cancel",
            tooltip="Stop the analysis being computed (nothing half-done is kept)",
        ),
    ]

    DEFAULT_CSS = """
    ExplorerScreen {
        & #title-bar {
            width: 1fr;
            height: 1;
            padding: 0 1;
            background: $panel;
            color: $text;
            text-wrap: nowrap;
            text-overflow: ellipsis;
        }
        & #explorer-body { height: 1fr; }
        & #main { width: 1fr; height: 1fr; }
        & #panes { height: 1fr; }
        &.-narrow SidePanel { width: 22; }
    }
    """

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
        # None: the app's defaults; a callable: what makes them; either made in a worker (the engine imports torch)
        self.analysis = analysis
        self.analyse_all = analyse_all
        # the first view is on screen or says why not: until then nothing else is started that could delay it
        self._first_shown = False
        self._caching_waits = False  # the background pass, waiting for that
        self.note = note
        self.summary: StoreSummary | None = None
        self.kind = KINDS[0]  # the first view of the registry (CKA)
        self.model_a: str | None = None
        self.model_b: str | None = None
        self.keep_model_b = False  # set before opening (a snapshot of cka:A): no A x B on first load
        self.picked_layer: dict[tuple[str, str], str] = {}  # (view, model) -> the layer a one-layer view is of
        self._views: dict[str, object] = {}  # spec -> LoadedView, kept so switching back costs nothing
        # kind -> the analysis's own options its view is read with ({"zoo_measure": "mknn"}: `m` in the zoo)
        self.view_options: dict[str, dict] = {}
        self._status: dict[str, str] = {}
        self._loading: str | None = None
        self._failure: str | None = None  # why the store could not be opened: what every pane says
        self._poll = None  # the timer that watches an extraction in progress
        self._polling = False
        self._search = ""  # the search text n / N step through the matches of ("" : no search)
        self._match = -1  # which of them the cursor is on
        # (kind, places): where the cursor goes once that view is in (the dossier's layer, the cell `m` left)
        self._pending: tuple[str, tuple[Place, ...]] | None = None

    # --- layout -------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Label(f" {self.path.name}", id="title-bar")
        with Horizontal(id="explorer-body"):
            yield SidePanel(id="side-panel")
            with Vertical(id="main"):
                yield ViewTabs(TAB_LABELS, active=tab_of(self.kind))  # a snapshot opens on its own view
                yield TaskBar(id="view-task")
                with ContentSwitcher(initial=f"pane-{self.kind}", id="panes"):
                    for kind in KINDS:
                        yield PANES[kind](kind, self.options.color_mode, self.options.cmap)
        yield TaskBar(id="background-task")
        yield StatusLine(id="status-line")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#view-task", TaskBar).start(f"opening {self.path.name}")
        for kind in KINDS:
            self.pane(kind).show_message(f"opening {self.path} \u2026")
        self._read_summary()

    def pane(self, kind: str | None = None) -> ViewPane:
        return self.query_one(f"#pane-{kind or self.kind}", ViewPane)

    # --- the store -----------------------------------------------------------------------------------------

    @work(thread=True, group="summary", exit_on_error=False)
    def _read_summary(self) -> None:
        try:
            self.post_message(SummaryLoaded(read_summary(self.path)))
        except VitseeError as exc:
            self.post_message(SummaryFailed(self.path, str(exc)))
        except Exception as exc:  # a bug: say it in one line, keep the app alive
            log.exception("reading %s", self.path)
            self.post_message(SummaryFailed(self.path, bug_text(f"cannot read {self.path}", exc)))

    def on_summary_failed(self, message: SummaryFailed) -> None:
        self._failure = message.error
        self.query_one("#view-task", TaskBar).stop()
        for kind in KINDS:
            self.pane(kind).show_message(message.error)
        self.query_one(StatusLine).show(message.error)
        self.notify(message.error, severity="error", timeout=10)
        self._view_settled()

    def _show_title(self) -> None:
        """Puts the longest title that fits the bar: every model's weights in full, else in a word, else the
        model names alone."""
        from vitsee.analyses.views import dataset_label

        summary = self.summary
        if summary is None:
            return
        head = f" {self.path.name} \u00b7 {summary.n_images} images of {dataset_label(summary.dataset)} \u00b7 "
        titles = [  # the models by their display names (engine/store/names.py)
            head + "; ".join(m.described or f"{m.shown}: {m.weights}" for m in summary.models),
            head + ", ".join(m.shown for m in summary.models),  # 'test_vit (random init)'
            f" {self.path.name} \u00b7 {summary.n_images} {dataset_label(summary.dataset)} \u00b7 "
            + ", ".join(m.shown for m in summary.models),
        ]
        room = self.size.width - 2  # the bar's padding
        # none fits (a long dataset path): the full title, cut at the end, as before
        self.query_one("#title-bar", Label).update(next((t for t in titles if len(t) <= room), titles[0]))

    def on_resize(self) -> None:
        self._show_title()

    def on_summary_loaded(self, message: SummaryLoaded) -> None:
        first = self.summary is None
        summary = self.summary = message.summary
        self._failure = None
        self.query_one("#view-task", TaskBar).stop()
        self._show_title()
        if summary.models and (self.model_a is None or self.model_a not in summary.keys):
            self.model_a = summary.models[0].key
        if self.model_b not in summary.keys:
            self.model_b = None
        if (
            first and self.model_b is None and not self.keep_model_b
        ):  # two models: the cross-model matrix is the interesting first view
            self.model_b = next((k for k in summary.keys if k != self.model_a), None)
        self.query_one(SidePanel).set_models(summary, self.model_a, self.model_b)
        if summary.problem and first:
            self.notify(summary.problem, severity="error", timeout=10)
        if self.note and first:
            self.notify(self.note, title="demo", timeout=8)
        self._watch_extraction(summary)
        self.show_view(self.kind)
        if self.analyse_all and summary.problem is None:
            if self._first_shown:
                self._analyse_all()
            else:  # it reads and computes on the same cores and GIL as the first view: it starts once that is shown
                self._caching_waits = True

    # --- an extraction in progress ---------------------------------------------------------------------------

    POLL_SECONDS: ClassVar[float] = 1.5

    def _watch_extraction(self, summary: StoreSummary) -> None:
        """While a model's rows are unfinished, poll the store's done rows; stop once all are done."""
        unfinished = bool(summary.models) and any(m.rows_done < summary.n_images for m in summary.models)
        if unfinished and self._poll is None:
            self._poll = self.set_interval(self.POLL_SECONDS, self._poll_rows)
        elif not unfinished and self._poll is not None:
            self._poll.stop()
            self._poll = None

    def _poll_rows(self) -> None:
        if not self._polling:  # a slow disk: one read at a time
            self._polling = True
            self._read_rows_done()

    @work(thread=True, group="poll", exit_on_error=False)
    def _read_rows_done(self) -> None:
        """Reads only each model's done rows (cheap); a change brings the whole summary again."""
        try:
            from vitsee.store import Store

            with Store.open(self.path) as store:
                done = {key: store.rows_done(key) for key in store.models}
        except Exception:  # a writer mid-flush, or a replaced file: try again at the next tick
            done = None
        finally:
            self._polling = False
        summary = self.summary
        if done is not None and summary is not None and done != {m.key: m.rows_done for m in summary.models}:
            self._read_summary()

    # --- which view --------------------------------------------------------------------------------------

    def spec_for(self, kind: str) -> tuple[str | None, str]:
        """Returns (view spec, '') for the pane of `kind` with the picked models, or (None, why not)."""
        summary, a = self.summary, self.model_a
        if summary is None and self._failure is not None:
            return None, self._failure
        if summary is None:
            return None, f"opening {self.path} \u2026"
        if a is None:
            return None, "no models in this store: add one with `vitsee extract STORE --model NAME`"
        analysis = analysis_of(kind)
        least, most = analysis.models
        others = [k for k in summary.keys if k != a]
        b = self.model_b if self.model_b and self.model_b != a else None
        if least > 1 and b is None:  # a view of two models: model B, else the first other model
            b = others[0] if others else None
        keys = [] if most == 0 else [a] + ([b] if most > 1 and b else [])  # most 0: a view of every model (zoo)
        for key in keys or summary.keys:
            m = summary.model(key)
            if m.rows_done < summary.n_images:
                return None, (
                    f"{key}: extraction incomplete: {m.rows_done} of {summary.n_images} images; "
                    f"{INCOMPLETE_HINT} (or `vitsee extract {self.path}`)"
                )
        reason = summary.model(a).reason(kind)
        if reason:  # the analysis's own words; where it applies to another model, the key that shows it
            where = next((k for k in others if summary.model(k).reason(kind) is None), None)
            return None, reason + (f"; press a to pick {where} as model A" if where else "")
        if len(keys) < least:
            return None, f"{analysis.label} compares {least} models: extract another one into this store"
        layer = self.picked_layer.get((kind, a)) if analysis.takes_layer else None
        return ":".join([kind, *keys, *([layer] if layer else [])]), ""

    def action_show_view(self, kind: str) -> None:
        self.show_view(kind)

    def show_view(self, kind: str) -> None:
        """Switch to a view's pane and load what it should show."""
        self.kind = kind
        self.query_one("#panes", ContentSwitcher).current = f"pane-{kind}"
        tabs = self.query_one(ViewTabs)
        tabs.name_tab(tab_of(kind), VIEW_LABELS[kind])  # the CKA tab says which measure it shows
        if tabs.active != f"tab-{tab_of(kind)}":
            tabs.active = f"tab-{tab_of(kind)}"
        self.request(kind)
        self.query_one(StatusLine).show(self._status.get(kind, ""))
        self._update_side_panel()
        self._focus_view()
        if self._search:  # the same search, over this view's layers
            self._match = -1
            self._count_matches()

    @on(Tabs.TabActivated, "#view-tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        kind = (event.tab.id or "").removeprefix("tab-")
        if kind in KINDS and kind != tab_of(self.kind):  # a measure shown in the CKA tab is that tab's view
            self.show_view(kind)

    def request(self, kind: str) -> None:
        """Make the pane of `kind` show its view: at once when it is loaded, else through a worker."""
        pane = self.pane(kind)
        spec, reason = self.spec_for(kind)
        if spec is None:
            pane.show_message(reason)
            if self.summary is not None or self._failure is not None:
                self._view_settled()
            return
        if pane.loaded is not None and self._is_current(pane.loaded, spec):
            pane.post_status()
            self._go_pending(pane)
            return
        if spec in self._views and self._is_current(self._views[spec], spec):
            self._show(pane, self._views[spec])
            return
        if self._loading == spec:
            return
        pane.show_message(f"loading {spec} \u2026")
        waiting = self.query_one("#background-task", TaskBar).running
        self.query_one("#view-task", TaskBar).start(
            f"reading {spec}" + (" (after the analysis running below)" if waiting else "")
        )
        self._loading = spec
        self._load(spec)

    def _is_current(self, loaded, spec: str) -> bool:
        """Returns whether a loaded view is of `spec` read with the options its kind has now."""
        return loaded.spec == spec and loaded.options == self.view_options.get(spec.partition(":")[0], {})

    def _show(self, pane: ViewPane, loaded) -> None:
        pane.show(loaded)
        if pane.kind == self.kind:
            self._update_side_panel()
            self._focus_view()
            self.call_after_refresh(self._go_pending, pane)  # once a new heatmap is mounted
            if not self._first_shown:
                pane.when_drawn(self._view_settled)

    def _view_settled(self) -> None:
        """The first view is drawn (or says why not): starts what waited for it, and tells the app."""
        if self._first_shown:
            return
        self._first_shown = True
        if self._caching_waits:
            self._caching_waits = False
            self._analyse_all()
        self.post_message(FirstViewShown(self.path))

    def _go_pending(self, pane: ViewPane) -> None:
        """Moves the cursor to where the dossier asked to open this view, once its numbers are shown."""
        pending = self._pending
        if pending is not None and pending[0] == pane.kind and pane.loaded is not None:
            self._pending = None
            for place in pending[1]:
                if not pane.go_to(place):
                    self.notify(f"{place.name} is not in this view", severity="warning", timeout=3)
            pane.post_status()  # a heatmap not laid out yet moves its cursor without saying so

    def _focus_view(self) -> None:
        focused = self.focused
        if focused is not None and focused in self.query_one(SidePanel).query("*"):
            return  # the user is picking in the side panel
        widget = self.pane().main_widget()
        if widget is not None and widget.focusable:
            widget.focus()

    def _update_side_panel(self) -> None:
        panel = self.query_one(SidePanel)
        pane = self.pane()
        summary = self.summary
        if summary is None or self.model_a is None:
            return
        model = summary.model(self.model_a)
        analysis = analysis_of(self.kind)
        if analysis.takes_layer:  # the layers a map can be of; Enter shows the map of one
            view = pane.view
            current = view.params.get("layer") if view is not None else self.picked_layer.get((self.kind, self.model_a))
            panel.set_layers(analysis.layer_list_title, model.layer_choices.get(self.kind, []), current, show_b=False)
        else:
            choices = pane.layer_choices() or (model.layers if pane.lists_model_layers else [])
            panel.set_layers(analysis.layer_list_title, choices, show_b=analysis.models[1] > 1)

    # --- loading --------------------------------------------------------------------------------------------

    def _config(self) -> AnalyzeConfig:
        """Returns the parameters for what is not cached (worker threads only: it imports the engine)."""
        if callable(self.analysis):
            self.analysis = self.analysis()
        return self.analysis or self.options.analysis_config()

    @work(thread=True, exclusive=True, group="view", exit_on_error=False)
    def _load(self, spec: str) -> None:
        worker = get_current_worker()
        shown = StepThrottle()  # ~10 steps a second reach the event loop, however often the engine reports

        def progress(step: Step) -> None:
            if shown(step.done, step.total):
                self.post_message(AnalysisStep(spec, step.analysis, step.done, step.total, step.message))

        try:
            loaded = read_view(
                self.path,
                spec,
                self._config(),
                progress,
                cancelled=lambda: worker.is_cancelled,
                warn=self._warn_from_worker,
                options=self.view_options.get(spec.partition(":")[0]),
            )
        except Cancelled:
            return
        except VitseeError as exc:
            self.post_message(ViewFailed(spec, str(exc)))
        except Exception as exc:  # a bug: one line on screen, the traceback in the log
            log.exception("loading %s", spec)
            self.post_message(ViewFailed(spec, bug_text(f"cannot show {spec}", exc)))
        else:
            self.post_message(ViewLoaded(loaded))

    def _warn_from_worker(self, text: str) -> None:
        """Shows a warning a worker thread raised before a long computation (e.g. probes over a minute)."""
        self.app.call_from_thread(self.notify, text, severity="warning", timeout=15)

    def on_analysis_step(self, message: AnalysisStep) -> None:
        what = f"computing {message.analysis}"
        if message.message:
            what += f"  {message.message}"
        bar_id = "#view-task" if message.spec == self._loading else "#background-task"
        if bar_id == "#background-task":
            what = f"caching every view: {message.spec}  {what}"
        else:
            kind = message.spec.partition(":")[0]
            if self.pane(kind).loaded is None:
                self.pane(kind).show_message(
                    f"{message.spec} is not in the store's cache yet: computing it now, then it is cached for next "
                    "time. x cancels."
                )
        self.query_one(bar_id, TaskBar).advance(what, message.done, message.total)

    def on_view_loaded(self, message: ViewLoaded) -> None:
        loaded = message.loaded
        if self._loading == loaded.spec:
            self._loading = None
            self.query_one("#view-task", TaskBar).stop()
        kind = loaded.view.kind
        if not self._is_current(loaded, loaded.spec):  # read with options the view has left since (the zoo's measure)
            if kind == self.kind and self.spec_for(kind)[0] == loaded.spec:
                self.request(kind)
            return
        self._views[loaded.spec] = loaded
        if self.spec_for(kind)[0] == loaded.spec:
            self._show(self.pane(kind), loaded)
        if loaded.computed:
            self.notify(f"computed and cached {loaded.spec} in {loaded.seconds:.1f} s", timeout=4)

    def on_view_failed(self, message: ViewFailed) -> None:
        if self._loading == message.spec:
            self._loading = None
            self.query_one("#view-task", TaskBar).stop()
        kind = message.spec.partition(":")[0]
        if self.spec_for(kind)[0] == message.spec:
            self.pane(kind).show_message(message.error)
            if kind == self.kind:
                self._view_settled()
        self.notify(message.error, severity="error", timeout=10)

    def action_cancel(self) -> None:
        cancelled = False
        for worker in self.workers:
            if worker.group in ("view", "background") and worker.is_running:
                worker.cancel()
                cancelled = True
        if cancelled:
            self._loading = None
            self.query_one("#view-task", TaskBar).stop()
            self.query_one("#background-task", TaskBar).stop()
            self.pane().show_message("cancelled: nothing was cached; open the view again to compute it")
            self.notify("analysis cancelled: nothing half-done was cached", timeout=4)
        else:
            self.notify("nothing is being computed", timeout=3)

    @work(thread=True, group="background", exit_on_error=False)
    def _analyse_all(self) -> None:
        """Cache every result `vitsee analyze` would (the driver's plan, in its order), each through its view, so
        every view opens at once later (views fill in as results arrive)."""
        from vitsee.analyses.driver import plan_views
        from vitsee.store import Store
        from vitsee.tui.results import ACCESS

        worker = get_current_worker()
        try:
            with ACCESS.read(), Store.open(self.path) as store:
                specs = [view.spec for view in plan_views(store)]
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=10)
            self.post_message(CachingEnded(0, 0, cancelled=True))  # stops the bar, says nothing more
            return
        cached = 0
        for index, spec in enumerate(specs, start=1):
            if worker.is_cancelled:
                break

            def progress(step: Step, spec=spec, shown=StepThrottle()) -> None:  # noqa: B008 (one throttle per spec)
                if shown(step.done, step.total):
                    self.post_message(
                        AnalysisStep(
                            spec, f"{step.analysis} ({index}/{len(specs)})", step.done, step.total, step.message
                        )
                    )

            try:
                loaded = read_view(
                    self.path,
                    spec,
                    self._config(),
                    progress,
                    cancelled=lambda: worker.is_cancelled,
                    warn=self._warn_from_worker,
                )
            except Cancelled:
                break
            except VitseeError as exc:
                self.post_message(ViewFailed(spec, str(exc)))
                continue
            except Exception as exc:
                log.exception("caching %s", spec)
                self.post_message(ViewFailed(spec, bug_text(f"cannot compute {spec}", exc)))
                continue
            cached += 1
            self.post_message(ViewLoaded(loaded))
            self.post_message(ResultCached(spec))
        self.post_message(CachingEnded(cached, len(specs), cancelled=worker.is_cancelled))

    def on_caching_ended(self, message: CachingEnded) -> None:
        self.query_one("#background-task", TaskBar).stop()
        if message.cancelled:
            return
        if message.cached == message.total:
            self.notify(f"all {message.total} views are cached in the store", timeout=4)
        else:
            self.notify(
                f"{message.cached} of {message.total} views cached; the others failed (see above)",
                severity="warning",
                timeout=6,
            )

    # --- panes and side panel --------------------------------------------------------------------------------

    def on_status_changed(self, message: StatusChanged) -> None:
        self._status[message.kind] = message.text
        if message.kind == self.kind:
            self.query_one(StatusLine).show(message.text)

    def on_models_picked(self, message: ModelsPicked) -> None:
        if (message.model_a, message.model_b) == (self.model_a, self.model_b):
            return
        self.model_a, self.model_b = message.model_a, message.model_b
        self.request(self.kind)
        self._update_side_panel()

    def on_pair_opened(self, message: PairOpened) -> None:
        """Shows the view of a pair of models a pane asked for (models A and B set to the pair)."""
        summary = self.summary
        if summary is None or message.kind not in KINDS or message.model_a not in summary.keys:
            return
        self.model_a = message.model_a
        self.model_b = message.model_b if message.model_b != message.model_a else None
        self.query_one(SidePanel).set_models(summary, self.model_a, self.model_b)
        self.show_view(message.kind)

    def on_layer_picked(self, message: LayerPicked) -> None:
        if not self._pick_layer(message.layer):
            self.notify(f"{message.layer} is not in this view", severity="warning", timeout=3)
        widget = self.pane().main_widget()
        if widget is not None:
            widget.focus()

    def _pick_layer(self, layer: str) -> bool:
        """Shows the map of `layer` (a view of one layer: spatial, ERF) or moves the view's cursor to it; returns
        whether it could."""
        if analysis_of(self.kind).takes_layer and self.model_a is not None:
            self.picked_layer[(self.kind, self.model_a)] = layer
            self.request(self.kind)
            return True
        return self.pane().jump_to_layer(layer)

    def action_cycle_model(self, which: str) -> None:
        summary = self.summary
        if summary is None or not summary.models:
            return
        keys = summary.keys
        panel = self.query_one(SidePanel)
        if which == "a":
            current = keys.index(self.model_a) if self.model_a in keys else -1
            panel.pick(model_a=keys[(current + 1) % len(keys)])
        else:
            # 'same as A', then the other models: A itself by name would show the same matrix again
            choices: list[str | None] = [None, *(k for k in keys if k != self.model_a)]
            current = choices.index(self.model_b) if self.model_b in choices else 0
            nxt = choices[(current + 1) % len(choices)]
            panel.pick(model_b=nxt, same=nxt is None)
            if analysis_of(self.kind).models[1] < 2:  # a view of model A alone: show the first that compares two
                self.show_view(next(k for k in KINDS if analysis_of(k).models[1] > 1))

    def action_toggle_panel(self) -> None:
        self.query_one(SidePanel).toggle_class("-hidden")

    def action_cycle_cmap(self) -> None:
        cmap = COLORMAPS[(COLORMAPS.index(self.options.cmap) + 1) % len(COLORMAPS)]
        self.options.cmap = cmap
        for kind in KINDS:
            self.pane(kind).set_cmap(cmap)
        self.notify(f"colormap {cmap}", timeout=2)

    def action_toggle_zoom(self) -> None:
        if not self.pane().toggle_zoom():
            self.notify("this view has no heatmap to zoom", severity="warning", timeout=3)

    def _app_exiting(self) -> bool:
        # a key typed right after q still arrives: a screen pushed while the app closes never composes
        return bool(getattr(self.app, "_exit", False))

    def action_open_store(self) -> None:
        from vitsee.tui.screens.start import StartScreen

        if not self._app_exiting():
            self.app.push_screen(StartScreen(self.options))

    def action_new_run(self) -> None:
        from vitsee.tui.screens.new_run import NewRunScreen

        if not self._app_exiting():
            self.app.push_screen(NewRunScreen(self.options))

    # --- search and jump ------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "step_match":  # n / N belong to the search only while one is open and the box is left
            return bool(self._search) and not isinstance(self.focused, Input)
        if action == "close_search":
            return self.query_one(SidePanel).searching
        return True

    def action_search(self) -> None:
        self.query_one(SidePanel).open_search()

    def action_close_search(self) -> None:
        self.query_one(SidePanel).close_search()
        self._search, self._match = "", -1
        self.refresh_bindings()
        widget = self.pane().main_widget()
        if widget is not None:
            widget.focus()

    def search_matches(self) -> list[Place]:
        """Returns the places of the current view whose layer matches the search, in the order n visits them."""
        if not self._search:
            return []
        if analysis_of(self.kind).takes_layer:  # their side panel lists the layers a map can be of
            places = [Place(layer, "layer") for layer in self.query_one(SidePanel).layer_names]
        else:
            places = self.pane().places()
        return [place for place in places if matches_query(place.name, self._search)]

    def on_search_changed(self, message: SearchChanged) -> None:
        self._search, self._match = message.query, -1
        self.refresh_bindings()
        if message.submitted:
            if self.search_matches():
                widget = self.pane().main_widget()
                if widget is not None:
                    widget.focus()  # n / N step on from the view
            self.action_step_match(1)
        else:
            self._count_matches()

    def _count_matches(self, matches: list[Place] | None = None) -> None:
        matches = self.search_matches() if matches is None else matches
        panel = self.query_one(SidePanel)
        if not self._search:
            panel.show_count("")
        elif not matches:
            panel.show_count("no match in this view")
        elif self._match < 0:
            panel.show_count(f"{len(matches)} match{'es' if len(matches) > 1 else ''} (Enter)")
        else:
            panel.show_count(f"{self._match + 1}/{len(matches)} {matches[self._match].name}  n/N")

    def action_step_match(self, step: int) -> None:
        """Moves the cursor to the next (step 1) or previous (-1) match of the search, around the end."""
        matches = self.search_matches()
        if not matches:
            models = [key for key in (self.summary.keys if self.summary else []) if matches_query(key, self._search)]
            where = f"; model {', '.join(models)} does: pick it in the side panel" if models else ""
            self.notify(
                f"no layer of the {VIEW_LABELS.get(self.kind, self.kind)} view matches '{self._search}'{where}",
                severity="warning",
                timeout=4,
            )
            self._count_matches()
            return
        self._match = (self._match + step) % len(matches) if self._match >= 0 or step > 0 else len(matches) - 1
        place = matches[self._match]
        if place.axis == "layer":
            self._pick_layer(place.name)
        elif not self.pane().go_to(place):
            self.notify(f"{place.name} is not in this view", severity="warning", timeout=3)
        self._count_matches(matches)

    def jump_targets(self) -> list:
        """Returns every pane with what it shows for the current models (its view string, or why nothing)."""
        from vitsee.tui.screens.jump import JumpTarget

        targets = []
        numbers = {kind: str(i) for i, kind in enumerate(TAB_LABELS, start=1)}
        for kind, label in VIEW_LABELS.items():
            spec, reason = self.spec_for(kind)
            key = numbers[kind] if kind in numbers else f"{numbers.get(tab_of(kind), '')}m"  # its tab, then m
            targets.append(JumpTarget(kind, key, label, self._shown_spec(spec) if spec else reason.splitlines()[0]))
        return targets

    def _shown_spec(self, spec: str) -> str:
        """Returns what a view string shows, its models by their display names: 'ViT (trained here) x ResNet-18
        (trained here)', 'ViT (trained here) blocks.5' (a layer), 'every model' (the zoo)."""
        from vitsee.analyses.views import parse_view

        names = self.summary.names if self.summary is not None else {}
        _, args = parse_view(spec)
        shown = [names.get(a, a) for a in args]
        models = [s for a, s in zip(args, shown) if a in names]
        rest = [s for a, s in zip(args, shown) if a not in names]  # a layer
        return " x ".join(models or ["every model"]) + "".join(f" {r}" for r in rest)

    def action_jump(self) -> None:
        from vitsee.tui.screens.jump import JumpScreen

        def go(kind: str | None) -> None:
            if kind is not None:
                self.show_view(kind)

        self.app.push_screen(JumpScreen(self.jump_targets(), self.kind), go)

    # --- the measures of a layer pair (m) -----------------------------------------------------------------------

    def family_views(self, kind: str) -> list[str]:
        """Returns the views of `kind`'s family (CKA, the other layer x layer measures, their comparison), in order."""
        family = analysis_of(kind).family
        return [k for k in KINDS if family and analysis_of(k).family == family]

    def action_cycle_measure(self) -> None:
        """Shows the next view of this view's family cached for the models shown, the cursor on the same layer pair
        (a worker finds which are cached); says how to compute them when none but this one is. In a view that
        summarises a measure (the zoo), the next measure cached for every model, summarised."""
        if analysis_of(self.kind).measure_option:
            if self.summary is None or self.pane().view is None:
                self.notify("nothing to switch yet: wait for the view to load", severity="warning", timeout=4)
                return
            self._find_summarised(self.kind)
            return
        family = self.family_views(self.kind)
        if len(family) < 2:
            first = next((k for k in KINDS if len(self.family_views(k)) > 1), None)
            where = f": press {list(TAB_LABELS).index(tab_of(first)) + 1} first" if first in TAB_LABELS else ""
            self.notify(
                f"m cycles the layer x layer measures of the {VIEW_LABELS.get(first, 'CKA')} view{where}",
                severity="warning",
                timeout=4,
            )
            return
        specs = {k: self.spec_for(k)[0] for k in family}
        if specs[self.kind] is None or self.summary is None:
            self.notify("nothing to compare yet: wait for the view to load", severity="warning", timeout=4)
            return
        pane = self.pane()
        places: tuple[Place, ...] = ()
        if pane.selection is not None and pane.view is not None and analysis_of(self.kind).family:
            row, col = pane.selection
            if pane.view.shape is analysis_of(family[0]).shape:  # a layer pair: the next measure keeps it
                places = (Place(pane.view.rows[row]), Place(pane.view.cols[col], "col"))
        self._find_measures(self.kind, specs, places)

    @work(thread=True, exclusive=True, group="measures", exit_on_error=False)
    def _find_measures(self, kind: str, specs: dict[str, str | None], places: tuple) -> None:
        from vitsee.store import Store
        from vitsee.analyses.views import cached_params
        from vitsee.tui.results import ACCESS

        try:
            with ACCESS.read(), Store.open(self.path) as store:
                cached = [
                    k
                    for k, spec in specs.items()
                    if spec is not None and (spec in self._views or cached_params(store, spec) is not None)
                ]
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        self.post_message(MeasuresFound(kind, cached, places))

    @work(thread=True, exclusive=True, group="measures", exit_on_error=False)
    def _find_summarised(self, kind: str) -> None:
        from vitsee.store import Store
        from vitsee.tui.results import ACCESS

        try:
            with ACCESS.read(), Store.open(self.path) as store:
                choices = analysis_of(kind).measure_choices(store)
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        self.post_message(MeasuresFound(kind, choices, ()))

    def _summarise_next(self, choices: list[str]) -> None:
        """Reads this view again with the next of the measures cached (its `measure_option`), or says how to cache
        others."""
        from vitsee.analyses.driver import measures_command

        analysis, pane = analysis_of(self.kind), self.pane()
        current = analysis.measure_of_view(pane.view) if pane.view is not None else ""
        others = [k for k in choices if k != current]
        if not others:
            missing = [k for k in self.family_views(current or KINDS[0]) if analysis_of(k).cost > 0 and k != current]
            self.notify(
                f"only {VIEW_LABELS.get(current, current)} is cached for every model: "
                f"`{measures_command(self.path, missing)}` computes the others, then m shows them here",
                title="measures",
                severity="warning",
                timeout=10,
            )
            return
        nxt = choices[(choices.index(current) + 1) % len(choices)] if current in choices else others[0]
        self.view_options[self.kind] = {analysis.measure_option: nxt}
        self._loading = None  # a read with the measure left behind is superseded (the view worker is exclusive)
        self.request(self.kind)
        self.notify(f"{analysis.label}: {VIEW_LABELS.get(nxt, nxt)}", timeout=3)

    def on_measures_found(self, message: MeasuresFound) -> None:
        from vitsee.analyses.driver import measures_command

        if message.kind != self.kind:  # the user moved on meanwhile
            return
        if analysis_of(self.kind).measure_option:
            self._summarise_next(message.cached)
            return
        family = self.family_views(self.kind)
        # cost 0 (the comparison of the cached measures): offered once another measure is cached, computed at once
        measured = [k for k in message.cached if analysis_of(k).cost > 0]
        cheap = len(measured) > 1
        cycle = [k for k in family if k == self.kind or k in measured or (analysis_of(k).cost == 0 and cheap)]
        if len(cycle) < 2 or not [k for k in measured if k != self.kind]:
            missing = [k for k in family if k not in message.cached and analysis_of(k).cost > 0]
            have = ", ".join(VIEW_LABELS[k] for k in measured) or "nothing"
            self.notify(
                f"only {have} is cached for these models: `{measures_command(self.path, missing)}` "
                "computes the other measures",
                title="measures",
                severity="warning",
                timeout=10,
            )
            return
        nxt = cycle[(cycle.index(self.kind) + 1) % len(cycle)]
        if message.places and analysis_of(nxt).shape is analysis_of(self.kind).shape:
            self._pending = (nxt, message.places)
        self.show_view(nxt)

    def on_view_wanted(self, message: ViewWanted) -> None:
        message.stop()
        if message.kind in KINDS:
            self.show_view(message.kind)

    # --- the layer-pair dossier ------------------------------------------------------------------------------

    def action_dossier(self) -> None:
        from vitsee.analyses.contract import Shape
        from vitsee.tui.screens.dossier import DossierScreen

        pane = self.pane()
        if analysis_of(self.kind).shape is not Shape.LAYER_MATRIX:  # a cell of a layer x layer view names two layers
            first = next((i for i, k in enumerate(KINDS, start=1) if analysis_of(k).shape is Shape.LAYER_MATRIX), 1)
            self.notify(
                f"the dossier is of a {VIEW_LABELS[KINDS[first - 1]]} cell: press {first}, pick a cell, then d",
                severity="warning",
                timeout=4,
            )
            return
        if pane.loaded is None or pane.selection is None or self.summary is None:
            self.notify(f"nothing to show yet: wait for the {pane.label} view to load", severity="warning", timeout=4)
            return
        row, col = pane.selection
        screen = DossierScreen(self.path, self.summary, pane.loaded, row, col, self._config, self._views)
        self.app.push_screen(screen, self._open_from_dossier)

    def _open_from_dossier(self, target) -> None:
        if target is not None:
            self.open_at(target.kind, target.model, target.layer)

    def open_at(self, kind: str, model: str, layer: str) -> None:
        """Shows the view `kind` of `model` (as model A) with its cursor at `layer` (the map of it: spatial, ERF);
        a view of two models (the dossier's own cell) opens as it was."""
        summary = self.summary
        if summary is None or model not in summary.keys:
            return
        analysis = analysis_of(kind)
        if analysis.models[1] > 1:
            self.show_view(kind)
            return
        if model != self.model_a:
            if self.model_b == model:  # B becomes the old A: the CKA view still shows the same two models
                self.model_b = self.model_a
            self.model_a = model
            self.query_one(SidePanel).set_models(summary, self.model_a, self.model_b)
        if analysis.takes_layer:
            self.picked_layer[(kind, model)] = layer
        else:
            self._pending = (kind, (Place(layer),))
        self.show_view(kind)

    # --- naming a model -------------------------------------------------------------------------------------------

    def action_name_model(self) -> None:
        """Asks for a display name for model A (the command palette's "Name model A"), kept in the store."""
        from vitsee.tui.screens.name_model import NameModelScreen

        if self.summary is None or self.model_a is None:
            return
        key = self.model_a

        def named(name: str | None) -> None:
            if name is not None:
                self._rename(key, name)

        self.app.push_screen(NameModelScreen(key, self.summary.names.get(key, key)), named)

    @work(thread=True, group="rename", exit_on_error=False)
    def _rename(self, key: str, name: str) -> None:
        from vitsee.tui.results import ACCESS

        try:
            with ACCESS.write(self.path) as store:
                shown = store.set_display_name(key, name or None)
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        self.app.call_from_thread(self._renamed, key, shown)

    def _renamed(self, key: str, shown: str) -> None:
        """Gives the views already read the model's new name, then reads the store's summary again."""
        from vitsee.analyses.views import with_names

        old = self.summary.names.get(key, key) if self.summary is not None else key
        loaded = [*self._views.values(), *(self.pane(kind).loaded for kind in KINDS)]
        for view in {id(item.view): item.view for item in loaded if item is not None}.values():
            if key in view.names:
                view.names = {**view.names, key: shown}
                view.title, view.subtitle = (
                    with_names(view.title, {old: shown}),
                    with_names(view.subtitle, {old: shown}),
                )
        self.notify(f"{key} is now called {shown!r}", title="name", timeout=6)
        self._read_summary()
        pane = self.pane()
        if pane.loaded is not None:
            self._show(pane, pane.loaded)

    # --- export -------------------------------------------------------------------------------------------------

    def action_export(self) -> None:
        pane = self.pane()
        view = pane.view
        if view is None:
            self.notify("nothing to export yet: wait for the view to load", severity="warning", timeout=4)
            return
        self._export(view, pane.selection, pane.cmap)

    @work(thread=True, group="export", exit_on_error=False)
    def _export(self, view: View, selection: tuple[int, int] | None, cmap: str) -> None:
        try:
            # a paper's figure has no cursor: the PNG marks the cell only when the config asks (export_marks)
            json_path, png_path, note = export_view(
                view, self.options.export_dir, selection, cmap, marks=self.options.export_marks
            )
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        except Exception as exc:
            log.exception("exporting %s", view.spec)
            self.app.call_from_thread(self.notify, bug_text("export failed", exc), severity="error", timeout=8)
            return
        self.post_message(ExportWritten(json_path, png_path, note))

    def on_export_written(self, message: ExportWritten) -> None:
        if message.png_path is not None:
            self.notify(f"exported {message.png_path} (+ {message.json_path.name})", title="export", timeout=8)
        else:
            self.notify(f"{message.note}: {message.json_path}", title="export", severity="warning", timeout=8)

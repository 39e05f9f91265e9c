"""The explorer's panes, one per registered analysis, of which one shows, under the bar of the view being read.

A pane's numbers come from the views read before (kept, so switching back costs nothing) or from a worker
(`read_view`: the cache, or a computation that caches, its progress in the bar). Which view string a pane should
show now is the explorer's to say (`spec_for`, given at construction); the panes say when they show new numbers
(Shown) and, once, when the first view is drawn or says why not (Settled: what waits for that may start).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import ContentSwitcher
from textual.worker import get_current_worker

from vitsee.errors import VitseeError
from vitsee.store.lock import StoreBusy
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import AnalysisStep, Place, ViewFailed, ViewLoaded
from vitsee.tui.options import COLORMAPS, AppOptions
from vitsee.tui.results import Cancelled, LoadedView, read_view
from vitsee.tui.widgets.panes import KINDS, PANES
from vitsee.tui.widgets.task_bar import StepThrottle, TaskBar
from vitsee.tui.widgets.view_pane import ViewPane

if TYPE_CHECKING:
    from vitsee.analyses.base import Step
    from vitsee.analyses.driver import AnalyzeConfig

log = logging.getLogger(__name__)

CMAP_BINDING = Binding(
    "c", "cycle_cmap", "Colours", show=False, id="explorer.cmap", tooltip="Cycle the colormap: viridis, magma, cividis"
)
CANCEL_BINDING = Binding(
    "x",
    "cancel",
    "Cancel",
    show=False,
    id="explorer.cancel",
    tooltip="Stop the analysis being computed (nothing half-done is kept)",
)

SpecFor = Callable[[str], tuple[str | None, str]]  # kind -> (the view string it should show, '') or (None, why not)


class ViewPanes(Vertical):
    """The panes in a ContentSwitcher, the view bar above them, and the reading of their numbers."""

    DEFAULT_CSS = """
    ViewPanes {
        height: 1fr;
        & > #panes { height: 1fr; }
    }
    """

    @dataclass
    class Shown(Message):
        """A pane shows new numbers (None: a line of text instead)."""

        kind: str
        loaded: LoadedView | None

    class Settled(Message):
        """The first view is drawn, or says why it cannot be."""

    class WriterWaited(Message):
        """A view could not be computed while another process wrote the store: worth reading again after it."""

    def __init__(
        self,
        path: Path,
        options: AppOptions,
        kind: str,
        spec_for: SpecFor,
        analysis: AnalyzeConfig | Callable[[], AnalyzeConfig] | None = None,
    ) -> None:
        super().__init__(id="view-panes")
        self.path, self.options, self.kind, self.spec_for = Path(path), options, kind, spec_for
        # what computes an uncached view: None, the app's defaults; a callable, what makes them (in a worker: the
        # engine imports torch)
        self.analysis = analysis
        self.views: dict[str, LoadedView] = {}  # spec -> what was read
        self.loading: str | None = None  # the view string the worker reads
        # kind -> the analysis's own options its view is read with ({"zoo_measure": "mknn"}: `m` in the zoo)
        self.view_options: dict[str, dict] = {}
        # (kind, places): where the cursor goes once that view is in (the dossier's layer, the cell `m` left)
        self.pending: tuple[str, tuple[Place, ...]] | None = None
        self.opened = False  # the store was read (or failed to be): a pane's reason is then the last word
        self.first_shown = False  # the first view is drawn or says why not

    def compose(self) -> ComposeResult:
        yield TaskBar(id="view-task")
        with ContentSwitcher(initial=f"pane-{self.kind}", id="panes"):
            for kind in KINDS:
                yield PANES[kind](kind, self.options.color_mode, self.options.cmap)

    def on_mount(self) -> None:
        self.bar.start(f"opening {self.path.name}")
        for kind in KINDS:
            self.pane(kind).show_message(f"opening {self.path} \u2026")

    def opened_as(self, failure: str | None) -> None:
        """The store was read (failure None) or could not be (every pane says why, and that is the first view)."""
        self.opened = True
        self.bar.stop()
        if failure is not None:
            for kind in KINDS:
                self.pane(kind).show_message(failure)
            self.settle()

    def pane(self, kind: str | None = None) -> ViewPane:
        return self.query_one(f"#pane-{kind or self.kind}", ViewPane)

    def config(self) -> AnalyzeConfig:
        """Returns the parameters for what is not cached (worker threads only: it imports the engine)."""
        if callable(self.analysis):
            self.analysis = self.analysis()
        return self.analysis or self.options.analysis_config()

    def warn(self, text: str) -> None:
        """Shows a warning a worker thread raised before a long computation (e.g. probes over a minute)."""
        self.app.call_from_thread(self.notify, text, severity="warning", timeout=15)

    def focus_view(self, unless_in: Widget | None = None) -> None:
        """Gives the keys to the shown view's main widget, unless the focus is inside `unless_in` (the side panel,
        where the user is picking)."""
        focused, widget = self.screen.focused, self.pane().main_widget()
        if unless_in is not None and focused is not None and focused in unless_in.query("*"):
            return
        if widget is not None and widget.focusable:
            widget.focus()

    def switch(self, kind: str) -> None:
        """Shows the pane of `kind` (its numbers are asked for with `request`)."""
        self.kind = kind
        self.query_one(ContentSwitcher).current = f"pane-{kind}"

    def cycle_cmap(self) -> None:
        """Draws every pane with the next colormap (the app's options keep it)."""
        cmap = COLORMAPS[(COLORMAPS.index(self.options.cmap) + 1) % len(COLORMAPS)]
        self.options.cmap = cmap
        for kind in KINDS:
            self.pane(kind).set_cmap(cmap)
        self.notify(f"colormap {cmap}", timeout=2)

    @property
    def bar(self) -> TaskBar:
        return self.query_one("#view-task", TaskBar)

    # --- asking for a view -------------------------------------------------------------------------------------

    def request(self, kind: str) -> None:
        """Make the pane of `kind` show its view: at once when it is loaded, else through a worker."""
        pane = self.pane(kind)
        spec, reason = self.spec_for(kind)
        if spec is None:
            pane.show_message(reason)
            self._shown(kind, None)
            if self.opened:
                self.settle()
            return
        if pane.loaded is not None and self._is_current(pane.loaded, spec):
            pane.post_status()
            self.go_pending(pane)
            return
        if spec in self.views and self._is_current(self.views[spec], spec):
            self._show(pane, self.views[spec])
            return
        if self.loading == spec:
            return
        pane.show_message(f"loading {spec} \u2026")
        self._shown(kind, None)
        waiting = self.screen.query_one("#background-task", TaskBar).running
        self.bar.start(f"reading {spec}" + (" (after the analysis running below)" if waiting else ""))
        self.loading = spec
        self._load(spec)

    def reread(self, kind: str, options: dict) -> None:
        """Reads the view of `kind` again with other options of its analysis (the zoo's measure)."""
        self.view_options[kind] = options
        self.loading = None  # a read with the options left behind is superseded (the view worker is exclusive)
        self.request(kind)

    def _is_current(self, loaded: LoadedView, spec: str) -> bool:
        """Returns whether a loaded view is of `spec` read with the options its kind has now."""
        return loaded.spec == spec and loaded.options == self.view_options.get(spec.partition(":")[0], {})

    def _show(self, pane: ViewPane, loaded: LoadedView) -> None:
        pane.show(loaded)
        self._shown(pane.kind, loaded)
        if pane.kind == self.kind:
            self.call_after_refresh(self.go_pending, pane)  # once a new heatmap is mounted
            if not self.first_shown:
                pane.when_drawn(self.settle)

    def _shown(self, kind: str, loaded: LoadedView | None) -> None:
        if kind == self.kind:
            self.post_message(self.Shown(kind, loaded))

    def settle(self) -> None:
        """The first view is drawn (or says why not): tells the explorer, once."""
        if not self.first_shown:
            self.first_shown = True
            self.post_message(self.Settled())

    def go_pending(self, pane: ViewPane) -> None:
        """Moves the cursor to where the dossier or `m` asked to open this view, once its numbers are shown."""
        pending = self.pending
        if pending is not None and pending[0] == pane.kind and pane.loaded is not None:
            self.pending = None
            for place in pending[1]:
                if not pane.go_to(place):
                    self.notify(f"{place.name} is not in this view", severity="warning", timeout=3)
            pane.post_status()  # a heatmap not laid out yet moves its cursor without saying so

    # --- reading ----------------------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="view", exit_on_error=False)
    def _load(self, spec: str) -> None:
        worker = get_current_worker()
        shown = StepThrottle()  # ~10 steps a second reach the event loop, however often the engine reports
        screen = self.screen  # it routes the steps: this bar, or the background pass's

        def progress(step: Step) -> None:
            if shown(step.done, step.total):
                screen.post_message(AnalysisStep(spec, step.analysis, step.done, step.total, step.message))

        try:
            loaded = read_view(
                self.path,
                spec,
                self.config(),
                progress,
                cancelled=lambda: worker.is_cancelled,
                warn=self.warn,
                options=self.view_options.get(spec.partition(":")[0]),
            )
        except Cancelled:
            return
        except VitseeError as exc:
            self.post_message(ViewFailed(spec, str(exc), busy=isinstance(exc, StoreBusy)))
        except Exception as exc:  # a bug: one line on screen, the traceback in the log
            log.exception("loading %s", spec)
            self.post_message(ViewFailed(spec, bug_text(f"cannot show {spec}", exc)))
        else:
            self.post_message(ViewLoaded(loaded))

    def step(self, message: AnalysisStep) -> None:
        """Shows a step of the view being read: in the bar, and in its pane while it has no numbers yet."""
        kind = message.spec.partition(":")[0]
        if self.pane(kind).loaded is None:
            self.pane(kind).show_message(
                f"{message.spec} is not in the store's cache yet: computing it now, then it is cached for next "
                "time. x cancels."
            )
        what = f"computing {message.analysis}" + (f"  {message.message}" if message.message else "")
        self.bar.advance(what, message.done, message.total)

    def on_view_loaded(self, message: ViewLoaded) -> None:
        loaded = message.loaded
        if self.loading == loaded.spec:
            self.loading = None
            self.bar.stop()
        kind = loaded.view.kind
        if not self._is_current(loaded, loaded.spec):  # read with options the view has left since (the zoo's measure)
            if kind == self.kind and self.spec_for(kind)[0] == loaded.spec:
                self.request(kind)
            return
        self.views[loaded.spec] = loaded
        if self.spec_for(kind)[0] == loaded.spec:
            self._show(self.pane(kind), loaded)
        if loaded.computed:
            self.notify(f"computed and cached {loaded.spec} in {loaded.seconds:.1f} s", timeout=4)

    def on_view_failed(self, message: ViewFailed) -> None:
        if self.loading == message.spec:
            self.loading = None
            self.bar.stop()
        kind = message.spec.partition(":")[0]
        if self.spec_for(kind)[0] == message.spec:
            self.pane(kind).show_message(message.error)
            self._shown(kind, None)
            if kind == self.kind:
                self.settle()
        self.notify(message.error, severity="error", timeout=10)
        if message.busy:  # another process's analysis or extraction: read the view again once it has finished
            self.post_message(self.WriterWaited())

    def cancel(self) -> bool:
        """Stops the view being read (nothing half-done is kept); returns whether one was."""
        running = [worker for worker in self.workers if worker.group == "view" and worker.is_running]
        for worker in running:
            worker.cancel()
        return bool(running)

    def cancelled(self) -> None:
        """Says in the shown pane that what was computing was cancelled."""
        self.loading = None
        self.bar.stop()
        self.pane().show_message("cancelled: nothing was cached; open the view again to compute it")

"""The bar under the explorer's panes, and the background pass it reports: after a new run, every result
`vitsee analyze` would cache (the driver's plan, in its order), each read through its view, so every view opens at
once later. The views it reads reach the explorer as they arrive (ViewLoaded); its steps come back through the
explorer (AnalysisStep), which tells them from the shown view's own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.widget import Widget
from textual.worker import get_current_worker

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import AnalysisStep, CachingEnded, ResultCached, ViewFailed, ViewLoaded
from vitsee.tui.results import Cancelled, read_view
from vitsee.tui.widgets.task_bar import StepThrottle, TaskBar

if TYPE_CHECKING:
    from vitsee.analyses.base import Step
    from vitsee.analyses.driver import AnalyzeConfig

log = logging.getLogger(__name__)


class CachingBar(TaskBar):
    """A TaskBar whose own worker caches every view of a store (`cache_all`); x cancels it with the view's."""

    def cache_all(
        self, path: Path, config: Callable[[], AnalyzeConfig], warn: Callable[[str], None], views: Widget
    ) -> None:
        """Starts caching every view of the store at `path` with the parameters `config()` makes (in the worker);
        each view read goes to `views` (ViewLoaded, ViewFailed), each step to the screen (AnalysisStep)."""
        self._cache_all(Path(path), config, warn, self.screen, views)

    def step(self, message: AnalysisStep) -> None:
        """Shows a step of the pass (or of any view read besides the shown one)."""
        what = f"computing {message.analysis}" + (f"  {message.message}" if message.message else "")
        self.advance(f"caching every view: {message.spec}  {what}", message.done, message.total)

    def cancel(self) -> bool:
        """Stops the pass (nothing half-done is kept); returns whether one was running."""
        running = [w for w in self.workers if w.group == "background" and w.is_running]
        for worker in running:
            worker.cancel()
        if running:
            self.stop()
        return bool(running)

    @work(thread=True, group="background", exit_on_error=False)
    def _cache_all(self, path: Path, config, warn, screen, views) -> None:
        from vitsee.analyses.driver import plan_views
        from vitsee.store import Store
        from vitsee.tui.results import ACCESS

        worker = get_current_worker()
        try:
            with ACCESS.read(), Store.open(path) as store:
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
                    label = f"{step.analysis} ({index}/{len(specs)})"
                    screen.post_message(AnalysisStep(spec, label, step.done, step.total, step.message))

            try:
                loaded = read_view(path, spec, config(), progress, cancelled=lambda: worker.is_cancelled, warn=warn)
            except Cancelled:
                break
            except VitseeError as exc:
                views.post_message(ViewFailed(spec, str(exc)))
                continue
            except Exception as exc:  # a bug: one line on screen, the traceback in the log
                log.exception("caching %s", spec)
                views.post_message(ViewFailed(spec, bug_text(f"cannot compute {spec}", exc)))
                continue
            cached += 1
            views.post_message(ViewLoaded(loaded))
            views.post_message(ResultCached(spec))
        self.post_message(CachingEnded(cached, len(specs), cancelled=worker.is_cancelled))

    def on_caching_ended(self, message: CachingEnded) -> None:
        self.stop()
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

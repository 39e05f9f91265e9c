"""An extraction running in a thread worker: what it plans (size on disk), loading, images done; cancellable.

When it ends the store opens in the explorer, which then caches every view in the background, so views
fill in as their results arrive. A cancelled run keeps its finished batches: r resumes it here (the engine call
of `vitsee extract STORE`, from the run the store records) and Esc goes back to where the run was started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Label, ProgressBar, RichLog
from textual.worker import get_current_worker

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import RunEnded, RunEvent
from vitsee.tui.options import AppOptions
from vitsee.tui.results import read_summary

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.extraction.plan import ExtractConfig, Progress

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """What to extract (a config, or a store whose recorded run to resume), how to analyse it afterwards,
    and a note for the explorer (the demo's weights)."""

    config: ExtractConfig | None
    analysis: AnalyzeConfig
    note: str | None = None
    reuse_complete: bool = False  # open an existing complete store as it is (the demo)
    # work before the extraction (the demo trains its models): called with a progress callback for engine
    # TrainEvents and the cancel event
    before: Callable[[Callable, threading.Event], None] | None = None
    resume: Path | None = None  # resume the run this store records, as `vitsee extract STORE` does
    opened: Callable[[Path], None] | None = None  # told the store once it opens complete (the demo remembers it)
    # work on the complete store before it opens, in the worker (the demo names its models)
    after: Callable[[Path], None] | None = None
    # one bar for the whole run, training included, its parts weighed by their expected seconds (the demo's build):
    # an object with begin/extracting/advance/train_step/describe/done/total as demo.BuildClock has them
    clock: object | None = None

    @property
    def store(self) -> Path:
        return Path(self.resume if self.config is None else self.config.store)


def what_is_missing(cfg: ExtractConfig) -> str | None:
    """Returns why the store a run names cannot be opened as it is (its problem, 'models missing', 'no store'), or None
    when it holds the run's models complete: what a plan with reuse_complete opens without running."""
    if not Path(cfg.store).exists():
        return "no store"
    summary = read_summary(cfg.store)
    if summary.problem is not None:
        return summary.problem
    return None if len(summary.models) == len(cfg.models) else "models missing"


class RunScreen(Screen):
    """Progress of one extraction."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "x,escape",
            "cancel",
            "Cancel",
            id="run.cancel",
            tooltip="Stop after the current batch; finished batches are kept and r resumes",
        ),
        Binding(
            "r",
            "resume",
            "Resume",
            id="run.resume",
            tooltip="Resume the stopped run: extract the batches it has not finished",
        ),
        Binding(
            "escape", "leave", "Back", id="run.back", tooltip="Leave the stopped run: back to where it was started"
        ),
    ]

    DEFAULT_CSS = """
    RunScreen {
        align: center top;
        & > #run { width: 1fr; max-width: 110; height: 1fr; padding: 1 2; }
        & .run--title { text-style: bold; }
        & #run-stage { margin-top: 1; color: $text; }
        & #run-bar { margin: 1 0; }
        & #run-log { height: 1fr; border: round $foreground 30%; }
    }
    """

    def __init__(self, options: AppOptions, prepare: Callable[[], RunPlan], title: str) -> None:
        super().__init__()
        self.options = options
        self.prepare = prepare
        self.title_text = title
        self.cancel_event = threading.Event()
        self.plan: RunPlan | None = None
        self.running = True  # False once the run ended cancelled or failed (a finished one opens the store)
        # the next run resumes the store's recorded run: set once an extraction stopped cancelled (it had made
        # the store or its model files); otherwise (cancelled in training, failed in planning) the plan runs again
        self.resuming = False

    def compose(self) -> ComposeResult:
        with Vertical(id="run"):
            yield Label(self.title_text, classes="run--title")
            yield Label("preparing \u2026", id="run-stage")
            yield ProgressBar(total=None, id="run-bar", show_eta=True)
            # RichLog renders every line at least min_width (78) wide: at 80x24, inside the padding and the
            # border, the ends of the lines were cut off instead of wrapped
            yield RichLog(id="run-log", wrap=True, markup=False, min_width=1)
        yield Footer()

    def on_mount(self) -> None:
        self._run()

    def on_unmount(self) -> None:
        self.cancel_event.set()  # quitting mid-run: stop at the next batch, keep what is written

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Cancel while the run goes; Resume and Back once it stopped."""
        if action == "cancel":
            return self.running
        if action in ("resume", "leave"):
            return not self.running
        return True

    def action_cancel(self) -> None:
        if self.cancel_event.is_set():
            return
        self.cancel_event.set()
        self.query_one("#run-stage", Label).update("cancelling after the current batch \u2026")

    def action_resume(self) -> None:
        """Runs again: the store's recorded run once an extraction was cancelled, else the plan from the start."""
        if self.running:
            return
        self.cancel_event = threading.Event()
        self._set_running(True)
        self.query_one("#run-stage", Label).update("resuming \u2026")
        self._run()

    def action_leave(self) -> None:
        """Back to the screen the run was started from (the start screen when it was the first)."""
        first = len(self.app.screen_stack) <= 2  # started by `vitsee-tui --demo`: nothing below but the default
        self.app.pop_screen()
        if first:
            self.app.show_start()

    def _set_running(self, running: bool) -> None:
        self.running = running
        self.refresh_bindings()

    @work(thread=True, group="run", exit_on_error=False)
    def _run(self) -> None:
        worker = get_current_worker()
        try:
            from vitsee.extraction.extract import run_extraction
            from vitsee.threads import set_compute_threads

            set_compute_threads()  # the free cores, as `vitsee extract` takes them
            first = self.plan is None
            plan = self.plan = self.plan or self.prepare()

            def progress(event: Progress) -> None:
                self.post_message(RunEvent(event.stage, event.done, event.total, event.message))

            if plan.config is None or self.resuming:
                result = self._resume(plan.store, progress)
                if result is not None and not worker.is_cancelled:
                    self.post_message(RunEnded(result.store, cancelled=result.cancelled))
                return
            cfg = plan.config
            if first:
                self.post_message(RunEvent("plan", text=f"store {cfg.store}"))
            if plan.note and first:
                self.post_message(RunEvent("plan", text=plan.note))
            if plan.reuse_complete and Path(cfg.store).exists():
                missing = what_is_missing(cfg)
                if missing is None:
                    if plan.after is not None:
                        plan.after(Path(cfg.store))
                    self.post_message(RunEnded(Path(cfg.store)))
                    return
                self.post_message(RunEvent("plan", text=f"resuming: {missing}"))
            Path(cfg.store).parent.mkdir(parents=True, exist_ok=True)
            if plan.before is not None:
                plan.before(self._post_train_event, self.cancel_event)
                if self.cancel_event.is_set():
                    self.post_message(RunEnded(Path(cfg.store), cancelled=True))
                    return

            if cfg.workers is None:
                # images decode in this process: a loader worker forked from the app (Textual's and torch's
                # threads running) now and then died at start-up in full test runs, and torch's SIGCHLD handler
                # then raised inside the app's event loop; heavy runs belong to `vitsee extract`
                cfg = replace(cfg, workers=0)
            if plan.clock is not None:
                plan.clock.extracting()
            result = run_extraction(cfg, progress, self.cancel_event)
            self.resuming = result.cancelled
            if not result.cancelled and plan.after is not None:
                plan.after(Path(result.store))
        except VitseeError as exc:
            self.post_message(RunEnded(self.plan.store if self.plan else Path("."), error=str(exc)))
            return
        except Exception as exc:  # a bug: one line, the traceback in the log
            log.exception("extraction")
            self.post_message(
                RunEnded(self.plan.store if self.plan else Path("."), error=bug_text("extraction failed", exc))
            )
            return
        if not worker.is_cancelled:
            self.post_message(RunEnded(result.store, cancelled=result.cancelled))

    def _resume(self, store: Path, progress):
        """Returns the result of resuming the store's recorded run (None when it was complete already)."""
        from vitsee.extraction.extract import resume_extraction
        from vitsee.extraction.run_config import plan_resume

        # images decode in this process, as for a new run (see below)
        resume = plan_resume(store, workers=0)
        self.post_message(RunEvent("plan", text=resume.describe()))
        if resume.complete:
            self.post_message(RunEnded(store))
            return None
        return resume_extraction(resume, progress, self.cancel_event)

    def _post_train_event(self, event) -> None:
        """Posts an engine TrainEvent as a RunEvent: 'train' steps move the bar, epochs and plans are log lines."""
        if event.stage == "step":
            text = f"training: epoch {event.epoch} of {event.epochs}, loss {event.loss:.3f}"
            clock = self.plan.clock if self.plan is not None else None
            if clock is not None:  # the whole build's bar: this epoch's steps move it by their share
                clock.train_step(event)
                now = clock.parts[clock.index][0]
                text = clock.describe(f"{now}: epoch {event.epoch} of {event.epochs}, loss {event.loss:.3f}")
                self.post_message(RunEvent("build", round(clock.done, 2), round(clock.total, 2), text))
                return
            self.post_message(RunEvent("train", event.done, event.total, text))
        elif event.stage == "epoch":
            r = event.row
            self.post_message(
                RunEvent(
                    "plan",
                    text=f"epoch {r['epoch']}/{event.epochs}: loss {r['train_loss']:.3f}, "
                    f"test accuracy {r['test_accuracy']:.3f} ({r['seconds']:.0f} s)",
                )
            )
        else:
            self.post_message(RunEvent("plan", text=event.message))

    def on_run_event(self, message: RunEvent) -> None:
        stage = self.query_one("#run-stage", Label)
        bar = self.query_one("#run-bar", ProgressBar)
        if message.stage == "train":
            stage.update(message.text)
            bar.update(total=max(message.total, 1), progress=message.done)
            return
        if message.stage == "build":
            stage.update(message.text)
            bar.update(total=max(message.total, 1e-9), progress=message.done)
            return
        if message.stage == "extract":
            text = f"extracting: {message.done} of {message.total} images"
            clock = self.plan.clock if self.plan is not None else None
            if clock is not None:  # the build's last part: the images move the whole build's bar
                clock.advance(message.done / max(message.total, 1))
                stage.update(clock.describe(text))
                bar.update(total=max(clock.total, 1e-9), progress=clock.done)
                return
            stage.update(text)
            bar.update(total=max(message.total, 1), progress=message.done)
            return
        if message.text:
            self.query_one(RichLog).write(message.text)
        if message.stage == "plan" and "expected size on disk" in message.text:
            stage.update(message.text.split(": ", 1)[-1])
        elif message.stage == "load":
            stage.update(message.text)

    def on_run_ended(self, message: RunEnded) -> None:
        if message.error:
            self._set_running(False)
            self.query_one("#run-stage", Label).update(message.error)
            self.query_one(RichLog).write(f"error: {message.error}")
            self.notify(message.error, severity="error", timeout=12)
            return
        if message.cancelled:
            self._set_running(False)
            text = f"cancelled: finished batches are kept in {message.store}; r resumes, Esc goes back"
            self.query_one("#run-stage", Label).update(text)
            self.query_one(RichLog).write(text)
            self.notify(text, severity="warning", timeout=10)
            return
        plan = self.plan
        stack = self.app.screen_stack
        below = stack[-2] if len(stack) > 2 else None
        if getattr(below, "path", None) == message.store:  # resumed from that store's explorer: replace it
            self.app.pop_screen()
        self.app.open_store(
            message.store,
            analyse_all=True,
            analysis=plan.analysis if plan else None,
            note=plan.note if plan else None,
            replace=True,
        )
        if plan is not None and plan.opened is not None:
            plan.opened(message.store)

"""The store the explorer shows, as the explorer learns of it: its summary (models, layers, what is cached) read in a
worker, read again while an extraction in progress finishes rows, and the write lock a view could not be computed
under watched until it is free (the explorer then reads that view again: issue 29, 7, the Zoo tab said "being
written by process ... (vitsee analyze)" 30 s after that process had ended). All of it by polling, in workers."""

from __future__ import annotations

from pathlib import Path

import logging

from textual import work
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import SummaryFailed, SummaryLoaded
from vitsee.tui.results import StoreSummary, read_summary

log = logging.getLogger(__name__)


class StoreWatch(Widget):
    """Polls a store every `poll_s` seconds while an extraction is unfinished or a writer holds its lock."""

    DEFAULT_CSS = "StoreWatch { display: none; }"

    class WriterGone(Message):
        """The process that held the store's write lock released it: what waited for it may be computed now."""

    def __init__(self, path: Path, poll_s: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.path = Path(path)
        self.poll_s = poll_s
        self._rows: dict[str, int] = {}  # model -> rows done, as the summary last read them
        self._rows_timer: Timer | None = None
        self._lock_timer: Timer | None = None
        self._reading = False  # one read at a time: a slow disk must not pile them up

    @work(thread=True, group="summary", exit_on_error=False)
    def read(self) -> None:
        """Reads the store's summary; the screen gets SummaryLoaded, or SummaryFailed with the reason in one line."""
        screen = self.screen
        try:
            screen.post_message(SummaryLoaded(read_summary(self.path)))
        except VitseeError as exc:
            screen.post_message(SummaryFailed(self.path, str(exc)))
        except Exception as exc:  # a bug: say it in one line, keep the app alive
            log.exception("reading %s", self.path)
            screen.post_message(SummaryFailed(self.path, bug_text(f"cannot read {self.path}", exc)))

    # --- an extraction in progress ------------------------------------------------------------------------

    def watch_rows(self, summary: StoreSummary) -> None:
        """Polls the store's done rows while a model's are unfinished; stops once all are done."""
        self._rows = {m.key: m.rows_done for m in summary.models}
        unfinished = bool(summary.models) and any(m.rows_done < summary.n_images for m in summary.models)
        if unfinished and self._rows_timer is None:
            self._rows_timer = self.set_interval(self.poll_s, self._poll_rows)
        elif not unfinished and self._rows_timer is not None:
            self._rows_timer.stop()
            self._rows_timer = None

    def _poll_rows(self) -> None:
        if not self._reading:
            self._reading = True
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
            self._reading = False
        if done is not None and done != self._rows:
            self.read()

    # --- a writer's lock ----------------------------------------------------------------------------------

    def wait_for_writer(self) -> None:
        """Polls the store's write lock until nobody holds it, then posts WriterGone (once)."""
        if self._lock_timer is None:
            self._lock_timer = self.set_interval(self.poll_s, self._poll_lock)

    def _poll_lock(self) -> None:
        if not self._reading:
            self._reading = True
            self._read_lock()

    @work(thread=True, group="poll", exit_on_error=False)
    def _read_lock(self) -> None:
        from vitsee.store.lock import writer_of

        try:
            writer = writer_of(self.path)
        finally:
            self._reading = False
        if writer is None:
            self.app.call_from_thread(self._writer_gone)

    def _writer_gone(self) -> None:
        if self._lock_timer is not None:
            self._lock_timer.stop()
            self._lock_timer = None
            self.post_message(self.WriterGone())

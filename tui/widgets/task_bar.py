"""A one-line progress report for work running in a thread: what it is doing, how far it got, when it ends."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

# An ETA from the first second or first step is mostly start-up noise (imports, the first read): wait for both.
ETA_AFTER_S = 1.0


def format_eta(seconds: float) -> str:
    """Returns seconds as 'm:ss', or 'h:mm:ss' from an hour on."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class EtaClock:
    """Estimates the time left from the elapsed time per unit done since the job (its total) started."""

    def __init__(self, now=time.monotonic) -> None:
        self.now = now
        self.total: int | None = None
        self.start_time = 0.0
        self.start_done = 0

    def restart(self) -> None:
        self.total = None

    def update(self, done: int, total: int) -> float | None:
        """Returns the seconds left, or None while there is too little to go on."""
        now = self.now()
        if total != self.total or done < self.start_done:  # another job, or the same one started over
            self.total, self.start_time, self.start_done = total, now, done
            return None
        elapsed, progressed = now - self.start_time, done - self.start_done
        if elapsed < ETA_AFTER_S or progressed <= 0:
            return None
        return elapsed / progressed * max(total - done, 0)


class StepThrottle:
    """Lets progress through at most once per interval (and always the last step), so a worker that reports
    every batch cannot flood the event loop with messages."""

    def __init__(self, interval_s: float = 0.1, now=time.monotonic) -> None:
        self.interval_s, self.now = interval_s, now
        self.last = -float("inf")

    def __call__(self, done: int, total: int) -> bool:
        """Returns whether this step should be shown."""
        now = self.now()
        if done >= total or now - self.last >= self.interval_s:
            self.last = now
            return True
        return False


class TaskBar(Horizontal):
    """'computing probes test_vit  blocks.3  [=====    ]  40%  ETA 0:42' — hidden while idle."""

    DEFAULT_CSS = """
    TaskBar {
        height: 1;
        display: none;
        padding: 0 1;
        background: $boost;
        &.-running { display: block; }
        & > .task-bar--text { width: 1fr; height: 1; color: $text; text-wrap: nowrap; text-overflow: ellipsis; }
        & > ProgressBar { width: auto; height: 1; }
        & > .task-bar--eta { width: auto; height: 1; color: $text; padding: 0 0 0 1; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clock = EtaClock()

    def compose(self) -> ComposeResult:
        yield Label("", classes="task-bar--text")
        yield ProgressBar(total=None, show_eta=False, show_percentage=False, classes="task-bar--bar")
        yield Label("", classes="task-bar--eta")

    def start(self, text: str) -> None:
        """Show the bar, pulsing (no total yet)."""
        self.query_one(".task-bar--text", Label).update(text)
        self.query_one(".task-bar--eta", Label).update("")
        self.query_one(ProgressBar).update(total=None, progress=0)
        self.clock.restart()
        self.add_class("-running")

    def advance(self, text: str, done: int, total: int) -> None:
        """Show `done` of `total`, the percentage and, once it can be told, the time left."""
        total = max(total, 1)
        left = self.clock.update(done, total)
        self.query_one(".task-bar--text", Label).update(text)
        self.query_one(ProgressBar).update(total=total, progress=done)
        percent = f"{100 * min(done, total) // total}%"
        self.query_one(".task-bar--eta", Label).update(
            percent if left is None else f"{percent}  ETA {format_eta(left)}"
        )
        self.add_class("-running")

    def stop(self) -> None:
        self.clock.restart()
        self.remove_class("-running")

    @property
    def text(self) -> str:
        """Returns what the bar says now, its percentage and ETA included."""
        labels = (self.query_one(f".task-bar--{part}", Label) for part in ("text", "eta"))
        return "  ".join(filter(None, (str(label.content) for label in labels)))

    @property
    def running(self) -> bool:
        return self.has_class("-running")

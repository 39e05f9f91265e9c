"""A one-line progress report for work running in a thread: what it is doing and how far it got."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar


class TaskBar(Horizontal):
    """'computing probes test_vit  blocks.3  [=====    ] 40%' — hidden while idle."""

    DEFAULT_CSS = """
    TaskBar {
        height: 1;
        display: none;
        padding: 0 1;
        background: $boost;
        &.-running { display: block; }
        & > Label { width: 1fr; height: 1; color: $text; }
        & > ProgressBar { width: auto; height: 1; }
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("", classes="task-bar--text")
        yield ProgressBar(total=None, show_eta=False, classes="task-bar--bar")

    def start(self, text: str) -> None:
        """Show the bar, pulsing (no total yet)."""
        self.query_one(Label).update(text)
        self.query_one(ProgressBar).update(total=None, progress=0)
        self.add_class("-running")

    def advance(self, text: str, done: int, total: int) -> None:
        self.query_one(Label).update(text)
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)
        self.add_class("-running")

    def stop(self) -> None:
        self.remove_class("-running")

    @property
    def running(self) -> bool:
        return self.has_class("-running")

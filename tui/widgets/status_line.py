"""The status line under the views: always the selected layer pair (or cell) and its value."""

from __future__ import annotations

from textual.widgets import Static


class StatusLine(Static):
    """One line of text whose size never changes, so an update repaints just this line.

    A plain `Static.update` would lay the screen out again on every cursor move, which repaints every
    scrollbar on it too: a few kilobytes a keypress over SSH instead of one line.
    """

    DEFAULT_CSS = """
    StatusLine { width: 1fr; height: 1; padding: 0 1; background: $panel; color: $text; text-style: bold; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.text = ""

    def show(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.update(text, layout=False)

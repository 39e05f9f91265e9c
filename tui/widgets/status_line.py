"""The status line under the views: always the selected layer pair (or cell) and its value."""

from __future__ import annotations

from textual.widgets import Static

from vitsee.tui.widgets.fit import fit_line


class StatusLine(Static):
    """One line of text whose size never changes, so an update repaints just this line.

    The text is parts separated by two spaces ('blocks.0 head 1  distance 82.2 px  uniform 83.0 px'); where
    the line is narrower than the text, the trailing parts are left out whole rather than a value cut in half.

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
            self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        width = self.content_size.width
        self.update(fit_line(self.text, width) if width > 0 else self.text, layout=False)

    @property
    def shown(self) -> str:
        """Returns the text as drawn at the current width."""
        width = self.content_size.width
        return fit_line(self.text, width) if width > 0 else self.text

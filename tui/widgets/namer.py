"""Naming a model from the app (the command palette's "Name model A"): the name asked for in a modal, written to the
store in a worker (engine/store/names.py), then every view already read calls the model by it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.message import Message
from textual.widget import Widget

from vitsee.errors import VitseeError


class ModelNamer(Widget):
    """Asks for and writes a model's display name; posts Renamed once the store keeps it."""

    DEFAULT_CSS = "ModelNamer { display: none; }"

    @dataclass
    class Renamed(Message):
        """The store calls `key` by `shown` now (it was called `old`)."""

        key: str
        old: str
        shown: str

    def __init__(self, path: Path, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.path = Path(path)

    def ask(self, key: str, name_now: str) -> None:
        """Opens the modal for `key`; a name given there is written (an empty one: the automatic name)."""
        from vitsee.tui.screens.name_model import NameModelScreen

        def named(name: str | None) -> None:
            if name is not None:
                self._rename(key, name_now, name)

        self.app.push_screen(NameModelScreen(key, name_now), named)

    @work(thread=True, group="rename", exit_on_error=False)
    def _rename(self, key: str, old: str, name: str) -> None:
        from vitsee.tui.results import ACCESS

        try:
            with ACCESS.write(self.path) as store:
                shown = store.set_display_name(key, name or None)
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        self.post_message(self.Renamed(key, old, shown))

"""Naming a model from the app (the command palette's "Name model A"): the name asked for in a modal, written to the
store in a worker (engine/store/names.py), then every view already read calls the model by it (the explorer's panes,
reached through the screen)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.message import Message
from textual.widget import Widget

from vitsee.errors import VitseeError
from vitsee.tui.widgets.panes import KINDS
from vitsee.tui.widgets.store_watch import StoreWatch

if TYPE_CHECKING:
    from vitsee.tui.results import StoreSummary


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

    def ask_for(self, summary: StoreSummary | None, key: str | None) -> None:
        """Opens the modal for model `key` of the store `summary` describes; nothing while either is unknown."""
        if summary is not None and key is not None:
            self.ask(key, summary.names.get(key, key))

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

    def on_model_namer_renamed(self, message: ModelNamer.Renamed) -> None:
        """Gives the views already read the model's new name, shows the current one again, rereads the summary."""
        from vitsee.analyses.views import with_names

        key, old, shown = message.key, message.old, message.shown
        screen = self.screen  # the explorer: its panes hold the views read
        loaded = [*screen.panes.views.values(), *(screen.pane(kind).loaded for kind in KINDS)]
        for view in {id(item.view): item.view for item in loaded if item is not None}.values():
            if key in view.names:
                view.names = {**view.names, key: shown}
                view.title, view.subtitle = (
                    with_names(view.title, {old: shown}),
                    with_names(view.subtitle, {old: shown}),
                )
        self.notify(f"{key} is now called {shown!r}", title="name", timeout=6)
        screen.query_one(StoreWatch).read()
        pane = screen.pane()
        if pane.loaded is not None:
            pane.show(pane.loaded)

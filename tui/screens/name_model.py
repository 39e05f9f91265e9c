"""Naming a model: what every title, legend and file name calls it, kept in the store (engine/store/names.py)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class NameModelScreen(ModalScreen[str | None]):
    """Asks for a model's display name; dismisses with it ("" for the automatic name), None on Esc."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close", id="name_model.close", tooltip="Keep the name it has"),
    ]

    DEFAULT_CSS = """
    NameModelScreen {
        align: center middle;
        & > #name-model { width: 90%; max-width: 90; height: auto; border: round $accent; background: $surface;
                          padding: 0 1; }
        & .name-model--title { text-style: bold; width: 1fr; }
        & .name-model--hint { color: $text-muted; width: 1fr; }
    }
    """

    def __init__(self, key: str, name: str) -> None:
        super().__init__()
        self.key = key
        self.name_now = name

    def compose(self) -> ComposeResult:
        with Vertical(id="name-model"):
            yield Label(f"Name {self.key}", classes="name-model--title")
            yield Input(self.name_now, id="name-model-input", compact=True)
            yield Label(
                "what titles, legends and file names call it, kept in the store; Enter sets it (empty: the "
                "automatic name), Esc keeps it",
                classes="name-model--hint",
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

"""The jump overlay: every pane of the explorer with what it would show for the current models; Enter goes there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class JumpTarget:
    """One pane as the overlay lists it: its key, its name, and its view string or why it has none."""

    kind: str
    key: str  # the number key that shows it in the explorer ('1m': in tab 1, where m cycles to it)
    label: str
    what: str  # 'cka:vit:resnet' or the sentence the pane would show instead


class JumpScreen(ModalScreen[str | None]):
    """Lists the panes; dismisses with the kind picked (None: Esc)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss", "Close", id="jump.close", tooltip="Close the list and stay in this view"),
    ]

    DEFAULT_CSS = """
    JumpScreen {
        align: center middle;
        & > #jump { width: 90%; max-width: 100; height: auto; max-height: 90%; border: round $accent;
                    background: $surface; padding: 0 1; }
        & .jump--title { text-style: bold; width: 1fr; }
        & .jump--hint { color: $text-muted; width: 1fr; }
        & OptionList { height: auto; max-height: 20; border: none; }
    }
    """

    def __init__(self, targets: list[JumpTarget], current: str) -> None:
        super().__init__()
        self.targets = targets
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="jump"):
            yield Label("Go to a view", classes="jump--title")
            yield OptionList(
                *[Option(f"{t.key:<2} {t.label:<10} {t.what}", id=t.kind) for t in self.targets], id="jump-list"
            )
            yield Label("\u2191\u2193 pick, Enter goes there, Esc stays", classes="jump--hint")

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        kinds = [t.kind for t in self.targets]
        if self.current in kinds:
            option_list.highlighted = kinds.index(self.current)
        option_list.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

"""The help screen: every key that works where the user is, grouped by the widget that owns it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Label


@dataclass
class KeyHelp:
    """One action and the keys that trigger it."""

    owner: str
    keys: str
    description: str
    binding_id: str


def describe_bindings(screen: Screen) -> list[KeyHelp]:
    """Returns the active bindings of a screen (focused widget first, then its parents, screen, app),
    one row per action with all its keys."""
    app = screen.app
    rows: dict[tuple[int, str], KeyHelp] = {}
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if binding.system and binding.action not in ("app.command_palette", "command_palette"):
            continue
        node = active.node
        owner = type(node).__name__ if node is not app else "App"
        group = (id(node), binding.action)
        shown = app.get_key_display(binding)
        description = binding.tooltip or binding.description or binding.action
        row = rows.get(group)
        if row is None:
            rows[group] = KeyHelp(owner, shown, description, binding.id or "")
        elif shown not in row.keys.split(" / "):
            if binding.id and not row.binding_id:  # ours over Textual's default for the same action (q, ctrl+q)
                row.keys, row.description, row.binding_id = f"{shown} / {row.keys}", description, binding.id
            else:
                row.keys += f" / {shown}"
    return list(rows.values())


class HelpScreen(ModalScreen[None]):
    """A table of keys: where they work, what they do, and the binding id (for remapping)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close", id="help.close", tooltip="Close the help"),
    ]

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        & > #help {
            width: 90%;
            max-width: 120;
            height: 90%;
            border: round $accent;
            background: $surface;
            padding: 0 1;
        }
        & .help--title { text-style: bold; }
        & .help--hint { color: $text-muted; width: 1fr; }
        & DataTable { height: 1fr; }
    }
    """

    def __init__(self, keys: list[KeyHelp], title: str = "Keys") -> None:
        super().__init__()
        self.keys = keys
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label(self.title_text, classes="help--title")
            yield Label("ctrl+p opens the command palette (open store, switch models or view, export, zoom); Esc closes",
                        classes="help--hint")
            yield DataTable(id="help-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("key", "what it does", "where", "binding id")
        for row in self.keys:
            table.add_row(row.keys, row.description, row.owner, row.binding_id)
        table.focus()

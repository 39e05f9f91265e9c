"""The help screen: which view is shown, the keys that work there grouped as a user thinks of them, each with
what it does in that view, and what the view's glyphs and markers mean."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

GROUPS = ("Move", "Views", "Models", "This view", "App")
MOVES = (
    "up",
    "down",
    "left",
    "right",
    "page_up",
    "page_down",
    "first",
    "last",
    "first_row",
    "last_row",
    "first_col",
    "last_col",
    "cursor_up",
    "cursor_down",
    "cursor_left",
    "cursor_right",
    "page_left",
    "page_right",
    "scroll_up",
    "scroll_down",
    "scroll_left",
    "scroll_right",
    "scroll_home",
    "scroll_end",
    "scroll_top",
    "scroll_bottom",
    "focus_next",
    "focus_previous",
)
KEY_WIDTH = 12  # the widest key ('shift+home', '0-9 a-z') and the legend's marks line up across groups
VIEW_IDS = ("explorer.panel", "explorer.cmap")
APP_IDS = ("explorer.open", "explorer.new_run", "explorer.cancel", "detail.help")
SCREEN_TITLES = {  # the screens without a help_context of their own, in the user's words
    "StartScreen": "Start: pick a store or begin a run",
    "NewRunScreen": "New run: models, images and layers",
    "RunScreen": "A run in progress",
    "ExplorerScreen": "Explorer",
}


@dataclass
class KeyHelp:
    """One action, the keys that trigger it, and the group the help lists it under."""

    group: str
    keys: str
    description: str
    binding_id: str  # kept for remapping (config.toml); never shown


def key_group(binding: Binding) -> str:
    """Returns the group a binding belongs to: Move, Views, Models, This view or App."""
    bid, action = binding.id or "", binding.action
    name = (bid or action.partition("(")[0]).rpartition(".")[2]
    if bid.startswith("app.") or bid in APP_IDS or name in ("quit", "command_palette", "copy_text", "help"):
        return "App"
    if bid.startswith("explorer.view_") or bid in VIEW_IDS:
        return "Views"
    if bid.startswith("explorer.model_"):
        return "Models"
    if name in MOVES or action.startswith(("move", "jump", "page", "step", "row(")):
        return "Move"
    return "This view"


def describe_bindings(screen: Screen, descriptions: dict[str, str] | None = None) -> list[KeyHelp]:
    """Returns the active bindings of a screen (focused widget first, then its parents, screen, app), one row per
    action with all its keys, in GROUPS order; `descriptions` (binding id -> text) say what a key does here."""
    app = screen.app
    descriptions = descriptions or {}
    rows: dict[tuple[int, str], KeyHelp] = {}
    for active in screen.active_bindings.values():
        binding = active.binding
        if binding.system and binding.action not in ("app.command_palette", "command_palette"):
            continue
        group = (id(active.node), binding.action)
        shown = app.get_key_display(binding)
        description = descriptions.get(binding.id or "") or binding.tooltip or binding.description or binding.action
        row = rows.get(group)
        if row is None:
            rows[group] = KeyHelp(key_group(binding), shown, description, binding.id or "")
        elif shown not in row.keys.split(" / "):
            if binding.id and not row.binding_id:  # ours over Textual's default for the same action (q, ctrl+q)
                row.keys, row.description, row.binding_id = f"{shown} / {row.keys}", description, binding.id
            else:
                row.keys += f" / {shown}"
    return sorted(rows.values(), key=lambda row: GROUPS.index(row.group))


def help_context(screen: Screen) -> tuple[str, dict[str, str], list[tuple[str, str]]]:
    """Returns (title, key descriptions by binding id, glyph legend) for the screen the help is asked on."""
    own = getattr(screen, "help_context", None)
    if callable(own):
        return own()
    pane = getattr(screen, "pane", None)
    if callable(pane) and getattr(screen, "kind", None):  # the explorer: what its shown view says
        shown = pane()
        models = (
            " x ".join(shown.view.name(m) for m in dict.fromkeys(shown.view.models))
            if shown.view is not None
            else "loading"
        )
        return f"{shown.label} view ({models})", dict(shown.key_help), shown.legend()
    return SCREEN_TITLES.get(type(screen).__name__, "Keys on this screen"), {}, []


def keys_table(rows: list[KeyHelp]) -> Table:
    """Returns a two-column table, key and what it does, the description wrapping (nothing cut at 80 columns)."""
    table = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    table.add_column("key", style="bold", no_wrap=True, width=KEY_WIDTH)
    table.add_column("what it does", ratio=1)
    for row in rows:
        table.add_row(row.keys, row.description)
    return table


def legend_table(legend: list[tuple[str, str]]) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    table.add_column("mark", style="bold", no_wrap=True, width=KEY_WIDTH)
    table.add_column("meaning", ratio=1)
    for glyph, meaning in legend:
        table.add_row(glyph, meaning)
    return table


class HelpScreen(ModalScreen[None]):
    """The keys of the current view by group, then the legend of its marks; scrolls when it is taller than the
    window."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close", id="help.close", tooltip="Close the help"),
    ]

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        & > #help {
            width: 90%;
            max-width: 110;
            height: 90%;
            border: round $accent;
            background: $surface;
            padding: 0 1;
        }
        & .help--title { text-style: bold; width: 1fr; height: auto; }
        & .help--hint { color: $text-muted; width: 1fr; height: auto; }
        & .help--group { color: $accent; text-style: bold; margin-top: 1; height: auto; }
        & #help-body { height: 1fr; scrollbar-size-vertical: 1; }
        & #help-body > Static { height: auto; }
    }
    """

    def __init__(self, keys: list[KeyHelp], title: str = "Keys", legend: list[tuple[str, str]] | None = None) -> None:
        super().__init__()
        self.keys = keys
        self.title_text = title
        self.legend = legend or []

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static(Text(f"Help: {self.title_text}"), classes="help--title")
            yield Static(
                "\u2191\u2193 scroll \u00b7 ctrl+p: every command by name \u00b7 Esc, ? or q closes",
                classes="help--hint",
                markup=False,
            )
            with VerticalScroll(id="help-body"):
                for group in GROUPS:
                    rows = [row for row in self.keys if row.group == group]
                    if rows:
                        yield Static(group, classes="help--group", markup=False)
                        yield Static(keys_table(rows), classes="help--keys")
                if self.legend:
                    yield Static("What the marks mean", classes="help--group", markup=False)
                    yield Static(legend_table(self.legend), id="help-legend")

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()

    def text(self) -> str:
        """Returns the help as plain text: title, groups, keys, legend (what a reader of the screen gets)."""
        lines = [f"Help: {self.title_text}"]
        for group in GROUPS:
            rows = [row for row in self.keys if row.group == group]
            lines += [group] + [f"  {row.keys}  {row.description}" for row in rows] if rows else []
        if self.legend:
            lines += ["What the marks mean"] + [f"  {glyph}  {meaning}" for glyph, meaning in self.legend]
        return "\n".join(lines)

"""The start screen: the stores in the current folder (newest first, an interrupted one marked and resumable
with R), a path to open, a new run, the demo."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from vitsee.errors import VitseeError
from vitsee.store import human_bytes
from vitsee.tui.options import AppOptions


def find_stores(folder: Path) -> list[Path]:
    """Returns the .h5 files in folder, newest first."""
    try:
        files = [p for p in folder.glob("*.h5") if p.is_file()]
    except OSError:
        return []
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


def store_line(path: Path) -> str:
    stat = path.stat()
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(stat.st_mtime))
    return f"{path.name:<40} {human_bytes(stat.st_size):>9}  {when}"


# The explorer's keys to this screen and to the new-run form (ids as the explorer's: its screen holds them).
STORE_BINDINGS = [
    Binding("o", "open_store", "Open", show=False, id="explorer.open", tooltip="Open another store"),
    Binding(
        "ctrl+n",
        "new_run",
        "New run",
        show=False,
        id="explorer.new_run",
        tooltip="Extract another store (models, images, layers)",
    ),
]


class StartScreen(Screen):
    """Where vitsee-tui starts without a store."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "new_run", "New run", id="start.new_run", tooltip="Extract a new store: models, images, layers"),
        Binding("d", "demo", "Demo", id="start.demo", tooltip="Open the demo store (built on first use)"),
        Binding("r", "rescan", "Rescan", id="start.rescan", tooltip="Look for stores in the folder again"),
        Binding(
            "R",
            "resume",
            "Resume",
            id="start.resume",
            tooltip="Resume the highlighted store's interrupted extraction (as `vitsee extract STORE` does)",
        ),
        Binding("escape", "back", "Back", show=False, id="start.back", tooltip="Back to the store that was open"),
    ]

    DEFAULT_CSS = """
    StartScreen {
        align: center top;
        & > #start { width: 1fr; max-width: 100; height: 1fr; padding: 1 2; }
        & .start--title { text-style: bold; }
        & .start--hint { color: $text-muted; margin-bottom: 1; }
        & #stores { height: 1fr; min-height: 3; border: round $foreground 30%; }
        & #stores:focus { border: round $accent; }
        & #open-path { margin-top: 1; }
        & #start-buttons { height: auto; margin-top: 1; }
        & #start-buttons > Button { margin-right: 2; }
    }
    """

    def __init__(self, options: AppOptions) -> None:
        super().__init__()
        self.options = options
        self.incomplete: set[str] = set()  # option ids (paths) of stores whose extraction is unfinished

    def compose(self) -> ComposeResult:
        with Vertical(id="start"):
            yield Label("vitsee \u2014 do vision transformers see like CNNs?", classes="start--title")
            yield Label(
                f"Stores in {self.options.folder} (newest first); Enter opens one.",
                classes="start--hint",
                id="start-folder",
            )
            yield OptionList(id="stores")
            yield Input(placeholder="or type the path of a store and press Enter", id="open-path")
            with Horizontal(id="start-buttons"):
                yield Button("New run (n)", id="new-run", variant="primary")
                yield Button("Demo (d)", id="demo")
        yield Footer()

    def on_mount(self) -> None:
        self.action_rescan()

    def on_screen_resume(self) -> None:
        if self.is_mounted:  # back from a run or a store: a store may have been made or finished meanwhile
            self.action_rescan()

    def action_rescan(self) -> None:
        stores = find_stores(self.options.folder)
        found = self.query("#stores")
        if not found:  # pushed while the app quits: nothing was composed
            return
        option_list = found.first(OptionList)
        option_list.clear_options()
        self.incomplete.clear()
        if stores:
            option_list.add_options([Option(store_line(p), id=str(p)) for p in stores])
            option_list.highlighted = 0
            option_list.focus()
            self._mark_incomplete(stores)
        else:
            option_list.add_option(
                Option("no .h5 stores here: start a new run (n) or open the demo (d)", disabled=True)
            )
            self.query_one("#new-run", Button).focus()

    @work(thread=True, exclusive=True, group="store-status", exit_on_error=False)
    def _mark_incomplete(self, stores: list[Path]) -> None:
        """Reads each store's done rows (h5py, off the event loop) and marks the unfinished ones."""
        from vitsee.store import Store
        from vitsee.store.lock import writer_of

        for path in stores:
            try:
                with Store.open(path) as s:
                    done = min((s.rows_done(m) for m in s.models), default=s.n_images)
                    n = s.n_images
            except (VitseeError, OSError):  # not a store, or being replaced: listed as it is
                continue
            if done < n:
                writer = writer_of(path)  # another process still extracting: not for R to resume
                text = f"extracting {done}/{n}, written by {writer}" if writer else f"incomplete {done}/{n}, R resumes"
                self.app.call_from_thread(self._mark, path, text, writer is None)

    def _mark(self, path: Path, text: str, resumable: bool = True) -> None:
        option_list = self.query_one("#stores", OptionList)
        try:
            option_list.replace_option_prompt(str(path), f"{store_line(path)}  {text}")
        except OptionDoesNotExist:  # rescanned meanwhile
            return
        if resumable:
            self.incomplete.add(str(path))
        self.refresh_bindings()

    def _highlighted_store(self) -> str | None:
        option = self.query_one("#stores", OptionList).highlighted_option
        return option.id if option is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Resume shows while an unfinished store is highlighted."""
        if action == "resume":
            return bool(self.query("#stores")) and self._highlighted_store() in self.incomplete
        return True

    @on(OptionList.OptionHighlighted, "#stores")
    def _highlight_changed(self) -> None:
        self.refresh_bindings()

    def action_resume(self) -> None:
        path = self._highlighted_store()
        if path in self.incomplete:
            self.app.resume_store(Path(path))

    @on(OptionList.OptionSelected, "#stores")
    def _open_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.app.open_store(Path(event.option.id))

    @on(Input.Submitted, "#open-path")
    def _open_typed(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text:
            self.app.open_store(Path(text).expanduser())

    @on(Button.Pressed, "#new-run")
    def action_new_run(self) -> None:
        from vitsee.tui.screens.new_run import NewRunScreen

        self.app.push_screen(NewRunScreen(self.options))

    @on(Button.Pressed, "#demo")
    def action_demo(self) -> None:
        self.app.open_demo()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

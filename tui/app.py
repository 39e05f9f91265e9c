"""`vitsee-tui`: explore a store's analyses in the terminal (over SSH, in tmux), export what you see.

    vitsee-tui [STORE] [--export-dir DIR] [--no-mouse] [--color auto|truecolor|256|16|none] [--demo]
    vitsee-tui --show-config
    vitsee-tui STORE --snapshot VIEW --out screen.svg|screen.png [--size 120x40]

With a STORE it opens on the CKA view of its first model; without one it lists the stores in the current
folder and offers a new run; --demo builds (once) and opens a small store of a ViT and a ResNet. Settings
and key remaps come from $XDG_CONFIG_HOME/vitsee/config.toml (see tui/config.py); flags override them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from vitsee.output.colormap import ColorMode
from vitsee.errors import VitseeError
from vitsee.tui.commands import VitseeCommands
from vitsee.tui.config import COLOR_CHOICES, Settings, load_settings
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import FirstViewShown
from vitsee.tui.options import COLORMAPS, AppOptions

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.tui.screens.run import RunPlan
    from vitsee.tui.snapshot import SnapshotPlan

log = logging.getLogger(__name__)


class VitseeApp(App):
    """The terminal explorer: a start screen, the new-run form, runs, and the explorer of one store."""

    TITLE = "vitsee"
    CSS_PATH = "vitsee.tcss"
    COMMANDS = App.COMMANDS | {VitseeCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", id="app.quit", tooltip="Quit vitsee-tui"),
        Binding("question_mark", "help", "Help", id="app.help", tooltip="List the keys that work here"),
        Binding(
            "ctrl+p",
            "command_palette",
            "Commands",
            show=False,
            id="app.command_palette",
            tooltip="Open the command palette: open store, switch view or models, export, zoom",
        ),
        Binding(
            "R",
            "resume",
            "Resume",
            id="app.resume",
            tooltip="Resume the open store's interrupted extraction (as `vitsee extract STORE` does)",
        ),
    ]

    def __init__(
        self,
        store: Path | None = None,
        *,
        options: AppOptions | None = None,
        demo: bool = False,
        keymap: dict[str, str] | None = None,
        snapshot: SnapshotPlan | None = None,
    ) -> None:
        super().__init__()
        from vitsee.tui.logs import setup_logging

        self.log_file = setup_logging()  # where a bug's traceback goes (the line on screen names it)
        self.options = options or AppOptions()
        self.store = store
        self.demo = demo
        self.snapshot = snapshot  # --snapshot: open on its view, screenshot it, quit
        self._demo_to_check: Path | None = None  # the demo store shown before its checks ran (see open_demo)
        if keymap:
            self.set_keymap(keymap)

    def get_line_filters(self):
        """Textual's filters; with no colour asked for (NO_COLOR, --color none) every colour dropped, not greyed:
        tui/no_color.py."""
        filters = list(super().get_line_filters())
        if self.options.color_mode is ColorMode.NONE:
            from textual.filter import Monochrome

            filters = [f for f in filters if not isinstance(f, Monochrome)] + [self._colourless]
        return filters

    @property
    def _colourless(self):
        from vitsee.tui.no_color import Colourless

        if not hasattr(self, "_colourless_filter"):
            self._colourless_filter = Colourless()
        return self._colourless_filter

    def on_mount(self) -> None:
        if self.demo:
            self.open_demo()
        elif self.store is not None:
            self.open_store(self.store)
        else:
            self.show_start()

    # --- screens ------------------------------------------------------------------------------------------

    def show_start(self) -> None:
        from vitsee.tui.screens.start import StartScreen

        if not self._exiting():
            self.push_screen(StartScreen(self.options))

    def new_run(self) -> None:
        from vitsee.tui.screens.new_run import NewRunScreen

        if not self._exiting():
            self.push_screen(NewRunScreen(self.options))

    def _exiting(self) -> bool:
        # a key typed right after q still arrives: a screen pushed while the app closes never composes
        return bool(getattr(self, "_exit", False))

    def open_store(
        self,
        path: Path,
        *,
        analyse_all: bool = False,
        analysis: AnalyzeConfig | None = None,
        note: str | None = None,
        replace: bool = False,
    ) -> None:
        """Open a store in the explorer (a missing or broken one is reported there, not raised)."""
        from vitsee.tui.screens.explorer import ExplorerScreen

        screen = ExplorerScreen(Path(path), self.options, analyse_all=analyse_all, note=note, analysis=analysis)
        if self.snapshot is not None:
            from vitsee.tui.snapshot import prepare

            prepare(self.snapshot, screen)
        if replace:
            self.switch_screen(screen)
            return
        while len(self.screen_stack) > 2:  # one explorer at a time: the start screen, a finished run ... go
            self.pop_screen()
        if len(self.screen_stack) == 2:
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def resume_store(self, path: Path) -> None:
        """Resume the run a store records (an interrupted extraction) in a run screen over this one."""
        from vitsee.tui.screens.run import RunPlan, RunScreen

        def prepare() -> RunPlan:  # in the run's worker
            from vitsee.analyses.driver import AnalyzeConfig

            return RunPlan(None, AnalyzeConfig(device=self.options.device), resume=Path(path))

        self.push_screen(RunScreen(self.options, prepare, f"Resuming the extraction into {path}"))

    def _incomplete_store(self) -> Path | None:
        """Returns the path of the store the explorer shows when its extraction is unfinished, else None."""
        from vitsee.tui.screens.explorer import ExplorerScreen

        screen = self.screen
        summary = getattr(screen, "summary", None) if isinstance(screen, ExplorerScreen) else None
        if summary is None or not summary.models or all(m.rows_done >= summary.n_images for m in summary.models):
            return None
        return None if summary.writer is not None else screen.path  # another process extracting: not for R

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Resume shows on an explorer of an incomplete store only."""
        if action == "resume":
            return self._incomplete_store() is not None
        return True

    def action_resume(self) -> None:
        path = self._incomplete_store()
        if path is not None:
            self.resume_store(path)

    DEMO_TITLE: ClassVar[str] = "Demo: a small ViT and a ResNet (trained here when no pretrained weights can be had)"

    def open_demo(self) -> None:
        """Opens the demo store: the one the last launch opened at once, checked once its first view is on screen;
        else through a run screen that checks, then builds it on first use."""
        from vitsee.tui import demo
        from vitsee.tui.screens.run import RunScreen

        opened = demo.last_opened()
        if opened is None:
            self.push_screen(RunScreen(self.options, self._demo_plan, self.DEMO_TITLE))
            return
        self._demo_to_check = opened.store
        plan = demo.DemoPlan(**self.demo_overrides)
        self.open_store(
            opened.store,
            analyse_all=True,
            note=opened.note,
            analysis=lambda: demo.analysis_config(plan, self.options.device),
        )

    def _demo_plan(self) -> RunPlan:
        """Returns the demo's run: its checks (cached weights, the Hub, the recipe) and the store they pick
        (worker threads only: the checks import timm and may wait on the network)."""
        from vitsee.tui import demo
        from vitsee.tui.screens.run import RunPlan

        choice = demo.choose(device=self.options.device, plan=demo.DemoPlan(**self.demo_overrides))
        note = f"demo store {choice.config.store}: {choice.weights_note}"
        clock = demo.BuildClock.for_choice(choice)  # one bar for the training and the extraction
        before = None
        if choice.training:

            def before(progress, cancel):
                demo.prepare_trained(choice, progress, cancel, clock=clock)

        return RunPlan(
            choice.config,
            choice.analysis,
            note=note,
            reuse_complete=True,
            before=before,
            opened=lambda store: demo.remember(store, note),
            after=lambda store: demo.name_models(store, choice),
            clock=clock,
        )

    def on_first_view_shown(self, message: FirstViewShown) -> None:
        if self._demo_to_check is not None and Path(message.path) == self._demo_to_check:
            self._demo_to_check = None
            self._check_demo(message.path)

    @work(thread=True, group="demo-check", exit_on_error=False)
    def _check_demo(self, shown: Path) -> None:
        """Runs the demo's checks behind the store shown from the last launch; when they pick another store (pretrained
        weights now cached, another recipe, models missing) its run screen comes up to build it."""
        from vitsee.tui.screens.run import what_is_missing

        try:
            plan = self._demo_plan()
            cfg = plan.config
            if Path(cfg.store).resolve() == Path(shown).resolve() and what_is_missing(cfg) is None:
                plan.after(Path(shown))  # a store built before the demo named its models gets its names now
                return  # the same store, complete: what the run screen would have opened
        except VitseeError as exc:
            self.call_from_thread(self.notify, str(exc), severity="error", timeout=10)
            return
        except Exception as exc:  # a bug: one line, the traceback in the log
            log.exception("checking the demo")
            self.call_from_thread(self.notify, bug_text("cannot check the demo store", exc), severity="error")
            return
        self.call_from_thread(self._rebuild_demo, plan)

    def _rebuild_demo(self, plan: RunPlan) -> None:
        from vitsee.tui.screens.run import RunScreen

        self.notify(f"the demo's checks pick {plan.config.store}: building it", timeout=8)
        self.push_screen(RunScreen(self.options, lambda: plan, self.DEMO_TITLE))

    demo_overrides: ClassVar[dict] = {}  # tests make the demo small

    def action_help(self) -> None:
        from vitsee.tui.screens.help import HelpScreen, describe_bindings, help_context

        if isinstance(self.screen, HelpScreen):
            return
        title, descriptions, legend = help_context(self.screen)  # the shown view's words and marks
        self.push_screen(HelpScreen(describe_bindings(self.screen, descriptions), title=title, legend=legend))


# --- command line ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # settings default to None, "not given", so a value from the config file stands unless a flag overrides it
    parser = argparse.ArgumentParser(
        prog="vitsee-tui",
        description="Explore a vitsee store in the terminal: CKA, attention distances, "
        "probes, skip ratios, spatial maps; export any view to PNG + JSON. Settings and key remaps: "
        "$XDG_CONFIG_HOME/vitsee/config.toml (flags override it; --show-config says what is in effect).",
    )
    parser.add_argument("store", nargs="?", type=Path, help="a store made by `vitsee extract` (default: pick one)")
    parser.add_argument(
        "--export-dir", type=Path, default=None, help="where `e` writes PNG + JSON (default ./vitsee-exports)"
    )
    parser.add_argument(
        "--no-mouse",
        dest="mouse",
        action="store_false",
        default=None,
        help="turn mouse reporting off (slow links, tmux copy mode)",
    )
    parser.add_argument(
        "--color",
        default=None,
        choices=list(COLOR_CHOICES),
        help="heatmap colours (default auto: COLORTERM/TERM; NO_COLOR means none)",
    )
    parser.add_argument("--cmap", default=None, choices=list(COLORMAPS), help="heatmap colormap (default viridis)")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="open the demo store (built on first use from built-in images and two small models)",
    )
    parser.add_argument("--device", default=None, help="device for analyses not cached yet: auto, cpu, cuda[:N]")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the config file to read (default $XDG_CONFIG_HOME/vitsee/config.toml)",
    )
    parser.add_argument(
        "--show-config",
        action="store_true",
        help="print each setting, its value and where it came from, and the key remaps; then exit",
    )
    parser.add_argument(
        "--snapshot",
        metavar="VIEW",
        default=None,
        help="render VIEW (cka:A:B, attention:MODEL, ... or a kind such as attention) once its data "
        "is drawn, write the screen to --out (SVG or PNG) and exit",
    )
    parser.add_argument("--out", type=Path, default=None, help="the file --snapshot writes: *.svg or *.png")
    parser.add_argument("--size", default=None, help="the terminal size --snapshot renders at (default 120x40)")
    return parser.parse_args(argv)


def read_settings(args: argparse.Namespace) -> Settings:
    """Returns the settings: the flags given over the config file over the defaults."""
    flags = {
        "colormap": args.cmap,
        "color": args.color,
        "mouse": args.mouse,
        "export_dir": args.export_dir,
        "device": args.device,
    }
    return load_settings(flags, path=args.config)


def build_app(args: argparse.Namespace, settings: Settings | None = None) -> VitseeApp:
    """Returns the app the arguments describe (a VitseeError for a bad value)."""
    settings = settings or read_settings(args)
    if args.store is not None and args.demo:
        raise VitseeError("give a STORE or --demo, not both")
    snapshot = None
    if args.snapshot is not None:
        from vitsee.tui.snapshot import plan_snapshot

        if args.store is None or args.demo:
            raise VitseeError("--snapshot needs a STORE: vitsee-tui STORE --snapshot VIEW --out screen.svg")
        snapshot = plan_snapshot(args.store, args.snapshot, args.out, args.size or "120x40")
    elif args.out is not None or args.size is not None:
        raise VitseeError(
            f"{'--out' if args.out is not None else '--size'} goes with --snapshot VIEW: add it, or drop the flag"
        )
    options = settings.options()
    if snapshot is not None and settings["color"] == "auto":
        options.color_mode = ColorMode.TRUECOLOR  # a screenshot shows every colour, whatever terminal runs this
    return VitseeApp(args.store, options=options, demo=args.demo, keymap=settings.keymap(), snapshot=snapshot)


def fail(message: str) -> None:
    """Prints a user's error in one line, as the vitsee CLI does, and exits 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        settings = read_settings(args)
        if args.show_config:
            print(settings.describe())
            sys.exit(0)
        app = build_app(args, settings)
    except VitseeError as exc:
        fail(str(exc))
    if app.snapshot is not None:
        from vitsee.tui.snapshot import take

        plan = app.snapshot
        app.run(headless=True, size=plan.size, mouse=False, auto_pilot=lambda pilot: take(plan, pilot))
        if plan.error is not None:
            fail(plan.error)
        if plan.spec is None:  # the app stopped before the view was drawn: Textual printed why
            sys.exit(app.return_code or 1)
        print(f"wrote {plan.out} ({plan.spec} at {plan.size[0]}x{plan.size[1]})")
        sys.exit(0)
    app.run(mouse=settings["mouse"])
    sys.exit(app.return_code or 0)


if __name__ == "__main__":
    main()

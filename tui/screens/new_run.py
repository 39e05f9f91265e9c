"""The new-run form: models, images, layers, device, where the store goes; its size on disk before it starts."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Footer, Input, Label, Select

from vitsee.data import BUILTIN_DATASETS, MIN_IMAGES
from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.options import AppOptions
from vitsee.tui.results import estimate_size
from vitsee.tui.screens.run import RunPlan, RunScreen
from vitsee.tui.widgets.model_picker import ModelPicker

if TYPE_CHECKING:
    from vitsee.extraction.plan import ExtractConfig

log = logging.getLogger(__name__)


def extract_config(fields: dict) -> ExtractConfig:
    """Returns the engine's config for the form's fields (in a worker: the engine imports torch)."""
    from vitsee.extraction.plan import ExtractConfig

    return ExtractConfig(**fields)


class NewRunScreen(Screen):
    """Fill in a run, check its size, start it (the RunScreen shows its progress)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "start", "Start", id="new_run.start", tooltip="Start the extraction"),
        Binding(
            "f2",
            "estimate",
            "Size",
            id="new_run.estimate",
            tooltip="Work out the size on disk (builds each model once, writes nothing)",
        ),
        Binding("escape", "back", "Back", id="new_run.back", tooltip="Leave the form"),
    ]

    DEFAULT_CSS = """
    NewRunScreen {
        & > #form { padding: 0 2; }
        & .form--title { text-style: bold; margin-top: 1; }
        & .form--label { color: $text-muted; margin-top: 1; width: 1fr; }
        & Input, Select { margin-right: 1; }
        & .form--row { height: auto; }
        & .form--row > Vertical { width: 1fr; height: auto; }
        & .form--field { width: 1fr; height: auto; margin-right: 1; }
        & #size-line { margin-top: 1; color: $text; text-style: bold; width: 1fr; }
        & #form-buttons { height: auto; margin: 1 0; }
        & #form-buttons > Button { margin-right: 2; }
    }
    """

    def __init__(self, options: AppOptions, models: list[str] | None = None) -> None:
        super().__init__()
        self.options = options
        self.initial_models = models or []

    def compose(self) -> ComposeResult:
        stamp = time.strftime("%Y%m%d-%H%M")
        with VerticalScroll(id="form"):
            yield Label("New run: extract activations into a store", classes="form--title")
            yield Label("Models", classes="form--label")
            yield ModelPicker(self.initial_models, id="model-picker")
            yield Label(
                "Images: dataset (samples, synthetic, digits, imagefolder:PATH, cifar10:PATH, npz:PATH) and how many",
                classes="form--label",
            )
            with Horizontal(classes="form--row"):
                yield Input(
                    "samples",
                    id="dataset",
                    classes="form--field",
                    compact=True,
                    suggester=SuggestFromList(list(BUILTIN_DATASETS), case_sensitive=False),
                )
                yield Input(
                    "240", id="n-images", type="integer", classes="form--field", placeholder="all", compact=True
                )
            yield Label("Layers, device, image size (empty: the model's own)", classes="form--label")
            with Horizontal(classes="form--row"):
                yield Select(
                    [("blocks", "blocks"), ("sublayers (6x the size)", "sublayers")],
                    value="blocks",
                    allow_blank=False,
                    id="layers",
                    classes="form--field",
                    compact=True,
                )
                yield Select(
                    [("auto", "auto"), ("cpu", "cpu"), ("cuda", "cuda")],
                    value="auto",
                    allow_blank=False,
                    id="device",
                    classes="form--field",
                    compact=True,
                )
                yield Input(
                    "", id="img-size", type="integer", placeholder="e.g. 224", classes="form--field", compact=True
                )
            yield Label(
                "What to keep: activations serve every view; streaming computes CKA, attention distances and "
                "skip ratios during the pass and stores no activations (for runs too large to keep; no probes "
                "or spatial maps), with head-level CKA if asked (a ViT's heads against another model's layers)",
                classes="form--label",
            )
            yield Select(
                [
                    ("activations", "activations"),
                    ("streaming: results only", "streaming"),
                    ("streaming: results and head-level CKA", "streaming-heads"),
                ],
                value="activations",
                allow_blank=False,
                id="keep",
                compact=True,
            )
            yield Label("Store file", classes="form--label")
            yield Input(str(self.options.folder / f"vitsee-{stamp}.h5"), id="store-path", compact=True)
            yield Label("size on disk: press F2 to work it out (Start shows it too, before extracting)", id="size-line")
            with Horizontal(id="form-buttons"):
                yield Button("Start (ctrl+s)", id="start", variant="primary")
                yield Button("Size (F2)", id="estimate")
                yield Button("Back (esc)", id="back")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#model-search", Input).focus()

    def fields(self) -> dict:
        """Returns the run the form describes, as ExtractConfig fields; a VitseeError names the field to fix."""
        models = self.query_one(ModelPicker).specs
        if not models:
            raise VitseeError("no model in the run: search for one and press Enter, or type NAME@random and Enter")
        n_text = self.query_one("#n-images", Input).value.strip()
        size_text = self.query_one("#img-size", Input).value.strip()
        store = self.query_one("#store-path", Input).value.strip()
        if not store:
            raise VitseeError("no store file: type a path ending in .h5")
        try:
            n_images = int(n_text) if n_text else None
            img_size = int(size_text) if size_text else None
        except ValueError:
            raise VitseeError(
                f"'{n_text or size_text}' is not a whole number: fix the images or image size field"
            ) from None
        if n_images is not None and n_images < MIN_IMAGES:
            raise VitseeError(
                f"{n_images} images is too few: CKA needs at least {MIN_IMAGES} (a few hundred is better)"
            )
        keep = self.query_one("#keep", Select).value
        if keep == "streaming-heads" and len(models) < 2:
            raise VitseeError(
                "head-level CKA compares a ViT's heads with another model's layers: add a second model "
                "(e.g. resnet18), or stream results only"
            )
        return dict(
            store=Path(store).expanduser(),
            models=models,
            dataset=self.query_one("#dataset", Input).value.strip() or "samples",
            n_images=n_images,
            device=str(self.query_one("#device", Select).value),
            layers=str(self.query_one("#layers", Select).value),
            img_size=img_size,
            streaming=keep in ("streaming", "streaming-heads"),
            heads=keep == "streaming-heads",
        )

    @on(Button.Pressed, "#estimate")
    def action_estimate(self) -> None:
        try:
            fields = self.fields()
        except VitseeError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.query_one("#size-line", Label).update("working out the size \u2026 (building each model once)")
        self._estimate(fields)

    @work(thread=True, exclusive=True, group="estimate", exit_on_error=False)
    def _estimate(self, fields: dict) -> None:
        try:
            text = estimate_size(extract_config(fields))
        except VitseeError as exc:
            text = str(exc)
            self.app.call_from_thread(self.notify, text, severity="error", timeout=10)
        except Exception as exc:
            log.exception("estimating %s", fields)
            text = bug_text("cannot plan this run", exc)
        self.app.call_from_thread(self.query_one("#size-line", Label).update, text)

    @on(Button.Pressed, "#start")
    def action_start(self) -> None:
        try:
            fields = self.fields()
        except VitseeError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return

        def prepare() -> RunPlan:  # in the run's worker
            from vitsee.analyses.driver import AnalyzeConfig

            return RunPlan(extract_config(fields), AnalyzeConfig(device=fields["device"]))

        self.app.switch_screen(RunScreen(self.options, prepare, f"Extracting into {fields['store']}"))

    @on(Button.Pressed, "#back")
    def action_back(self) -> None:
        self.app.pop_screen()

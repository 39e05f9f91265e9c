"""Pick timm models for a run: search the registry (family, weights cached here) or type a spec by hand."""

from __future__ import annotations

import logging

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text

log = logging.getLogger(__name__)
MAX_MATCHES = 200
CACHED = "\u2713"  # ✓


class ChosenModels(OptionList):
    """The models of the run; Delete removes the highlighted one."""

    BINDINGS = [
        Binding(
            "delete,backspace",
            "remove",
            "Remove model",
            id="new_run.remove_model",
            tooltip="Remove the highlighted model from the run",
        ),
    ]

    def action_remove(self) -> None:
        if self.highlighted is not None and self.option_count:
            option = self.get_option_at_index(self.highlighted)
            if option.id:
                self.remove_option(option.id)


class ModelPicker(Vertical):
    """A search box over timm's models, its matches, and the chosen models."""

    BINDINGS = [
        Binding(
            "down",
            "focus_matches",
            "Matches",
            show=False,
            id="new_run.matches",
            tooltip="Move from the search box into its matches",
        ),
    ]

    DEFAULT_CSS = """
    ModelPicker {
        height: auto;
        & > #model-matches { height: 7; border: round $foreground 30%; }
        & > #model-matches:focus { border: round $accent; }
        & > #models-chosen { height: 4; border: round $foreground 30%; }
        & > #models-chosen:focus { border: round $accent; }
        & > Label { color: $text-muted; }
    }
    """

    def __init__(self, initial: list[str] | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.initial = initial or []
        self.rows: list[dict] = []

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="search timm models (vit, resnet...), or type NAME[.TAG][@random|@FILE] + Enter",
            id="model-search",
            compact=True,
        )
        yield Label("matches: name, family, \u2713 = weights cached here", id="model-matches-label")
        yield OptionList(id="model-matches")
        yield Label("models of the run (Delete removes)")
        yield ChosenModels(*[Option(spec, id=spec) for spec in self.initial], id="models-chosen")

    def action_focus_matches(self) -> None:
        self.query_one("#model-matches", OptionList).focus()

    def on_mount(self) -> None:
        self.query_one("#model-matches", OptionList).add_option(
            Option("loading timm's model list \u2026", disabled=True)
        )
        self._load_models()

    @work(thread=True, group="models", exit_on_error=False)
    def _load_models(self) -> None:
        from vitsee.models.load import list_models

        try:
            rows = list_models("*")
        except Exception as exc:  # timm missing or broken: typing a spec still works
            log.exception("listing models")
            self.app.call_from_thread(self.notify, bug_text("cannot list timm models", exc), severity="error")
            return
        self.app.call_from_thread(self._models_loaded, rows)

    def _models_loaded(self, rows: list[dict]) -> None:
        self.rows = rows
        self._filter(self.query_one("#model-search", Input).value)

    @on(Input.Changed, "#model-search")
    def _search_changed(self, event: Input.Changed) -> None:
        self._filter(event.value)

    def _filter(self, text: str) -> None:
        if not self.rows:
            return
        words = text.lower().split("@")[0].split()
        matches = [r for r in self.rows if all(w in r["name"].lower() for w in words)]
        first = words[0] if words else ""
        # weights at hand first, then names that start with what was typed
        matches.sort(key=lambda r: (not r["cached"], not r["name"].lower().startswith(first), r["name"]))
        option_list = self.query_one("#model-matches", OptionList)
        option_list.clear_options()
        width = max((len(r["name"]) for r in matches[:MAX_MATCHES]), default=10)
        option_list.add_options(
            [
                Option(f"{r['name']:<{width}}  {r['family']:<6} {CACHED if r['cached'] else ' '}", id=r["name"])
                for r in matches[:MAX_MATCHES]
            ]
        )
        more = len(matches) - MAX_MATCHES
        self.query_one("#model-matches-label", Label).update(
            f"{len(matches)} matches{f' (first {MAX_MATCHES} shown)' if more > 0 else ''}; "
            f"{CACHED} = weights cached here; \u2193 then Enter adds one"
        )

    @on(OptionList.OptionSelected, "#model-matches")
    def _match_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.add(event.option.id)

    @on(Input.Submitted, "#model-search")
    def _typed(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            return
        try:
            from vitsee.models.load import parse_model_spec

            spec = parse_model_spec(text)
        except VitseeError as exc:
            option_list = self.query_one("#model-matches", OptionList)
            if option_list.option_count == 1 and option_list.get_option_at_index(0).id:
                self.add(option_list.get_option_at_index(0).id)  # the only match: take it
                return
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.add(str(spec) if spec.weights != "pretrained" else text)

    def add(self, spec: str) -> None:
        chosen = self.query_one("#models-chosen", ChosenModels)
        if spec in self.specs:
            self.notify(f"{spec} is already in the run", severity="warning", timeout=3)
            return
        chosen.add_option(Option(spec, id=spec))
        self.notify(f"added {spec}", timeout=2)

    @property
    def specs(self) -> list[str]:
        chosen = self.query_one("#models-chosen", ChosenModels)
        return [str(o.id) for o in chosen.options if o.id]

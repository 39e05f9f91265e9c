"""The side panel: which models the views show (A; B for the CKA columns), a list of their layers, and the
search that filters that list (`/` in the explorer)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, OptionList, Select
from textual.widgets.option_list import Option

from vitsee.tui.messages import LayerPicked, ModelsPicked, SearchChanged
from vitsee.tui.results import StoreSummary

SAME_AS_A = "\x00same"
MODEL_OPTION = "\x00model:"  # a model the search found, listed among the layers: Enter picks it as model A


def matches_query(name: str, query: str) -> bool:
    """Returns whether a layer or model name contains the search text (case does not matter)."""
    return query.strip().lower() in name.lower()


def model_label(key: str, width: int = 22) -> str:
    """Returns a model key short enough for the panel: the timm name without its tag, and how it was
    initialised when that fits too (the title bar always says it)."""
    name, _, init = key.partition("@")
    base = name.partition(".")[0]
    kind = "random" if init.startswith("random") else "file" if init.startswith("file") else ""
    if kind and len(base) + len(kind) + 3 <= width:
        return f"{base} ({kind})"
    return base


class SidePanel(Vertical):
    """Model A, model B (CKA columns) and the layers of the current view."""

    DEFAULT_CSS = """
    SidePanel {
        width: 30;
        height: 1fr;
        border-right: vkey $foreground 20%;
        padding: 0 1 0 0;
        & > Label { color: $text-muted; padding: 0 1; margin-top: 1; }
        & > Label.-first { margin-top: 0; }
        & > Select { width: 1fr; }
        & > Select Static#label { text-wrap: nowrap; text-overflow: ellipsis; }
        & > OptionList { height: 1fr; border: none; padding: 0; }
        &.-hidden { display: none; }
        & > #search { display: none; width: 1fr; }
        & > #search-count { display: none; margin-top: 0; }
        &.-searching > #search, &.-searching > #search-count { display: block; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.layer_names: list[str] = []  # the current view's layers, unfiltered
        self.model_options: list[tuple[str, str]] = []  # (label, key)
        self.search_text = ""  # what the list is filtered by ("" shows everything)

    def compose(self) -> ComposeResult:
        yield Input(placeholder="layer or model", id="search", compact=True)
        yield Label("", id="search-count")
        yield Label("Model A (rows)", classes="-first", id="label-model-a")
        yield Select([], prompt="model A", id="model-a", compact=True)
        yield Label("Model B (columns)", id="label-model-b")
        yield Select([], prompt="model B", id="model-b", compact=True)
        yield Label("Layers", id="label-layers")
        yield OptionList(id="layers")

    def set_models(self, summary: StoreSummary, model_a: str | None = None, model_b: str | None = None) -> None:
        """Offer the store's models and show the picked A and B (B on 'same as A' when it is None)."""
        labels = [m.name or model_label(m.key) for m in summary.models]  # the display names
        if len(set(labels)) < len(labels):  # two read alike (a model and its twin from weights files): tell them apart
            from vitsee.output.labels import model_labels

            labels = model_labels(summary.keys, 22)
        options = self.model_options = list(zip(labels, summary.keys))
        select_a = self.query_one("#model-a", Select)
        select_b = self.query_one("#model-b", Select)
        with self.prevent(Select.Changed):
            select_a.set_options(options)
            select_b.set_options([("same as A", SAME_AS_A), *options])
            if options:
                select_a.value = model_a if model_a in summary.keys else options[0][1]
            select_b.value = model_b if model_b in summary.keys else SAME_AS_A

    @property
    def model_a(self) -> str | None:
        value = self.query_one("#model-a", Select).value
        return value if isinstance(value, str) else None

    @property
    def model_b(self) -> str | None:
        value = self.query_one("#model-b", Select).value
        return value if isinstance(value, str) and value != SAME_AS_A else None

    def pick(self, model_a: str | None = None, model_b: str | None = None, same: bool = False) -> None:
        """Set A and/or B from a key or command (posts ModelsPicked like a user's pick would)."""
        if model_a is not None:
            self.query_one("#model-a", Select).value = model_a
        if model_b is not None or same:
            self.query_one("#model-b", Select).value = SAME_AS_A if same else model_b

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if self.model_a is not None:
            self.post_message(ModelsPicked(self.model_a, self.model_b))

    def set_layers(self, title: str, layers: list[str], current: str | None = None, show_b: bool = True) -> None:
        """Offer a list of layers (or blocks, or grid layers) under a title."""
        self.query_one("#label-layers", Label).update(title)
        for widget_id in ("#label-model-b", "#model-b"):
            self.query_one(widget_id).display = show_b
        self.layer_names = list(layers)
        self._fill_list(current)

    def _fill_list(self, current: str | None = None) -> None:
        """List the layers that match the search (all without one), after the models that match it."""
        query = self.search_text
        layers = [layer for layer in self.layer_names if matches_query(layer, query)] if query else self.layer_names
        models = [(label, key) for label, key in self.model_options if matches_query(key, query)] if query else []
        options = [Option(f"model {label}", id=MODEL_OPTION + key) for label, key in models]
        options += [Option(layer, id=layer) for layer in layers]
        option_list = self.query_one("#layers", OptionList)
        if [o.id for o in option_list.options] != [o.id for o in options]:
            option_list.clear_options()
            option_list.add_options(options)
        if current in layers:
            option_list.highlighted = len(models) + layers.index(current)

    # --- search ------------------------------------------------------------------------------------------

    @property
    def searching(self) -> bool:
        return self.has_class("-searching")

    def open_search(self) -> None:
        """Show the search box (and the panel, if it was hidden) and give it the keys."""
        self.remove_class("-hidden")
        self.add_class("-searching")
        search = self.query_one("#search", Input)
        search.value = ""
        search.focus()

    def close_search(self) -> None:
        """Hide the search box and list every layer again."""
        self.remove_class("-searching")
        self.search_text = ""
        with self.prevent(Input.Changed):
            self.query_one("#search", Input).value = ""
        self._fill_list()

    def show_count(self, text: str) -> None:
        """Say under the search box which match the cursor is on ('2 of 5 matches', 'no match')."""
        self.query_one("#search-count", Label).update(text)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.search_text = event.value.strip()
        self._fill_list()
        self.post_message(SearchChanged(self.search_text, submitted=False))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(SearchChanged(event.value.strip(), submitted=True))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        option_id = event.option.id
        if option_id is not None and option_id.startswith(MODEL_OPTION):
            self.pick(model_a=option_id.removeprefix(MODEL_OPTION))
        elif option_id is not None:
            self.post_message(LayerPicked(option_id))

"""The side panel: which models the views show (A; B for the CKA columns), a list of their layers, and the
search (`/` in the explorer, widgets/search_box.py) whose matches that list shows while it is open."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, OptionList, Select
from textual.widgets.option_list import Option

from vitsee.tui.messages import LayerPicked, ModelsPicked, Place, PlaceWanted
from vitsee.tui.results import ModelSummary, StoreSummary
from vitsee.tui.widgets.search_box import SearchBox, matches_query, place_label

if TYPE_CHECKING:
    from vitsee.tui.widgets.view_pane import ViewPane

SAME_AS_A = "\x00same"
MODEL_OPTION = "\x00model:"  # a model the search found, listed among the layers: Enter picks it as model A
PLACE_OPTION = "\x00place:"  # a place the search found (a row, a column, a layer): Enter moves the cursor there

__all__ = ["MODEL_BINDINGS", "PANEL_BINDING", "SidePanel", "matches_query", "model_label"]

# The explorer's keys for the panel (its screen holds them: they work wherever the focus is in it).
MODEL_BINDINGS = [
    Binding("a", "cycle_model('a')", "Model A", id="explorer.model_a", tooltip="Show the next model as model A (rows)"),
    Binding(
        "b",
        "cycle_model('b')",
        "Model B",
        id="explorer.model_b",
        tooltip="Compare model A with the next model in the CKA view (columns)",
    ),
]
PANEL_BINDING = Binding(
    "ctrl+b",
    "toggle_panel",
    "Panel",
    show=False,
    id="explorer.panel",
    tooltip="Show or hide the side panel (models and layers)",
)


def model_label(key: str, width: int = 22) -> str:
    """Returns a model key short enough for the panel: the timm name without its tag, and how it was
    initialised when that fits too (the title bar always says it)."""
    name, _, init = key.partition("@")
    base = name.partition(".")[0]
    kind = "random" if init.startswith("random") else "file" if init.startswith("file") else ""
    if kind and len(base) + len(kind) + 3 <= width:
        return f"{base} ({kind})"
    return base


def next_models(which: str, keys: list[str], a: str | None, b: str | None) -> tuple[str | None, str | None]:
    """Returns (A, B) with the next of the store's models as model A (which 'a'), or as model B: 'same as A' (None),
    then the models other than A (A itself by name would show the same matrix again). The explorer sets them as its
    models, which puts them in the panel: picking through the Selects would post a change that a view key pressed at
    once (a, then 1) overtook with the models before."""
    if which == "a":
        current = keys.index(a) if a in keys else -1
        return keys[(current + 1) % len(keys)], b
    choices: list[str | None] = [None, *(k for k in keys if k != a)]
    current = choices.index(b) if b in choices else 0
    return a, choices[(current + 1) % len(choices)]


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
        & > SearchBox { display: none; }
        &.-searching > SearchBox { display: block; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.layer_names: list[str] = []  # the current view's layers, unfiltered
        self.model_options: list[tuple[str, str]] = []  # (label, key)

    def compose(self) -> ComposeResult:
        yield SearchBox(id="search-box")
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
        search = self.search
        search.set_places(search.places, options, search.view_label)

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

    def set_layers(
        self,
        title: str,
        layers: list[str],
        current: str | None = None,
        show_b: bool = True,
        places: list[Place] | None = None,
        view_label: str = "",
    ) -> None:
        """Offer a list of layers (or blocks, or grid layers) under a title; `places` (default: the layers) are where
        the search looks, in the view called `view_label`."""
        self.query_one("#label-layers", Label).update(title)
        for widget_id in ("#label-model-b", "#model-b"):
            self.query_one(widget_id).display = show_b
        self.layer_names = list(layers)
        places = [Place(layer) for layer in layers] if places is None else places
        self.search.set_places(places, self.model_options, view_label)
        self._fill_list(current)

    def list_layers_of(self, pane: ViewPane, model: ModelSummary, picked: str | None) -> None:
        """Lists what the pane's view offers model A: the layers its map can be of where it shows one layer (the one
        shown highlighted; `picked` until it loads), else the view's own layers (the model's before it loads)."""
        from vitsee.analyses import REGISTRY

        analysis, label = REGISTRY[pane.kind], pane.label
        if analysis.takes_layer:  # Enter shows the map of one
            view = pane.view
            current = view.params.get("layer") if view is not None else picked
            layers = model.layer_choices.get(pane.kind, [])
            places = [Place(layer, "layer") for layer in layers]
            self.set_layers(analysis.layer_list_title, layers, current, False, places=places, view_label=label)
            return
        layers = pane.layer_choices() or (model.layers if pane.lists_model_layers else [])
        places = pane.places() or [Place(layer) for layer in layers]
        show_b = analysis.models[1] > 1
        self.set_layers(analysis.layer_list_title, layers, show_b=show_b, places=places, view_label=label)

    def _fill_list(self, current: str | None = None) -> None:
        """List the layers, or while a search is open the models and places it matches (what its count counts)."""
        search = self.search
        if search.query_text:
            options = [Option(f"model {label}", id=MODEL_OPTION + key) for label, key in search.model_matches()]
            options += [Option(place_label(p), id=f"{PLACE_OPTION}{p.axis}:{p.name}") for p in search.matches()]
            listed = []
        else:
            options = [Option(layer, id=layer) for layer in self.layer_names]
            listed = self.layer_names
        option_list = self.query_one("#layers", OptionList)
        if [o.id for o in option_list.options] != [o.id for o in options]:
            option_list.clear_options()
            option_list.add_options(options)
        if current in listed:
            option_list.highlighted = listed.index(current)

    # --- search ------------------------------------------------------------------------------------------

    @property
    def search(self) -> SearchBox:
        return self.query_one(SearchBox)

    @property
    def searching(self) -> bool:
        return self.has_class("-searching")

    def open_search(self) -> None:
        """Show the search box (and the panel, if it was hidden) and give it the keys."""
        self.remove_class("-hidden")
        self.add_class("-searching")
        self.search.start()

    def close_search(self) -> None:
        """Hide the search box and list every layer again."""
        self.remove_class("-searching")
        self.search.clear()
        self._fill_list()

    def on_search_box_changed(self, event: SearchBox.Changed) -> None:
        self._fill_list()  # and on to the explorer, whose n / N depend on the search

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        option_id = event.option.id
        if option_id is None:
            return
        if option_id.startswith(MODEL_OPTION):
            self.pick(model_a=option_id.removeprefix(MODEL_OPTION))
        elif option_id.startswith(PLACE_OPTION):
            axis, _, name = option_id.removeprefix(PLACE_OPTION).partition(":")
            self.post_message(PlaceWanted(Place(name, axis), focus=True))
        else:
            self.post_message(LayerPicked(option_id))

"""The side panel: which models the views show (A; B for the CKA columns) and a list of their layers."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, OptionList, Select
from textual.widgets.option_list import Option

from vitsee.tui.messages import LayerPicked, ModelsPicked
from vitsee.tui.results import StoreSummary

SAME_AS_A = "\x00same"


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
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("Model A (rows)", classes="-first", id="label-model-a")
        yield Select([], prompt="model A", id="model-a", compact=True)
        yield Label("Model B (columns)", id="label-model-b")
        yield Select([], prompt="model B", id="model-b", compact=True)
        yield Label("Layers", id="label-layers")
        yield OptionList(id="layers")

    def set_models(self, summary: StoreSummary, model_a: str | None = None, model_b: str | None = None) -> None:
        """Offer the store's models and show the picked A and B (B on 'same as A' when it is None)."""
        options = [(model_label(m.key), m.key) for m in summary.models]
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
        option_list = self.query_one("#layers", OptionList)
        if [str(o.prompt) for o in option_list.options] != layers:
            option_list.clear_options()
            option_list.add_options([Option(layer, id=layer) for layer in layers])
        if current in layers:
            option_list.highlighted = layers.index(current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(LayerPicked(event.option.id))

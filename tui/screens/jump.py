"""The jump overlay: every pane of the explorer with what it would show for the current models; Enter goes there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


JUMP_BINDING = Binding(
    "colon",
    "jump",
    "Jump",
    show=False,
    id="explorer.jump",
    tooltip="List every view with what it shows for the current models, and go to the one picked",
)


@dataclass(frozen=True)
class JumpTarget:
    """One pane as the overlay lists it: its key, its name, and its view string or why it has none."""

    kind: str
    key: str  # the number key that shows it in the explorer ('1m': in tab 1, where m cycles to it)
    label: str
    what: str  # 'cka:vit:resnet' or the sentence the pane would show instead


def jump_targets(spec_for: Callable[[str], tuple[str | None, str]], names: dict[str, str]) -> list[JumpTarget]:
    """Returns every pane with what it shows for the current models: `spec_for(kind)` is (its view string, '') or
    (None, why nothing), as the explorer has them; `names` the models' display names by store key."""
    from vitsee.tui.widgets.fit import crop
    from vitsee.tui.widgets.panes import TAB_LABELS, VIEW_LABELS, tab_of

    targets = []
    numbers = {kind: str(i) for i, kind in enumerate(TAB_LABELS, start=1)}
    for kind, label in VIEW_LABELS.items():
        spec, reason = spec_for(kind)
        key = numbers[kind] if kind in numbers else f"{numbers.get(tab_of(kind), '')}m"  # its tab, then m
        what = shown_spec(spec, names) if spec else reason.splitlines()[0]
        targets.append(JumpTarget(kind, key, label, crop(what, WIDTH - len(f"{key:<2} {label:<10} "))))
    return targets


WIDTH = 78  # an option's characters: one line in an 80-column terminal (a longer reason is cut; its pane says it all)


def shown_spec(spec: str, names: dict[str, str]) -> str:
    """Returns what a view string shows, its models by their display names: 'ViT (trained here) x ResNet-18
    (trained here)', 'ViT (trained here) blocks.5' (a layer), 'every model' (the zoo)."""
    from vitsee.analyses.views import parse_view

    _, args = parse_view(spec)
    shown = [names.get(a, a) for a in args]
    models = [s for a, s in zip(args, shown) if a in names]
    rest = [s for a, s in zip(args, shown) if a not in names]  # a layer
    return " x ".join(models or ["every model"]) + "".join(f" {r}" for r in rest)


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

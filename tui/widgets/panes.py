"""The explorer's panes: one per analysis in the engine's REGISTRY, of the class that draws the analysis's view shape.

Importing this module imports every `*_pane.py` module of this package; each pane class enters
view_pane.PANE_CLASSES under the shape it draws (a new kind of picture is one new pane module, found by being
there). The explorer's tabs (an analysis declared without one shows in its family's tab), number keys and command
palette entries follow REGISTRY's order from here. A
registered analysis whose shape has no pane is a bug that tests/test_tui_explore.py catches; the app leaves it out
rather than fail.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

from textual.binding import Binding

from vitsee.analyses import REGISTRY, Analysis
from vitsee.tui import widgets
from vitsee.tui.widgets.view_pane import PANE_CLASSES, ViewPane

log = logging.getLogger(__name__)

for _module in pkgutil.iter_modules(widgets.__path__):
    if _module.name.endswith("_pane") and _module.name != "view_pane":
        importlib.import_module(f"{widgets.__name__}.{_module.name}")


def missing_panes() -> list[str]:
    """Returns the registered analyses whose view shape has no pane (empty when the app shows them all)."""
    return [name for name, analysis in REGISTRY.items() if analysis.shape not in PANE_CLASSES]


def registered_panes() -> dict[str, type[ViewPane]]:
    """Returns analysis name -> the pane class of its shape, for every registered analysis that has one, in
    REGISTRY order."""
    for name in missing_panes():
        log.warning(
            "analysis %s has no pane in the app (no pane draws a %s): it is left out", name, REGISTRY[name].shape.value
        )
    return {name: PANE_CLASSES[a.shape] for name, a in REGISTRY.items() if a.shape in PANE_CLASSES}


PANES = registered_panes()
KINDS = tuple(PANES)
VIEW_LABELS = {kind: REGISTRY[kind].label for kind in PANES}


def analysis_of(kind: str) -> Analysis:
    """Returns the registered analysis a pane shows."""
    return REGISTRY[kind]


def tab_of(kind: str) -> str:
    """Returns the view whose tab shows `kind`: itself, or for an analysis without a tab of its own (the layer x
    layer measures) the first of its family that has one (CKA), where `m` cycles the family."""
    analysis = REGISTRY[kind]
    if analysis.tab or not analysis.family:
        return kind
    return next((k for k in KINDS if REGISTRY[k].family == analysis.family and REGISTRY[k].tab), kind)


TAB_LABELS = {kind: label for kind, label in VIEW_LABELS.items() if tab_of(kind) == kind}  # the tabs, keys 1-9


def tooltip(kind: str) -> str:
    """Returns what the number key of a view does, as its analysis says it (default: 'Show the LABEL view')."""
    analysis = REGISTRY[kind]
    return analysis.tooltip or f"Show the {analysis.label} view"


def view_bindings() -> list[Binding]:
    """Returns the explorer's number key per tab, in REGISTRY order: 1 CKA, 2 Attention, ..."""
    return [
        Binding(str(i), f"show_view('{kind}')", label, show=False, id=f"explorer.view_{kind}", tooltip=tooltip(kind))
        for i, (kind, label) in enumerate(TAB_LABELS.items(), start=1)
        if i <= 9
    ]

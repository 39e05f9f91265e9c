"""The explorer's panes, one per analysis in the engine's REGISTRY, found by the analysis each pane class names.

Importing the pane modules defines their classes, and each class enters view_pane.PANE_CLASSES under its `kind`;
the explorer's tabs, number keys and command palette entries follow REGISTRY's order from here. A registered
analysis without a pane is a bug that tests/test_tui_explore.py catches; the app leaves it out rather than fail.
"""

from __future__ import annotations

import logging

from vitsee.engine.analyses import REGISTRY
from vitsee.tui.widgets import (  # noqa: F401  (imported to define, and so register, each pane)
    attention_pane,
    cka_pane,
    erf_pane,
    heads_pane,
    probes_pane,
    skip_pane,
    spatial_pane,
)
from vitsee.tui.widgets.view_pane import PANE_CLASSES, ViewPane

log = logging.getLogger(__name__)


def missing_panes() -> list[str]:
    """Returns the registered analyses that have no pane (empty when the app shows them all)."""
    return [name for name in REGISTRY if name not in PANE_CLASSES]


def registered_panes() -> dict[str, type[ViewPane]]:
    """Returns analysis name -> pane class for every registered analysis that has a pane, in REGISTRY order."""
    for name in missing_panes():
        log.warning("analysis %s has no pane in the app: it is left out", name)
    return {name: PANE_CLASSES[name] for name in REGISTRY if name in PANE_CLASSES}


PANES = registered_panes()
KINDS = tuple(PANES)
VIEW_LABELS = {kind: pane.label for kind, pane in PANES.items()}

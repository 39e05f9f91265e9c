"""The row of view names above the panes; number keys and clicks switch views, focus stays on the view."""

from __future__ import annotations

from textual.widgets import Tab, Tabs


class ViewTabs(Tabs, can_focus=False):
    """Tabs named '1 CKA', '2 Attention', ... whose ids are `tab-KIND`, one per pane in the order given."""

    DEFAULT_CSS = """
    ViewTabs { height: 2; }
    """

    def __init__(self, labels: dict[str, str], active: str = "cka") -> None:
        tabs = [Tab(f"{i} {label}", id=f"tab-{kind}") for i, (kind, label) in enumerate(labels.items(), start=1)]
        super().__init__(*tabs, id="view-tabs", active=f"tab-{active}")

"""The row of view names above the panes; number keys and clicks switch views, focus stays on the view."""

from __future__ import annotations

from textual.widgets import Tab, Tabs

TAB_PADDING = 2


def short_labels(labels: dict[str, str]) -> dict[str, str]:
    """Returns each view's short tab label, as its analysis declares it (default: the label's first 4 letters)."""
    from vitsee.analyses import REGISTRY

    return {
        kind: (REGISTRY[kind].short_label if kind in REGISTRY else "") or label[:4] for kind, label in labels.items()
    }


def tab_labels(labels: dict[str, str], width: int) -> dict[str, str]:
    """Returns each view's tab label ('2 Attention', or '2 Attn', then '2 Att', where the row would not fit `width`).

    While the row is wider than the pane (80 columns leave the tabs some 57) the longest labels are shortened first:
    a row that does not fit scrolls, and then the first tabs are cut off."""
    names = dict(labels)
    short = short_labels(labels)

    def row() -> int:
        return sum(len(f"{i} {name}") + TAB_PADDING for i, name in enumerate(names.values(), start=1))

    for kind in sorted(names, key=lambda k: -len(names[k])):  # stable: equal lengths in the tabs' order
        if row() <= width:
            break
        names[kind] = short[kind]
    for kind in sorted(names, key=lambda k: -len(names[k])):  # still too wide (eight tabs at 80 columns): 3 letters
        if row() <= width:
            break
        names[kind] = names[kind][:3]
    return {kind: f"{i} {name}" for i, (kind, name) in enumerate(names.items(), start=1)}


class ViewTabs(Tabs, can_focus=False):
    """Tabs named '1 CKA', '2 Attention', ... whose ids are `tab-KIND`, one per pane in the order given."""

    DEFAULT_CSS = """
    ViewTabs { height: 2; }
    """

    def __init__(self, labels: dict[str, str], active: str = "cka") -> None:
        self._labels = dict(labels)
        tabs = [Tab(f"{i} {label}", id=f"tab-{kind}") for i, (kind, label) in enumerate(labels.items(), start=1)]
        super().__init__(*tabs, id="view-tabs", active=f"tab-{active}")

    def name_tab(self, kind: str, label: str) -> None:
        """Names tab `kind` after the view it shows now (the CKA tab showing RSA reads '1 RSA')."""
        if self._labels.get(kind) != label:
            self._labels[kind] = label
            if self.size.width:  # else the first resize names it
                self.on_resize()

    def show_view(self, kind: str, label: str) -> None:
        """Makes tab `kind` the active one, named after the view it shows now (`name_tab`)."""
        self.name_tab(kind, label)
        if self.active != f"tab-{kind}":
            self.active = f"tab-{kind}"

    def on_resize(self) -> None:
        for kind, label in tab_labels(self._labels, self.size.width).items():
            tab = self.query_one(f"#tab-{kind}", Tab)
            if tab.label_text != label:
                tab.label = label

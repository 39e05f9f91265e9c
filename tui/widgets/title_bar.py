"""The explorer's title bar: the store, its images and its models, in the longest form that fits the width."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Label

from vitsee.tui.results import StoreSummary


def title_forms(path: Path, summary: StoreSummary) -> list[str]:
    """Returns the title from the longest form to the shortest: every model's weights in full, else in a word, else
    the model names alone (the models by their display names, engine/store/names.py)."""
    from vitsee.analyses.views import dataset_label

    head = f" {path.name} \u00b7 {summary.n_images} images of {dataset_label(summary.dataset)} \u00b7 "
    return [
        head + "; ".join(m.described or f"{m.shown}: {m.weights}" for m in summary.models),
        head + ", ".join(m.shown for m in summary.models),  # 'test_vit (random init)'
        f" {path.name} \u00b7 {summary.n_images} images \u00b7 " + ", ".join(m.shown for m in summary.models),
    ]


class TitleBar(Label):
    """One line naming the store; `show(summary)` fills it, a resize picks the form again."""

    DEFAULT_CSS = """
    TitleBar {
        width: 1fr;
        height: 1;
        padding: 0 1;
        background: $panel;
        color: $text;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, path: Path, *, id: str | None = None) -> None:
        super().__init__(f" {Path(path).name}", id=id)
        self.path = Path(path)
        self.summary: StoreSummary | None = None

    def show(self, summary: StoreSummary) -> None:
        self.summary = summary
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self.summary is None:
            return
        titles = title_forms(self.path, self.summary)
        room = self.outer_size.width - 2  # the bar's padding
        # none fits (a long dataset path): the full title, cut at the end, as before
        self.update(next((t for t in titles if len(t) <= room), titles[0]))

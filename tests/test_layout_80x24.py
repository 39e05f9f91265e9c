"""At 80x24 nothing on the explorer's header, tabs or the run log is cut off (issue 13, point 9)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from textual.app import App

from helpers.app import analysed_copy, make_app, settle, view_shown

from vitsee.tui.messages import RunEvent
from vitsee.tui.options import AppOptions
from vitsee.tui.screens.run import RunScreen
from vitsee.tui.widgets.fit import fit_caption, fit_parts
from vitsee.tui.widgets.panes import TAB_LABELS
from vitsee.tui.widgets.view_tabs import TAB_PADDING, tab_labels


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


def screen_text(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def test_tab_labels_shorten_only_as_far_as_the_row_needs():
    assert tab_labels(TAB_LABELS, 200) == {
        kind: f"{i} {name}" for i, (kind, name) in enumerate(TAB_LABELS.items(), start=1)
    }
    for width in (57, 60, 64):
        labels = tab_labels(TAB_LABELS, width)
        assert sum(len(label) + TAB_PADDING for label in labels.values()) <= width
        assert [label.split()[0] for label in labels.values()] == [str(i) for i in range(1, len(TAB_LABELS) + 1)]
    full = sum(len(label) + TAB_PADDING for label in tab_labels(TAB_LABELS, 1000).values())
    just = tab_labels(TAB_LABELS, full - len("Attention") + len("Attn"))  # room for 'Attention' -> 'Attn' alone
    assert just["attention"] == "2 Attn" and just["spatial"] == "5 Spatial"


async def test_the_header_and_every_tab_fit_80_columns(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("4")  # the skip tab, far enough right that a row too wide scrolled the first tabs away
        await settle(pilot, view_shown("skip"))
        lines = screen_text(app)
    assert "\u2026" not in lines[0] and "test_vit" in lines[0] and "test_resnet" in lines[0]
    assert "48 images" in lines[0]
    for i in range(1, 8):
        assert f" {i} " in lines[1]
    assert "1 CKA" in lines[1] and "7 ERF" in lines[1]


async def test_the_run_log_wraps_long_lines_at_80x24_instead_of_cutting_them():
    gate = threading.Event()

    def prepare():  # holds the run at its start: the log is what this test reads
        gate.wait(30)
        raise RuntimeError("not run")

    words = [f"w{i:02d}" for i in range(60)]  # where a line is cut, some word is missing
    line = " ".join(words)

    class RunApp(App):
        def on_mount(self) -> None:
            self.push_screen(RunScreen(AppOptions(), prepare, "New run"))

    app = RunApp()
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            for _ in range(20):  # more than the log shows: a scrollbar too
                app.screen.post_message(RunEvent("plan", text=line))
            await pilot.pause(0.3)
            shown = " ".join(text.strip(" \u2502") for text in screen_text(app))
    finally:
        gate.set()
    assert " ".join(words) in " ".join(shown.split())


def test_fit_parts_keeps_whole_parts_and_cuts_only_a_first_part_too_long():
    parts = [
        "blocks.0 head 1 (1/2 by distance)",
        "distance 82.2 px \u00b1 0.0",
        "mean in [82.2, 82.3]",
        "uniform 83.0 px",
    ]
    full = "  ".join(parts)
    assert fit_parts(parts, len(full)) == full
    assert fit_parts(parts, len(full) - 1) == "  ".join(parts[:3])
    assert fit_parts(parts, len(parts[0]) + 5) == parts[0]
    assert fit_parts(parts, 10) == "blocks.0 \u2026"
    rng = np.random.default_rng(0)
    for _ in range(200):  # never wider than asked, always whole leading parts (or the first one cut)
        words = ["x" * int(n) for n in rng.integers(1, 12, size=int(rng.integers(1, 6)))]
        width = int(rng.integers(1, 40))
        shown = fit_parts(words, width)
        assert len(shown) <= width
        kept = shown.split("  ")
        assert kept == words[: len(kept)] or (len(kept) == 1 and shown.endswith("\u2026"))


def test_fit_caption_drops_the_lead_in_then_the_later_clauses_then_the_tests_name():
    caption = "95% Student-t interval of the mean over 64 images; the images vary, the model is fixed"
    assert fit_caption(caption, 200, "head: ") == "head: " + caption
    assert fit_caption(caption, 60, "head: ") == "head: 95% Student-t interval of the mean over 64 images"
    assert fit_caption(caption, len(caption)) == caption
    assert fit_caption(caption, 55) == "95% Student-t interval of the mean over 64 images"
    assert fit_caption(caption, 45) == "95% interval of the mean over 64 images"
    assert fit_caption(caption, 20) == "95% interval of the\u2026"


async def test_the_attention_view_at_80x24_shows_whole_values_in_its_status_line_and_captions(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("2")
        await settle(pilot, view_shown("attention"))
        full = app.screen.pane("attention").status_text()
        lines = screen_text(app)
        region = app.screen.query_one("#status-line").region
        shown = lines[region.y].strip()  # as drawn: a text too long for the line would be cropped there
    assert len(full) > 78  # the case: the whole status does not fit 80 columns
    kept = shown.split("  ")
    assert kept == full.split("  ")[: len(kept)] and len(kept) >= 2, shown
    assert "95% interval of the mean over 48 images" in "\n".join(lines)  # the whisker's caption, whole
    histogram_caption = next(text for text in lines if "\u25b2 uniform" in text)
    assert histogram_caption.rstrip().endswith(("blocks.0", "every head and image")), histogram_caption


async def test_a_toast_leaves_the_status_line_and_the_footer_readable(store, tmp_path):
    """Issue 29 (10): toasts covered the end of the status line, where the value of the cell is."""
    from textual.widgets._toast import Toast

    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:  # run_test leaves toasts out by default
        await settle(pilot, view_shown("cka"))
        app.notify("a note as long as the ones the explorer shows, over two lines of the toast at this width")
        await pilot.pause()
        status = app.screen.query_one("#status-line")
        toasts = app.screen.query(Toast)
        assert toasts and status.region.y == 22  # the status line sits just above the footer
        for toast in toasts:
            assert toast.region.bottom <= status.region.y  # wholly above it
        assert status.text in screen_text(app)[22]  # the value at the end of the line, drawn

"""The line plot (skip ratios, probe accuracy): distinct curves, x labels that never run together, y ticks
(issue 13, points 9 and 10)."""

from __future__ import annotations

import numpy as np
from textual.app import App, ComposeResult

from vitsee.tui.widgets.line_plot import AXIS_WIDTH, MARKERS, LinePlot, Series, format_tick

LAYERS = ["patch_embed"] + [f"blocks.{i}" for i in range(6)] + ["norm"]


class PlotApp(App):
    def __init__(self, plot: LinePlot) -> None:
        super().__init__()
        self.plot = plot

    def compose(self) -> ComposeResult:
        yield self.plot


def strips(plot: LinePlot) -> list:
    return [plot.render_line(y) for y in range(plot.size.height)]


def styles_along(strip) -> list:
    """Returns the style of every character of a rendered line."""
    out = []
    for segment in strip:
        out += [segment.style] * len(segment.text)
    return out


def two_curves(monochrome: bool = False) -> LinePlot:
    plot = LinePlot(monochrome=monochrome)
    plot.styles.height = 10
    return plot


CLS = np.linspace(0.2, 0.9, len(LAYERS))
SPATIAL = np.linspace(0.8, 0.1, len(LAYERS))


async def test_x_labels_never_run_together_and_the_marked_one_is_highlighted_in_its_own_slot():
    for mark in range(len(LAYERS)):
        plot = two_curves()
        async with PlotApp(plot).run_test(size=(46, 10)) as pilot:
            plot.plot([Series("CLS token", CLS), Series("spatial", SPATIAL)], LAYERS, mark=mark, hline=1.0)
            await pilot.pause()
            line = strips(plot)[-2]  # x labels, then the legend
        text = line.text[AXIS_WIDTH:]
        assert "\u25b2" not in text  # no marker glued onto a label ('patch_emb▲b.0')
        words = text.split()
        assert words[0].startswith("pa") and words[-1].startswith("n")  # both ends are there
        assert len(words) == len(set(words))
        reversed_at = [i for i, style in enumerate(styles_along(line)[AXIS_WIDTH:]) if style and style.reverse]
        marked = text[reversed_at[0] : reversed_at[-1] + 1]
        assert marked in words and reversed_at == list(range(reversed_at[0], reversed_at[0] + len(marked)))
        # the highlighted slot is the marked layer's, in the form the others have
        assert (
            marked == LAYERS[mark]
            or marked == ("b." + LAYERS[mark].split(".")[-1])
            or LAYERS[mark].startswith(marked.rstrip("\u2026"))
        )


async def test_the_two_skip_curves_have_distinct_colours_named_in_the_legend():
    plot = two_curves()
    async with PlotApp(plot).run_test(size=(46, 10)) as pilot:
        plot.plot([Series("CLS token", CLS), Series("spatial tokens (mean)", SPATIAL)], LAYERS, mark=2)
        await pilot.pause()
        lines = strips(plot)
    colours = set()
    for strip in lines[:-2]:
        for segment in strip:
            if any(0x2800 < ord(c) <= 0x28FF for c in segment.text) and segment.style and segment.style.color:
                colours.add(segment.style.color)
    assert len(colours) == 2  # two curves, two colours (accent and warning are the same orange)
    legend = lines[-1]
    swatches = {seg.style.color for seg in legend if seg.text.strip() == "\u2812\u2812"}
    assert swatches == colours and "CLS token" in legend.text and "spatial tokens (mean)" in legend.text


async def test_without_colour_the_second_curve_is_a_glyph_at_each_sample():
    plot = two_curves(monochrome=True)
    async with PlotApp(plot).run_test(size=(46, 10)) as pilot:
        plot.plot([Series("CLS token", CLS), Series("spatial", SPATIAL)], LAYERS, ymin=0.0, ymax=1.0)
        await pilot.pause()
        lines = [strip.text for strip in strips(plot)]
    area = [line[AXIS_WIDTH:] for line in lines[:-2]]
    plot_w, plot_h = 46 - AXIS_WIDTH, len(area)
    dots_h = plot_h * 4
    for i, value in enumerate(SPATIAL):  # the marker sits where the sample is: same x and y mapping as the curve
        col = round(i * (2 * plot_w - 1) / (len(LAYERS) - 1)) // 2
        row = round((1.0 - value) * (dots_h - 1)) // 4
        assert area[row][col] == MARKERS[0]
    assert sum(line.count(MARKERS[0]) for line in area) == len(LAYERS)
    assert f"{MARKERS[0]} spatial" in lines[-1] and "\u2812\u2812 CLS token" in lines[-1]


async def test_the_y_axis_has_ticks_between_its_ends_at_the_values_of_their_lines():
    plot = LinePlot()
    plot.styles.height = 12
    async with PlotApp(plot).run_test(size=(46, 12)) as pilot:
        plot.plot([Series("acc", [0.0, 0.5, 1.0])], ["a", "b", "c"], ymin=0.0, ymax=2.0)
        await pilot.pause()
        lines = [strip.text for strip in strips(plot)]
    plot_h = 10
    ticked = {
        row: line[: AXIS_WIDTH - 1].strip()
        for row, line in enumerate(lines[:plot_h])
        if line[AXIS_WIDTH - 1] == "\u2524"
    }
    assert ticked[0] == "2.000" and ticked[plot_h - 1] == "0.000"
    assert set(ticked) == {0, 3, 6, 9}
    for row in (3, 6):  # the value at the middle of the line's four dot rows
        assert ticked[row] == format_tick(2.0 - (4 * row + 1.5) / (4 * plot_h - 1) * 2.0)

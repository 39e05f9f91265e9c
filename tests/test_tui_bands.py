"""The app's plots draw the intervals a result carries: bands behind the probe and skip curves, a whisker
for the attention head under the cursor, each with a caption saying what the interval is; a result
computed without statistics (`--ci 0`) draws neither.

Where a glyph should be is worked out here from the plot's size and the interval's ends with the plots'
stated geometry (braille cells of 2 x 4 dots, a distance axis of one column per step), not read back
from the widgets.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from textual.app import App, ComposeResult

from helpers.app import CACHED, SIZE, analysed_copy, make_app, settle, view_shown
from vitsee.analyses.driver import AnalyzeConfig, run_analyses
from vitsee.output.colormap import ColorMode
from vitsee.tui.widgets.distance_plot import DistancePlot
from vitsee.tui.widgets.heatmap import fit_labels
from vitsee.tui.widgets.line_plot import AXIS_WIDTH, BAND, MARKERS, LinePlot, Series

WHISKER_GLYPHS = set("\u251c\u2500\u2524")  # ├ ─ ┤


@pytest.fixture(scope="session")
def store(tiny_store, tmp_path_factory) -> Path:
    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def bare_store(tiny_store, tmp_path_factory) -> Path:
    """Returns a copy of the tiny store analysed with no statistics at all (--ci 0 --permutations 0)."""
    path = tmp_path_factory.mktemp("bare") / "tiny.h5"
    shutil.copy(tiny_store, path)
    run_analyses(
        path, None, AnalyzeConfig(shuffles=CACHED.shuffles, batch_size=CACHED.batch_size, ci=0, permutations=0)
    )
    return path


def screen_lines(widget) -> list[str]:
    """Returns the widget's lines as the screen shows them."""
    return ["".join(segment.text for segment in widget.render_line(y)) for y in range(widget.size.height)]


def is_braille(char: str) -> bool:
    return 0x2800 < ord(char) <= 0x28FF


def band_cells(series: list[Series], n: int, plot_w: int, plot_h: int, lo: float, hi: float) -> set[tuple[int, int]]:
    """Returns the (row, column) cells, in the plot's area, that the series' intervals cover."""
    dots_w, dots_h = 2 * plot_w, 4 * plot_h
    banded = [s for s in series if s.low is not None and np.isfinite(np.asarray(s.low, dtype=float)).any()]
    side_by_side = (plot_w - 1) / (n - 1) >= len(banded) + 1
    cells = set()
    for k, s in enumerate(banded):
        for i, (low, high) in enumerate(zip(s.low, s.high)):
            if not (np.isfinite(low) and np.isfinite(high)):
                continue
            col = round(i * (dots_w - 1) / (n - 1)) // 2
            if side_by_side:
                col = min(col + k, plot_w - len(banded) + k)
            top, bottom = (round((hi - min(max(v, lo), hi)) / (hi - lo) * (dots_h - 1)) // 4 for v in (high, low))
            cells |= {(row, col) for row in range(top, bottom + 1)}
    return cells


def assert_bands_drawn(lines: list[str], expected: set[tuple[int, int]], plot_h: int) -> None:
    """Every band glyph lies in an interval, and every cell of an interval not taken by a curve (a braille
    line, or without colour a series' marker glyph) is a band glyph."""
    area = [line[AXIS_WIDTH:] for line in lines[:plot_h]]
    drawn = {(r, c) for r, line in enumerate(area) for c, char in enumerate(line) if char == BAND}
    assert drawn and drawn <= expected
    assert all(is_braille(area[r][c]) or area[r][c] in MARKERS for r, c in expected - drawn)


class PlotApp(App):
    def __init__(self, widget) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget


# --- the line plot alone -------------------------------------------------------------------------------


async def test_a_band_fills_the_rows_between_the_ends_of_each_interval_behind_the_curve():
    plot = LinePlot()
    values = [0.2, 0.5, 0.8, 0.4]
    low, high = [0.1, 0.3, 0.75, np.nan], [0.3, 0.9, 0.85, np.nan]  # no interval at the last sample
    series = [Series("CLS", values, low, high)]
    async with PlotApp(plot).run_test(size=(46, 12)) as pilot:
        plot.styles.height = 12
        plot.plot(series, ["a", "b", "c", "d"], ymin=0.0, ymax=1.0, caption="95% test interval")
        await pilot.pause()
        lines = screen_lines(plot)
    plot_w, plot_h = 40, 12 - 3
    expected = band_cells(series, 4, plot_w, plot_h, 0.0, 1.0)
    assert_bands_drawn(lines, expected, plot_h)
    last_col = round(3 * (2 * plot_w - 1) / 3) // 2
    assert all(line[AXIS_WIDTH + last_col] != BAND for line in lines[:plot_h])  # NaN interval: no band
    assert lines[-1].strip() == f"{BAND} 95% test interval"


async def test_readouts_sharing_x_positions_get_bands_side_by_side_where_there_is_room_and_overlap_where_not():
    rng = np.random.default_rng(0)
    for n in (4, 30):  # 40 columns: 13 apart, room for 3 bands; under 2 apart, none
        values = rng.uniform(0.3, 0.7, size=(3, n))
        series = [Series(f"s{k}", values[k], values[k] - 0.2, values[k] + 0.2) for k in range(3)]
        plot = LinePlot(monochrome=True)
        async with PlotApp(plot).run_test(size=(46, 14)) as pilot:
            plot.styles.height = 14
            plot.plot(series, [str(i) for i in range(n)], ymin=0.0, ymax=1.0, caption="intervals")
            await pilot.pause()
            lines = screen_lines(plot)
        expected = band_cells(series, n, 40, 11, 0.0, 1.0)
        assert_bands_drawn(lines, expected, 11)
        columns = {c for _, c in expected}
        assert len(columns) == (3 * n if n == 4 else len({round(i * 79 / (n - 1)) // 2 for i in range(n)}))
        assert lines[-1].strip().startswith(BAND * 3 + " intervals")


async def test_a_series_without_interval_draws_no_band_and_no_caption_line():
    plot = LinePlot()
    async with PlotApp(plot).run_test(size=(46, 10)) as pilot:
        plot.styles.height = 10
        plot.plot(
            [Series("CLS", [0.2, 0.5, 0.8]), Series("GAP", [0.1, 0.4, 0.3], [np.nan] * 3, [np.nan] * 3)],
            ["a", "b", "c"],
            ymin=0.0,
            ymax=1.0,
            hline=0.5,
            hline_name="chance",
            caption="ignored",
        )
        await pilot.pause()
        lines = screen_lines(plot)
    assert not any(BAND in line for line in lines)
    assert "chance" in lines[-1] and "ignored" not in "".join(lines)
    assert lines[-2].strip().startswith("a") and lines[-2].rstrip().endswith("c")  # x labels, then the legend


# --- the distance plot alone ---------------------------------------------------------------------------


def whisker_columns(line: str, gutter: int) -> dict[int, str]:
    return {c - gutter: char for c, char in enumerate(line) if c >= gutter and char in WHISKER_GLYPHS}


async def test_the_head_under_the_cursor_gets_a_whisker_from_its_low_to_its_high_end():
    plot = DistancePlot()
    distances = np.array([[10.0, 50.0], [20.0, 60.0]])
    low, high = np.array([[5.0, 45.0], [12.0, 55.0]]), np.array([[15.0, 55.0], [30.0, 70.0]])
    blocks = ["blocks.0", "blocks.1"]
    width = 60
    gutter = max(map(len, fit_labels(blocks, 10))) + 1
    plot_w = width - gutter - 1

    def x_of(px: float) -> int:
        return round(px / 100.0 * (plot_w - 1))

    async with PlotApp(plot).run_test(size=(width, 10)) as pilot:
        plot.show(distances, blocks, 100.0, 40.0, None, low, high, caption="95% t interval")
        plot.cursor = (1, 0)
        await pilot.pause()
        first = screen_lines(plot)
        plot.cursor = (1, 1)
        await pilot.pause()
        second = screen_lines(plot)
    for lines, head in ((first, 0), (second, 1)):
        assert whisker_columns(lines[0], gutter) == {}  # only the cursor's row
        start, end, dot = x_of(low[1, head]), x_of(high[1, head]), x_of(distances[1, head])
        expected = {x: "\u2500" for x in range(start + 1, end) if x != dot} | {start: "\u251c", end: "\u2524"}
        assert whisker_columns(lines[1], gutter) == expected
        assert lines[1][gutter + dot] == "\u25cf"  # the head's own dot stays on top
        assert lines[-1].strip() == "\u251c\u2500\u2524 head under the cursor: 95% t interval"


async def test_heads_without_intervals_get_no_whisker_and_no_caption_line():
    plot = DistancePlot()
    async with PlotApp(plot).run_test(size=(60, 10)) as pilot:
        plot.show(np.array([[10.0, 50.0], [20.0, 60.0]]), ["blocks.0", "blocks.1"], 100.0, 40.0)
        plot.cursor = (1, 0)
        await pilot.pause()
        lines = screen_lines(plot)
    assert lines[-1].strip().endswith("100 px")  # the axis labels are the last line: no caption below
    assert not any(set(line[9:]) & (WHISKER_GLYPHS - {"\u2500"}) for line in lines)
    assert "\u2500" not in lines[1]


# --- in the app, on a real analysed store ---------------------------------------------------------------


async def open_view(app, pilot, kind: str) -> None:
    await settle(pilot, view_shown("cka"))
    await pilot.press({"attention": "2", "probes": "3", "skip": "4"}[kind])
    await settle(pilot, view_shown(kind))


@pytest.mark.parametrize("color", [ColorMode.TRUECOLOR, ColorMode.NONE])
async def test_probe_curves_draw_their_clopper_pearson_bands_and_say_so(store, tmp_path, color):
    app = make_app(store, tmp_path, color=color)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(app, pilot, "probes")
        view = app.screen.pane("probes").view
        plot = app.screen.query_one("#probes-plot", LinePlot)
        lines = screen_lines(plot)
        width, height = plot.size
    assert view.ci_low is not None
    series = [
        Series(name, view.matrix[:, c], view.ci_low[:, c], view.ci_high[:, c]) for c, name in enumerate(view.cols)
    ]
    plot_h = height - 3
    assert_bands_drawn(lines, band_cells(series, len(view.rows), width - AXIS_WIDTH, plot_h, 0.0, 1.0), plot_h)
    assert lines[-1].strip().startswith(BAND * len(view.cols) + " 95% Clopper-Pearson interval on")


async def test_skip_curves_draw_their_intervals_over_images(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(app, pilot, "skip")
        view = app.screen.pane("skip").view
        plot = app.screen.query_one("#skip-plot", LinePlot)
        lines = screen_lines(plot)
        width, height = plot.size
    extra = view.extra
    series = [
        Series("CLS", extra["cls"], extra["cls_ci_low"], extra["cls_ci_high"]),
        Series("spatial", extra["spatial_mean"], extra["spatial_ci_low"], extra["spatial_ci_high"]),
    ]
    every = np.concatenate([np.asarray(a, dtype=float) for s in series for a in (s.values, s.low, s.high)] + [[1.0]])
    lo, hi = float(np.nanmin(every)), float(np.nanmax(every))
    plot_h = height - 3
    assert_bands_drawn(lines, band_cells(series, len(view.rows), width - AXIS_WIDTH, plot_h, lo, hi), plot_h)
    assert lines[-1].strip().startswith(BAND * 2 + " 95% Student-t interval of the mean over 48 images")


async def test_the_attention_whisker_spans_the_interval_of_the_head_under_the_cursor(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(app, pilot, "attention")
        await pilot.press("down", "right")
        await settle(pilot)
        view = app.screen.pane("attention").view
        plot = app.screen.query_one("#attention-plot", DistancePlot)
        lines = screen_lines(plot)
        width = plot.size.width
    assert plot.cursor == (1, 1) and view.ci_low is not None
    gutter = max(map(len, fit_labels(list(view.rows), 10))) + 1
    plot_w, max_px = width - gutter - 1, float(view.extra["hist_edges"][-1])

    def x_of(px: float) -> int:
        return round(px / max_px * (plot_w - 1))

    start, end = x_of(view.ci_low[1, 1]), x_of(view.ci_high[1, 1])
    # a random-init ViT's heads vary little over images: the whisker may be narrower than a column
    expected = {x for x in range(start, end + 1) if end > start and x not in {x_of(d) for d in view.matrix[1]}}
    assert set(whisker_columns(lines[1], gutter)) == expected
    assert all(not whisker_columns(line, gutter) for row, line in enumerate(lines[: len(view.rows)]) if row != 1)
    assert lines[-1].strip().startswith("\u251c\u2500\u2524 head under the cursor: 95% Student-t interval of the mean")


async def test_results_without_statistics_draw_no_bands_and_no_whiskers(bare_store, tmp_path):
    app = make_app(bare_store, tmp_path, color=ColorMode.NONE)
    async with app.run_test(size=SIZE) as pilot:
        shown = {}
        for kind, plot_id in (("probes", "#probes-plot"), ("skip", "#skip-plot"), ("attention", "#attention-plot")):
            await open_view(app, pilot, kind)
            assert app.screen.pane(kind).view.ci_low is None
            shown[kind] = screen_lines(app.screen.query_one(plot_id))
            await pilot.press("1")
    for kind, lines in shown.items():
        assert not any(BAND in line for line in lines), kind
        assert "interval" not in "".join(lines), kind
    assert not any(set(line) & {"\u251c", "\u2524"} for line in shown["attention"])
    assert shown["probes"][-1].strip().startswith("\u2812\u2812 CLS")  # the legend is the last line again

"""The heatmap widget: a cursor over real cells, colours that match the scale, cheap repaints."""

from __future__ import annotations

import numpy as np
import pytest
from rich.style import Style
from textual.app import App, ComposeResult
from textual.widgets import Label

from vitsee.output.colormap import ASCII_RAMP, ColorMode, palette
from vitsee.tui.widgets import Heatmap
from vitsee.tui.widgets.heatmap import MISSING_GLYPH, UPPER_HALF, abbreviate_label

# 7 x 9, every value distinct, spanning 0..1 so the scale is exactly [0, 1].
MATRIX = np.arange(63, dtype=np.float64).reshape(7, 9) / 62
ROWS = [f"blocks.{i}" for i in range(7)]
COLS = [f"layer{i // 3 + 1}.{i % 3}" for i in range(9)]
SIZE = (100, 30)


class HeatmapApp(App):
    """A heatmap over the whole screen but one status line, recording what it reports."""

    def __init__(self, matrix=MATRIX, rows=ROWS, cols=COLS, **options) -> None:
        super().__init__()
        self.heatmap = Heatmap(matrix, rows, cols, **{"color_mode": "truecolor", **options})
        self.moves: list[Heatmap.CursorMoved] = []
        self.selected: list[Heatmap.CellSelected] = []

    def compose(self) -> ComposeResult:
        yield self.heatmap
        yield Label(id="status")

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        self.moves.append(message)
        self.query_one("#status", Label).update(message.summary)

    def on_heatmap_cell_selected(self, message: Heatmap.CellSelected) -> None:
        self.selected.append(message)


def style_at(strip, x: int) -> tuple[str, Style]:
    """Return the character and style at cell x of a rendered line."""
    for segment in strip:
        if x < len(segment.text):
            return segment.text[x], segment.style
        x -= len(segment.text)
    raise IndexError(x)


def gutter(heatmap: Heatmap) -> int:
    return heatmap._layout.gutter


# --- Cursor and messages ------------------------------------------------------------------------------


async def test_arrows_and_hjkl_move_one_cell_and_report_the_layer_pair_and_value():
    app = HeatmapApp()
    async with app.run_test(size=SIZE) as pilot:
        expected = [
            ("right", (0, 1)),
            ("down", (1, 1)),
            ("l", (1, 2)),
            ("j", (2, 2)),
            ("left", (2, 1)),
            ("up", (1, 1)),
            ("h", (1, 0)),
            ("k", (0, 0)),
        ]
        for key, cell in expected:
            await pilot.press(key)
            assert app.heatmap.cursor == cell
            moved = app.moves[-1]
            assert (moved.row, moved.col) == cell
            assert (moved.row_label, moved.col_label) == (ROWS[cell[0]], COLS[cell[1]])
            assert moved.value == MATRIX[cell]
        await pilot.press("down", "down", "right")
        await pilot.pause()
        assert str(app.query_one("#status", Label).render()) == f"blocks.2 x layer1.1  CKA {MATRIX[2, 1]:.4f}"


async def test_the_cursor_stops_at_the_edges_without_reporting_a_move():
    app = HeatmapApp()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        before = len(app.moves)
        await pilot.press("up", "left", "k", "h")
        assert app.heatmap.cursor == (0, 0)
        assert len(app.moves) == before


async def test_home_end_and_shift_variants_jump_to_the_first_and_last_row_and_column():
    app = HeatmapApp()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right", "end")
        assert app.heatmap.cursor == (6, 1)
        await pilot.press("shift+end")
        assert app.heatmap.cursor == (6, 8)
        await pilot.press("home")
        assert app.heatmap.cursor == (0, 8)
        await pilot.press("shift+home")
        assert app.heatmap.cursor == (0, 0)
        assert (app.moves[-1].row_label, app.moves[-1].col_label) == ("blocks.0", "layer1.0")


async def test_page_down_moves_a_screenful_of_rows_and_page_up_comes_back():
    big = np.linspace(0, 1, 120 * 120).reshape(120, 120)
    app = HeatmapApp(big, [f"blocks.{i}" for i in range(120)], [f"blocks.{i}" for i in range(120)], zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("pagedown")
        heatmap = app.heatmap
        screenful = (heatmap.scrollable_content_region.height - 2) * 2  # grid lines x two rows per line
        assert heatmap.cursor == (screenful, 0)
        assert app.moves[-1].row_label == f"blocks.{screenful}"
        await pilot.press("pageup")
        assert heatmap.cursor == (0, 0)
        await pilot.press("pageup")
        assert heatmap.cursor == (0, 0)


async def test_without_scrollbars_the_legend_says_which_rows_and_columns_are_in_view():
    big = np.linspace(0, 1, 120 * 120).reshape(120, 120)
    app = HeatmapApp(big, [f"b{i}" for i in range(120)], [f"b{i}" for i in range(120)], zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        heatmap = app.heatmap
        legend = heatmap.render_line(heatmap.size.height - 1).text
        rows_in_view = 2 * (heatmap.size.height - 2)
        assert f"rows 1-{rows_in_view}/120" in legend
        await pilot.press("end")
        legend = heatmap.render_line(heatmap.size.height - 1).text
        assert f"rows {120 - rows_in_view + 1}-120/120" in legend
        assert heatmap.scrollbar_size_vertical == 0 and heatmap.scrollbar_size_horizontal == 0


async def test_enter_posts_cell_selected_with_the_value_under_the_cursor():
    app = HeatmapApp()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "right", "enter")
        await pilot.pause()
        assert [(m.row, m.col, m.value) for m in app.selected] == [(2, 1, MATRIX[2, 1])]


async def test_a_click_moves_the_cursor_and_a_second_click_selects():
    app = HeatmapApp(zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        x = gutter(app.heatmap) + 4
        await pilot.click(Heatmap, offset=(x, 1))  # line 1 holds rows 2 and 3; a click lands on the upper one
        assert app.heatmap.cursor == (2, 4)
        await pilot.click(Heatmap, offset=(x, 1))
        await pilot.pause()
        assert [(m.row, m.col) for m in app.selected] == [(2, 4)]


async def test_z_cycles_fit_then_one_to_one_then_detail_and_the_cursor_stays_on_its_cell():
    app = HeatmapApp()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "right", "right")
        zooms = [app.heatmap.zoom]
        for _ in range(3):
            await pilot.press("z")
            zooms.append(app.heatmap.zoom)
        assert zooms == ["fit", "1:1", "detail", "fit"]
        assert app.heatmap.cursor == (1, 2)


async def test_detail_zoom_prints_every_value_on_its_colour():
    app = HeatmapApp(zoom="detail")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("end")  # cursor away from the cells we read
        heatmap = app.heatmap
        line = heatmap.render_line(1)
        assert line.text.split()[1:] == [f"{v:.3f}" for v in MATRIX[1]]
        assert line.text.split()[0] == "blocks.1"
        colors = palette("viridis", 24, ColorMode.TRUECOLOR).colors
        level = heatmap.scale.quantize(MATRIX[1, 0])
        _, style = style_at(line, gutter(heatmap) + 1)
        assert style.bgcolor.name == colors[level]


async def test_fit_zoom_pools_a_large_matrix_but_the_cursor_still_addresses_real_cells():
    big = np.arange(200 * 200, dtype=np.float64).reshape(200, 200)
    app = HeatmapApp(big, [f"r{i}" for i in range(200)], [f"c{i}" for i in range(200)])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        heatmap = app.heatmap
        assert heatmap.virtual_size.height <= heatmap.size.height  # the whole matrix is on screen
        assert heatmap._layout.pool_rows > 1
        await pilot.press("down", "right", "right")
        assert heatmap.cursor == (1, 2)
        assert app.moves[-1].value == big[1, 2]
        assert app.moves[-1].col_label == "c2"


async def test_set_data_keeps_labels_and_cursor_and_reports_the_new_value():
    app = HeatmapApp()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "right")
        app.heatmap.set_data(MATRIX[::-1].copy())
        await pilot.pause()
        assert app.heatmap.cursor == (1, 1)
        assert app.moves[-1].value == MATRIX[5, 1]
        assert app.moves[-1].row_label == "blocks.1"


# --- What gets drawn ----------------------------------------------------------------------------------


async def test_half_blocks_carry_the_upper_cell_as_foreground_and_the_lower_as_background():
    app = HeatmapApp(zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("end", "shift+end")  # cursor in the far corner, away from what we check
        heatmap = app.heatmap
        colors = palette("viridis", 24, ColorMode.TRUECOLOR).colors
        levels = heatmap.scale.quantize(MATRIX)
        for line, col in [(0, 0), (0, 5), (1, 3), (2, 8)]:
            char, style = style_at(heatmap.render_line(line), gutter(heatmap) + col)
            assert char == UPPER_HALF
            assert style.color.name == colors[levels[2 * line, col]]
            assert style.bgcolor.name == colors[levels[2 * line + 1, col]]
        # 7 rows: the last line's lower half is past the matrix and shows the widget's background.
        _, style = style_at(heatmap.render_line(3), gutter(heatmap))
        assert style.color.name == colors[levels[6, 0]]
        assert style.bgcolor == heatmap.rich_style.bgcolor


@pytest.mark.parametrize("cmap", ["viridis", "magma"])
async def test_the_cursor_cell_keeps_its_own_colour_under_corner_marks_no_value_looks_like(cmap):
    matrix = MATRIX.copy()
    matrix[2, 1] = 0.0  # the darkest level: a solid black cursor would have looked just like it
    app = HeatmapApp(matrix, zoom="1:1", cmap=cmap)
    async with app.run_test(size=SIZE) as pilot:
        heatmap = app.heatmap
        await pilot.press("down", "down", "right")  # (2, 1): upper half of line 1
        colors = palette(cmap, 24, ColorMode.TRUECOLOR).colors
        levels = heatmap.scale.quantize(matrix)
        char, style = style_at(heatmap.render_line(1), gutter(heatmap) + 1)
        assert char == "+" and char not in (UPPER_HALF, " ")  # a mark, not a half block of some value
        assert style.bgcolor.name == colors[levels[2, 1]]  # the value's own colour stays visible
        assert style.color.name == "#ffffff"  # light ink on the darkest level
        # the cells around it are plain half blocks of their values
        char, style = style_at(heatmap.render_line(1), gutter(heatmap) + 2)
        assert char == UPPER_HALF and style.color.name == colors[levels[2, 2]]
        # rows 2 and 3 share the line: its label names both, the cursor's part highlighted
        assert heatmap.render_line(1).text.startswith("blocks.2/3")
        assert style_at(heatmap.render_line(1), len("blocks."))[1].reverse
        assert not style_at(heatmap.render_line(1), 0)[1].reverse and not style_at(heatmap.render_line(1), 9)[1].reverse
        await pilot.press("end", "shift+end")  # (6, 8): the top level gets dark ink
        char, style = style_at(heatmap.render_line(3), gutter(heatmap) + 8)
        assert char == "+" and style.bgcolor.name == colors[levels[6, 8]] and style.color.name == "#000000"
        # nowhere else on screen is a mark drawn
        grid = "".join(heatmap.render_line(y).text[gutter(heatmap) :] for y in range(4))
        assert grid.count("+") == 1


@pytest.mark.parametrize("mode", ["256", "16"])
async def test_indexed_colour_modes_draw_with_palette_indices(mode):
    app = HeatmapApp(zoom="1:1", color_mode=mode)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("end")
        heatmap = app.heatmap
        pal = palette("viridis", 24, ColorMode(mode))
        levels = heatmap.scale.quantize(MATRIX)
        _, style = style_at(heatmap.render_line(0), gutter(heatmap) + 4)
        assert (style.color.number, style.bgcolor.number) == (
            int(pal.colors[levels[0, 4]][6:-1]),
            int(pal.colors[levels[1, 4]][6:-1]),
        )


async def test_no_colour_mode_draws_density_characters_and_no_colour_at_all():
    app = HeatmapApp(color_mode="none", zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "right")
        heatmap = app.heatmap
        lines = [heatmap.render_line(y) for y in range(heatmap.size.height)]
        for line in lines:
            for segment in line:
                assert segment.style is None or (segment.style.color is None and segment.style.bgcolor is None)
        grid = "".join(line.text[gutter(heatmap) :] for line in lines[:7])
        assert {"@", " "} <= set(grid) and set(grid) <= set(ASCII_RAMP)
        # one matrix row per line, two characters per cell: the last cell of the last row is the top level
        assert lines[6].text[gutter(heatmap) + 16 : gutter(heatmap) + 18] == "@@"
        # the cursor is visible without colour: reversed
        _, style = style_at(lines[1], gutter(heatmap) + 2)
        assert style.reverse
        # 2-character cells are too narrow for 'l1.0': with lines free below, the labels stand upright
        assert [line.text[gutter(heatmap) + 6] for line in lines[7:11]] == list("l2.0")
        assert "[" + "".join(heatmap.palette.chars) + "]" in lines[11].text  # the legend ramp


async def test_cells_not_computed_yet_get_a_neutral_glyph():
    matrix = MATRIX.copy()
    matrix[0:2, 3] = np.nan
    for mode, glyph in [("truecolor", MISSING_GLYPH), ("none", "?")]:
        app = HeatmapApp(matrix, color_mode=mode, zoom="1:1")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("end")
            heatmap = app.heatmap
            char, _ = style_at(heatmap.render_line(0), gutter(heatmap) + 3 * (1 if mode == "truecolor" else 2))
            assert char == glyph
            assert "not computed" in heatmap.render_line(heatmap.scrollable_content_region.height - 1).text or any(
                "not computed" in heatmap.render_line(y).text for y in range(heatmap.size.height)
            )


async def test_labels_fit_the_gutter_and_the_cursor_column_is_named_in_its_own_slot():
    app = HeatmapApp(zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right", "right", "right", "right")
        heatmap = app.heatmap
        assert heatmap.render_line(0).text.startswith("blocks.0/1 ")  # two rows a line: the label names both
        x = gutter(heatmap) + 4
        # 7 rows -> 4 grid lines, then the column labels: one column each, written downwards, all nine there
        lines = [heatmap.render_line(y) for y in range(4, 8)]
        assert "".join(line.text[x] for line in lines) == "l2.1"
        assert all(style_at(line, x)[1].reverse for line in lines)
        assert not any(style_at(line, x - 1)[1].reverse or style_at(line, x + 1)[1].reverse for line in lines)
        assert [line.text[gutter(heatmap) : gutter(heatmap) + 9] for line in lines][0] == "lllllllll"


def test_abbreviations_keep_the_distinctive_tail():
    assert abbreviate_label("blocks.11", 9) == "blocks.11"
    assert abbreviate_label("blocks.11", 5) == "b.11"
    assert abbreviate_label("layer2.1.conv1", 10) == "l2.1.conv1"
    assert abbreviate_label("blocks.3.attn", 6) == "3.attn"
    for label in ["blocks.11", "layer4.2.downsample.0", "patch_embed", "norm"]:
        for width in range(1, 12):
            assert len(abbreviate_label(label, width)) <= width


def test_every_binding_has_an_id_and_a_description():
    assert all(binding.id and binding.description for binding in Heatmap.BINDINGS)
    keys = {key for binding in Heatmap.BINDINGS for key in binding.key.split(",")}
    assert {
        "up",
        "down",
        "left",
        "right",
        "h",
        "j",
        "k",
        "l",
        "pageup",
        "pagedown",
        "home",
        "end",
        "z",
        "enter",
    } <= keys


# --- Repaint cost -------------------------------------------------------------------------------------


async def _rendered_lines_after(pilot, heatmap: Heatmap, key: str) -> set[int]:
    """Press a key and return which lines of the heatmap were rendered for the next frame."""
    rendered: set[int] = set()
    render_line = heatmap.render_line

    def spy(y: int):
        rendered.add(y)
        return render_line(y)

    heatmap.render_line = spy
    try:
        await pilot.press(key)
        await pilot.pause()
    finally:
        del heatmap.render_line
    return rendered


async def test_a_cursor_move_repaints_only_the_lines_it_left_and_entered():
    big = np.linspace(0, 1, 60 * 60).reshape(60, 60)
    app = HeatmapApp(big, [f"blocks.{i}" for i in range(60)], [f"blocks.{i}" for i in range(60)], zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down")  # settle: (1, 0), lower half of line 0
        heatmap = app.heatmap
        label_line = heatmap._layout.grid_lines - heatmap.scroll_offset.y
        label_line = min(label_line, heatmap._layout.view_lines)

        assert await _rendered_lines_after(pilot, heatmap, "down") == {0, 1, label_line}  # line 0 -> line 1
        assert await _rendered_lines_after(pilot, heatmap, "right") == {1, label_line}  # along line 1
        assert await _rendered_lines_after(pilot, heatmap, "down") == {1, label_line}  # upper -> lower half


async def test_a_cursor_move_refreshes_only_small_regions():
    app = HeatmapApp(zoom="1:1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        heatmap = app.heatmap
        regions = []
        refresh = heatmap.refresh

        def spy(*args, **kwargs):
            regions.extend(args)
            return refresh(*args, **kwargs)

        heatmap.refresh = spy
        await pilot.press("right")
        del heatmap.refresh
        assert regions, "the move repainted nothing"
        assert all(region.height == 1 or region.width == 1 for region in regions)  # upright labels: a column
        assert sum(region.area for region in set(regions)) <= 2 * (gutter(heatmap) + 1) + heatmap.size.width


# --- Snapshots ----------------------------------------------------------------------------------------

SNAP_MATRIX = np.exp(-np.abs(np.subtract.outer(np.arange(12), np.arange(12))) / 4)
SNAP_MATRIX[0, 3] = SNAP_MATRIX[3, 0] = np.nan
SNAP_LABELS = [f"blocks.{i}" for i in range(12)]


def test_snapshot_truecolor_fit(snap_compare):
    app = HeatmapApp(SNAP_MATRIX, SNAP_LABELS, SNAP_LABELS, title="vit_b16 x vit_b16")
    assert snap_compare(app, press=["down", "down", "right"], terminal_size=(80, 24))


def test_snapshot_no_colour_fit(snap_compare):
    app = HeatmapApp(SNAP_MATRIX, SNAP_LABELS, SNAP_LABELS, color_mode="none", title="vit_b16 x vit_b16")
    assert snap_compare(app, press=["down", "down", "right"], terminal_size=(80, 24))


def test_snapshot_256_colour_fit(snap_compare):
    # tmux without COLORTERM: mid-range viridis must stay blue-green here, not turn grey (issue 13.3)
    app = HeatmapApp(SNAP_MATRIX, SNAP_LABELS, SNAP_LABELS, color_mode="256", title="vit_b16 x vit_b16")
    assert snap_compare(app, press=["down", "down", "right"], terminal_size=(80, 24))

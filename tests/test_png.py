"""The screen as a PNG (tui/png.py): each cell painted with its colours, the heatmap's half blocks and the line plot's
Braille dots as shapes; and `vitsee-tui --snapshot VIEW --out x.png` writing it."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.segment import Segment
from rich.style import Style

from conftest import RESNET, VIT
from helpers.app import SIZE, analysed_copy, make_app, settle, view_shown
from vitsee.tui.app import main
from vitsee.tui.png import Cell, cell_size, cells_of_lines, render_cells, screen_png
from vitsee.tui.widgets.heatmap import Heatmap

RED, BLUE, GREEN, BLACK = (255, 0, 0), (0, 0, 255), (0, 160, 0), (0, 0, 0)


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory) -> Path:
    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


def paint(cells: list[Cell]) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(render_cells([cells], len(cells)))).convert("RGB"))


def colours(pixels: np.ndarray) -> set[tuple[int, int, int]]:
    return {tuple(int(v) for v in p) for p in pixels.reshape(-1, 3)}


class TestCells:
    def test_a_half_block_is_its_colour_above_and_the_background_below_exactly(self):
        w, h = cell_size()
        img = paint([Cell("\u2580", RED, BLUE)])
        assert img.shape == (h, w, 3)
        assert colours(img[: h // 2]) == {RED} and colours(img[h // 2 :]) == {BLUE}

    def test_blocks_fill_their_part_of_the_cell(self):
        w, h = cell_size()
        img = paint([Cell("\u258c", RED, BLUE), Cell("\u2588", GREEN, BLUE), Cell("\u2584", RED, BLUE)])
        left = img[:, :w]
        assert colours(left[:, : w // 2]) == {RED} and colours(left[:, w // 2 :]) == {BLUE}  # left half
        assert colours(img[:, w : 2 * w]) == {GREEN}  # full block
        lower = img[:, 2 * w :]
        assert colours(lower[: h // 2]) == {BLUE} and colours(lower[h // 2 :]) == {
            RED
        }  # lower half: the upper's complement

    def test_a_braille_dot_is_in_its_place_of_the_2_by_4_grid(self):
        w, h = cell_size()
        one = paint([Cell("\u2801", RED, BLACK)])  # dot 1: left column, top row
        eight = paint([Cell("\u2880", RED, BLACK)])  # dot 8: right column, bottom row
        for img, top, left in ((one, True, True), (eight, False, False)):
            ys, xs = np.nonzero((img == RED).all(axis=2))
            assert ys.size > 0
            assert (ys < h // 4).all() if top else (ys >= 3 * h // 4).all()
            assert (xs < w // 2).all() if left else (xs >= w // 2).all()
        full = paint([Cell("\u28ff", RED, BLACK)])
        assert (full == RED).all(axis=2).sum() == 8 * (one == RED).all(axis=2).sum()  # eight dots alike

    def test_a_letter_is_inked_inside_its_cell_only(self):
        w, h = cell_size()
        img = paint([Cell(" ", RED, BLUE), Cell("W", RED, BLUE, bold=True), Cell(" ", RED, BLUE)])
        assert colours(img[:, :w]) == colours(img[:, 2 * w :]) == {BLUE}
        ink = (np.abs(img[:, w : 2 * w].astype(int) - BLUE).sum(axis=2) > 0).sum()
        assert 0.1 * w * h < ink < 0.6 * w * h

    def test_an_underscore_is_a_bar_across_its_cell_clear_of_the_next_line(self):
        # issue 29: the font's underscore was one pixel on the cell's last row, read as lost in `patch_embed`
        w, h = cell_size()
        img = paint([Cell("_", RED, BLUE)])
        rows = np.flatnonzero((img == RED).all(axis=2).any(axis=1))
        assert len(rows) >= 2 and rows.max() < h - 1  # two pixels at least, not on the row next to the line below
        assert all((img[r] == RED).all(axis=1).sum() == w for r in rows)  # across the whole cell, as a terminal

    def test_styles_reverse_and_dim_as_a_terminal_does(self):
        (row,) = cells_of_lines(
            [
                [
                    Segment("a", Style(color="#ff0000", bgcolor="#0000ff", reverse=True)),
                    Segment("b", Style(color="#ff0000", bgcolor="#000000", dim=True)),
                    Segment("\x1b[2J", None, control=[(1,)]),
                ]
            ]
        )
        assert [(c.char, c.fg, c.bg) for c in row] == [("a", BLUE, RED), ("b", (127, 0, 0), BLACK)]


async def test_the_png_of_the_cka_view_has_every_heatmap_cell_in_the_widgets_own_colours(store, tmp_path):
    """Each half block the heatmap draws is, in the PNG, its upper colour above and its lower colour below, at the
    cell the screen puts it: the screen's geometry and the widget's colours, painted."""
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        heatmap = app.screen.query_one(Heatmap)
        img = np.asarray(Image.open(io.BytesIO(screen_png(app))).convert("RGB"))
        w, h = cell_size()
        assert img.shape == (SIZE[1] * h, SIZE[0] * w, 3)
        region, checked = heatmap.region, 0
        for y in range(region.height):
            x = region.x
            for segment in heatmap.render_line(y):
                for char in segment.text:
                    if char == "\u2580" and x < region.right:
                        top = img[(region.y + y) * h + 2, x * w + w // 2]
                        bottom = img[(region.y + y) * h + h - 3, x * w + w // 2]
                        assert tuple(top) == tuple(segment.style.color.get_truecolor())
                        assert tuple(bottom) == tuple(segment.style.bgcolor.get_truecolor())
                        checked += 1
                    x += 1
        assert checked >= 50


def test_snapshot_to_png_writes_the_screen_at_its_size(store, tmp_path, capsys):
    out = tmp_path / "shots" / "cka.png"
    out.parent.mkdir()  # a folder that is not there is refused, as `vitsee export` refuses it (test_first_hour.py)
    code = 0
    try:
        main([str(store), "--snapshot", f"cka:{VIT}:{RESNET}", "--out", str(out), "--size", "100x30"])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out == f"wrote {out} (cka:{VIT}:{RESNET} at 100x30)\n"
    image = Image.open(out)
    w, h = cell_size()
    assert image.format == "PNG" and image.size == (100 * w, 30 * h)
    assert len(image.convert("RGB").getcolors(maxcolors=100000)) > 20  # the colour ramp and the text, not a blank
    assert not list(out.parent.glob(".*.part"))

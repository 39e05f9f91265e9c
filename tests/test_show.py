"""`vitsee show`: half-block heatmaps in the cells' own colours, plain ASCII without colour, readable tables."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text

from conftest import RESNET, VIT, run_cli
from helpers.stores import VIEWS_CFG as CFG, analysed_store
from vitsee import cli
from vitsee.output.colormap import ASCII_RAMP, ColorMode, ColorScale, palette
from vitsee.output.render import UPPER_HALF, render_view
from vitsee.analyses.views import View, load_view

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def store(tiny_store):
    return analysed_store(tiny_store)


@pytest.fixture(autouse=True)
def plain_env(monkeypatch):
    """Colour decisions come from each test alone, not from the terminal running pytest."""
    for name in ("NO_COLOR", "VITSEE_COLOR", "COLORTERM", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


def show(store, view: str, *options: str, monkeypatch, capsys) -> tuple[int, str, str]:
    """Runs `vitsee show STORE VIEW OPTIONS` on a 100-column truecolor terminal; returns (code, stdout, stderr)."""
    terminal = io.StringIO()
    monkeypatch.setattr(
        cli, "out", Console(file=terminal, force_terminal=True, color_system="truecolor", width=100, soft_wrap=True)
    )
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: __import__("os").terminal_size((100, 40)))
    code, _, err = run_cli(["show", store, view, *options], capsys)
    return code, terminal.getvalue(), err


def printed(renderables, mode: str = "truecolor", width: int = 100) -> str:
    """Returns what a terminal `width` wide in `mode` receives (escape codes included)."""
    systems = {"truecolor": "truecolor", "256": "256", "none": None}
    console = Console(file=io.StringIO(), force_terminal=True, color_system=systems[mode], width=width, soft_wrap=True)
    for renderable in renderables:
        console.print(renderable)
    return console.file.getvalue()


def styles_of(line: Text) -> list[tuple[str, Style]]:
    """Returns (character, style) for every character of a rendered line."""
    styles = [Style.null()] * len(line.plain)
    for span in line.spans:
        for i in range(span.start, span.end):
            styles[i] = span.style if isinstance(span.style, Style) else Style.parse(span.style)
    return list(zip(line.plain, styles))


def ansi_rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"{r};{g};{b}"


def synthetic(rows: int, cols: int, kind: str = "cka") -> View:
    """A view whose every cell has its own value in [0, 1]."""
    matrix = np.arange(rows * cols, dtype=float).reshape(rows, cols) / (rows * cols - 1)
    names = [f"blocks.{i}" for i in range(max(rows, cols))]
    return View(
        kind,
        f"{kind}:m",
        f"{kind} m",
        "m: random init",
        matrix,
        names[:rows],
        names[:cols],
        "CKA",
        0.0,
        1.0,
        models=["m", "m"],
    )


# --- colour ------------------------------------------------------------------------------------------


def test_show_prints_half_blocks_in_the_colours_of_the_cells(store, monkeypatch, capsys):
    code, out, err = show(store, f"cka:{VIT}", "--color", "truecolor", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    view = load_view(store, f"cka:{VIT}")  # what show loads: the default analysis parameters
    colors = palette("viridis", 24, ColorMode.TRUECOLOR).colors
    levels = ColorScale(0.0, 1.0, 24, "viridis").quantize(view.matrix)
    assert UPPER_HALF in out
    # 8 layers on 100 columns are magnified: the first text row is layer 0 in both halves
    first = next(line for line in out.splitlines() if ANSI.sub("", line).lstrip().startswith("patch_embed"))
    top_left, top_right = colors[levels[0, 0]], colors[levels[0, -1]]
    assert f"38;2;{ansi_rgb(top_left)};48;2;{ansi_rgb(top_left)}m{UPPER_HALF}" in first
    assert first.rstrip().endswith(f"38;2;{ansi_rgb(top_right)};48;2;{ansi_rgb(top_right)}m{UPPER_HALF * 4}\x1b[0m")
    assert view.title in ANSI.sub("", out)


def test_each_text_row_holds_two_matrix_rows_upper_in_the_foreground_lower_in_the_background():
    view = synthetic(5, 40)  # too wide to magnify on 60 columns: one character per cell
    lines = render_view(view, color="truecolor", width=60)
    scale = ColorScale(0.0, 1.0, 24, "viridis")
    colors, levels = palette("viridis", 24, ColorMode.TRUECOLOR).colors, scale.quantize(view.matrix)
    grid = [line for line in lines if isinstance(line, Text) and UPPER_HALF in line.plain]
    assert len(grid) == 3  # rows 0-1, 2-3, 4
    for y, line in enumerate(grid):
        cells = [(ch, st) for ch, st in styles_of(line) if ch == UPPER_HALF]
        assert len(cells) == 40
        for c, (_, style) in enumerate(cells):
            assert style.color.name == colors[levels[2 * y, c]]
            if 2 * y + 1 < 5:
                assert style.bgcolor.name == colors[levels[2 * y + 1, c]]
            else:  # an odd last row leaves the lower half to the terminal
                assert style.bgcolor is None
    assert grid[0].plain.lstrip().startswith("blocks.0") and grid[1].plain.lstrip().startswith("blocks.2")


def test_a_wide_matrix_is_pooled_to_fit_the_terminal_and_says_so():
    view = synthetic(30, 300)
    for mode in ("truecolor", "none"):
        text = ANSI.sub("", printed(render_view(view, color=mode, width=80), mode, width=200))
        grid = [line for line in text.splitlines() if line.lstrip().startswith("blocks.")]
        assert grid and max(len(line) for line in grid) <= 80
        assert "pooled" in text


def test_256_colour_terminals_get_palette_colours(store):
    out = printed(render_view(load_view(store, f"cka:{VIT}", CFG), color="256"), "256")
    assert "38;5;" in out and "38;2;" not in out


# --- no colour ---------------------------------------------------------------------------------------


def test_no_color_prints_plain_ascii_one_matrix_row_per_line(store, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    view = load_view(store, f"cka:{VIT}:{RESNET}", CFG)
    out = printed(render_view(view, color="auto"), "truecolor")  # even a colour console gets no codes
    assert "\x1b" not in out and out.isascii()
    grid = [line for line in out.splitlines() if line.lstrip().split(" ")[0] in view.rows]
    assert [line.split()[0] for line in grid] == view.rows  # every layer on its own line
    levels = ColorScale(0.0, 1.0, len(ASCII_RAMP), "viridis").quantize(view.matrix)
    gutter = len(grid[0]) - 2 * len(view.cols)  # two characters per cell keep ASCII cells square
    for r, line in enumerate(grid):
        cells = line[gutter:]
        assert set(cells) <= set(ASCII_RAMP)
        assert cells == "".join(ASCII_RAMP[level] * 2 for level in levels[r])


def test_color_none_shows_every_view_without_escape_codes_or_block_characters(store, monkeypatch, capsys):
    for view in (f"cka:{VIT}", f"attention:{VIT}", f"probes:{VIT}", f"skip:{VIT}", f"spatial:{VIT}", f"skip:{RESNET}"):
        code, out, err = show(store, view, "--color", "none", monkeypatch=monkeypatch, capsys=capsys)
        assert code == 0, err
        assert "\x1b" not in out and out.isascii(), view
        assert UPPER_HALF not in out


# --- tables and maps ---------------------------------------------------------------------------------


def _table_rows(text: str) -> dict[str, list[str]]:
    """Returns label -> cells of an ASCII table."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|-"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_probe_table_stars_the_best_layer_of_each_readout(store):
    view = load_view(store, f"probes:{VIT}", CFG)
    out = printed(render_view(view, color="none"), "none")
    rows = _table_rows(out)
    assert list(rows)[1:] == view.rows  # header first
    for c, readout in enumerate(view.cols):
        column = view.matrix[:, c]
        starred = [layer for layer in view.rows if rows[layer][c].endswith("*")]
        assert starred == [view.rows[i] for i in np.flatnonzero(column == np.nanmax(column))], readout
        for layer, cell in zip(view.rows, (rows[layer][c] for layer in view.rows)):
            value = column[view.rows.index(layer)]
            assert cell.rstrip(" *") == (f"{value:.3f}" if np.isfinite(value) else "-")
    assert f"chance {view.extra['chance']:.3f}" in out


def test_probe_table_best_cells_are_bold_in_colour():
    matrix = np.array([[0.2, 0.5], [0.9, 0.4], [0.3, 0.8]])
    view = View(
        "probes",
        "probes:m",
        "probes m",
        "",
        matrix,
        ["a", "b", "c"],
        ["CLS", "GAP"],
        "accuracy",
        0.0,
        1.0,
        extra={"chance": 0.1, "token_maps": {}},
    )
    out = printed(render_view(view, color="truecolor"))
    assert re.search(r"\x1b\[1m\s*0\.900 \*", out) and re.search(r"\x1b\[1m\s*0\.800 \*", out)
    plain = ANSI.sub("", out)
    assert "0.500" in plain and "0.500 *" not in plain


def test_attention_table_lists_sorted_head_distances_and_the_uniform_distance(store):
    view = load_view(store, f"attention:{VIT}", CFG)
    out = printed(render_view(view, color="none"), "none")
    rows = _table_rows(out)
    for b, block in enumerate(view.rows):
        assert [float(cell.split()[0]) for cell in rows[block]] == [round(v, 1) for v in view.matrix[b]]
    assert f"uniform attention: {view.extra['uniform_px']:.1f} px" in out


def test_spatial_shows_the_centre_tokens_map_with_its_cell_marked(store):
    view = load_view(store, f"spatial:{VIT}", CFG)  # 4x4 grid: the centre token is r2c2
    out = printed(render_view(view, color="none"), "none")
    grid = [line for line in out.splitlines() if re.match(r"\s*r\d ", line)]
    assert len(grid) == 4
    assert grid[2].split(" ", 1)[1][4:6] == "<>" and "<>" not in "".join(grid[:2] + grid[3:])
    levels = ColorScale(0.0, 1.0, len(ASCII_RAMP), "viridis").quantize(view.matrix[10].reshape(4, 4))
    assert grid[0].split(" ", 1)[1] == "".join(ASCII_RAMP[level] * 2 for level in levels[0])
    assert "token r2c2" in out
    coloured = ANSI.sub("", printed(render_view(view, color="truecolor"))).splitlines()
    assert sum(line.count("<>") for line in coloured if re.match(r"\s*r\d ", line) or line.startswith("   ")) == 1


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("view, needle", [("bogus:x", "unknown view 'bogus:x'"), ("cka:nomodel", "nomodel")])
def test_a_bad_view_is_a_one_line_error(store, view, needle, capsys):
    code, out, err = run_cli(["show", store, view], capsys)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_an_unknown_colour_mode_is_a_one_line_error(store, capsys):
    code, _, err = run_cli(["show", store, f"cka:{VIT}", "--color", "rainbow"], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "rainbow" in err, err


def test_device_on_show_and_export_says_where_to_compute_not_which_estimate_to_show(tiny_store, tmp_path, capsys):
    """A store analysed with --batch-size 8: `show --device cpu` used to compute and show the default estimate."""
    import json as json_mod

    from vitsee.store import Store, copy_store

    path = copy_store(tiny_store, tmp_path / "b8.h5")
    code, _, err = run_cli(
        ["analyze", path, "--cka", "--batch-size", "8", "--shuffles", "0", "--device", "cpu", "-q"], capsys
    )
    assert code == 0, err
    with Store.open(path) as s:
        before = [r["id"] for r in s.results()]
    code, out, err = run_cli(["show", path, f"cka:{VIT}", "--device", "cpu", "--format", "json"], capsys)
    assert code == 0, err
    assert json_mod.loads(out)["params"]["batch_size"] == 8
    code, _, err = run_cli(["export", path, f"cka:{VIT}", "--device", "cpu", "--out", tmp_path / "x.json"], capsys)
    assert code == 0, err
    assert json_mod.loads((tmp_path / "x.json").read_text())["params"]["batch_size"] == 8
    with Store.open(path) as s:
        assert [r["id"] for r in s.results()] == before  # nothing computed: the cached estimate was shown
    code, out, err = run_cli(["show", path, f"skip:{VIT}", "--device", "cpu", "--format", "json"], capsys)
    assert code == 0, err  # not cached: computed, on that device


# --- one label layout, every layer told apart -------------------------------------------------------------------


def _sublayers(depth: int) -> list[str]:
    """Returns the layer names of a ViT of `depth` blocks at sublayer granularity, as extraction records them."""
    import timm

    from vitsee.models.load import layer_points

    model = timm.create_model(
        "vit_tiny_patch16_224", depth=depth, img_size=32, patch_size=8, embed_dim=24, num_heads=2, pretrained=False
    )
    return [point.name for point in layer_points(model, "vit", "sublayers")]


def test_show_gives_every_layer_of_a_sublayer_store_a_label_of_its_own():
    from vitsee.output.labels import fit_labels

    names = _sublayers(12)
    assert {"blocks.1.mlp.act", "blocks.10.mlp.act", "blocks.11.mlp.act"} <= set(
        names
    )  # one short form for all three once
    n = len(names)
    view = View("cka", "cka:m", "CKA m", "", np.eye(n), names, names, "CKA", 0.0, 1.0, models=["m", "m"])
    console = Console(width=n + 40, record=True, color_system="truecolor")
    for renderable in render_view(view, color="truecolor", width=n + 40):
        console.print(renderable)
    gutter = [line.strip().split(" ")[0] for line in console.export_text().splitlines()[1 : 1 + n // 2]]
    assert len(gutter) == n // 2 and len(set(gutter)) == n // 2  # one text row for two layers, each one named
    shown = fit_labels(names, 14)  # what the gutter writes: the app's own layout
    assert len(set(shown)) == n and set(gutter) <= set(shown)
    three = ["blocks.1.mlp.act", "blocks.10.mlp.act", "blocks.11.mlp.act"]  # all 'b.1.m.act' once
    assert fit_labels(three, 10) == ["b.1.m.act", "b.10.m.act", "b.11.m.act"]
    assert len(set(fit_labels(three, 5))) == 3  # narrower than any short form: wider, never alike


def test_the_app_and_show_shorten_labels_alike():
    from vitsee.output import render
    from vitsee.tui.widgets import axis_labels

    names = _sublayers(12)
    for width in (4, 8, 14):
        assert render.fit_labels(names, width) == axis_labels.fit_labels(names, width)

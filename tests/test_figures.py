"""PNG figures of every view: valid images that draw exactly the view's numbers, names, colour range and selection."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from PIL import Image

from conftest import RESNET, VIT, run_cli
from vitsee.engine.analyze import AnalyzeConfig
from vitsee.engine.errors import VitseeError
from vitsee.engine.figures import figure_for, spatial_centre_token, token_grid
from vitsee.engine.export import write_view
from vitsee.engine.views import View, load_view

CFG = AnalyzeConfig(shuffles=0, batch_size=16, device="cpu")
VIEWS = {  # short name -> view string
    "cka": f"cka:{VIT}", "ckax": f"cka:{VIT}:{RESNET}", "attention": f"attention:{VIT}",
    "probes": f"probes:{VIT}", "probes:resnet": f"probes:{RESNET}", "skip": f"skip:{VIT}",
    "skip:resnet": f"skip:{RESNET}", "spatial": f"spatial:{VIT}", "spatial:resnet": f"spatial:{RESNET}",
}


def analysed_store(tiny_store: Path) -> Path:
    """Returns a copy of the tiny store with every view's analysis cached; made once per session.

    test_show.py uses it too. The copy keeps these caches out of the store other test files read.
    """
    path = tiny_store.with_name("views.h5")
    if path.exists():
        return path
    partial = path.with_suffix(".partial.h5")
    shutil.copy(tiny_store, partial)
    # Batched eigh on 2 busy cores runs ~50x slower with 2 threads than with 1 (per-token probes: 15 s vs 0.5 s);
    # the numbers are the same either way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for spec in VIEWS.values():
            load_view(partial, spec, CFG)
    finally:
        torch.set_num_threads(threads)
    partial.rename(path)
    return path


@pytest.fixture(scope="module")
def store(tiny_store) -> Path:
    return analysed_store(tiny_store)


@pytest.fixture(scope="module")
def views(store) -> dict[str, View]:
    return {name: load_view(store, spec, CFG) for name, spec in VIEWS.items()}


def axes(fig, label: str):
    """Returns the one axes of fig with this label."""
    found = [ax for ax in fig.axes if ax.get_label() == label]
    assert len(found) == 1, [ax.get_label() for ax in fig.axes]
    return found[0]


def with_gid(fig, gid: str) -> list:
    return [artist for artist in fig.findobj() if artist.get_gid() == gid]


def colorbar_of(fig, image):
    return next(ax for ax in fig.axes if ax.get_label() == "<colorbar>" and image.colorbar.ax is ax)


# --- every kind ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VIEWS)
def test_every_view_exports_a_valid_small_png_with_the_selection_marked(views, name, tmp_path):
    view = views[name]
    selection = (min(1, view.matrix.shape[0] - 1), min(1, view.matrix.shape[1] - 1))
    out = write_view(view, tmp_path / "x.png", selection=selection)
    with Image.open(out) as image:
        assert image.format == "PNG"
        width, height = image.size
        pixels = np.asarray(image.convert("L"), dtype=float)
    assert 800 <= width <= 2000 and 600 <= height <= 1200
    assert out.stat().st_size < 1_000_000
    assert pixels.std() > 20  # a drawn figure, not a blank page
    fig = figure_for(view, selection=selection)
    assert isinstance(fig.canvas, FigureCanvasAgg)
    assert with_gid(fig, "selection"), "the selected cell is not marked"
    assert any(view.title in t.get_text() or t.get_text() in view.title for t in fig.texts if t.get_text())


def test_a_selection_outside_the_matrix_is_a_user_error_naming_it(views):
    with pytest.raises(VitseeError, match=r"selection \(8, 0\) is outside the 8x8 matrix"):
        figure_for(views["cka"], selection=(8, 0))


def test_an_unknown_colormap_is_a_user_error(views):
    with pytest.raises(VitseeError, match="unknown colormap 'rainbowz'"):
        figure_for(views["cka"], cmap="rainbowz")


# --- CKA ----------------------------------------------------------------------------------------------


def test_cka_figure_is_the_view_matrix_with_layer_names_and_a_0_to_1_colour_bar(views):
    view = views["ckax"]  # ViT rows x ResNet cols
    fig = figure_for(view, selection=(2, 3), cmap="magma")
    ax = axes(fig, "heatmap")
    image = ax.images[0]
    np.testing.assert_array_equal(np.ma.getdata(image.get_array()), view.matrix)
    assert image.origin == "lower"  # layer 0 at the bottom left, as in the paper's Fig. 1
    assert image.get_cmap().name.startswith("magma")
    assert (image.norm.vmin, image.norm.vmax) == (view.vmin, view.vmax) == (0.0, 1.0)
    bar = colorbar_of(fig, image)
    assert bar.get_ylabel() == "CKA" and bar.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == view.rows
    assert [t.get_text() for t in ax.get_xticklabels()] == view.cols
    assert VIT in ax.get_ylabel() and RESNET in ax.get_xlabel()


def test_cka_selection_rectangle_sits_on_the_selected_cell_and_names_its_value(views):
    view = views["ckax"]
    fig = figure_for(view, selection=(6, 1))
    (rect,) = [a for a in with_gid(fig, "selection")]
    assert rect.get_xy() == (0.5, 5.5) and (rect.get_width(), rect.get_height()) == (1, 1)
    (label,) = with_gid(fig, "selection-label")
    assert f"{view.value(6, 1):.3f}" in label.get_text()
    assert "blocks.5" in label.get_text() and "layer1.0" in label.get_text()


def test_many_layers_label_every_nth_tick_starting_at_the_first():
    n = 150
    rows = [f"blocks.{i}" for i in range(n)]
    view = View("cka", "cka:big", "CKA big", "", np.eye(n), rows, rows, "CKA", 0.0, 1.0, models=["big", "big"])
    ax = axes(figure_for(view), "heatmap")
    ticks = ax.get_yticks()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    step = ticks[1] - ticks[0]
    assert 10 <= len(labels) <= 40 and step > 1
    assert labels[0] == "blocks.0" and labels == [rows[int(t)] for t in ticks]
    assert np.all(np.diff(ticks) == step)


# --- attention ----------------------------------------------------------------------------------------


def test_attention_figure_plots_every_heads_mean_with_its_spread_uniform_line_and_histogram(views):
    view = views["attention"]
    fig = figure_for(view, selection=(3, 1))
    ax = axes(fig, "distances")
    (heads,) = with_gid(fig, "heads")
    np.testing.assert_array_equal(heads.get_offsets()[:, 1], view.matrix.ravel())
    (bars,) = with_gid(fig, "spread")
    spans = np.array([seg[1, 1] - seg[0, 1] for seg in bars.get_segments()])
    np.testing.assert_allclose(spans, 2 * np.asarray(view.extra["std_px"]).ravel(), atol=1e-9)
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_ydata()[0] for line in dashed] == [view.extra["uniform_px"]]
    assert ax.get_ylim() == (view.vmin, view.vmax)

    hist = axes(fig, "histogram")
    (steps,) = hist.patches
    values, edges, _ = steps.get_data()
    np.testing.assert_array_equal(values, view.extra["hist_counts"][3])
    np.testing.assert_array_equal(edges, view.extra["hist_edges"])
    assert hist.get_title().startswith("blocks.3")


# --- probes -------------------------------------------------------------------------------------------


def test_probe_figure_has_a_line_per_readout_chance_and_every_best_layer_starred(views):
    view = views["probes"]
    assert view.cols == ["CLS", "GAP", "tokens (mean)"]
    fig = figure_for(view)
    for c, readout in enumerate(view.cols):
        (line,) = with_gid(fig, f"readout:{readout}")
        np.testing.assert_array_equal(line.get_ydata(), view.matrix[:, c])  # NaN where a readout has no value
        (stars,) = with_gid(fig, f"best:{readout}")
        column = view.matrix[:, c]
        np.testing.assert_array_equal(stars.get_xdata(), np.flatnonzero(column == np.nanmax(column)))
    (chance,) = with_gid(fig, "chance")
    assert chance.get_linestyle() == ":" and chance.get_ydata()[0] == view.extra["chance"]


def test_probe_token_map_panel_is_the_layers_per_token_accuracy_on_the_patch_grid(views):
    view = views["probes"]
    layer = "blocks.2"
    fig = figure_for(view, selection=(view.rows.index(layer), 2))
    panel = axes(fig, "token map")
    accuracy = view.extra["token_maps"][layer]
    assert accuracy.shape == (17,)  # CLS first, then the 4x4 grid
    np.testing.assert_array_equal(np.ma.getdata(panel.images[0].get_array()), accuracy[1:].reshape(4, 4))
    assert f"CLS token {accuracy[0]:.2f}" in panel.get_title()
    # the patch embedding has its 16 patch tokens and no CLS: the whole map is the grid, no CLS in the title
    embed = view.extra["token_maps"]["patch_embed"]
    assert embed.shape == (16,) and view.extra["token_prefix"]["patch_embed"] == 0
    panel = axes(figure_for(view, selection=(0, 1)), "token map")
    np.testing.assert_array_equal(np.ma.getdata(panel.images[0].get_array()), embed.reshape(4, 4))
    assert "CLS" not in panel.get_title()
    # a CNN has no token probes, so no panel
    assert not [a for a in figure_for(views["probes:resnet"]).axes if a.get_label() == "token map"]


def test_token_grid_finds_the_prefix_that_leaves_a_square():
    assert token_grid(197, has_cls=True) == (1, (14, 14))
    assert token_grid(201, has_cls=True) == (5, (14, 14))  # CLS + 4 registers
    assert token_grid(16, has_cls=False) == (0, (4, 4))
    assert token_grid(1 + 14 * 15, has_cls=True) == (1, (1, 210))  # a 14x15 grid is not found: one row


# --- skip ---------------------------------------------------------------------------------------------


def test_skip_figure_is_the_ratio_matrix_on_a_log_scale_with_cls_and_spatial_curves(views):
    view = views["skip"]
    fig = figure_for(view, selection=(4, 0))
    image = axes(fig, "heatmap").images[0]
    np.testing.assert_array_equal(np.ma.getdata(image.get_array()), view.matrix)
    assert isinstance(image.norm, LogNorm) and (image.norm.vmin, image.norm.vmax) == (view.vmin, view.vmax)
    assert "log scale" in colorbar_of(fig, image).get_ylabel()
    (cls,) = with_gid(fig, "cls")
    (spatial,) = with_gid(fig, "spatial")
    np.testing.assert_array_equal(cls.get_ydata(), view.extra["cls"])
    np.testing.assert_array_equal(spatial.get_ydata(), view.extra["spatial_mean"])
    assert axes(fig, "curves").get_yscale() == "log"


def test_skip_figure_of_a_resnet_without_finite_ratios_says_so(views):
    view = views["skip:resnet"]
    assert not np.isfinite(view.matrix).any()  # zero-initialised last BN: the residual branch adds nothing
    fig = figure_for(view)
    assert any("no finite ratios" in t.get_text() for t in axes(fig, "curves").texts)


# --- spatial ------------------------------------------------------------------------------------------


def test_spatial_figure_defaults_to_the_centre_tokens_map_with_its_cell_outlined(views):
    view = views["spatial"]
    gh, gw = view.extra["grid"]
    centre = spatial_centre_token(gh, gw)
    fig = figure_for(view)
    ax = axes(fig, "map")
    np.testing.assert_array_equal(np.ma.getdata(ax.images[0].get_array()), view.matrix[centre].reshape(gh, gw))
    assert colorbar_of(fig, ax.images[0]).get_ylabel() == "CKA"
    (token,) = [p for p in ax.patches if p.get_gid() == "token"]
    assert token.get_xy() == (centre % gw - 0.5, centre // gw - 0.5)
    assert view.rows[centre] in ax.get_title()
    small = [a for a in fig.axes if a.get_label().startswith("token ")]
    assert len(small) == 9  # rows and columns 0, 1, 3 of the 4x4 grid


def test_spatial_selection_picks_the_token_and_marks_the_patch(views):
    view = views["spatial"]
    fig = figure_for(view, selection=(5, 14))
    ax = axes(fig, "map")
    np.testing.assert_array_equal(np.ma.getdata(ax.images[0].get_array()), view.matrix[5].reshape(4, 4))
    (patch,) = with_gid(fig, "selection")
    assert patch.get_xy() == (14 % 4 - 0.5, 14 // 4 - 0.5)


# --- numbers beside the figure ------------------------------------------------------------------------


def test_exported_json_round_trips_to_the_views_matrix(store, views, tmp_path, capsys):
    for spec, key in ((f"cka:{VIT}:{RESNET}", "ckax"), (f"probes:{VIT}", "probes")):
        out = tmp_path / f"{key}.json"
        code, _, err = run_cli(["export", store, spec, "--out", out, "--shuffles", "0", "--batch-size", "16",
                                "--device", "cpu"], capsys)
        assert code == 0, err
        exported = json.loads(out.read_text())
        view = views[key]
        values = np.array([[np.nan if v is None else v for v in row] for row in exported["values"]])
        np.testing.assert_array_equal(values, view.matrix)  # exact, NaN (null) included
        assert exported["rows"] == view.rows and exported["cols"] == view.cols


def test_a_png_and_its_json_come_from_the_same_selection(views, tmp_path):
    view = views["cka"]
    write_view(view, tmp_path / "x.png", selection=(1, 4))
    payload = json.loads(write_view(view, tmp_path / "x.json", selection=(1, 4)).read_text())
    assert payload["selection"]["value"] == view.value(1, 4)
    assert (payload["selection"]["row_label"], payload["selection"]["col_label"]) == ("blocks.0", "blocks.3")

"""PNG figures of every view: valid images that draw exactly the view's numbers, names, colour range and selection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from PIL import Image

from conftest import RESNET, VIT, run_cli
from vitsee.errors import VitseeError
from vitsee.output.figures import ORIENTATION, figure_for, spatial_centre_token, token_grid, wrap_to_width
from vitsee.output.export import write_view
from vitsee.analyses.views import View, load_view

from helpers.stores import VIEWS, VIEWS_CFG as CFG, analysed_store


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
    assert (
        ax.get_ylabel() == f"{view.name(VIT)} layer" and ax.get_xlabel() == f"{view.name(RESNET)} layer"
    )  # names, not keys


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


def test_spatial_views_say_the_tokens_are_compared_with_the_normalised_stored_input(views, capsys):
    from vitsee.analyses.spatial import INPUT_NOTE
    from vitsee.output.render import render_view

    view = views["spatial"]
    assert view.extra["pixels"] == INPUT_NOTE and "normalised input as the store keeps it" in INPUT_NOTE
    (caption,) = with_gid(figure_for(view), "caption")
    assert INPUT_NOTE in " ".join(caption.get_text().split())
    text = " ".join(str(r) for r in render_view(view, color="none", width=120))
    assert INPUT_NOTE in " ".join(text.split())
    assert view.to_json()["pixels"] == INPUT_NOTE


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
        code, _, err = run_cli(
            ["export", store, spec, "--out", out, "--shuffles", "0", "--batch-size", "16", "--device", "cpu"], capsys
        )
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


# --- every text inside the figure (issue 13.11) -------------------------------------------------------

LONG_A = "vit_large_patch16_384.augreg_in21k_ft_in1k@random"  # long timm names as a store keys them
LONG_B = "resnetv2_152x2_bit.goog_in21k_ft_in1k@weights"
STATS = {"ci": 0.95, "permutations": 199}


def _subtitle(*models: str) -> str:
    """The subtitle load_view writes: each model's weights, then the images."""
    return "; ".join(f"{m}: random init (seed 0)" for m in models) + (
        "; 2560 images of npz:/mnt/shared/Datasets/ImageNet/"
        "ILSVRC2012_VALIDATION_MAXRES_WITH_BOXES_AND_MASKS_FROM_THE_2026_RELABELLING_WMW.npz"
    )


def _names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}.{i}.attn.proj_drop_path" if i % 3 else f"{prefix}.{i}" for i in range(n)]


def long_view(kind: str, n: int = 24) -> View:
    """Returns a view of `kind` with long model and layer names and many layers (n), drawn from seeded noise."""
    rng = np.random.default_rng(0)
    if kind in ("cka", "ckax"):
        rows, cols = _names("blocks", n), _names("stages.3.blocks", n + 13) if kind == "ckax" else _names("blocks", n)
        models = [LONG_A, LONG_B] if kind == "ckax" else [LONG_A, LONG_A]
        matrix = rng.uniform(0, 1, (len(rows), len(cols)))
        title = f"CKA {LONG_A} (rows) x {LONG_B} (cols)" if kind == "ckax" else f"CKA {LONG_A}"
        return View(
            "cka",
            "cka:x",
            title,
            _subtitle(*dict.fromkeys(models)),
            matrix,
            rows,
            cols,
            "CKA",
            0.0,
            1.0,
            params={"stats": STATS},
            extra={"n_batches": 4},
            models=models,
            ci_low=matrix - 0.05,
            ci_high=matrix + 0.05,
            p_value=rng.uniform(0, 0.06, matrix.shape),
        )
    if kind == "attention":
        blocks, heads, bins = _names("blocks", n), 16, 30
        mean = np.sort(rng.uniform(10, 110, (n, heads)), axis=1)
        counts = np.stack([rng.multinomial(2560 * heads, np.full(bins, 1 / bins)) for _ in range(n)])
        extra = {
            "std_px": rng.uniform(1, 20, (n, heads)),
            "hist_counts": counts,
            "hist_edges": np.linspace(0, 120, bins + 1),
            "uniform_px": 85.3,
        }
        return View(
            "attention",
            "attention:x",
            f"Mean attention distance {LONG_A}",
            _subtitle(LONG_A),
            mean,
            blocks,
            [f"head {h}" for h in range(heads)],
            "distance (px)",
            0.0,
            120.0,
            params={"n_images": 2560},
            extra=extra,
            models=[LONG_A],
            n_images=2560,
        )
    if kind == "probes":
        layers = _names("blocks", n)
        matrix = rng.uniform(0.1, 1.0, (n, 3))
        maps = {layers[-1]: rng.uniform(0, 1, 1 + 14 * 14)}
        extra = {"chance": 0.1, "token_maps": maps, "token_prefix": {layers[-1]: 1}, "grid": [14, 14]}
        return View(
            "probes",
            "probes:x",
            f"Linear probe test accuracy {LONG_A}",
            _subtitle(LONG_A),
            matrix,
            layers,
            ["CLS", "GAP", "tokens (mean)"],
            "accuracy",
            0.0,
            1.0,
            params={"n_train": 2048, "n_test": 512},
            extra=extra,
            models=[LONG_A],
        )
    if kind == "skip":
        rows = [f"blocks.{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}" for i in range(2 * n)]
        cols = ["CLS"] + [f"token {t}" for t in range(196)]
        matrix = rng.uniform(0.5, 40, (len(rows), len(cols)))
        return View(
            "skip",
            "skip:x",
            f"Skip-connection norm ratio ||z||/||f(z)|| {LONG_A}",
            _subtitle(LONG_A),
            matrix,
            rows,
            cols,
            "ratio",
            0.5,
            40.0,
            extra={"cls": matrix[:, 0], "spatial_mean": matrix[:, 1:].mean(1)},
            models=[LONG_A],
        )
    if kind == "spatial":
        g = 14
        tokens = [f"token {i} (row {i // g}, col {i % g})" for i in range(g * g)]
        patches = [f"patch {i}" for i in range(g * g)]
        return View(
            "spatial",
            "spatial:x",
            f"Spatial localisation {LONG_A} blocks.23.attn.proj_drop_path",
            _subtitle(LONG_A),
            rng.uniform(0, 1, (g * g, g * g)),
            tokens,
            patches,
            "CKA",
            0.0,
            1.0,
            extra={"grid": [g, g]},
            models=[LONG_A],
        )
    if kind == "heads":
        n_heads = 12
        rows = [f"blocks.{b}.head.{h}" for b in range(n) for h in range(n_heads)]
        cols = _names("stages.3.blocks", n)
        extra = {
            "distance_px": rng.uniform(5, 110, len(rows)),
            "block": np.repeat(np.arange(n), n_heads),
            "scatter_col": 3,
        }
        return View(
            "heads",
            "heads:x",
            f"Head-level CKA {LONG_A} heads (rows) x {LONG_B} (cols)",
            _subtitle(LONG_A, LONG_B),
            rng.uniform(0, 1, (len(rows), len(cols))),
            rows,
            cols,
            "CKA",
            0.0,
            1.0,
            extra=extra,
            models=[LONG_A, LONG_B],
        )
    if kind == "erf":
        layers = ["patch_embed", "blocks.7.attn.proj_drop_path", "blocks.15.mlp.fc2_with_a_long_name", "norm"]
        maps = {layer: rng.uniform(0, 1, (96, 96)) ** 8 for layer in layers}
        return View(
            "erf",
            "erf:x",
            f"Effective receptive field {LONG_A} {layers[-1]}",
            _subtitle(LONG_A),
            maps["norm"],
            [str(i) for i in range(96)],
            [str(j) for j in range(96)],
            "ERF",
            0.0,
            None,
            params={"layer": "norm"},
            extra={"depth_layers": layers, "depth_maps": maps},
            models=[LONG_A],
        )
    raise KeyError(kind)


FIT_KINDS = ("cka", "ckax", "attention", "probes", "skip", "spatial", "heads", "erf")


def drawn_texts(fig) -> list:
    """Returns every non-empty visible Text the figure draws: figure texts, titles, axis labels, tick labels
    inside the axis's view (matplotlib keeps labels of ticks it does not draw), legends, annotations."""
    from matplotlib.text import Text

    texts = []
    for artist in fig.findobj(Text):
        if not artist.get_visible() or not artist.get_text().strip():
            continue
        texts.append(artist)
    drawn_ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for ticks in (axis.get_major_ticks(), axis.get_minor_ticks()):
                for tick in ticks:
                    if low - 1e-9 <= tick.get_loc() <= high + 1e-9:
                        drawn_ticks.update((id(tick.label1), id(tick.label2)))
    tick_labels = {
        id(t.label1)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for t in axis.get_major_ticks() + axis.get_minor_ticks()
    }
    tick_labels |= {
        id(t.label2)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for t in axis.get_major_ticks() + axis.get_minor_ticks()
    }
    return [t for t in texts if id(t) not in tick_labels or id(t) in drawn_ticks]


def texts_outside(fig) -> list[str]:
    """Returns '<text>: <extent>' for every drawn text whose window extent leaves the figure (1 px slack)."""
    fig.canvas.draw()  # the layout engine places everything at draw time
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for text in drawn_texts(fig):
        extent = text.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.y0 < box.y0 - 1 or extent.x1 > box.x1 + 1 or extent.y1 > box.y1 + 1:
            out.append(
                f"{text.get_text()[:60]!r}: x {extent.x0:.0f}..{extent.x1:.0f}, y {extent.y0:.0f}..{extent.y1:.0f}"
                f" of {box.width:.0f} x {box.height:.0f}"
            )
    return out


@pytest.mark.parametrize("kind", FIT_KINDS)
def test_every_text_of_a_figure_with_long_names_and_many_layers_lies_inside_it(kind):
    view = long_view(kind)
    for selection in (None, (view.matrix.shape[0] - 1, view.matrix.shape[1] - 1)):
        outside = texts_outside(figure_for(view, selection=selection))
        assert not outside, (selection, outside)


@pytest.mark.parametrize("name", VIEWS)
def test_every_text_of_the_stores_figures_lies_inside_them(views, name):
    view = views[name]
    assert not texts_outside(figure_for(view, selection=(view.matrix.shape[0] - 1, 0)))


@pytest.mark.parametrize("kind", ["cka", "ckax", "skip", "heads"])
def test_layer_heatmaps_say_in_their_caption_that_layer_0_is_at_the_bottom(kind):
    fig = figure_for(long_view(kind, n=8))
    (caption,) = with_gid(fig, "caption")
    assert caption.get_text().replace("\n", " ").startswith(ORIENTATION)
    heatmap = axes(fig, "heatmap")
    assert heatmap.images[0].origin == "lower" and heatmap.get_ylim()[0] < heatmap.get_ylim()[1]


@pytest.mark.parametrize("kind", ["attention", "probes", "spatial", "erf"])
def test_figures_without_layer_rows_make_no_orientation_claim(kind):
    assert not any(
        ORIENTATION in t.get_text().replace("\n", " ") for t in drawn_texts(figure_for(long_view(kind, n=8)))
    )


@pytest.mark.parametrize("kind", ["ckax", "skip", "heads"])
def test_layer_tick_labels_of_a_crowded_heatmap_do_not_overlap(kind):
    fig = figure_for(long_view(kind))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = axes(fig, "heatmap")
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        labels = [t.label1 for t in axis.get_major_ticks() if low <= t.get_loc() <= high and t.label1.get_text()]
        extents = [t.get_window_extent(renderer) for t in labels]
        assert len(extents) >= 5
        for a, b in zip(extents, extents[1:]):
            gap = b.y0 - a.y1 if axis is ax.yaxis else b.x0 - a.x1
            assert gap >= 0, (kind, [t.get_text() for t in labels])


def test_wrapped_lines_measure_at_most_the_width_and_keep_every_character():
    fig = figure_for(long_view("probes", n=4))
    renderer = fig.canvas.get_renderer()
    text = f"{LONG_A}: random init (seed 0); {LONG_B}_{LONG_A}_{LONG_B}; 2560 images of WWWWMMMM cifar10:/data/x"
    from matplotlib.font_manager import FontProperties

    for width in (120.0, 300.0):
        lines = wrap_to_width(fig, text, 8, width)
        assert len(lines) > 2
        widths = [
            renderer.get_text_width_height_descent(line, FontProperties(size=8), ismath=False)[0] for line in lines
        ]
        assert max(widths) <= width
        assert "".join(lines).replace(" ", "") == text.replace(" ", "")
    assert wrap_to_width(fig, "short", 8, 300.0) == ["short"]

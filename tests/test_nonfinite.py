"""NaN/Inf in a store: extraction names where they are, every view marks them as non-finite (never "not
computed"), probes skip and name what they cannot fit, and the app draws such a store.

The non-finite values are planted with h5py in a COPY of the shared tiny store, as extraction would have
written them: the activation values and the per-batch counts of the store's `nonfinite` array together.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.store import Store
from vitsee.analyses.views import load_view

CFG = AnalyzeConfig(shuffles=0, batch_size=16)
NAN_ROWS = [5, 6, 7, 8, 9]  # blocks.2 of the ViT, one spatial token each: NaN
INF_ROW = 17  # blocks.2 of the ViT, its CLS token: Inf
RESNET_ROWS = [40, 41]  # layer2.0 of the ResNet: NaN


def _plant(
    f: h5py.File, layers: dict, batch: dict, model: str, layer: str, rows: list[int], index: tuple, value: float
) -> None:
    acts, counts = f[f"models/{model}/acts/{layer}"], f[f"models/{model}/nonfinite"]
    for r in rows:
        x = acts[r]
        x[index] = value
        acts[r] = x
        c = counts[r // batch[model]]
        c[layers[model].index(layer)] += 1
        counts[r // batch[model]] = c


@pytest.fixture(scope="module")
def bad_store(tiny_store, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nonfinite") / "bad.h5"
    shutil.copy(tiny_store, path)
    with Store.open(path) as s:
        layers = {m: s.layers(m) for m in s.models}
        batch = {m: s.batch_size(m) for m in s.models}
    with h5py.File(path, "r+") as f:
        _plant(f, layers, batch, VIT, "blocks.2", NAN_ROWS, (3, 7), np.nan)
        _plant(f, layers, batch, VIT, "blocks.2", [INF_ROW], (0, 1), np.inf)
        _plant(f, layers, batch, RESNET, "layer2.0", RESNET_ROWS, (0, 1, 1), np.nan)
        dist = f[f"models/{VIT}/stats/attention_distance"]
        d = dist[:]
        d[[2, 3], 4, 1] = np.nan  # block 4, head 2: two images
        d[20, 1, 0] = np.inf  # block 1, head 1: one image
        dist[:] = d
        skip = f[f"models/{VIT}/stats/skip_ratio_attn"]
        k = skip[:]
        k[:, 3, 5] = np.nan  # blocks.3.attn, token 4: every image
        skip[:] = k
    return path


# --- extraction ----------------------------------------------------------------------------------------------


def test_row_ranges_compress_runs_and_cut_after_the_limit():
    from vitsee.extraction.writer import row_ranges

    assert row_ranges([5, 6, 7, 8, 9, 17]) == "5-9, 17"
    assert row_ranges([0, 2, 4, 6, 7], limit=2) == "0, 2 and 3 more"


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_extraction_ends_with_one_line_naming_the_layers_and_rows_with_nonfinite_values(
    tmp_path, capsys, monkeypatch, quiet
):
    """--quiet drops the progress bars, not the warnings about the data (fp16 loss, non-finite values)."""
    from vitsee.extraction import extract

    monkeypatch.setattr(extract, "fp16_note", lambda key, loss: f"{key}: float16 storage rounds away up to 2.0e-03")

    forward = extract._forward

    def overflowing(mp, x):  # as fp16 overflow would: Inf in blocks.1 of images 5-9 and 17 (batches of 8)
        acts, stats = forward(mp, x)
        first = overflowing.batch * 8
        overflowing.batch += 1
        planted = acts["blocks.1"].clone()  # the recorder's tensor is an inference tensor: change a copy
        for r in [5, 6, 7, 8, 9, 17]:
            if first <= r < first + len(x):
                planted[r - first, 2, 0] = float("inf")
        return {**acts, "blocks.1": planted}, stats

    overflowing.batch = 0
    monkeypatch.setattr(extract, "_forward", overflowing)
    store = tmp_path / "overflow.h5"
    code, _, err = run_cli(
        [
            "extract",
            store,
            "-m",
            VIT,
            "--dataset",
            "synthetic",
            "-n",
            24,
            "--batch-size",
            8,
            "--img-size",
            IMG,
            "--device",
            "cpu",
            "--workers",
            0,
            *quiet,
        ],
        capsys,
    )
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: non-finite")]
    assert len(warnings) == 1
    assert [line for line in err.splitlines() if "float16 storage" in line] == [
        f"warning: {VIT}: float16 storage rounds away up to 2.0e-03"
    ]
    if quiet:
        assert err.splitlines() == [line for line in err.splitlines() if line.startswith("warning: ")], err
    assert f"{VIT} layer(s) blocks.1 in 6 image(s) (store rows 5-9, 17)" in warnings[0]
    assert f"vitsee info {store}" in warnings[0]
    with Store.open(store) as s:  # the store's counts say the same, per layer
        counts = s.nonfinite_counts(VIT)
    assert counts["blocks.1"] == 6 and sum(counts.values()) == 6
    code, out, _ = run_cli(["info", store], capsys)
    assert code == 0 and any(line.split()[:1] == ["blocks.1"] and line.split()[-1] == "6" for line in out.splitlines())


# --- views ---------------------------------------------------------------------------------------------------


def test_cka_marks_the_cells_of_a_nonfinite_layer_and_keeps_the_others_exact(bad_store, tiny_store, tmp_path, capsys):
    out = tmp_path / "cka.json"
    code, _, err = run_cli(
        ["export", bad_store, f"cka:{VIT}", "--out", out, "--shuffles", 0, "--batch-size", 16], capsys
    )
    assert code == 0, err
    data = json.loads(out.read_text())
    bad = data["rows"].index("blocks.2")
    values = np.array(data["values"], dtype=float)  # null -> nan
    assert np.isnan(values[bad]).all() and np.isnan(values[:, bad]).all()
    marked = {(c["row"], c["col"]): c["images"] for c in data["nonfinite"]}
    n = len(data["rows"])
    assert set(marked) == {(bad, j) for j in range(n)} | {(i, bad) for i in range(n)}
    assert set(marked.values()) == {len(NAN_ROWS) + 1}  # rows 5-9 and 17
    clean = load_view(_clean(tiny_store, tmp_path), f"cka:{VIT}", CFG)
    keep = [i for i in range(n) if i != bad]
    assert np.array_equal(values[np.ix_(keep, keep)], clean.matrix[np.ix_(keep, keep)])


def _clean(tiny_store: Path, tmp_path: Path) -> Path:
    path = tmp_path / "clean.h5"
    shutil.copy(tiny_store, path)
    return path


def test_cka_across_models_counts_the_images_of_either_layer(bad_store):
    view = load_view(bad_store, f"cka:{VIT}:{RESNET}", CFG)
    r, c = view.rows.index("blocks.2"), view.cols.index("layer2.0")
    assert view.cell_text(r, c) == "non-finite (8 of 48 images)"  # 6 of the ViT's, 2 of the ResNet's
    assert view.cell_text(0, c) == "non-finite (2 of 48 images)"
    assert np.isfinite(view.matrix[0, 0]) and not view.is_nonfinite(0, 0)


def test_show_says_non_finite_never_nan_or_not_computed(bad_store, capsys):
    for spec in (f"cka:{VIT}", f"attention:{VIT}", f"skip:{VIT}", f"spatial:{VIT}:blocks.2"):
        code, out, err = run_cli(
            ["show", bad_store, spec, "--color", "none", "--shuffles", 0, "--batch-size", 16], capsys
        )
        assert code == 0, err
        assert "nan" not in out.lower().replace("nan/inf", "") and "not computed" not in out
        if not spec.startswith("spatial"):  # the default token's map is finite there
            assert "non-finite" in out
    code, out, _ = run_cli(["show", bad_store, f"attention:{VIT}", "--color", "none"], capsys)
    assert "non-finite (2/48)" in out and "non-finite (1/48)" in out


def test_attention_export_lists_the_heads_with_nonfinite_distances(bad_store, tmp_path, capsys):
    out = tmp_path / "attention.json"
    code, _, err = run_cli(["export", bad_store, f"attention:{VIT}", "--out", out], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    marked = {(c["row_label"], c["images"]) for c in data["nonfinite"]}
    assert marked == {("blocks.4", 2), ("blocks.1", 1)}
    for c in data["nonfinite"]:
        assert data["values"][c["row"]][c["col"]] is None
    with Store.open(bad_store) as s:  # every other head: the plain mean over images
        dist = s.attention_distance(VIT).astype(np.float64)
    order = np.array(data["head_order"])
    expected = np.take_along_axis(dist.mean(axis=0), order, axis=1)
    got = np.array(data["values"], dtype=float)
    finite = np.isfinite(got)
    assert finite.sum() == got.size - 2 and np.allclose(got[finite], expected[finite], rtol=0, atol=1e-9)


def test_skip_marks_a_cell_with_no_finite_ratio_as_nonfinite(bad_store):
    view = load_view(bad_store, f"skip:{VIT}", CFG)
    r, c = view.rows.index("blocks.3.attn"), view.cols.index("token 4")
    assert view.cell_text(r, c) == "non-finite (48 of 48 images)"
    assert view.nonfinite.sum() == 1


def test_probes_skip_and_name_the_readouts_with_nonfinite_features(bad_store, tiny_store, tmp_path, capsys):
    view = load_view(bad_store, f"probes:{VIT}", CFG)
    skipped = {(s["layer"], s["readout"]): s["images"] for s in view.extra["skipped"]}
    assert skipped == {("blocks.2", "CLS"): 1, ("blocks.2", "GAP"): len(NAN_ROWS), ("blocks.2", "tokens (mean)"): 6}
    clean = load_view(_clean(tiny_store, tmp_path), f"probes:{VIT}", CFG)
    keep = [i for i, layer in enumerate(view.rows) if layer != "blocks.2"]
    assert np.array_equal(view.matrix[keep], clean.matrix[keep], equal_nan=True)  # the rest are fitted as before
    code, out, err = run_cli(["show", bad_store, f"probes:{VIT}", "--color", "none"], capsys)
    assert code == 0, err
    assert "skipped" in out and "not fitted, their features hold NaN/Inf: blocks.2 CLS (1 of 48 images)" in out


def test_png_export_of_a_nonfinite_cka_paints_those_cells(bad_store, tmp_path):
    from vitsee.output.figures import figure_for

    view = load_view(bad_store, f"cka:{VIT}", CFG)
    fig = figure_for(view)
    overlay = [im for ax in fig.axes for im in ax.images if im.get_gid() == "nonfinite"]
    assert len(overlay) == 1 and (~overlay[0].get_array().mask).sum() == view.nonfinite.sum()
    assert any(t.get_gid() == "nonfinite-note" and "blocks.2" in t.get_text() for t in fig.texts)


# --- the app -------------------------------------------------------------------------------------------------


from helpers.app import SIZE, make_app, settle, status, view_shown  # noqa: E402  (the app's helpers)


async def test_the_app_draws_the_attention_and_cka_views_of_a_nonfinite_store(bad_store, tmp_path):
    path = tmp_path / "bad.h5"
    shutil.copy(bad_store, path)
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"), timeout=120)
        await pilot.press("down", "down", "down")  # blocks.2
        await settle(pilot)
        assert "blocks.2 x maxpool  CKA non-finite (6 of 48 images)" in status(app)  # opens on ViT x ResNet
        await pilot.press("2")
        await settle(pilot, view_shown("attention"), timeout=60)
        await pilot.press("down", "down", "down", "down", "right")  # blocks.4, the farther head: NaN in 2 images
        await settle(pilot)
        assert "distance non-finite (2 of 48 images)" in status(app)
        plot = app.screen.query_one("#attention-plot")
        assert "\u00d7" in str(plot.render())  # the head is drawn, as a cross at the right end
        assert app.is_running


async def test_after_a_failed_open_the_view_keys_keep_the_error(tmp_path):
    path = tmp_path / "broken.h5"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for key in "12345":
            await pilot.press(key)
            await settle(pilot)
            assert "not a readable vitsee store" in status(app)
            assert "no models in this store" not in status(app)


async def test_a_store_being_extracted_refreshes_as_rows_finish(bad_store, tmp_path, monkeypatch):
    from vitsee.tui.screens.explorer import ExplorerScreen

    monkeypatch.setattr(ExplorerScreen, "POLL_SECONDS", 0.2)
    path = tmp_path / "live.h5"
    shutil.copy(bad_store, path)
    with h5py.File(path, "r+") as f:  # as if the extraction were writing its last two batches
        f[f"models/{VIT}/done"][1:] = 0
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "extraction incomplete: 16 of 48 images" in status(app)
        _finish_batch(path, 1)
        await settle(pilot, lambda app: "32 of 48" in status(app), timeout=20, idle=False)
        _finish_batch(path, 2)
        await settle(pilot, view_shown("cka"), timeout=120, idle=False)
        assert "incomplete" not in status(app)


def _finish_batch(path, batch: int) -> None:
    """Marks a batch done from another process, as the extraction writing the store would (HDF5 refuses a
    second, read-write open of a file this process has open to read)."""
    import subprocess
    import sys

    code = (
        f"import h5py\nwith h5py.File({str(path)!r}, 'r+', locking=False) as f:\n"
        f"    f['models/{VIT}/done'][{batch}] = 1\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("delay", [0.0, 1.0])
async def test_q_then_o_quits_without_a_traceback(tiny_store, tmp_path, delay):
    from textual import events

    app = make_app(_clean(tiny_store, tmp_path), tmp_path)  # a copy: the app caches what it computes
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(delay)  # at start-up (panes still filling) and once the view is up
        app.post_message(events.Key("q", "q"))  # both queued before the first is handled, as a fast typist's are
        app.post_message(events.Key("o", "o"))
        await pilot.pause(0.5)
    assert app.return_code == 0 and app._exception is None


async def test_the_spatial_token_detail_says_non_finite_never_not_computed(bad_store, tmp_path):
    """blocks.2 of the ViT holds NaN in one spatial token of images 5-9: its map's cells are non-finite."""
    from vitsee.tui.results import LoadedView
    from vitsee.tui.screens.view_detail import spatial_token_detail

    path = tmp_path / "bad.h5"
    shutil.copy(bad_store, path)
    view = load_view(path, f"spatial:{VIT}:blocks.2", AnalyzeConfig(shuffles=0, batch_size=16, ci=0))
    assert view.nonfinite is not None and view.nonfinite.any()
    token, patch = (int(i[0]) for i in np.nonzero(view.nonfinite))
    gh, gw = view.extra["grid"]
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"), timeout=120)
        app.push_screen(spatial_token_detail(LoadedView(view.spec, view, False, 0.0, {}), token, (gh, gw)))
        await settle(pilot)
        heatmap = app.screen.query_one("#detail-map")
        text = heatmap.describe(patch // gw, patch % gw)
        assert text.startswith("non-finite (") and "of 48 images" in text

"""`extract --streaming --heads`: head-level CKA (paper Fig. 5) accumulated straight from the forward pass, the same
numbers as extracting the head outputs first and running `analyze --heads` after, found by show / export / the app."""

from __future__ import annotations

import json
import re
import shutil
import threading
from dataclasses import replace

import h5py
import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from helpers.reference import reference_cka
from vitsee.analyses.heads import run_heads
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.errors import VitseeError
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.store import Store

BATCH = 16
ROWS = [f"blocks.{b}.head.{h}" for b in range(6) for h in range(2)]  # test_vit: 6 blocks of 2 heads
# the stored and the streamed run feed the estimator the same fp16 values in the same batches, so only the order of
# the fp64 sums could differ: 1e-6 (fp32 rounding of the Grams) bounds that with room; measured: 0.0
TOLERANCE = 1e-6


def _config(path, **kw) -> ExtractConfig:
    """The run of conftest's tiny_store (48 synthetic images, batches of 16), streamed with head-level CKA."""
    return ExtractConfig(
        store=path,
        models=[VIT, RESNET],
        dataset="synthetic",
        n_images=48,
        batch_size=BATCH,
        img_size=IMG,
        device="cpu",
        workers=0,
        streaming=True,
        heads=True,
        **kw,
    )


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    path = tmp_path_factory.mktemp("streamed_heads") / "streamed.h5"
    run_extraction(_config(path))
    return path


@pytest.fixture(scope="module")
def analyzed(tiny_store, tmp_path_factory):
    """`analyze --heads --batch-size 16 --shuffles 0` on a copy of conftest's store of the same run."""
    path = shutil.copy(tiny_store, tmp_path_factory.mktemp("analyzed") / "analyzed.h5")
    with Store.writer(path) as s:
        return run_heads(s, VIT, RESNET, AnalyzeConfig(batch_size=BATCH, shuffles=0, device="cpu"))


def _streamed_result(path) -> dict:
    with Store.open(path) as s:
        [entry] = s.results("heads")
        return s.get_result("heads", entry["params"])


def test_streamed_head_cka_equals_analyze_heads_on_the_stored_run(streamed, analyzed):
    result = _streamed_result(streamed)
    assert result["_params"] == analyzed.params  # the same cache key: views and the app find it like an analyzed one
    assert result["_params"]["batch_size"] == BATCH and result["_params"]["shuffles"] == 0
    assert result["cka"].shape == (12, 5)
    np.testing.assert_allclose(result["cka"], analyzed["cka"], rtol=0, atol=TOLERANCE)
    for name in ("rows", "cols", "block", "head", "distance_px", "shuffle_std"):
        np.testing.assert_array_equal(result[name], analyzed[name], err_msg=name)
    assert list(result["rows"]) == ROWS and np.all(result["distance_px"] > 0)


def test_streamed_head_cka_matches_a_per_head_numpy_reference(streamed, tiny_store):
    """Each head (spatial tokens x head_dim, flattened per image) against each ResNet layer, by the explicit
    unbiased-HSIC formula in fp64 over the batches of 16 in store order, from the values the stored run kept."""
    result = _streamed_result(streamed)
    with Store.open(tiny_store) as s:
        layers = s.layers(RESNET)
        other = [s.activations(RESNET, layer).reshape(48, -1).astype(np.float64) for layer in layers]
        heads = [
            s.head_outputs(VIT, f"blocks.{b}")[:, h].reshape(48, -1).astype(np.float64)
            for b in range(6)
            for h in range(2)
        ]
    batches = [np.arange(start, start + BATCH) for start in range(0, 48, BATCH)]
    for r, x in enumerate(heads):
        for c, y in enumerate(other):
            assert result["cka"][r, c] == pytest.approx(reference_cka(x, y, batches), abs=TOLERANCE), (
                ROWS[r],
                layers[c],
            )


def test_streaming_heads_keeps_no_head_outputs_and_costs_no_disk(streamed, tmp_path, capsys):
    from vitsee.extraction.plan import estimate

    code, out, _ = run_cli(["info", streamed], capsys)
    assert code == 0 and "statistics and CKA and head-level CKA from the forward pass only" in out

    with h5py.File(streamed, "r", locking=False) as f:
        assert "heads" not in f[f"models/{VIT}"] and "acts" not in f[f"models/{VIT}"]
        assert f[f"streaming/heads/{VIT}"].shape == (
            2,
            (12 + 5) ** 2 + 1,
        )  # the accumulator's two slots, nothing per image
    cfg = _config(tmp_path / "e.h5")
    assert estimate(cfg).total_bytes == estimate(replace(cfg, heads=False)).total_bytes


def test_show_export_and_analyze_read_the_streamed_head_cka(streamed, tmp_path, capsys):
    result = _streamed_result(streamed)
    code, _, err = run_cli(
        ["analyze", streamed, "--heads", "--quiet"], capsys
    )  # no estimator asked for: the streamed one
    assert code == 0, err
    code, out, err = run_cli(["show", streamed, f"heads:{VIT}:{RESNET}"], capsys)
    assert code == 0, err
    assert "blocks.5.head.1" in out
    code, _, err = run_cli(["export", streamed, f"heads:{VIT}:{RESNET}", "--out", tmp_path / "h.json"], capsys)
    assert code == 0, err
    exported = json.loads((tmp_path / "h.json").read_text())
    np.testing.assert_allclose(np.array(exported["values"]), result["cka"], rtol=1e-12)
    np.testing.assert_allclose(exported["distance_px"], result["distance_px"], rtol=1e-12)
    assert exported["params"]["shuffles"] == 0 and exported["params"]["batch_size"] == BATCH
    with Store.open(streamed) as s:
        assert len(s.results("heads")) == 1  # nothing was computed again


def test_a_resnet_of_a_streamed_heads_store_has_no_heads_of_its_own(streamed, capsys):
    code, _, err = run_cli(["show", streamed, f"heads:{RESNET}:{VIT}"], capsys)
    assert code == 2 and f"{RESNET} has no stored head outputs" in err and "ViT-like" in err


def test_other_estimator_settings_on_a_streamed_store_name_the_streamed_ones(streamed, capsys):
    code, _, err = run_cli(["analyze", streamed, "--heads", "--batch-size", "8", "--quiet"], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "--batch-size 16 --shuffles 0" in err and "re-extract without --streaming" in err


def test_the_terminal_app_reads_the_streamed_head_cka_from_the_cache(streamed):
    from vitsee.tui.results import read_summary, read_view

    assert read_summary(streamed).model(VIT).reason("heads") is None
    loaded = read_view(streamed, f"heads:{VIT}:{RESNET}", AnalyzeConfig())
    assert not loaded.computed
    np.testing.assert_array_equal(loaded.view.matrix, _streamed_result(streamed)["cka"])
    assert loaded.view.rows == ROWS


async def test_heads_view_of_a_streamed_store_names_head_distance_and_cka(streamed, tmp_path):
    from helpers.app import SIZE, make_app, settle, status, view_shown

    app = make_app(streamed, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("6")
        await settle(pilot, view_shown("heads"))
        pane = app.screen.pane("heads")
        assert pane.loaded.spec == f"heads:{VIT}:{RESNET}" and not pane.loaded.computed
        view = pane.view
        col = int(view.extra["scatter_col"])
        line = status(app)
        assert re.fullmatch(
            rf"blocks\.0\.head\.0  distance \d+\.\d px  CKA vs {re.escape(view.cols[col])} -?\d\.\d\d", line
        ), line
        assert f"{view.extra['distance_px'][0]:.1f} px" in line and f"{view.matrix[0, col]:.2f}" in line


def test_an_interrupted_streaming_heads_run_resumes_to_the_uninterrupted_result(streamed, tmp_path):
    path = tmp_path / "interrupted.h5"
    cancel = threading.Event()

    def stop_after_two_batches(event):
        if event.stage == "extract" and event.done >= 2 * BATCH:
            cancel.set()

    assert run_extraction(_config(path), progress=stop_after_two_batches, cancel=cancel).cancelled
    with Store.open(path) as s:
        assert s.rows_done(VIT) == 2 * BATCH and not s.results("heads")
    run_extraction(replace(_config(path), heads=False))  # the store decides: it accumulates heads, so it goes on
    np.testing.assert_array_equal(_streamed_result(path)["cka"], _streamed_result(streamed)["cka"])


def _one_line_error(args, capsys) -> str:
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


RUN = [
    "--dataset",
    "synthetic",
    "-n",
    "8",
    "--batch-size",
    "8",
    "--img-size",
    str(IMG),
    "--device",
    "cpu",
    "--workers",
    "0",
    "--quiet",
]


def test_streaming_heads_with_one_model_or_none_with_attention_is_one_line(tmp_path, capsys):
    err = _one_line_error(["extract", tmp_path / "one.h5", "-m", VIT, "--streaming", "--heads", *RUN], capsys)
    assert "has one model (test_vit@random:0)" in err and "add --model NAME" in err
    err = _one_line_error(
        ["extract", tmp_path / "cnn.h5", "-m", RESNET, "-m", "test_resnet@random:1", "--streaming", "--heads", *RUN],
        capsys,
    )
    assert "has attention heads" in err and "test_resnet@random:1" in err and "leave out --heads" in err
    assert not (tmp_path / "one.h5").exists() and not (tmp_path / "cnn.h5").exists()


def test_a_stream_without_heads_says_how_to_get_them(tmp_path, capsys):
    path = tmp_path / "plain.h5"
    code, _, err = run_cli(["extract", path, "-m", VIT, "-m", RESNET, "--streaming", *RUN], capsys)
    assert code == 0, err
    err = _one_line_error(["analyze", path, "--heads", "--quiet"], capsys)
    assert "without --heads" in err and "--streaming --heads" in err
    err = _one_line_error(["extract", path, "-m", VIT, "-m", RESNET, "--streaming", "--heads", *RUN], capsys)
    assert "streamed without --heads" in err and "--overwrite" in err
    with Store.open(path) as s:
        assert s.complete and not s.results("heads") and s.results("cka")  # what was written is still there
    with Store.open(path) as s, pytest.raises(VitseeError, match="head outputs cannot be read"):
        s.head_outputs(VIT, "blocks.0")

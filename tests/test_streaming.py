"""`extract --streaming`: CKA and statistics straight from the forward pass, no activations stored, the
same numbers as extracting first and analysing after."""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import replace

import h5py
import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from vitsee.analyses import driver as an
from vitsee.analyses.cka import run_cka
from vitsee.errors import VitseeError
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.store import Store

BATCH = 16


def _config(path, **kw) -> ExtractConfig:
    """The run of conftest's tiny_store (48 synthetic images, batches of 16), streamed."""
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
        **kw,
    )


@pytest.fixture(scope="module")
def stored(tiny_store, tmp_path_factory):
    """A copy of conftest's store of the same run: results cached here stay out of other modules' way."""
    return shutil.copy(tiny_store, tmp_path_factory.mktemp("stored") / "stored.h5")


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    path = tmp_path_factory.mktemp("streaming") / "streamed.h5"
    run_extraction(_config(path))
    return path


def _cka(path, **params):
    with Store.open(path) as s:
        [result] = [r for r in s.results("cka") if all(r["params"][k] == v for k, v in params.items())]
        return s.get_result("cka", result["params"])


def test_streamed_cka_equals_analyze_in_store_order_with_the_same_batch_size(streamed, stored):
    with Store.writer(stored) as s:
        stored = run_cka(s, an.AnalyzeConfig(batch_size=BATCH, shuffles=0, device="cpu", ci=0, permutations=0))
    result = _cka(streamed)
    assert result["_params"] == stored.params  # same key: views and the app find it like any cached CKA
    np.testing.assert_array_equal(result["matrix"], stored["matrix"])
    assert result["matrix"].shape == (13, 13) and abs(result["matrix"][0, 0] - 1) < 1e-12


def test_streamed_statistics_equal_the_stored_run(streamed, stored):
    with Store.open(streamed) as a, Store.open(stored) as b:
        for model in (VIT, RESNET):
            assert a.stats(model) == b.stats(model)
            for name in a.stats(model):
                np.testing.assert_array_equal(a.stat(model, name), b.stat(model, name), err_msg=name)
            assert a.layers(model) == b.layers(model)
            assert [a.layer_shape(model, x) for x in a.layers(model)] == [
                b.layer_shape(model, x) for x in b.layers(model)
            ]


def test_streaming_store_keeps_no_activations_and_says_so(streamed, capsys):
    with h5py.File(streamed, "r", locking=False) as f:
        assert "acts" not in f[f"models/{VIT}"] and "input" not in f[f"models/{VIT}"]
    code, out, _ = run_cli(["info", streamed], capsys)
    assert code == 0 and "streaming: activations not stored" in out
    with Store.open(streamed) as s:
        assert s.streaming and s.complete
        assert an.applicable(s, VIT) == ["attention", "skip"]
        with pytest.raises(VitseeError, match="re-extract without --streaming"):
            s.activations(VIT, "blocks.0")


@pytest.mark.parametrize(
    "args", [["--probes"], ["--spatial"], ["--cka", "--shuffles", "2"], ["--cka", "--batch-size", "8"]]
)
def test_what_needs_activations_names_the_way_out(streamed, capsys, args):
    code, _, err = run_cli(["analyze", streamed, *args, "--quiet"], capsys)
    assert code != 0 and "Traceback" not in err
    assert "was extracted with --streaming" in err and "re-extract without --streaming" in err


def test_export_and_analyze_read_the_streamed_cka(streamed, tmp_path, capsys):
    code, _, err = run_cli(["analyze", streamed, "--quiet"], capsys)  # no estimator asked for: the streamed one
    assert code == 0, err
    code, _, err = run_cli(["export", streamed, f"cka:{VIT}:{RESNET}", "--out", tmp_path / "x.json"], capsys)
    assert code == 0, err
    exported = json.loads((tmp_path / "x.json").read_text())
    matrix = _cka(streamed)["matrix"]
    np.testing.assert_allclose(np.array(exported["values"]), matrix[:8, 8:], rtol=1e-12)
    assert exported["params"]["shuffles"] == 0 and exported["params"]["batch_size"] == BATCH


def test_interrupted_streaming_run_resumes_to_the_uninterrupted_result(streamed, tmp_path):
    path = tmp_path / "interrupted.h5"
    cancel = threading.Event()

    def stop_after_two_batches(event):
        if event.stage == "extract" and event.done >= 2 * BATCH:
            cancel.set()

    first = run_extraction(_config(path), progress=stop_after_two_batches, cancel=cancel)
    assert first.cancelled
    with Store.open(path) as s:
        assert not s.complete and s.rows_done(VIT) == 2 * BATCH and not s.results("cka")
    run_extraction(_config(path))
    np.testing.assert_array_equal(_cka(path)["matrix"], _cka(streamed)["matrix"])


def test_a_streaming_store_resumes_only_as_the_same_streaming_run(streamed, stored):
    with pytest.raises(VitseeError, match="add --streaming to resume"):
        run_extraction(replace(_config(streamed), streaming=False))
    with pytest.raises(VitseeError, match="cannot take other models"):
        run_extraction(replace(_config(streamed), models=[VIT]))
    with pytest.raises(VitseeError, match="already holds activations"):
        run_extraction(_config(stored))


def test_the_terminal_app_reads_the_streamed_cka_from_the_cache(streamed):
    from vitsee.tui.results import read_view

    loaded = read_view(streamed, f"cka:{VIT}:{RESNET}", an.AnalyzeConfig())
    assert not loaded.computed
    np.testing.assert_array_equal(loaded.view.matrix, _cka(streamed)["matrix"][:8, 8:])


@pytest.mark.parametrize("view", ["cka:test_vit", "cka:test_vit:test_resnet"])
def test_device_on_show_of_a_streaming_store_reads_the_streamed_cka(streamed, capsys, view):
    code, out, err = run_cli(["show", streamed, view, "--device", "cpu", "--format", "json"], capsys)
    assert code == 0, err
    assert '"batch_size"' in out

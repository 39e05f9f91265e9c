"""Store-level analyses: the numbers match the pure cores on the store's own arrays, and results are cached."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from vitsee.analyses import driver as an
from vitsee.analyses.cka import cka_block, cka_params, run_cka
from vitsee.analyses.probes import run_probes
from vitsee.analyses import cka as cka_mod
from vitsee.analyses.cka import minibatch_cka
from vitsee.errors import VitseeError
from vitsee.analyses.ridge import ridge_probe
from vitsee.store import Store
from vitsee.analyses.views import load_view

CFG = an.AnalyzeConfig(batch_size=16, shuffles=0, device="cpu")


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    """A copy of the tiny store that the analyses here may write their caches into."""
    path = tmp_path_factory.mktemp("analyze") / "tiny.h5"
    shutil.copy(tiny_store, path)
    return path


def _acts(path, model):
    with Store.open(path) as s:
        return [s.activations(model, layer) for layer in s.layers(model)]


def test_analyze_then_export_json_matches_minibatch_cka_on_the_store(store, tmp_path, capsys):
    code, _, err = run_cli(["analyze", store, "--cka", "--shuffles", "0", "--batch-size", "16", "--quiet"], capsys)
    assert code == 0, err
    out = tmp_path / "cross.json"
    code, _, err = run_cli(
        ["export", store, "cka:test_vit:test_resnet", "--out", out, "--shuffles", "0", "--batch-size", "16"], capsys
    )
    assert code == 0, err
    exported = json.loads(out.read_text())
    vit, resnet = _acts(store, VIT), _acts(store, RESNET)
    expected = minibatch_cka(vit, resnet, batch_size=16)
    assert exported["view"] == "cka" and exported["model_a"] == VIT and exported["model_b"] == RESNET
    assert exported["rows"][0] == "patch_embed" and exported["cols"][-1] == "layer4.0"
    np.testing.assert_allclose(np.array(exported["values"]), expected, rtol=0, atol=1e-9)
    assert exported["params"]["batch_size"] == 16 and exported["params"]["shuffles"] == 0

    within = tmp_path / "within.json"
    run_cli(["export", store, f"cka:{VIT}", "--out", within, "--shuffles", "0", "--batch-size", "16"], capsys)
    values = np.array(json.loads(within.read_text())["values"])
    np.testing.assert_allclose(values, minibatch_cka(vit, batch_size=16), atol=1e-9)
    np.testing.assert_allclose(np.diag(values), 1.0, atol=1e-9)


def test_shuffles_average_seeded_permutations(store):
    cfg = an.AnalyzeConfig(batch_size=16, shuffles=2, seed=3, device="cpu")
    with Store.writer(store) as s:
        result = run_cka(s, cfg)
        matrix, _, _ = cka_block(result, VIT, VIT)
    vit = _acts(store, VIT)
    expected = np.mean(
        [
            minibatch_cka([a[np.random.default_rng([3, k]).permutation(48)] for a in vit], batch_size=16)
            for k in range(2)
        ],
        axis=0,
    )
    np.testing.assert_allclose(matrix, expected, atol=1e-9)


def test_a_second_run_returns_the_cache_and_recompute_does_not(store, monkeypatch):
    with Store.writer(store) as s:
        first = run_cka(s, CFG)
    monkeypatch.setattr(cka_mod, "compute_cka", lambda *a, **k: pytest.fail("computed although cached"))
    with Store.writer(store) as s:
        again = run_cka(s, CFG)
        np.testing.assert_array_equal(again["matrix"], first["matrix"])
        with pytest.raises(BaseException, match="computed although cached"):
            run_cka(s, an.AnalyzeConfig(batch_size=16, shuffles=0, recompute=True))
        other = cka_params(s, an.AnalyzeConfig(batch_size=8, shuffles=0))
        assert s.get_result("cka", other) is None  # other parameters are another cache entry


def test_spatial_maps_of_a_random_init_vit_peak_on_the_tokens_own_patch(store):
    view = load_view(store, f"spatial:{VIT}", CFG)
    assert view.matrix.shape == (16, 16) and view.extra["grid"] == [4, 4]
    assert view.params["layer"] == "blocks.5"
    assert list(view.matrix.argmax(axis=1)) == list(range(16))


def test_spatial_map_is_cka_of_token_and_pixels(store):
    view = load_view(store, f"spatial:{VIT}:blocks.2", CFG)
    with Store.open(store) as s:
        acts = s.activations(VIT, "blocks.2")  # (N, 17, 64)
        pixels = s.model_input(VIT)  # (N, 3, 64, 64)
    token, patch = 5, 9  # token r1c1 against patch r2c1
    r, c = divmod(patch, 4)
    pix = pixels[:, :, r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16]
    expected = minibatch_cka([acts[:, 1 + token]], [pix], batch_size=16)[0, 0]
    assert view.matrix[token, patch] == pytest.approx(expected, abs=1e-9)


def test_attention_summary_is_sorted_means_over_images(store):
    view = load_view(store, f"attention:{VIT}", CFG)
    with Store.open(store) as s:
        dist = s.attention_distance(VIT)
    np.testing.assert_allclose(view.matrix, np.sort(dist.mean(axis=0), axis=1), rtol=1e-6)
    assert view.extra["uniform_px"] == pytest.approx(
        np.mean([np.hypot(i // 4 - j // 4, i % 4 - j % 4) * 16 for i in range(16) for j in range(16)])
    )
    counts = np.asarray(view.extra["hist_counts"])
    assert counts.shape[0] == 6 and counts.sum(axis=1).tolist() == [48 * 2] * 6


def test_skip_summary_is_the_mean_over_images(store):
    view = load_view(store, f"skip:{VIT}", CFG)
    with Store.open(store) as s:
        attn = s.stat(VIT, "skip_ratio_attn")
        mlp = s.stat(VIT, "skip_ratio_mlp")
    assert view.rows[:2] == ["blocks.0.attn", "blocks.0.mlp"] and view.cols[:2] == ["CLS", "token 0"]
    np.testing.assert_allclose(view.matrix[0], attn[:, 0].mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(view.matrix[3], mlp[:, 1].mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(view.extra["cls"], view.matrix[:, 0])
    np.testing.assert_allclose(view.extra["spatial_mean"], view.matrix[:, 1:].mean(axis=1))


def test_probe_table_agrees_with_a_direct_ridge_probe(store):
    with Store.writer(store) as s:
        result = run_probes(s, VIT, CFG)
        labels = s.labels
        acts = s.activations(VIT, "blocks.3")
    layers = [str(x) for x in result["layers"]]
    li = layers.index("blocks.3")
    train, test = result["split_train"], result["split_test"]
    assert len(set(train) & set(test)) == 0 and len(train) + len(test) == 48
    gap = acts[:, 1:].mean(axis=1)
    expected = ridge_probe(gap[train], labels[train], gap[test], labels[test], float(result["l2"][li, 1]))
    assert result["accuracy"][li, 1] == pytest.approx(expected)
    cls = acts[:, 0]
    expected_cls = ridge_probe(cls[train], labels[train], cls[test], labels[test], float(result["l2"][li, 0]))
    assert result["accuracy"][li, 0] == pytest.approx(expected_cls)
    assert np.isnan(result["accuracy"][0, 0])  # patch_embed has no CLS token
    assert result["tokens/blocks.3"].shape == (17,)


def test_layers_wider_than_probe_max_dim_get_no_token_maps_and_the_table_says_so(tiny_store, tmp_path, capsys):
    store = tmp_path / "probes.h5"  # a copy with no probes cached yet
    shutil.copy(tiny_store, store)
    code, _, err = run_cli(["analyze", store, "--probes", "--probe-max-dim", "32", "--quiet"], capsys)
    assert code == 0, err
    with Store.open(store) as s:
        narrow = [r for r in s.results("probes") if r["params"]["max_token_dim"] == 32 and r["params"]["model"] == VIT]
        width = s.layer_shape(VIT, "blocks.0")[-1]
        layers = s.layers(VIT)
    assert width > 32 and len(narrow) == 1
    view = load_view(store, f"probes:{VIT}")  # no estimator options: any cached probes of this model serve
    assert view.params["max_token_dim"] == 32 and not view.extra["token_maps"]
    assert view.extra["tokens_too_wide"] == layers  # every layer has tokens, each wider than 32
    assert view.cols == ["CLS", "GAP"]  # no token column at all
    code, out, _ = run_cli(["show", store, f"probes:{VIT}", "--color", "none"], capsys)
    assert code == 0
    assert f"no per-token maps for {len(layers)} layer(s) wider than 32 channels" in " ".join(out.split())
    code, _, err = run_cli(["analyze", store, "--probes", "--quiet"], capsys)  # the default width takes them all
    assert code == 0, err
    for _ in range(2):  # the widest result serves, even when a narrower one is made after it
        view = load_view(store, f"probes:{VIT}")
        assert view.params["max_token_dim"] == 1024 and view.extra["tokens_too_wide"] == []
        assert sorted(view.extra["token_maps"]) == sorted(layers) and view.cols[-1] == "tokens (mean)"
        code, _, err = run_cli(["analyze", store, "--probes", "--probe-max-dim", "16", "--quiet"], capsys)
        assert code == 0, err


def test_probes_without_labels_are_a_clear_error_and_nothing_else_is(tmp_path, capsys):
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    images = np.random.default_rng(0).integers(0, 256, size=(12, 20, 20, 3), dtype=np.uint8)
    np.savez(tmp_path / "unlabelled.npz", images=images)
    path = tmp_path / "nolabels.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[VIT],
            dataset=str(tmp_path / "unlabelled.npz"),
            batch_size=6,
            img_size=IMG,
            device="cpu",
            workers=0,
        )
    )
    code, _, err = run_cli(["analyze", path, "--probes", "--quiet"], capsys)
    assert code == 2 and "has no labels" in err and "labelled dataset" in err
    code, _, err = run_cli(["analyze", path, "--batch-size", "6", "--shuffles", "0", "--quiet"], capsys)
    assert code == 0, err
    with Store.open(path) as s:
        assert {r["analysis"] for r in s.results()} == {"cka", "attention", "skip", "spatial"}


def test_an_incomplete_store_is_refused_with_the_way_out(store, tmp_path, capsys):
    cut = tmp_path / "partial.h5"
    shutil.copy(store, cut)
    import h5py

    with h5py.File(cut, "r+") as f:
        f[f"models/{VIT}/done"][1:] = 0  # as if killed after the first batch
    with Store.open(cut) as s:
        assert not s.complete and s.rows_done(VIT) == 16
    code, _, err = run_cli(["analyze", cut, "--cka", "--quiet"], capsys)
    assert code == 2 and "16 of 48 images" in err and f"resume it with `vitsee extract {cut}`" in err


@pytest.mark.parametrize(
    "view, needle",
    [
        ("heatmap:x", "unknown view 'heatmap:x'"),
        ("cka:nosuchmodel", "no model 'nosuchmodel'"),
        (f"cka:{VIT}/acts", f"no model '{VIT}/acts'"),  # a path inside the model's group is no model key
        ("cka:test", "matches several models"),
        ("spatial:test_vit:blocks.77", "no layer 'blocks.77'"),
        ("attention:test_resnet", "no attention distances"),
    ],
)
def test_bad_views_are_one_line_errors(store, tmp_path, capsys, view, needle):
    code, _, err = run_cli(["export", store, view, "--out", tmp_path / "x.json"], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_export_to_an_unknown_format_is_refused(store, tmp_path, capsys):
    code, _, err = run_cli(["export", store, f"cka:{VIT}", "--out", tmp_path / "x.tiff"], capsys)
    assert code == 2 and "use a .png, .json or .csv" in err


def test_csv_export_has_labels(store, tmp_path, capsys):
    out = tmp_path / "c.csv"
    code, _, err = run_cli(
        ["export", store, f"cka:{VIT}", "--out", out, "--shuffles", "0", "--batch-size", "16"], capsys
    )
    assert code == 0, err
    lines = out.read_text().splitlines()
    assert lines[0].split(",")[:3] == ["CKA", "patch_embed", "blocks.0"] and lines[1].startswith("patch_embed,1.0")


def test_cka_needs_four_images(tmp_path, monkeypatch):
    from vitsee import data
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    monkeypatch.setattr(data, "MIN_IMAGES", 1)  # extraction refuses 3 images now; a store from elsewhere may hold them
    path = tmp_path / "three.h5"
    run_extraction(
        ExtractConfig(
            store=path, models=[VIT], dataset="digits", n_images=3, batch_size=3, img_size=IMG, device="cpu", workers=0
        )
    )
    with Store.writer(path) as s, pytest.raises(VitseeError, match="has 3 images; CKA needs at least 4"):
        run_cka(s, CFG)

"""Head-level CKA (paper Fig. 5): the recorded head outputs against timm's attention recomputed by hand, the CKA
against a per-head numpy fp64 computation, the distances beside it, and the CLI / export around it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import IMG, RESNET, VIT, run_cli
from helpers.reference import reference_cka

VIT_KEY, RESNET_KEY = VIT, RESNET


@pytest.fixture()
def store_copy(tiny_store, tmp_path):
    """A copy of the shared tiny store, so results cached here do not reach other tests."""
    path = tmp_path / "heads.h5"
    shutil.copy(tiny_store, path)
    return path


def test_stored_head_outputs_are_softmax_qk_v_of_timms_attention(tiny_store):
    from vitsee.models.load import load_model
    from vitsee.store import Store

    loaded = load_model(VIT, img_size=IMG)
    block = loaded.model.blocks[2]
    attn = block.attn
    seen = {}
    handle = attn.register_forward_pre_hook(lambda _m, args: seen.__setitem__("x", args[0].detach()))
    with Store.open(tiny_store) as store:
        x = torch.from_numpy(store.model_input(VIT_KEY, slice(0, 5)))
        stored = store.head_outputs(VIT_KEY, "blocks.2", slice(0, 5))
    with torch.no_grad():
        loaded.model(x)
    handle.remove()
    h, d = attn.num_heads, attn.head_dim
    tokens = seen["x"]  # (B, N, C), what block 2's attention reads
    b, n, _ = tokens.shape
    q, k, v = (
        torch.nn.functional.linear(tokens, attn.qkv.weight, attn.qkv.bias).view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    )
    q, k = attn.q_norm(q), attn.k_norm(k)
    probs = torch.softmax(q @ k.transpose(-2, -1) * d**-0.5, dim=-1)  # (B, H, N, N)
    expected = (probs @ v)[:, :, loaded.num_prefix_tokens :].detach().numpy()  # spatial tokens only
    assert stored.shape == (5, h, 16, d)
    np.testing.assert_allclose(stored, expected, rtol=2e-3, atol=2e-3)  # fp16 storage


def test_head_outputs_are_allocated_per_block_and_counted_in_the_size_estimate(tiny_store):
    from vitsee.store import Store

    with Store.open(tiny_store) as store:
        assert store.head_blocks(VIT_KEY) == [f"blocks.{b}" for b in range(6)]
        assert store.head_blocks(RESNET_KEY) == []
        ds = store.model_group(VIT_KEY)["heads/blocks.0"]
        assert ds.dtype == np.float16 and ds.shape == (48, 2, 16, 32)
        assert "heads" not in store.stats(VIT_KEY)
        with pytest.raises(Exception, match="no head outputs of 'blocks.9'"):
            store.head_outputs(VIT_KEY, "blocks.9")


def test_size_estimate_includes_the_head_outputs(tmp_path):
    from vitsee.extraction.plan import ExtractConfig, estimate

    cfg = ExtractConfig(
        store=tmp_path / "e.h5",
        models=[VIT],
        dataset="synthetic",
        n_images=8,
        batch_size=8,
        img_size=IMG,
        device="cpu",
        workers=0,
    )
    with_heads = estimate(cfg).total_bytes
    streaming = estimate(ExtractConfig(**{**cfg.__dict__, "streaming": True})).total_bytes
    # per image: 8 layers' activations + the input + 6 blocks x 2 heads x 16 tokens x 32 dims of fp16 heads
    acts = (16 * 64 + 7 * 17 * 64) * 2 + 3 * IMG * IMG * 2
    heads = 6 * 2 * 16 * 32 * 2
    assert with_heads - streaming == 8 * (acts + heads)


@pytest.mark.parametrize("shuffles", [0, 2])
def test_head_cka_matches_a_per_head_reference(store_copy, shuffles):
    from vitsee.analyses.heads import run_heads
    from vitsee.analyses.base import batch_plan
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    cfg = AnalyzeConfig(batch_size=16, shuffles=shuffles, device="cpu")
    with Store.writer(store_copy) as store:
        result = run_heads(store, VIT_KEY, RESNET_KEY, cfg)
        layers = store.layers(RESNET_KEY)
        other = {layer: store.activations(RESNET_KEY, layer).reshape(48, -1) for layer in layers}
        heads = {b: store.head_outputs(VIT_KEY, f"blocks.{b}") for b in range(6)}
    plan = batch_plan(48, 16, shuffles, 0)
    per_shuffle = [[rows for k_, rows in plan if k_ == k] for k in range(max(1, shuffles))]
    assert list(result["rows"]) == [f"blocks.{b}.head.{h}" for b in range(6) for h in range(2)]
    assert list(result["cols"]) == layers
    for r, (b, h) in enumerate((b, h) for b in range(6) for h in range(2)):
        x = heads[b][:, h].reshape(48, -1)
        for c, layer in enumerate(layers):
            expected = np.mean([reference_cka(x, other[layer], batches) for batches in per_shuffle])
            assert result["cka"][r, c] == pytest.approx(expected, abs=1e-6)


def test_each_head_sits_beside_its_mean_attention_distance(store_copy):
    from vitsee.analyses.heads import run_heads
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    with Store.writer(store_copy) as store:
        result = run_heads(store, VIT_KEY, RESNET_KEY, AnalyzeConfig(batch_size=16, shuffles=0, device="cpu"))
        distances = store.attention_distance(VIT_KEY).astype(np.float64).mean(axis=0)  # (blocks, heads)
    np.testing.assert_allclose(result["distance_px"], distances.ravel(), rtol=1e-6)
    assert list(result["block"]) == [b for b in range(6) for _ in range(2)]
    assert list(result["head"]) == [0, 1] * 6


def test_analyze_heads_then_export_json_and_png(store_copy, tmp_path, capsys):
    code, _, err = run_cli(
        ["analyze", store_copy, "--heads", "--batch-size", "16", "--shuffles", "0", "--device", "cpu", "-q"], capsys
    )
    assert code == 0, err
    out = tmp_path / "heads.json"
    code, _, err = run_cli(["export", store_copy, "heads:test_vit:test_resnet", "--out", out], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["view"] == "heads" and data["model"] == VIT_KEY and data["other"] == RESNET_KEY
    assert data["rows"][:3] == ["blocks.0.head.0", "blocks.0.head.1", "blocks.1.head.0"]
    assert len(data["values"]) == 12 and len(data["values"][0]) == len(data["cols"]) == 5
    assert len(data["distance_px"]) == 12 and all(d > 0 for d in data["distance_px"])
    assert data["params"]["batch_size"] == 16 and data["params"]["shuffles"] == 0
    png = tmp_path / "heads.png"
    code, _, err = run_cli(["export", store_copy, "heads:test_vit:test_resnet", "--out", png], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heads_figure_scatters_distance_against_the_most_similar_layer(store_copy):
    from vitsee.output.figures import figure_for
    from vitsee.analyses.views import load_view

    view = load_view(store_copy, "heads:test_vit:test_resnet")
    col = int(view.extra["scatter_col"])
    assert col == int(np.argmax(view.matrix.mean(axis=0)))
    fig = figure_for(view)
    scatter = next(ax for ax in fig.axes if ax.get_label() == "scatter")
    points = np.concatenate([c.get_offsets() for c in scatter.collections if (c.get_gid() or "").startswith("block-")])
    expected = np.column_stack([view.extra["distance_px"], view.matrix[:, col]])
    np.testing.assert_allclose(np.sort(points, axis=0), np.sort(expected, axis=0))
    assert view.cols[col] in scatter.get_ylabel()


def test_a_heads_view_of_one_model_or_a_cnn_is_refused_in_one_line(store_copy, capsys):
    code, _, err = run_cli(["export", store_copy, "heads:test_vit", "--out", "x.json"], capsys)
    assert code == 2 and "heads:VIT:OTHER" in err
    code, _, err = run_cli(["export", store_copy, "heads:test_resnet:test_vit", "--out", "x.json"], capsys)
    assert code == 2 and "no stored head outputs" in err and len(err.strip().splitlines()) == 1


def test_streaming_stores_keep_no_head_outputs_and_refuse_heads(tmp_path, capsys):
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    path = tmp_path / "stream.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[VIT, RESNET],
            dataset="synthetic",
            n_images=8,
            batch_size=8,
            img_size=IMG,
            device="cpu",
            workers=0,
            streaming=True,
        )
    )
    code, _, err = run_cli(["analyze", path, "--heads", "-q"], capsys)
    assert code == 2 and "--streaming" in err and "head" in err


def test_a_store_extracted_before_head_outputs_resumes_without_them(tmp_path):
    import h5py

    from vitsee.extraction.extract import ExtractConfig, run_extraction
    from vitsee.store import Store

    path = tmp_path / "old.h5"
    cfg = ExtractConfig(
        store=path, models=[VIT], dataset="synthetic", n_images=8, batch_size=4, img_size=IMG, device="cpu", workers=0
    )
    run_extraction(cfg)
    with h5py.File(path, "r+") as f:  # what an older vitsee left: no heads/, the last batch not done
        del f[f"models/{VIT}/heads"]
        f[f"models/{VIT}/done"][1] = 0
    run_extraction(cfg)
    with Store.open(path) as store:
        assert store.is_complete() and store.head_blocks(VIT) == []

"""Extraction stores what timm computes: block outputs, inputs, attention distances, skip ratios."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import timm
import torch

from conftest import IMG, RESNET, VIT
from vitsee.data import open_dataset
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.models.load import load_model, make_transform
from vitsee.store import Store

FP16_TOL = dict(rtol=2e-3, atol=2e-3)


def _inputs(spec: str, n: int) -> torch.Tensor:
    """The preprocessed inputs, computed here independently of the extraction loop."""
    loaded = load_model(spec, img_size=IMG)
    transform = make_transform(loaded)
    images = open_dataset("synthetic")
    return torch.stack([transform(images.image(i)) for i in range(n)])


def _fresh(name: str, seed: int, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(name, **kw).eval()


def test_vit_block_outputs_equal_timm_forward_intermediates(tiny_store):
    x = _inputs(VIT, 48)
    model = _fresh("test_vit", 0, img_size=IMG)
    with torch.no_grad():
        _, inter = model.forward_intermediates(x, return_prefix_tokens=True, norm=False, output_fmt="NLC")
        final = model.forward_features(x)
    with Store.open(tiny_store) as s:
        assert s.layers(VIT) == ["patch_embed"] + [f"blocks.{i}" for i in range(6)] + ["norm"]
        for i, (spatial, prefix) in enumerate(inter):
            expected = torch.cat([prefix, spatial], dim=1).numpy()  # (N, 1 + 16, 64)
            stored = s.activations(VIT, f"blocks.{i}")
            assert stored.shape == expected.shape == (48, 17, 64)
            np.testing.assert_allclose(stored, expected, **FP16_TOL)
        np.testing.assert_allclose(s.activations(VIT, "norm"), final.numpy(), **FP16_TOL)
        assert s.layer_prefix_tokens(VIT, "blocks.0") == 1
        assert s.layer_prefix_tokens(VIT, "patch_embed") == 0
        np.testing.assert_allclose(s.model_input(VIT), x.numpy(), **FP16_TOL)


def test_resnet_block_outputs_equal_forward_hooks(tiny_store):
    x = _inputs(RESNET, 48)
    model = _fresh("test_resnet", 0)
    seen = {}
    names = ["maxpool", "layer1.0", "layer2.0", "layer3.0", "layer4.0"]
    for name in names:
        model.get_submodule(name).register_forward_hook(lambda _m, _i, o, name=name: seen.__setitem__(name, o.clone()))
    with torch.no_grad():
        model(x)
    with Store.open(tiny_store) as s:
        assert s.layers(RESNET) == names
        for name in names:
            stored = s.activations(RESNET, name)
            assert stored.shape == tuple(seen[name].shape)
            np.testing.assert_allclose(stored, seen[name].numpy(), **FP16_TOL)


def test_store_records_images_labels_and_metadata(tiny_store):
    with Store.open(tiny_store) as s:
        assert s.n_images == 48 and s.complete
        np.testing.assert_array_equal(s.indices, np.arange(48))
        np.testing.assert_array_equal(s.labels, np.arange(48) % 10)
        info = s.model_info(VIT)
        assert info["family"] == "vit" and info["grid_size"] == [4, 4] and info["patch_size"] == [16, 16]
        assert info["weights"]["kind"] == "random" and info["weights"]["seed"] == 0
        assert info["data_config"]["input_size"] == [3, IMG, IMG]
        assert "CenterCrop(size=(64, 64))" in info["transform"]
        assert s.model_info(RESNET)["family"] == "resnet"
        assert all(v == 0 for v in s.nonfinite_counts(VIT).values())


def _attention_maps(model, x) -> list[torch.Tensor]:
    """Full softmax attention per block, recomputed from q and k: (B, H, T, T)."""
    maps = []

    def hook(mod, args, _out):
        (inp,) = args
        B, N, C = inp.shape
        qkv = mod.qkv(inp).reshape(B, N, 3, mod.num_heads, C // mod.num_heads).permute(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]
        maps.append(((q @ k.transpose(-2, -1)) * mod.scale).softmax(-1))

    for block in model.blocks:
        block.attn.register_forward_hook(hook)
    with torch.no_grad():
        model(x)
    return maps


def test_stored_attention_distances_match_a_plain_loop(tiny_store):
    x = _inputs(VIT, 4)
    maps = _attention_maps(_fresh("test_vit", 0, img_size=IMG), x)
    centres = np.array([(r * 16, c * 16) for r in range(4) for c in range(4)], dtype=np.float64)
    with Store.open(tiny_store) as s:
        stored = s.attention_distance(VIT)[:4]  # (4, blocks, heads)
        renorm = s.attention_distance(VIT, renormalised=True)[:4]
    assert stored.shape == (4, 6, 2)
    for b, attn in enumerate(maps):
        a = attn.numpy().astype(np.float64)
        for img in range(4):
            for h in range(2):
                total = total_renorm = 0.0
                for q in range(16):
                    row = a[img, h, 1 + q, 1:]
                    d = sum(row[k] * np.linalg.norm(centres[q] - centres[k]) for k in range(16))
                    total += d
                    total_renorm += d / row.sum()
                assert stored[img, b, h] == pytest.approx(total / 16, rel=1e-4)
                assert renorm[img, b, h] == pytest.approx(total_renorm / 16, rel=1e-4)


def test_stored_skip_ratios_match_the_residual_stream(tiny_store):
    x = _inputs(VIT, 4)
    model = _fresh("test_vit", 0, img_size=IMG)
    with torch.no_grad():
        z = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        expected_attn, expected_mlp = [], []
        for block in model.blocks:
            f = block.ls1(block.attn(block.norm1(z)))
            expected_attn.append((z.norm(dim=-1) / f.norm(dim=-1)).numpy())
            z = z + f
            g = block.ls2(block.mlp(block.norm2(z)))
            expected_mlp.append((z.norm(dim=-1) / g.norm(dim=-1)).numpy())
            z = z + g
    with Store.open(tiny_store) as s:
        np.testing.assert_allclose(s.stat(VIT, "skip_ratio_attn")[:4], np.stack(expected_attn, 1), rtol=1e-4)
        np.testing.assert_allclose(s.stat(VIT, "skip_ratio_mlp")[:4], np.stack(expected_mlp, 1), rtol=1e-4)
        assert s.stat(RESNET, "skip_ratio_block").shape == (48, 4)


def test_weights_from_a_safetensors_file_give_the_source_models_activations(tmp_path):
    from safetensors.torch import save_file

    source = _fresh("test_vit", 123, img_size=IMG)
    weights = tmp_path / "my_vit.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(weights))
    store = tmp_path / "file.h5"
    run_extraction(
        ExtractConfig(
            store=store,
            models=[f"test_vit@{weights}"],
            dataset="synthetic",
            n_images=8,
            batch_size=8,
            img_size=IMG,
            device="cpu",
            workers=0,
        )
    )
    x = _inputs(VIT, 8)
    with torch.no_grad():
        expected = source.forward_features(x).numpy()
    with Store.open(store) as s:
        (key,) = s.models
        assert key == "test_vit@file:my_vit"
        w = s.model_info(key)["weights"]
        assert w["kind"] == "file" and w["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
        np.testing.assert_allclose(s.activations(key, "norm"), expected, **FP16_TOL)


def test_checkpoint_dicts_are_unwrapped(tmp_path):
    source = _fresh("test_resnet", 9)
    ckpt = tmp_path / "ckpt.pth"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, ckpt)
    loaded = load_model(f"test_resnet@{ckpt}")
    for k, v in source.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v)


def test_float32_storage_and_sublayers(tmp_path):
    store = tmp_path / "sub.h5"
    run_extraction(
        ExtractConfig(
            store=store,
            models=[VIT],
            dataset="digits",
            n_images=6,
            batch_size=4,
            img_size=IMG,
            device="cpu",
            dtype="float32",
            layers="sublayers",
            workers=0,
        )
    )
    model = _fresh("test_vit", 0, img_size=IMG)
    loaded = load_model(VIT, img_size=IMG)
    transform = make_transform(loaded)
    images = open_dataset("digits")
    x = torch.stack([transform(images.image(i)) for i in range(6)])
    seen = {}
    model.blocks[2].norm2.register_forward_pre_hook(lambda _m, a: seen.__setitem__("resid1", a[0].clone()))
    model.blocks[2].mlp.act.register_forward_hook(lambda _m, _a, o: seen.__setitem__("act", o.clone()))
    with torch.no_grad():
        model(x)
    with Store.open(store) as s:
        layers = s.layers(VIT)
        assert layers[:8] == [
            "patch_embed",
            "blocks.0.norm1",
            "blocks.0.attn",
            "blocks.0.resid1",
            "blocks.0.norm2",
            "blocks.0.mlp.act",
            "blocks.0",
            "blocks.1.norm1",
        ]
        assert s.model_info(VIT)["dtype"] == "float32"
        np.testing.assert_allclose(s.activations(VIT, "blocks.2.resid1"), seen["resid1"].numpy(), rtol=1e-5, atol=1e-5)
        assert s.layer_shape(VIT, "blocks.2.mlp.act") == (17, model.blocks[2].mlp.fc1.out_features)
        np.testing.assert_allclose(s.activations(VIT, "blocks.2.mlp.act"), seen["act"].numpy(), rtol=1e-5, atol=1e-5)


def test_explicit_layers_are_stored_in_forward_order(tmp_path):
    store = tmp_path / "explicit.h5"
    run_extraction(
        ExtractConfig(
            store=store,
            models=[RESNET],
            dataset="digits",
            n_images=4,
            batch_size=4,
            img_size=IMG,
            device="cpu",
            layers=["layer2.0", "conv1", "layer1.0.resid"],
            workers=0,
        )
    )
    with Store.open(store) as s:
        assert s.layers(RESNET) == ["conv1", "layer1.0.resid", "layer2.0"]


@pytest.mark.parametrize(
    "name, family",
    [
        ("test_vit", "vit"),
        ("test_vit_relpos", "vit"),
        ("test_resnet", "resnet"),
        ("test_convnext", "resnet"),
        # attention hybrids with ResNet-like stages.N.blocks.M, and CaiT, whose blocks see no CLS token
        ("test_maxvit", "other"),
        ("test_coatnet", "other"),
        ("test_efficientnet", "other"),
        ("cait_xxs24_224", "other"),
    ],
)
def test_the_family_listed_for_a_name_is_the_family_an_extraction_uses(name, family):
    from vitsee.models.load import family_of_model, family_of_name

    assert family_of_name(name) == family
    assert family_of_model(timm.create_model(name, pretrained=False)) == family


def test_a_model_of_no_known_family_is_extracted_at_the_layers_named(tmp_path):
    store = tmp_path / "cait.h5"
    spec = "cait_xxs24_224@random:0"
    run_extraction(
        ExtractConfig(
            store=store,
            models=[spec],
            dataset="synthetic",
            n_images=4,
            batch_size=4,
            img_size=IMG,
            device="cpu",
            layers=["blocks.0", "blocks.3"],
            workers=0,
        )
    )
    with Store.open(store) as s:
        info = s.model_info(spec)
        assert info["family"] == "other" and s.layers(spec) == ["blocks.0", "blocks.3"]
        assert s.activations(spec, "blocks.0").shape == (4, (IMG // 16) ** 2, 192)  # patches only: no CLS yet
        assert not s.stats(spec)  # no attention or skip statistics claimed for a structure vitsee does not know


def test_adding_a_model_appends_and_keeps_the_first_models_data(tmp_path):
    store = tmp_path / "append.h5"
    common = dict(dataset="synthetic", n_images=12, batch_size=8, img_size=IMG, device="cpu", workers=0)
    run_extraction(ExtractConfig(store=store, models=[VIT], **common))
    with Store.open(store) as s:
        before = s.activations(VIT, "blocks.3")
    run_extraction(ExtractConfig(store=store, models=[VIT, RESNET], **common))
    with Store.open(store) as s:
        assert s.models == [VIT, RESNET] and s.complete
        np.testing.assert_array_equal(s.activations(VIT, "blocks.3"), before)
        assert s.activations(RESNET, "layer4.0").shape[0] == 12


def test_a_different_dataset_is_refused_and_the_store_is_untouched(tmp_path):
    from vitsee.errors import VitseeError

    store = tmp_path / "keep.h5"
    run_extraction(
        ExtractConfig(
            store=store,
            models=[VIT],
            dataset="synthetic",
            n_images=8,
            batch_size=8,
            img_size=IMG,
            device="cpu",
            workers=0,
        )
    )
    digest = hashlib.sha256(store.read_bytes()).hexdigest()
    with pytest.raises(VitseeError, match="holds 8 images of 'synthetic'.*--overwrite"):
        run_extraction(
            ExtractConfig(
                store=store,
                models=[VIT],
                dataset="digits",
                n_images=8,
                batch_size=8,
                img_size=IMG,
                device="cpu",
                workers=0,
            )
        )
    assert hashlib.sha256(store.read_bytes()).hexdigest() == digest


def test_progress_reaches_the_callback(tmp_path):
    events = []
    run_extraction(
        ExtractConfig(
            store=tmp_path / "p.h5",
            models=[VIT],
            dataset="digits",
            n_images=10,
            batch_size=4,
            img_size=IMG,
            device="cpu",
            workers=0,
        ),
        progress=events.append,
    )
    stages = [e.stage for e in events]
    assert stages[0] == "load" and "plan" in stages and stages[-1] == "done"
    extract = [e.done for e in events if e.stage == "extract"]
    assert extract == [0, 4, 8, 10]
    assert any("expected size on disk" in e.message for e in events if e.stage == "plan")


def test_too_little_disk_is_refused_unless_forced(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from vitsee.errors import VitseeError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**6, 10**6 - 1000, 1000))
    cfg = ExtractConfig(
        store=tmp_path / "big.h5",
        models=[VIT],
        dataset="digits",
        n_images=8,
        batch_size=8,
        img_size=IMG,
        device="cpu",
        workers=0,
    )
    with pytest.raises(VitseeError, match=r"needs .* but .* has 1.0 KB free.*--force"):
        run_extraction(cfg)
    assert not (tmp_path / "big.h5").exists()
    cfg.force = True
    run_extraction(cfg)
    with Store.open(tmp_path / "big.h5") as s:
        assert s.complete

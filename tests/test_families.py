"""One invariant over every model family vitsee lists: units (px a token covers), prefix and class tokens, each
layer's layout, and probes' GAP against a numpy mean over the spatial axes of timm's own forward.

Each family is a tiny random timm model (img_size 56-64, two blocks, 16-32 channels) registered under a test name
in the timm module of its family, so extraction builds it by name like any model.
"""

from __future__ import annotations

import functools
from pathlib import Path
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from vitsee.analyses import driver as an
from vitsee.analyses.attention import attention_reference, run_attention
from vitsee.analyses.base import has_cls_token
from vitsee.analyses.probes import probe_readouts
from vitsee.analyses.skip import run_skip
from vitsee.analyses.attention import mean_window_attention_distance, uniform_attention_distance_px
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.models.load import family_of_name, load_model
from vitsee.store import Store

TINY_VIT = dict(embed_dim=32, depth=2, num_heads=2)


def _register(name: str, module: str, make) -> str:
    """Registers `name` in timm as an entrypoint of `module` that builds make(**kwargs); returns the name."""
    import importlib

    import timm
    from timm.models import register_model

    if not timm.is_model(name):
        mod = importlib.import_module(f"timm.models.{module}")

        def entry(pretrained=False, **kwargs):
            return make(**kwargs)

        entry.__name__, entry.__qualname__, entry.__module__ = name, name, mod.__name__
        register_model(entry)
    return name


def _timm(variant: str, **fixed):
    import timm

    return lambda **kwargs: timm.create_model(variant, **{**fixed, **kwargs})


def _mixer(**kwargs):
    from timm.models.mlp_mixer import _create_mixer

    return _create_mixer("mixer_s16_224", **{"patch_size": 16, "num_blocks": 2, "embed_dim": 32, **kwargs})


@functools.cache
def tiny_names() -> dict[str, str]:
    """Returns family label -> registered tiny model name."""
    return {
        "vit": "test_vit",
        "deit_distilled": _register(
            "vitsee_tiny_deit_distilled", "deit", _timm("deit_tiny_distilled_patch16_224", **TINY_VIT)
        ),
        "reg_gap_vit": _register(
            "vitsee_tiny_vit_reg4_gap", "vision_transformer", _timm("vit_base_patch16_reg4_gap_256", **TINY_VIT)
        ),
        "dinov2_reg": _register(
            "vitsee_tiny_dinov2_reg4", "vision_transformer", _timm("vit_small_patch14_reg4_dinov2", **TINY_VIT)
        ),
        "hybrid": _register(
            "vitsee_tiny_vit_r_s16_p8", "vision_transformer_hybrid", _timm("vit_tiny_r_s16_p8_224", **TINY_VIT)
        ),
        "swin": _register(
            "vitsee_tiny_swin",
            "swin_transformer",
            _timm("swin_tiny_patch4_window7_224", embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4),
        ),
        "resnet": "test_resnet",
        "resnetv2": _register("vitsee_tiny_resnetv2", "resnetv2", _timm("resnetv2_18", layers=[1, 1, 1, 1])),
        "convnext": "test_convnext",
        "mixer": _register("vitsee_tiny_mixer", "mlp_mixer", _mixer),
    }


@dataclass(frozen=True)
class Family:
    label: str
    img: int
    family: str
    prefix: int  # prefix tokens leading a block's token axis
    cls: bool
    token_px: int | None  # input px one token covers; None for CNNs
    block: str  # a default layer past the stem
    layout: str  # that layer's layout


FAMILIES = [
    Family("vit", 64, "vit", 1, True, 16, "blocks.1", "tokens"),
    Family("deit_distilled", 64, "vit", 2, True, 16, "blocks.1", "tokens"),
    Family("reg_gap_vit", 64, "vit", 4, False, 16, "blocks.1", "tokens"),
    Family("dinov2_reg", 56, "vit", 5, True, 14, "blocks.1", "tokens"),
    Family("hybrid", 64, "vit", 1, True, 32, "blocks.1", "tokens"),  # an 8-px patch on a stride-4 stem's map
    Family("swin", 64, "swin", 0, False, 4, "layers.1.blocks.1", "nhwc"),
    Family("resnet", 64, "resnet", 0, False, None, "layer4.0", "nchw"),
    Family("resnetv2", 64, "resnet", 0, False, None, "stages.3.blocks.0", "nchw"),
    Family("convnext", 64, "resnet", 0, False, None, "stages.1.blocks.0", "nchw"),
    Family("mixer", 64, "mixer", 0, False, 16, "blocks.1", "tokens"),
]


@functools.cache
def _store(label: str, tmp: str) -> str:
    fam = next(f for f in FAMILIES if f.label == label)
    path = f"{tmp}/{label}.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[f"{tiny_names()[label]}@random:0"],
            dataset="synthetic",
            n_images=8,
            batch_size=8,
            img_size=fam.img,
            device="cpu",
            workers=0,
        )
    )
    return path


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("families"))


def _hooked_outputs(spec: str, img: int, layers: list[str], x: torch.Tensor) -> dict[str, np.ndarray]:
    """Returns timm's own outputs of the named modules for input x (an independent forward, plain hooks)."""
    model = load_model(spec, img_size=img).model
    out = {}
    handles = [
        model.get_submodule(n).register_forward_hook(
            lambda _m, _a, o, n=n: out.__setitem__(n, o.detach().float().numpy())
        )
        for n in layers
    ]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return out


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.label)
def test_family_units_tokens_layout_and_gap(fam: Family, store_dir):
    name = tiny_names()[fam.label]
    assert family_of_name(name) == fam.family
    path = _store(fam.label, store_dir)
    with Store.open(path) as s:
        key = s.models[0]
        info = s.model_info(key)
        assert info["family"] == fam.family
        assert int(info["num_prefix_tokens"]) == fam.prefix
        assert has_cls_token(info) is fam.cls
        if fam.token_px is not None:
            gh, gw = info["grid_size"]
            assert tuple(info["patch_size"]) == (fam.token_px, fam.token_px) == (fam.img // gh, fam.img // gw)
        assert fam.block in s.layers(key)
        assert s.layer_layout(key, fam.block) == fam.layout
        shape = s.layer_shape(key, fam.block)
        if fam.layout == "tokens":
            assert s.layer_prefix_tokens(key, fam.block) == fam.prefix
            assert shape[0] == fam.prefix + info["grid_size"][0] * info["grid_size"][1]
        readouts = probe_readouts(s, key, fam.block)
        assert ("cls" in readouts) is fam.cls
        stored = s.activations(key, fam.block).astype(np.float32)
        x = torch.from_numpy(s.model_input(key).astype(np.float32))
    # the reference: timm's own forward on the stored (fp16) input, averaged over the spatial axes in numpy
    ref = _hooked_outputs(f"{name}@random:0", fam.img, [fam.block], x)[fam.block]
    ref = ref.reshape(len(ref), -1, ref.shape[-1]) if ref.ndim == 4 and fam.family == "vit" else ref
    np.testing.assert_allclose(stored, ref, rtol=2e-3, atol=2e-3)  # stored in fp16, same axes as timm hands out
    spatial_axes = {"tokens": (1,), "nchw": (2, 3), "nhwc": (1, 2)}[fam.layout]
    want = ref[:, fam.prefix :].mean(axis=1) if fam.layout == "tokens" else ref.mean(axis=spatial_axes)
    got = readouts["gap"](stored)[:, 0, :]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    assert got.shape[-1] == shape[-1 if fam.layout in ("tokens", "nhwc") else 0]  # the channels, not a spatial axis


def test_hybrid_uniform_reference_is_in_image_pixels():
    """vit_tiny_r_s16_p8 at 224 px: a 7x7 grid whose tokens cover 32 px (the 8-px patch lies on a stride-4 map),
    so uniform attention averages 115.5 px (28.9 with the stem's patch size)."""
    loaded = load_model(f"{tiny_names()['hybrid']}@random:0", img_size=224)
    assert loaded.grid_size == (7, 7) and loaded.patch_size == (32, 32)
    centres = [(32 * r, 32 * c) for r in range(7) for c in range(7)]
    hand = np.mean([np.hypot(a[0] - b[0], a[1] - b[1]) for a in centres for b in centres])
    assert hand == pytest.approx(115.5, abs=0.05)
    info = {
        "family": "vit",
        "grid_size": list(loaded.grid_size),
        "patch_size": list(loaded.patch_size),
        "num_blocks": 2,
    }
    uniform, largest = attention_reference(info)
    assert uniform[0] == pytest.approx(hand, rel=1e-9)
    assert largest == pytest.approx(np.hypot(6 * 32, 6 * 32))


def test_window_attention_distance_against_a_hand_count():
    """A 2x4 map in two 2x2 windows of 10-px tokens, and a 2x3 map whose padding column is left out."""
    diag = np.hypot(10, 10)
    uniform = torch.full((2, 1, 4, 4), 0.25)  # (windows, heads, A, A): each query spreads over its window
    got = mean_window_attention_distance(uniform, 1, (2, 4), (2, 2), (10, 10))
    assert got.item() == pytest.approx((0 + 10 + 10 + diag) / 4, rel=1e-6)  # from any corner of a 2x2 window
    # every query on the token diagonally across: sqrt(2) * 10 px
    across = torch.zeros(2, 1, 4, 4)
    for q, k in ((0, 3), (1, 2), (2, 1), (3, 0)):
        across[:, :, q, k] = 1
    assert mean_window_attention_distance(across, 1, (2, 4), (2, 2), (10, 10)).item() == pytest.approx(diag, rel=1e-6)
    # 2x3 map padded to 2x4: the pad column's queries (window 1, local column 1) look far, the real ones at themselves
    padded = torch.eye(4).repeat(2, 1, 1, 1)
    for q in (1, 3):  # local positions (0, 1) and (1, 1) of the second window are padding
        padded[1, 0, q] = across[1, 0, q]
    assert mean_window_attention_distance(padded, 1, (2, 3), (2, 2), (10, 10)).item() == pytest.approx(0.0, abs=1e-6)


def test_swin_distances_match_a_plain_loop_over_true_positions_and_stay_inside_a_window(store_dir):
    """Shifted windows included: a reference that places every window token at its true image position (undoing
    the cyclic shift) gives the same distances, and none exceeds the window's diagonal."""
    import timm

    model = timm.create_model(
        "swin_tiny_patch4_window7_224", img_size=64, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4
    ).eval()
    block = model.layers[0].blocks[1]  # the shifted one of stage 0 (16x16 map, 4x4 windows, shift 2)
    assert block.shift_size == (2, 2)
    block.attn.fused_attn = False
    seen = {}
    hooks = [
        block.register_forward_pre_hook(lambda _m, a: seen.__setitem__("shape", a[0].shape)),
        block.attn.attn_drop.register_forward_pre_hook(lambda _m, a: seen.__setitem__("attn", a[0].detach())),
    ]
    with torch.no_grad():
        model(torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    for h in hooks:
        h.remove()
    b, h, w, _ = seen["shape"]
    attn = seen["attn"].double().numpy()  # (b * 16 windows, heads, 16, 16)
    px, (ws, _), shift = 4, block.window_size, 2
    ref = np.zeros((b, attn.shape[1]))
    for img in range(b):
        for win in range(16):
            wr, wc = divmod(win, 4)
            pos = [((wr * ws + i + shift) % h, (wc * ws + j + shift) % w) for i in range(ws) for j in range(ws)]
            for q in range(16):
                for k in range(16):
                    d = px * np.hypot(pos[q][0] - pos[k][0], pos[q][1] - pos[k][1])
                    ref[img] += attn[img * 16 + win, :, q, k] * d / (h * w)
    got = mean_window_attention_distance(seen["attn"], b, (h, w), block.window_size, (px, px)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    # through extraction: every block's heads lie within its window's diagonal, the uniform reference per stage
    path = _store("swin", store_dir)
    with Store.open(path) as s:
        key = s.models[0]
        dist = s.stat(key, "attention_distance")  # (N, 4 blocks, 4 heads), stage 0 has 2 heads
        assert np.isnan(dist[:, :2, 2:]).all() and np.isfinite(dist[:, :2, :2]).all() and np.isfinite(dist[:, 2:]).all()
        for blocks, token_px in ((slice(0, 2), 4), (slice(2, 4), 8)):
            assert np.nanmax(dist[:, blocks]) <= np.hypot(3, 3) * token_px + 1e-4
    view = _attention_result(path)
    np.testing.assert_allclose(
        view["uniform_px_per_block"],
        [uniform_attention_distance_px(4, 4)] * 2 + [uniform_attention_distance_px(4, 8)] * 2,
    )
    assert view["hist_counts"].sum() == 8 * (2 * 2 + 2 * 4)  # the NaN heads are not counted


def _attention_result(path: str) -> dict:
    with Store.writer(path) as s:
        return run_attention(s, s.models[0], an.AnalyzeConfig(device="cpu"))


def test_mixer_skip_ratios_against_its_own_sublayers(store_dir):
    """Per block, ||z|| / ||f(z)|| for token mixing (f's (B, C, T) output normed over C) and channel mixing."""
    path = _store("mixer", store_dir)
    with Store.open(path) as s:
        key = s.models[0]
        tokens, channels = s.stat(key, "skip_ratio_token_mixing"), s.stat(key, "skip_ratio_channel_mixing")
        x = torch.from_numpy(s.model_input(key).astype(np.float32))
    model = load_model(f"{tiny_names()['mixer']}@random:0", img_size=64).model
    with torch.no_grad():  # on the stored (fp16-rounded) input, hence the 2e-3
        z = model.stem(x)
        for i, block in enumerate(model.blocks):
            f = block.mlp_tokens(block.norm1(z).transpose(1, 2)).transpose(1, 2)
            np.testing.assert_allclose(tokens[:, i], (z.norm(dim=-1) / f.norm(dim=-1)).numpy(), rtol=2e-3)
            z = z + f
            g = block.mlp_channels(block.norm2(z))
            np.testing.assert_allclose(channels[:, i], (z.norm(dim=-1) / g.norm(dim=-1)).numpy(), rtol=2e-3)
            z = z + g
    with Store.writer(path) as s:
        r = run_skip(s, key, an.AnalyzeConfig(device="cpu"))
        assert [str(x) for x in r["rows"][:2]] == ["blocks.0.token_mixing", "blocks.0.channel_mixing"]
        assert np.isnan(r["cls"]).all()
        assert "attention" not in an.applicable(s, key)
        with pytest.raises(Exception, match="MLP-Mixer: it mixes tokens with MLPs, not attention"):
            run_attention(s, key, an.AnalyzeConfig(device="cpu"))


# --- class tokens, head order, fp16 storage, info ---------------------------------------------------


def test_register_only_vit_has_no_cls_column_or_series_and_says_so(store_dir):
    """vit_*_reg4_gap_*: four prefix tokens, none of them a class token (register 0 was taken for CLS)."""
    from vitsee.analyses.views import load_view

    path = _store("reg_gap_vit", store_dir)
    key = "vitsee_tiny_vit_reg4_gap@random:0"
    skip = load_view(path, f"skip:{key}")
    assert np.isnan(np.asarray(skip.extra["cls"], dtype=float)).all()
    assert skip.cols[:5] == ["reg 0", "reg 1", "reg 2", "reg 3", "token 0"]
    assert "no class token" in skip.title
    probes = load_view(path, f"probes:{key}")
    assert "CLS" not in probes.cols and "GAP" in probes.cols
    assert "no class token" in probes.title
    # a ViT with a class token keeps both, and says nothing of the kind
    dino = load_view(_store("dinov2_reg", store_dir), "skip:vitsee_tiny_dinov2_reg4@random:0")
    assert dino.cols[:6] == ["CLS", "reg 0", "reg 1", "reg 2", "reg 3", "token 0"]
    assert np.isfinite(np.asarray(dino.extra["cls"], dtype=float)).all() and "no class token" not in dino.title


def test_renormalised_distances_are_in_the_plain_head_order(tiny_store, tmp_path):
    import shutil

    path = tmp_path / "s.h5"
    shutil.copy(tiny_store, path)
    with Store.writer(path) as s:
        key = s.resolve_model("test_vit")
        r = run_attention(s, key, an.AnalyzeConfig(device="cpu", recompute=True))
        plain = s.stat(key, "attention_distance").astype(np.float64).mean(axis=0)  # (blocks, heads)
        renorm = s.stat(key, "attention_distance_renorm").astype(np.float64).mean(axis=0)
    order = r["head_order"]
    np.testing.assert_allclose(r["mean_px"], np.take_along_axis(plain, order, axis=1), rtol=1e-6)
    np.testing.assert_allclose(r["mean_renorm_px"], np.take_along_axis(renorm, order, axis=1), rtol=1e-6)
    assert not np.array_equal(np.argsort(plain, axis=1), np.argsort(renorm, axis=1))  # the two orders differ here


def _unbiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased linear CKA of one batch, fp64, straight from the formula (Song et al. 2012)."""

    def hsic(k, l):
        n = len(k)
        k, l = k.copy(), l.copy()
        np.fill_diagonal(k, 0)
        np.fill_diagonal(l, 0)
        ones = np.ones(n)
        return (
            np.trace(k @ l)
            + ones @ k @ ones * (ones @ l @ ones) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * ones @ k @ l @ ones
        ) / (n * (n - 3))

    k, l = x @ x.T, y @ y.T
    return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


@pytest.mark.parametrize(
    "offset,spread,lossy", [(0, 1.0, False), (100, 0.3, False), (2000, 1.0, True), (2000, 3.0, True)]
)
def test_fp16_rounding_loss_bounds_what_cka_loses(offset, spread, lossy):
    """The measured ratio ||x - fp16(x)||^2 / ||x - mean||^2 tracks |1 - CKA(x, fp16(x))| (fp64, the formula); a few
    channels near +-2000 (as in pretrained ViTs) go over the limit, ordinary activations stay far below it."""
    from vitsee.models.load import Point
    from vitsee.extraction.recorders import FP16_LOSS_LIMIT, ActivationRecorder, fp16_lossy_layers

    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 16, 48))
    x[..., :4] = offset * np.sign(rng.standard_normal(4)) + spread * rng.standard_normal((128, 16, 4))
    rec = ActivationRecorder([Point("blocks.0", "blocks.0")], torch.float16)
    rec.loaded = None
    rec.measure_rounding = True
    rec._add_rounding("blocks.0", torch.from_numpy(x).float())
    ratio = rec.rounding_loss()["blocks.0"]
    x32 = x.astype(np.float32).astype(np.float64).reshape(128, -1)
    x16 = x.astype(np.float32).astype(np.float16).astype(np.float64).reshape(128, -1)
    want = ((x32 - x16) ** 2).sum() / ((x32 - x32.mean(axis=0)) ** 2).sum()
    assert ratio == pytest.approx(want, rel=1e-9)
    moved = abs(1 - _unbiased_cka(x32, x16))  # the unbiased estimate can move either way
    if lossy:  # the ratio predicts what CKA loses to within a small factor
        assert ratio / 4 <= moved <= 4 * ratio
    assert (fp16_lossy_layers({"blocks.0": ratio}) == ["blocks.0"]) is lossy
    assert (
        bool(moved > FP16_LOSS_LIMIT / 2) is lossy
    )  # the limit separates the CKA changes that show from those that do not


def test_extraction_names_fp16_lossy_layers_records_them_and_info_shows_them(tmp_path, capsys):
    """A ViT whose patch embedding adds +-2000 to four channels: the residual stream carries the offset."""
    import timm

    from conftest import run_cli
    from vitsee.extraction.extract import run_extraction as extract

    torch.manual_seed(0)
    model = timm.create_model("test_vit", img_size=64)
    state = model.state_dict()
    state["patch_embed.proj.bias"][:4] += torch.tensor([2000.0, -2000.0, 2000.0, -2000.0])
    weights = tmp_path / "offset.pth"
    torch.save(state, weights)
    events = []
    cfg = dict(
        models=[f"test_vit@{weights}"],
        dataset="synthetic",
        n_images=8,
        batch_size=8,
        img_size=64,
        device="cpu",
        workers=0,
    )
    result = extract(ExtractConfig(store=tmp_path / "a.h5", **cfg), progress=events.append)
    notes = [e.message for e in events if e.stage == "warning" and "float16" in e.message]  # said even with -q
    assert len(notes) == 1 and "patch_embed" in notes[0] and "--dtype float32" in notes[0]
    assert notes[0] in result.messages
    with Store.open(tmp_path / "a.h5") as s:
        info = s.model_info(s.models[0])
        assert "patch_embed" in info["fp16_lossy_layers"]
        assert info["fp16_loss"]["patch_embed"] > 1e-4
    code, out, _ = run_cli(["info", tmp_path / "a.h5"], capsys)
    assert code == 0 and "float16 storage lost" in out and "--dtype float32" in out
    # float32 storage loses nothing and says nothing; an ordinary model neither
    events.clear()
    extract(ExtractConfig(store=tmp_path / "b.h5", dtype="float32", **cfg), progress=events.append)
    plain = dict(cfg, models=["test_vit@random:0"])
    extract(ExtractConfig(store=tmp_path / "c.h5", **plain), progress=events.append)
    assert not [e for e in events if "float16" in e.message]
    with Store.open(tmp_path / "c.h5") as s:
        assert s.model_info(s.models[0])["fp16_lossy_layers"] == []


def test_info_prints_a_hybrids_grid_in_image_pixels(store_dir, capsys):
    from conftest import run_cli

    code, out, _ = run_cli(["info", _store("hybrid", store_dir)], capsys)
    assert code == 0 and "grid 2x2 of 32 px" in out


def test_stores_without_layouts_read_as_before(tmp_path, tiny_store):
    """Layouts absent (stores written before they were recorded): 2 axes are tokens, 3 are nchw."""
    import shutil

    import h5py

    path = tmp_path / "old.h5"
    shutil.copy(tiny_store, path)
    with h5py.File(path, "r+") as f:
        for model in f["models"].values():
            for ds in model["acts"].values():
                del ds.attrs["layout"]
    with Store.open(path) as s:
        vit, resnet = s.resolve_model("test_vit"), s.resolve_model("test_resnet")
        assert {s.layer_layout(vit, layer) for layer in s.layers(vit)} == {"tokens"}
        assert {s.layer_layout(resnet, layer) for layer in s.layers(resnet)} == {"nchw"}


def test_models_lists_mixer_and_swin_as_families(capsys):
    from conftest import run_cli

    for name, family in (
        ("mixer_s16_224", "mixer"),
        ("swin_tiny_patch4_window7_224", "swin"),
        ("resmlp_12_224", "other"),
    ):
        code, out, _ = run_cli(["models", name], capsys)
        rows = {line.split()[0].partition(".")[0]: line.split()[1] for line in out.splitlines()[1:-1] if line.split()}
        assert code == 0 and rows[name] == family


def test_show_swin_attention_leaves_missing_heads_blank_and_gives_the_stage_references(store_dir, capsys):
    from conftest import run_cli

    path = _store("swin", store_dir)
    code, out, _ = run_cli(["show", path, "attention:vitsee_tiny_swin@random:0", "--color", "none"], capsys)
    assert code == 0 and "nan" not in out
    ref = f"{uniform_attention_distance_px(4, 4):.1f}, {uniform_attention_distance_px(4, 8):.1f} px by stage"
    assert ref in " ".join(out.split())


async def test_the_app_draws_swin_attention_with_its_missing_heads(store_dir, tmp_path):
    """A Swin's first stage has fewer heads than its last: the NaN beyond them must not reach the dot plot's x."""
    from helpers.app import SIZE, make_app, settle, status, view_shown

    path = _store("swin", store_dir)
    app = make_app(Path(path), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("2")
        await settle(pilot, view_shown("attention"))
        line = status(app)
        assert (
            line.startswith("layers.0.blocks.0 head")
            and f"uniform {uniform_attention_distance_px(4, 4):.1f} px" in line
        )
        assert app.is_running


def test_the_probe_estimate_counts_the_features_each_fit_gets_channels_last_included(store_dir):
    """probe_jobs (the app's warning before a long probe job) sizes each fit by the width its readout gives:
    C of a Swin layer's (H, W, C), not H."""
    from vitsee.analyses.probes import probe_jobs
    from vitsee.analyses.driver import AnalyzeConfig

    layouts = set()
    for label in ("swin", "mixer"):
        with Store.open(_store(label, store_dir)) as store:
            key = store.models[0]
            for layer, group, n_probes, width in probe_jobs(store, key, AnalyzeConfig(device="cpu")):
                layouts.add(store.layer_layout(key, layer))
                readouts = probe_readouts(store, key, layer)
                one = store.layer_dataset(key, layer)[:1].astype(np.float32)
                features = readouts["gap" if group == "pooled" else "tokens"](one)  # (1, P, D)
                assert width == features.shape[-1], (label, layer, group)
                assert group == "tokens" or n_probes == len([n for n in readouts if n in ("cls", "gap", "flat")])
    assert "nhwc" in layouts and "tokens" in layouts

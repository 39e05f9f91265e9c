"""Effective receptive fields (paper Fig. 6): against autograd image by image on the tiny models, the patch
embedding's locality, the refusals (changed weights, streaming stores), the view and its export."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import IMG, RESNET, VIT, run_cli


@pytest.fixture()
def store_copy(tiny_store, tmp_path):
    path = tmp_path / "erf.h5"
    shutil.copy(tiny_store, path)
    return path


def _reference_erf(spec: str, module: str, x: np.ndarray, centre) -> np.ndarray:
    """One image at a time: |d centre(output of module) / d x| summed over colours, mean over images, sum 1."""
    from vitsee.models.load import load_model

    model = load_model(spec, img_size=IMG).model
    total = np.zeros(x.shape[2:])
    for image in x:
        inp = torch.tensor(image[None], requires_grad=True)
        seen = {}
        handle = model.get_submodule(module).register_forward_hook(lambda _m, _a, out: seen.__setitem__("out", out))
        model(inp)
        handle.remove()
        centre(seen["out"]).backward()
        total += inp.grad[0].abs().sum(dim=0).double().numpy()
    mean = total / len(x)
    return mean / mean.sum()


def _erf(store_copy, model: str, images: int = 6) -> dict:
    from vitsee.analyses.erf import run_erf
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    with Store.writer(store_copy) as store:
        return run_erf(store, model, AnalyzeConfig(device="cpu", erf_images=images))


def test_vit_erf_matches_autograd_image_by_image(store_copy, monkeypatch):
    from vitsee.analyses import erf
    from vitsee.store import Store

    monkeypatch.setattr(erf, "BATCH", 4)
    result = _erf(store_copy, VIT, images=6)  # two batches of the runner (4 + 2)
    with Store.open(store_copy) as store:
        x = store.model_input(VIT, slice(0, 6))
    layers = [str(x) for x in result["layers"]]
    assert layers == ["patch_embed", *[f"blocks.{b}" for b in range(6)], "norm"]
    centre_token = 1 + 2 * 4 + 2  # CLS, then grid (4 // 2, 4 // 2) of the 4x4 grid
    expected = _reference_erf(VIT, "blocks.3", x, lambda out: out[0, centre_token].sum())
    np.testing.assert_allclose(result["maps"][layers.index("blocks.3")], expected, rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(result["maps"][~result["no_field"]].sum(axis=(1, 2)), 1.0, rtol=1e-9)  # norm: none


def test_cnn_erf_matches_autograd_at_the_centre_of_the_map(store_copy):
    from vitsee.store import Store

    result = _erf(store_copy, RESNET)
    with Store.open(store_copy) as store:
        x = store.model_input(RESNET, slice(0, 6))
    layers = [str(x) for x in result["layers"]]
    expected = _reference_erf(RESNET, "layer2.0", x, lambda out: out[0, :, out.shape[2] // 2, out.shape[3] // 2].sum())
    np.testing.assert_allclose(result["maps"][layers.index("layer2.0")], expected, rtol=1e-4, atol=1e-9)


def test_patch_embedding_erf_covers_only_the_centre_patch(store_copy):
    result = _erf(store_copy, VIT)
    patch_embed = result["maps"][0]  # 16-px patches, grid 4x4: the centre token is the patch at rows/cols 32..47
    inside = np.zeros_like(patch_embed, dtype=bool)
    inside[32:48, 32:48] = True
    assert patch_embed[~inside].max() == 0.0
    assert patch_embed[inside].sum() == pytest.approx(1.0)
    assert (result["maps"][-2][~inside] > 0).any()  # attention spreads the last block's field over the image


def test_a_layer_whose_centre_sum_is_constant_has_no_receptive_field_not_a_map_of_rounding_noise(store_copy, capsys):
    """At random init timm's final LayerNorm (weight 1, bias 0) sums every token's channels to 0: its gradient is
    rounding noise that normalising to sum 1 drew as a map."""
    import json

    from vitsee.analyses.erf import NO_FIELD
    from vitsee.output.figures import figure_for
    from vitsee.analyses.views import load_view

    result = _erf(store_copy, VIT)
    layers = [str(x) for x in result["layers"]]
    assert layers[-1] == "norm" and result["no_field"].tolist() == [False] * (len(layers) - 1) + [True]
    assert np.isnan(result["maps"][-1]).all() and np.isfinite(result["maps"][:-1]).all()
    code, out, err = run_cli(["show", store_copy, "erf:test_vit:norm"], capsys)
    assert code == 0, err
    assert NO_FIELD in " ".join(out.split())
    code, out, err = run_cli(["show", store_copy, "erf:test_vit:norm", "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["no_field"] == NO_FIELD
    code, out, err = run_cli(["show", store_copy, "erf:test_vit:blocks.5", "--format", "json"], capsys)
    assert code == 0 and "no_field" not in json.loads(out) and json.loads(out)["no_field_layers"] == ["norm"]
    fig = figure_for(load_view(store_copy, "erf:test_vit"))
    assert [t.get_gid() for ax in fig.axes if ax.get_label() == "erf-norm" for t in ax.texts] == ["no-field"]


def test_no_field_is_the_gradient_zero_to_working_precision_next_to_a_random_sign_reference():
    import torch

    from vitsee.analyses.erf import Tap, centre_of_tokens, input_gradients, no_field

    class Layers(torch.nn.Module):  # (B, 3, 4, 4) -> tokens (B, 4, 8): a linear map, then LayerNorm without affine
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(12, 8, dtype=torch.float64)
            self.norm = torch.nn.LayerNorm(8, elementwise_affine=False, dtype=torch.float64)
            self.softmax = torch.nn.Softmax(dim=-1)

        def forward(self, x):
            tokens = self.embed(x.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(-1, 4, 12))
            return self.softmax(self.norm(tokens))

    torch.manual_seed(0)
    model, x = Layers().eval(), torch.randn(5, 3, 4, 4, dtype=torch.float64)
    taps = {name: Tap(name, "output", centre_of_tokens(0, (2, 2))) for name in ("embed", "norm", "softmax")}
    reference: dict = {}
    grads = input_gradients(model, x, taps, reference)
    flat = {name: no_field(float(grads[name].sum()), reference[name]) for name in taps}
    assert flat == {"embed": False, "norm": True, "softmax": True}  # a LayerNorm's and a softmax's sums are constant
    assert float(grads["norm"].sum()) < 1e-12 < reference["norm"]
    assert not no_field(1e-3, 1.0) and no_field(1e-5, 1.0) and no_field(0.0, 0.0)


def test_changed_weights_file_is_refused_in_one_line(tmp_path, capsys):
    from safetensors.torch import save_file

    from vitsee.extraction.extract import ExtractConfig, run_extraction
    from vitsee.models.load import load_model

    weights = tmp_path / "w.safetensors"
    model = load_model(VIT, img_size=IMG).model
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    path = tmp_path / "file.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[f"test_vit@{weights}"],
            dataset="synthetic",
            n_images=4,
            batch_size=4,
            img_size=IMG,
            device="cpu",
            workers=0,
        )
    )
    code, _, err = run_cli(["analyze", path, "--erf", "--erf-images", "2", "--device", "cpu", "-q"], capsys)
    assert code == 0, err  # the same file: computed
    state = model.state_dict()
    state["head.bias"] = state["head.bias"] + 1.0
    save_file({k: v.contiguous() for k, v in state.items()}, weights)
    code, _, err = run_cli(["analyze", path, "--erf", "--erf-images", "3", "--device", "cpu", "-q"], capsys)
    assert code == 2 and "changed since extraction" in err and len(err.strip().splitlines()) == 1


def test_streaming_store_is_refused_in_one_line(tmp_path, capsys):
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    path = tmp_path / "stream.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[RESNET],
            dataset="synthetic",
            n_images=8,
            batch_size=8,
            img_size=IMG,
            device="cpu",
            workers=0,
            streaming=True,
        )
    )
    code, _, err = run_cli(["analyze", path, "--erf", "-q"], capsys)
    assert code == 2 and "--streaming" in err and "receptive" in err


def test_erf_view_json_holds_the_pixel_map_and_png_shows_several_depths(store_copy, tmp_path, capsys):
    from vitsee.output.figures import figure_for
    from vitsee.analyses.views import load_view

    code, _, err = run_cli(["analyze", store_copy, "--erf", "--erf-images", "4", "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    out = tmp_path / "erf.json"
    code, _, err = run_cli(["export", store_copy, "erf:test_vit:blocks.2", "--out", out], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["view"] == "erf" and data["params"]["layer"] == "blocks.2" and data["params"]["erf_images"] == 4
    values = np.array(data["values"])
    assert values.shape == (IMG, IMG) and values.sum() == pytest.approx(1.0)
    assert data["rows"] == [str(i) for i in range(IMG)] and data["cols"] == [str(j) for j in range(IMG)]
    view = load_view(store_copy, "erf:test_vit")
    fig = figure_for(view)
    panels = [ax.get_label() for ax in fig.axes if ax.get_label().startswith("erf-")]
    assert panels == ["erf-patch_embed", "erf-blocks.1", "erf-blocks.4", "erf-norm"]
    code, _, err = run_cli(["export", store_copy, "erf:test_vit:blocks.9", "--out", out], capsys)
    assert code == 2 and "no ERF of layer 'blocks.9'" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_erf_and_head_cka_on_cuda_match_cpu(store_copy):
    from vitsee.analyses.heads import run_heads
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    with Store.writer(store_copy) as store:
        cpu = _erf_with(store, "cpu")
        gpu = _erf_with(store, "cuda")
        heads_cpu = run_heads(store, VIT, RESNET, AnalyzeConfig(batch_size=16, shuffles=0, device="cpu"))["cka"]
        heads_gpu = run_heads(
            store, VIT, RESNET, AnalyzeConfig(batch_size=16, shuffles=0, device="cuda", recompute=True)
        )["cka"]
    np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-7)
    np.testing.assert_allclose(heads_gpu, heads_cpu, atol=1e-6)


def _erf_with(store, device: str) -> np.ndarray:
    from vitsee.analyses.erf import run_erf
    from vitsee.analyses.driver import AnalyzeConfig

    return run_erf(store, VIT, AnalyzeConfig(device=device, erf_images=8, recompute=True))["maps"]

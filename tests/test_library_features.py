"""`vitsee.from_features`: a store from another tool's activations gives the CKA vitsee's own extraction gives, runs
the analyses that need activations only, refuses the others in one line, and opens in the app."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
import torch

import vitsee
from conftest import IMG, VIT, run_cli
from vitsee.data import open_dataset
from vitsee.models.load import load_model, make_transform
from vitsee.store import Store as EngineStore
from vitsee.store import copy_store

BLOCKS = [f"blocks.{i}" for i in range(6)]
FAST = {"shuffles": 0, "batch_size": 16, "device": "cpu", "progress": False}


@pytest.fixture(scope="module")
def hooked() -> dict[str, torch.Tensor]:
    """The tiny store's ViT block outputs over its 48 synthetic images, taken with plain forward hooks as another
    tool takes them (thingsvision hooks the module too): {layer: (48, tokens, dim)}."""
    loaded = load_model(VIT, img_size=IMG)
    transform, images = make_transform(loaded), open_dataset("synthetic")
    x = torch.stack([transform(images.image(i)) for i in range(48)])
    seen: dict[str, list[torch.Tensor]] = {layer: [] for layer in BLOCKS}
    hooks = [
        loaded.model.get_submodule(layer).register_forward_hook(
            lambda _m, _a, out, layer=layer: seen[layer].append(out.detach())
        )
        for layer in BLOCKS
    ]
    with torch.inference_mode():
        for start in range(0, 48, 16):
            loaded.model(x[start : start + 16])
    for hook in hooks:
        hook.remove()
    return {layer: torch.cat(parts) for layer, parts in seen.items()}


@pytest.fixture(scope="module")
def store(hooked, tmp_path_factory) -> vitsee.Store:
    """thingsvision's shape: per module a flattened (N, D) numpy array (`extract_features(..., flatten_acts=True)`)."""
    features = {"vit": {layer: acts.flatten(1).numpy() for layer, acts in hooked.items()}}
    return vitsee.from_features(tmp_path_factory.mktemp("features") / "tv.h5", features, images="synthetic")


def test_the_cka_is_the_cka_of_the_store_vitsee_extracted(store, tiny_store, tmp_path):
    extracted = vitsee.open(copy_store(tiny_store, tmp_path / "tiny.h5")).cka(VIT, **FAST)
    rows = [extracted.rows.index(layer) for layer in BLOCKS]
    mine = store.cka("vit", **FAST)
    assert mine.rows == mine.cols == BLOCKS
    # vitsee stores float16 activations; these are the float32 ones: CKA moves by ~1e-6
    assert np.abs(mine.to_numpy() - extracted.to_numpy()[np.ix_(rows, rows)]).max() < 1e-5
    assert not np.allclose(mine.to_numpy(), 1.0)  # layers that differ


def test_torch_tensors_of_tokens_store_the_same_numbers_as_their_flattened_arrays(store, hooked, tmp_path):
    tokens = vitsee.from_features(tmp_path / "tokens.h5", {"vit": hooked}, images="synthetic", prefix_tokens=1)
    with EngineStore.open(tokens.path) as a, EngineStore.open(store.path) as b:
        assert a.layer_layout("vit", "blocks.0") == "tokens" and b.layer_layout("vit", "blocks.0") == "flat"
        assert a.layer_prefix_tokens("vit", "blocks.0") == 1 and a.model_info("vit")["cls_token"]
        for layer in BLOCKS:
            assert np.array_equal(a.activations("vit", layer).reshape(48, -1), b.activations("vit", layer))
    assert np.allclose(tokens.cka("vit", **FAST).to_numpy(), store.cka("vit", **FAST).to_numpy(), atol=1e-12)
    probes = tokens.probes("vit", progress=False, device="cpu")
    assert {"CLS", "GAP"} <= set(probes.cols)  # the first prefix token is the CLS readout


def test_the_images_and_labels_are_those_of_the_dataset_or_given(store, tiny_store, tmp_path, hooked):
    with EngineStore.open(tiny_store) as s:
        assert np.array_equal(store.images.labels, s.labels) and store.images.dataset == s.dataset_spec
    labels = np.arange(48) % 3
    given = vitsee.from_features(
        tmp_path / "l.h5",
        {"m": {"x": hooked["blocks.0"][:, 0]}},
        labels=labels,
        class_names=["a", "b", "c"],
        dtype="float16",
    )
    assert np.array_equal(given.images.labels, labels) and given.images.class_names == ["a", "b", "c"]
    assert given.images.dataset == "from_features" and given.info()["models"]["m"]["dtype"] == "float16"
    seeded = vitsee.from_features(
        tmp_path / "s.h5", {"m": {"x": hooked["blocks.0"][:, 0]}}, images="digits", shuffle_seed=7
    )
    digits = open_dataset("digits")
    chosen = np.random.default_rng(7).permutation(len(digits))[:48]
    assert np.array_equal(seeded.images.index, chosen) and np.array_equal(seeded.images.labels, digits.labels()[chosen])
    assert seeded.probes("m", progress=False, device="cpu").values.shape == (1, 1)


def test_the_analyses_that_need_more_than_activations_say_so_in_one_line(store, capsys):
    from vitsee.analyses.similarity import layer_measures

    measures = [f"{a.name}:vit" for a in layer_measures()]  # CKA and the other measures need activations only
    assert store.views() == [*measures, "agree:vit", "probes:vit"]
    for spec, says in [
        ("attention:vit", "vit holds another tool's activations (vitsee.from_features), not a model vitsee ran"),
        ("skip:vit", "skip-connection ratios are recorded while vitsee runs the model"),
        ("spatial:vit", "spatial maps need `vitsee extract`"),
        ("erf:vit", "effective receptive fields need the model"),
        ("heads:vit:vit", "per-head attention outputs are recorded while vitsee runs the model"),
    ]:
        with pytest.raises(vitsee.VitseeError, match=re.escape(says)) as caught:
            store.view(spec, progress=False)
        code, _, err = run_cli(["show", store.path, spec], capsys)
        assert code == 2 and err.strip() == f"error: {caught.value}"
    code, _, err = run_cli(["analyze", store.path, "--device", "cpu", "--shuffles", "0", "--batch-size", "16"], capsys)
    assert code == 0 and "cka, probes:vit ready" in err


def test_a_non_finite_value_marks_its_cells_as_non_finite(hooked, tmp_path):
    broken = {layer: acts.flatten(1).numpy().copy() for layer, acts in hooked.items()}
    broken["blocks.2"][5, 3] = np.nan
    result = vitsee.from_features(tmp_path / "nan.h5", {"vit": broken}).cka("vit", **FAST)
    assert result.nonfinite[2].all() and result.nonfinite.sum() == 2 * 6 - 1
    assert "non-finite (1 of 48 images)" in result._view.cell_text(2, 0)


def test_the_store_opens_in_the_app(store, tmp_path, capsys):
    from vitsee.tui.app import main

    out = tmp_path / "cka.svg"
    with pytest.raises(SystemExit) as exit_info:
        main([str(store.path), "--snapshot", "cka", "--out", str(out), "--size", "100x30"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    runs = re.findall(r"<text[^>]*>(.*?)</text>", out.read_text())
    screen = "\n".join(html.unescape(run).replace("\xa0", " ") for run in runs)
    assert "48 images of synthetic" in screen and "vit: features" in screen and "blocks.5" in screen


@pytest.mark.parametrize(
    "features, says",
    [
        ([1, 2], "features must be a dict {model: {layer: array"),
        ({"vit": np.zeros((8, 4))}, "features['vit'] is not a dict of layers"),
        ({"vit": {}}, "model 'vit' has no layers"),
        (
            {"vit": {"a": np.zeros((8, 4)), "b": np.zeros((7, 4))}},
            "layer 'b' of model 'vit' has 7 images and the first layer 8",
        ),
        ({"vit": {"a": np.zeros((3, 4))}}, "the features hold 3 image(s) and CKA needs at least 4"),
        ({"vit": {"a": np.zeros(8)}}, "give numbers shaped (images, ...)"),
        ({"vit": {"a": np.array([["x"]] * 8)}}, "give numbers shaped (images, ...)"),
        ({"a/b": {"a": np.zeros((8, 4))}}, "model name 'a/b' holds '/' or ':'"),
        ({"vit@random:0": {"a": np.zeros((8, 4))}}, "model name 'vit@random:0' holds '/' or ':'"),
        ({"vit": {"blocks/1": np.zeros((8, 4))}}, "layer name 'blocks/1' of model 'vit' holds '/'"),
        ({"vit": {"": np.zeros((8, 4))}}, "layer name '' of model 'vit' is not a name"),
    ],
)
def test_features_of_the_wrong_shape_are_one_line_and_write_nothing(features, says, tmp_path):
    with pytest.raises(vitsee.VitseeError, match=re.escape(says)):
        vitsee.from_features(tmp_path / "x.h5", features)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "options, says",
    [
        ({"labels": [0, 1]}, "labels have shape (2,), the features 8 images"),
        ({"labels": [0.5] * 8}, "labels must be class indices"),
        ({"labels": [-2] * 8}, "label -2 is not a class index"),
        ({"images": "nosuch"}, "unknown dataset 'nosuch'"),
        ({"dtype": "int8"}, "unknown dtype 'int8'"),
        ({"prefix_tokens": 5}, "prefix_tokens 5 leaves no other token"),
    ],
)
def test_bad_options_are_one_line_and_write_nothing(options, says, tmp_path):
    with pytest.raises(vitsee.VitseeError, match=re.escape(says)):
        vitsee.from_features(tmp_path / "x.h5", {"m": {"x": np.zeros((8, 5, 4))}}, **options)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_store_is_kept_without_overwrite(store, tmp_path):
    features = {"m": {"x": np.random.default_rng(0).normal(size=(8, 4))}}
    path = vitsee.from_features(tmp_path / "x.h5", features).path
    with pytest.raises(vitsee.VitseeError, match="already exists: pass --overwrite"):
        vitsee.from_features(path, {"other": features["m"]})
    assert vitsee.open(path).models == ["m"]
    assert vitsee.from_features(path, {"other": features["m"]}, overwrite=True).models == ["other"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_at_the_path_is_refused_and_kept_with_or_without_overwrite(overwrite, tmp_path):
    folder = tmp_path / "x.h5"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "notes.txt").write_text("mine\n")
    with pytest.raises(vitsee.VitseeError, match=re.escape(f"{folder} is a folder, not a store file")):
        vitsee.from_features(folder, {"m": {"x": np.zeros((8, 4))}}, overwrite=overwrite)
    assert (folder / "sub" / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.h5"]  # no x.h5.d beside it

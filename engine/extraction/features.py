"""A store from activations another tool extracted (thingsvision, a torch hook, ...): `vitsee.from_features`.

The store is written the way `vitsee extract` writes one (engine/extraction/extract.py): made whole under a temporary
name by `store.creating` with the images and every model's arrays allocated, then filled batch by batch with
`Store.write_batch`, which marks each batch done after its data is on disk. What such a store lacks is what
extraction records beyond activations: the model input, per-image statistics (attention distances, skip ratios),
head outputs and a model that can be rebuilt. So CKA and probes run on it, and the app opens it; attention,
skip, spatial maps, heads and ERFs say that they need `vitsee extract`.

A model's weights record is `{"kind": "features", "source": ...}`; `is_features_model` is how the analyses that
need the model itself or its input tell such a model apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitsee import store as store_mod
from vitsee.errors import VitseeError
from vitsee.store import LayerSpec, Store
from vitsee.store.layout import FEATURES, is_features_model  # noqa: F401 (a store records which models these are)

DTYPES = ("float16", "float32")
NO_IMAGES = "from_features"  # the dataset spec recorded when the images are not named


@dataclass(frozen=True)
class FeatureImages:
    """The images the rows of the features are: a dataset spec, which of its images, their labels."""

    dataset: str
    indices: np.ndarray
    labels: np.ndarray  # -1: no label
    class_names: list[str] | None = None
    shuffle_seed: int | None = None


def feature_images(
    n: int, images: str | None = None, shuffle_seed: int | None = None, labels=None, class_names=None
) -> FeatureImages:
    """Returns the images of n feature rows: the first n of a dataset spec (or a seeded n, as `vitsee extract
    --n-images n --shuffle-seed S` takes them), with its labels unless `labels` gives them; or n unnamed images."""
    from vitsee.data import (
        MIN_IMAGES,
        open_dataset,
        select_indices,
    )  # image decoding: not for the analyses that import this

    if n < MIN_IMAGES:
        raise VitseeError(f"the features hold {n} image(s) and CKA needs at least {MIN_IMAGES}: extract more images")
    if images is not None:
        dataset = open_dataset(images)
        indices = select_indices(len(dataset), n, shuffle_seed)
        spec, names, known = dataset.spec, dataset.class_names, dataset.labels()[indices]
    else:
        spec, names, known, indices = NO_IMAGES, None, np.full(n, -1), np.arange(n, dtype=np.int64)
    if labels is not None:
        known = np.asarray(labels)
        if known.shape != (n,):
            raise VitseeError(
                f"labels have shape {known.shape}, the features {n} images: give one class index per image"
            )
        if known.dtype.kind == "f" and not np.all(known == np.round(known)):
            raise VitseeError("labels must be class indices (whole numbers, -1 for none), not fractions")
        known = known.astype(np.int64)
        if known.min() < -1:
            raise VitseeError(f"label {int(known.min())} is not a class index: use 0, 1, ... (-1 for no label)")
    if class_names is not None:
        names = [str(c) for c in class_names]
    return FeatureImages(spec, indices, np.asarray(known, dtype=np.int64), names, shuffle_seed)


def _check_name(kind: str, name, where: str = "") -> str:
    if not isinstance(name, str) or not name.strip():
        raise VitseeError(f"{kind} name {name!r}{where} is not a name: use a non-empty string")
    if "/" in name or name != name.strip() or (kind == "model" and ":" in name):
        bad = "'/' or ':'" if kind == "model" else "'/'"
        raise VitseeError(
            f"{kind} name '{name}'{where} holds {bad} or surrounding spaces, which the store cannot key: "
            f"rename it, e.g. '{name.strip().replace('/', '.').replace(':', '-')}'"
        )
    return name


def _layer_spec(name: str, array: np.ndarray, prefix_tokens: int) -> LayerSpec:
    """Returns how a (N, ...) array is stored: (N, D) flat, (N, T, D) tokens, (N, C, H, W) feature maps."""
    layout = {1: "flat", 2: "tokens", 3: "nchw"}.get(array.ndim - 1, "flat")
    prefix = prefix_tokens if layout == "tokens" else 0
    if layout == "tokens" and prefix >= array.shape[1]:
        raise VitseeError(f"prefix_tokens {prefix} leaves no other token of layer '{name}' ({array.shape[1]} tokens)")
    return LayerSpec(name, tuple(int(d) for d in array.shape[1:]), prefix_tokens=prefix, module=name, layout=layout)


def as_array(value) -> np.ndarray:
    """Returns a numpy array of a numpy array, a torch tensor (detached, on the CPU; bfloat16 as float32) or
    anything numpy reads, without importing torch."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if str(getattr(value, "dtype", "")) == "torch.bfloat16":  # numpy has no bfloat16
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def check_features(features) -> tuple[int, dict[str, dict[str, np.ndarray]]]:
    """Returns (images, {model: {layer: (N, ...) array}}) of a features mapping, or raises the VitseeError that
    says what is wrong with it (its shape, a name, an array)."""
    if not isinstance(features, Mapping) or not features:
        raise VitseeError(
            "features must be a dict {model: {layer: array (images, ...)}}, e.g. {'alexnet': {'features.10': acts}}"
        )
    out: dict[str, dict[str, np.ndarray]] = {}
    n = None
    for model, layers in features.items():
        _check_name("model", model)
        if not isinstance(layers, Mapping):
            raise VitseeError(
                f"features['{model}'] is not a dict of layers: give {{model: {{layer: array}}}}, e.g. "
                f"{{'my_model': {{'{model}': acts}}}} for one layer"
            )
        if not layers:
            raise VitseeError(f"model '{model}' has no layers: give at least one {{layer: array}}")
        out[model] = {}
        for layer, array in layers.items():
            _check_name("layer", layer, f" of model '{model}'")
            array = as_array(array)
            if array.dtype.kind not in "fiub" or array.ndim < 2:
                raise VitseeError(
                    f"layer '{layer}' of model '{model}' is a {array.dtype} array of shape "
                    f"{array.shape}: "
                    "give numbers shaped (images, ...), e.g. (N, D) or (N, C, H, W)"
                )
            if n is None:
                n = len(array)
            if len(array) != n:
                raise VitseeError(
                    f"layer '{layer}' of model '{model}' has {len(array)} images and the first layer "
                    f"{n}: "
                    "every layer of every model must hold the same images in the same order"
                )
            out[model][layer] = array
    return int(n), out


def write_feature_store(
    path: str | Path,
    features,
    images: FeatureImages,
    *,
    dtype: str = "float32",
    batch_size: int = 64,
    prefix_tokens: int = 0,
    source: str = "vitsee.from_features",
    overwrite: bool = False,
) -> Path:
    """Writes a store holding the given activations as models of their own; returns its path.

    features: {model: {layer: (N, ...) numpy array}} (checked by check_features), layers in forward order;
    images: which images the N rows are (feature_images). dtype: how activations are stored.
    """
    if dtype not in DTYPES:
        raise VitseeError(f"unknown dtype '{dtype}': use float16 or float32")
    if batch_size < 1:
        raise VitseeError(f"batch_size must be at least 1, got {batch_size}")
    if prefix_tokens < 0:
        raise VitseeError(
            f"prefix_tokens {prefix_tokens} is negative: use 0 (no CLS or register tokens) or their count"
        )
    n, features = check_features(features)
    if len(images.indices) != n:
        raise VitseeError(
            f"the images are {len(images.indices)} and the features {n}: give the images the features were made of"
        )
    path = Path(path)
    specs = {m: [_layer_spec(name, a, prefix_tokens) for name, a in layers.items()] for m, layers in features.items()}
    with store_mod.creating(path, overwrite=overwrite) as h5:
        store_mod.write_images(
            h5, images.dataset, images.indices, images.labels, images.class_names, images.shuffle_seed
        )
        for model, layers in specs.items():
            record = _record(model, source, prefix_tokens)
            store_mod.add_model_layout(h5, record, layers, [], (1,), batch_size, dtype, n)
            del h5[f"models/{model}/input"]  # extraction's model input, which another tool's features do not come with
    with Store.writer(path, rows=True) as store:
        for model, layers in features.items():
            for b, start in enumerate(range(0, n, batch_size)):
                rows = slice(start, min(start + batch_size, n))
                batch = {layer: np.asarray(a[rows], dtype=dtype) for layer, a in layers.items()}
                nonfinite = [int((~np.isfinite(v)).sum()) for v in batch.values()]
                store.write_batch(model, b, batch, {}, None, nonfinite)
    return path


def _record(model: str, source: str, prefix_tokens: int) -> dict:
    """Returns the model record of a features model: what extraction records, with nothing known of the model."""
    return {
        "key": model,
        "spec": model,
        "name": model,
        "tag": None,
        "timm_name": None,
        "family": "other",
        "weights": {"kind": FEATURES, "source": source, "seed": None, "path": None, "sha256": None},
        "data_config": {"input_size": None},
        "grid_size": None,
        "patch_size": None,
        # the first prefix token of a token layer is taken for a class token (the probes' CLS readout)
        "num_prefix_tokens": int(prefix_tokens),
        "cls_token": bool(prefix_tokens),
        "prefix_names": [],
        "num_blocks": 0,
        "num_heads": 0,
        "extra": {},
    }

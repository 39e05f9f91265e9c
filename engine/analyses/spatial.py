"""Spatial localisation (Raghu et al. 2021, Fig. 9, 10): minibatch CKA between one token position's
representation and the pixels of each input patch; the layout of a layer's cells, the parameters (cache key)
and the run over the store.

The pixels are the model's input as the store keeps it (`input`): after timm's eval transform (resize, crop,
per-channel mean/std normalisation) and in the store's dtype, not the raw image. A fair choice, since that is
what the tokens are computed from; CKA against the raw 0-255 pixels differs by about 2e-3. Views say so (INPUT_NOTE).
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import numpy as np

from ..errors import VitseeError
from ..features import is_features_model
from ..store import Store, read_rows
from .base import Analysis, AnalyzeConfig, StepFn, _check_ready, _device, _emit, _save, _with_stats, batch_plan
from .cka import _cka_accumulator, _cka_slots, _pooled_stats


INPUT_NOTE = "pixels: the model's normalised input as the store keeps it, not the raw image"


def _spatial_layout(store: Store, key: str, layer: str) -> tuple[tuple[int, int], int, Callable[[np.ndarray], list[np.ndarray]]]:
    """Returns (grid, patch px, function activations (b, ...) -> per-cell (b, D) features)."""
    shape = store.layer_shape(key, layer)
    layout = store.layer_layout(key, layer)
    info = store.model_info(key)
    if is_features_model(info):  # vitsee.from_features: no model input to cut into patches
        raise VitseeError(f"{key} holds another tool's activations without the model's input: spatial maps need "
                          "`vitsee extract`")
    _, h, w = info["data_config"]["input_size"]
    if layout == "tokens":  # ViT / Mixer tokens
        if not info.get("grid_size"):
            raise VitseeError(f"{key} has no patch grid: spatial maps need a ViT-like or CNN model")
        gh, gw = info["grid_size"]
        prefix = store.layer_prefix_tokens(key, layer)
        if shape[0] != prefix + gh * gw:
            raise VitseeError(f"layer {layer} of {key} has {shape[0]} tokens, not a {gh}x{gw} grid: pick a block output")
        return (gh, gw), h // gh, lambda a: [a[:, prefix + t, :] for t in range(gh * gw)]
    if layout in ("nchw", "nhwc"):
        gh, gw = shape[1:] if layout == "nchw" else shape[:2]
        if h % gh or w % gw:
            raise VitseeError(f"layer {layer} of {key} has a {gh}x{gw} map that does not tile the {h}x{w} input: pick another layer")
        if layout == "nhwc":  # channels-last (Swin): a cell is a[:, i, j, :]
            return (gh, gw), h // gh, lambda a: [a[:, i, j, :] for i in range(gh) for j in range(gw)]
        return (gh, gw), h // gh, lambda a: [a[:, :, i, j] for i in range(gh) for j in range(gw)]
    raise VitseeError(f"layer {layer} of {key} has shape {shape}: spatial maps need tokens or feature maps")


def default_spatial_layer(store: Store, key: str) -> str:
    """Returns the last block output (the paper's choice), or the last stored layer."""
    layers = store.layers(key)
    blocks = [layer for layer in layers if layer.startswith("blocks.") and layer.count(".") == 1]
    blocks = blocks or [layer for layer in layers if re.fullmatch(r"layers\.\d+\.blocks\.\d+", layer)]  # Swin
    if blocks:
        return blocks[-1]
    cnn = [layer for layer in layers if store.layer_layout(key, layer) in ("nchw", "nhwc")]
    return (cnn or layers)[-1]


def spatial_params(store: Store, key: str, cfg: AnalyzeConfig, layer: str | None = None) -> dict:
    store.require_activations("spatial maps cannot be computed")
    layer = layer or cfg.spatial_layer or default_spatial_layer(store, key)
    store.layer_dataset(key, layer)  # names the close matches if the layer is unknown
    params = {"model": key, "layer": layer, "n_images": store.n_images, "batch_size": min(cfg.batch_size, store.n_images),
              "shuffles": cfg.shuffles, "seed": cfg.seed if cfg.shuffles else None}
    # intervals only: a permutation per token and patch pair would cost more than the maps themselves
    return _with_stats(params, cfg, permutations=0)


def run_spatial(store: Store, model: str, cfg: AnalyzeConfig, layer: str | None = None, progress: StepFn | None = None) -> dict:
    """Returns the (cells, cells) CKA between each token position's representation and the pixels of each
    input patch (the normalised model input the store keeps): row t reshaped to the grid is token t's map."""
    key = store.resolve_model(model)
    store.require_complete(key)
    params = spatial_params(store, key, cfg, layer)
    layer, batch_size = params["layer"], params["batch_size"]
    (gh, gw), patch, cells = _spatial_layout(store, key, layer)
    cached = None if cfg.recompute else store.get_result("spatial", params)
    if cached is not None:
        return cached
    _check_ready(store, [key])
    device = _device(cfg.device)
    n_cells = gh * gw
    plan = batch_plan(store.n_images, batch_size, cfg.shuffles, cfg.seed)
    accumulators = [_cka_accumulator(2 * n_cells, device, params, k) for k in range(max(1, cfg.shuffles))]
    slots = _cka_slots(params)
    ds = store.layer_dataset(key, layer)
    pixels = store.model_group(key)["input"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b, (k, rows) in enumerate(plan):
            acts = read_rows(ds, rows)
            img = read_rows(pixels, rows)  # (b, 3, H, W)
            b_ = len(rows)
            patches = img.reshape(b_, 3, gh, patch, gw, patch).transpose(0, 2, 4, 1, 3, 5).reshape(b_, n_cells, -1)
            accumulators[k].update([*cells(acts), *[patches[:, c] for c in range(n_cells)]], slot=b % slots)
            _emit(progress, f"spatial {key}", b + 1, len(plan))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        maps = np.mean([acc.result(nonfinite="nan")[:n_cells, n_cells:] for acc in accumulators], axis=0)
        st = params.get("stats")
        per_shuffle = [] if st is None else [acc.statistics(st["ci"], st["bootstrap"], [st["seed"], k])
                                             for k, acc in enumerate(accumulators)]
    arrays = {"maps": maps, "grid": np.array([gh, gw]), "patch_px": np.array(patch)}
    for name, value in _pooled_stats(per_shuffle).items():
        arrays[name] = value[:n_cells, n_cells:] if value.ndim == 2 else value
    return _save(store, "spatial", params, arrays)


def applies(store: Store, key: str) -> bool:
    """Returns whether spatial maps apply to a model: activations are stored and its default layer has a grid."""
    if store.streaming:  # the maps read activations
        return False
    try:
        _spatial_layout(store, key, default_spatial_layer(store, key))
    except VitseeError:
        return False
    return True


# --- view and registration ------------------------------------------------------------------------


def view_fields(r: dict, keys: list[str], info: dict, layer: str | None = None) -> dict:
    """Returns the fields of the View of spatial:MODEL[:LAYER]: each token's map over the input patches."""
    key = keys[0]
    gh, gw = (int(v) for v in r["grid"])
    cells = [f"r{i}c{j}" for i in range(gh) for j in range(gw)]
    params = dict(r["_params"])
    extra = {"grid": [gh, gw], "patch_px": int(r["patch_px"]), "pixels": INPUT_NOTE,
             **({"n_batches": int(r["n_batches"])} if "n_batches" in r else {})}
    return dict(kind="spatial", spec="", title=f"Spatial localisation {key} {params['layer']}", subtitle="", matrix=r["maps"],
                rows=[f"token {c}" for c in cells], cols=[f"patch {c}" for c in cells], value_name="CKA", vmin=0.0,
                vmax=1.0, params=params, extra=extra, models=[key], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"))


SPEC = Analysis(
    name="spatial", identity=("model", "layer", "n_images"),
    params=lambda store, keys, layer, cfg: spatial_params(store, keys[0], cfg, layer),
    run=lambda store, keys, layer, cfg, progress=None: run_spatial(store, keys[0], cfg, layer, progress),
    view=view_fields, applies=applies, figure="spatial", layer=True, per_model=True, usage="spatial:MODEL[:LAYER]",
)

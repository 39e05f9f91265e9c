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

from vitsee.errors import VitseeError
from vitsee.store.layout import is_features_model
from vitsee.store import Store, read_rows
from vitsee.analyses.base import (
    AnalyzeConfig,
    StepFn,
    batch_plan,
    check_ready,
    emit,
    nonfinite_image_mask,
    resolve_device,
    save_result,
    with_stats,
)
from vitsee.analyses.cka import cka_accumulator, cka_slots, pooled_stats
from vitsee.analyses.contract import (
    Analysis,
    AnalysisOption,
    DossierEntry,
    Request,
    Result,
    Shape,
    View,
    bootstrap_words,
    streaming_reason,
)

RAMP = " .:-=+*#%@"  # a map as glyphs, dark to bright (readable without colour)


INPUT_NOTE = "pixels: the model's normalised input as the store keeps it, not the raw image"


def features_reason(key: str) -> str:
    """Returns why a model made from another tool's activations (vitsee.from_features) has no spatial maps."""
    return f"{key} holds another tool's activations without the model's input: spatial maps need `vitsee extract`"


def spatial_layout(
    store: Store, key: str, layer: str
) -> tuple[tuple[int, int], int, Callable[[np.ndarray], list[np.ndarray]]]:
    """Returns (grid, patch px, function activations (b, ...) -> per-cell (b, D) features)."""
    shape = store.layer_shape(key, layer)
    layout = store.layer_layout(key, layer)
    info = store.model_info(key)
    if is_features_model(info):  # vitsee.from_features: no model input to cut into patches
        raise VitseeError(features_reason(key))
    _, h, w = info["data_config"]["input_size"]
    if layout == "tokens":  # ViT / Mixer tokens
        if not info.get("grid_size"):
            raise VitseeError(f"{key} has no patch grid: spatial maps need a ViT-like or CNN model")
        gh, gw = info["grid_size"]
        prefix = store.layer_prefix_tokens(key, layer)
        if shape[0] != prefix + gh * gw:
            raise VitseeError(
                f"layer {layer} of {key} has {shape[0]} tokens, not a {gh}x{gw} grid: pick a block output"
            )
        return (gh, gw), h // gh, lambda a: [a[:, prefix + t, :] for t in range(gh * gw)]
    if layout in ("nchw", "nhwc"):
        gh, gw = shape[1:] if layout == "nchw" else shape[:2]
        if h % gh or w % gw:
            raise VitseeError(
                f"layer {layer} of {key} has a {gh}x{gw} map that does not tile the {h}x{w} input: pick another layer"
            )
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
    params = {
        "model": key,
        "layer": layer,
        "n_images": store.n_images,
        "batch_size": min(cfg.batch_size, store.n_images),
        "shuffles": cfg.shuffles,
        "seed": cfg.seed if cfg.shuffles else None,
    }
    # intervals only: a permutation per token and patch pair would cost more than the maps themselves
    return with_stats(params, cfg, permutations=0)


def run_spatial(
    store: Store, model: str, cfg: AnalyzeConfig, layer: str | None = None, progress: StepFn | None = None
) -> Result:
    """Returns the (cells, cells) CKA between each token position's representation and the pixels of each
    input patch (the normalised model input the store keeps): row t reshaped to the grid is token t's map."""
    key = store.resolve_model(model)
    store.require_complete(key)
    params = spatial_params(store, key, cfg, layer)
    layer, batch_size = params["layer"], params["batch_size"]
    (gh, gw), patch, cells = spatial_layout(store, key, layer)
    cached = None if cfg.recompute else Result.load(store, "spatial", params)
    if cached is not None:
        return cached
    check_ready(store, [key])
    device = resolve_device(cfg.device)
    n_cells = gh * gw
    plan = batch_plan(store.n_images, batch_size, cfg.shuffles, cfg.seed)
    accumulators = [cka_accumulator(2 * n_cells, device, params, k) for k in range(max(1, cfg.shuffles))]
    slots = cka_slots(params)
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
            emit(progress, f"spatial {key}", b + 1, len(plan))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        maps = np.mean([acc.result(nonfinite="nan")[:n_cells, n_cells:] for acc in accumulators], axis=0)
        st = params.get("stats")
        per_shuffle = (
            []
            if st is None
            else [acc.statistics(st["ci"], st.get("bootstrap"), [st["seed"], k]) for k, acc in enumerate(accumulators)]
        )
    arrays = {"maps": maps, "grid": np.array([gh, gw]), "patch_px": np.array(patch)}
    for name, value in pooled_stats(per_shuffle).items():
        arrays[name] = value[:n_cells, n_cells:] if value.ndim == 2 else value
    return save_result(store, "spatial", params, arrays)


def has_grid(store: Store, key: str, layer: str) -> bool:
    """Returns whether a layer of a model has a token grid or feature map that spatial maps can be of."""
    try:
        spatial_layout(store, key, layer)
    except VitseeError:
        return False
    return True


# --- the view and its dossier section --------------------------------------------------------------------


def ramp_rows(grid: np.ndarray) -> list[str]:
    """Returns a map as rows of RAMP glyphs scaled from its minimum to its maximum (NaN as a blank)."""
    finite = grid[np.isfinite(grid)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = high - low or 1.0
    levels = np.clip(((grid - low) / span * (len(RAMP) - 2)).round(), 0, len(RAMP) - 2)
    return [
        "".join(" " if not np.isfinite(v) else RAMP[int(lv) + 1] for v, lv in zip(vals, lvls))
        for vals, lvls in zip(grid, levels)
    ]


def spatial_lines(view: View) -> list[str]:
    """Returns how local the layer's tokens are (CKA with their own input patch) and the centre token's map."""
    gh, gw = (int(g) for g in view.extra["grid"])
    matrix = np.asarray(view.matrix, dtype=float)  # (tokens, patches)
    own = np.diag(matrix)
    finite = np.isfinite(matrix).any(axis=1)
    peaks = np.array([np.nanargmax(row) if ok else -1 for row, ok in zip(matrix, finite)])
    at_own = int((peaks == np.arange(len(peaks))).sum())
    centre = (gh // 2) * gw + gw // 2
    lines = [
        f"CKA of a token with its own patch: mean {np.nanmean(own):.3f}; the peak is its own patch for "
        f"{at_own} of {len(own)} tokens",
        f"map of token r{gh // 2}c{gw // 2} (dark {RAMP[1]} to bright {RAMP[-1]}):",
    ]
    lines += ["  " + row for row in ramp_rows(matrix[centre].reshape(gh, gw))]
    return lines


class SpatialMaps(Analysis):
    """Spatial localisation (paper Fig. 9, 10): for one layer, the CKA of each token position with the pixels of
    every input patch, a map over the grid per token."""

    name = "spatial"
    label = "Spatial"
    title = "CKA of each token of a layer with the pixels of every input patch"
    figures = ("9", "10")
    order = 50
    shape = Shape.TOKEN_MAPS
    tooltip = "Show the spatial localisation maps"
    option_help = "spatial localisation maps"
    options = (AnalysisOption("spatial-layer", str, "layer of the spatial maps (default: last block)", param="layer"),)
    cost = 1
    takes_layer = True
    needs = frozenset({"activations", "input"})
    identity = ("model", "layer", "n_images")
    nonfinite_source = "activations"
    dossier_title = "Spatial map"
    layer_list_title = "Map of layer (Enter)"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:  # the maps read activations
            return streaming_reason(store, "spatial maps cannot be computed")
        if is_features_model(store.model_info(key)):
            return features_reason(key)
        if not has_grid(store, key, default_spatial_layer(store, key)):
            return f"{key} has no layer with a token grid or feature map"
        return None

    def layer_choices(self, store: Store, key: str) -> list[str]:
        return [layer for layer in store.layers(key) if has_grid(store, key, layer)]

    def layer_missing(self, layer: str) -> str:
        return f"{layer} has no token grid or feature map"

    def command(self, store_path, layer: str | None = None) -> str:
        return super().command(store_path) + (f" --spatial-layer {layer}" if layer else "")

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return spatial_params(store, request.keys[0], cfg, request.layer)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_spatial(store, request.keys[0], cfg, request.layer, progress)

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns each token's map over the input patches (rows: tokens, cols: patches)."""
        r, key = result, request.keys[0]
        gh, gw = (int(v) for v in r["grid"])
        cells = [f"r{i}c{j}" for i in range(gh) for j in range(gw)]
        params = dict(r.params)
        extra = {
            "grid": [gh, gw],
            "patch_px": int(r["patch_px"]),
            "pixels": INPUT_NOTE,
            **({"n_batches": int(r["n_batches"])} if "n_batches" in r else {}),
        }
        return View.of(
            request,
            title=f"Spatial localisation {key} {params['layer']}",
            matrix=r["maps"],
            rows=[f"token {c}" for c in cells],
            cols=[f"patch {c}" for c in cells],
            value_name="CKA",
            vmin=0.0,
            vmax=1.0,
            params=params,
            extra=extra,
            models=[key],
            ci_low=r.get("ci_low"),
            ci_high=r.get("ci_high"),
        )

    def interval_words(self, view: View, level: str) -> str:
        return bootstrap_words(view, level)

    def nonfinite_images(self, view: View, store: Store) -> np.ndarray | None:
        """Returns per token the images whose activations of that token hold NaN/Inf."""
        _, _, cells = spatial_layout(store, view.models[0], view.params["layer"])
        tokens = nonfinite_image_mask(store, view.models[0], view.params["layer"], cells)  # (N, cells)
        if tokens is None:
            return None
        per_token = tokens.sum(axis=0)
        return np.where(view.nonfinite & (per_token[:, None] > 0), per_token[:, None], -1)

    def dossier_section(self, view: View, layer: str, note: str = "") -> DossierEntry:
        return DossierEntry(layer, spatial_lines(view))

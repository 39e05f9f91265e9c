"""Effective receptive fields (Raghu et al. 2021, Fig. 6; Luo et al. 2017): how much each input pixel moves the
centre position of a layer.

For a layer, the scalar is the sum over channels of the centre position's output (ViT: the spatial token at
grid (gh // 2, gw // 2); CNN: map position (H // 2, W // 2)). The ERF is the mean over images of
|d scalar / d input|, summed over colour channels, normalised to sum 1; the input is the preprocessed input
the store holds. The model is reloaded exactly as recorded (spec, weights and their sha256, input size).

A layer whose centre scalar does not depend on the input has no receptive field, only rounding noise that
normalising would blow up into a map: at random init timm's final `norm` (a LayerNorm with weight 1 and bias 0)
makes the channel sum of every token 0 whatever the input, and its gradient is ~1e-14 in fp64, 4e-5 in fp32. So
the first batch also takes the gradient of a fixed random-sign sum of the centre's channels (which any layer with
a field moves): where the centre sum's gradient is under NO_FIELD_RTOL of it, the layer is marked `no_field`
and its map left empty (measured on vit_tiny / resnet18 at random init: 5.6e-8 for `norm`, 0.56 to 1 for every
other layer).

The pure core is `input_gradients` (a model, hooks and a batch in, per-layer |gradient| maps out) and
`normalised`; `run_erf` is the store-facing runner, `erf_params` its cache key, and `ReceptiveFields` its contract
(view, to which models it applies, its dossier section: engine/analyses/contract.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vitsee.errors import VitseeError
from vitsee.store.layout import is_features_model
from vitsee.lazy import lazy_module
from vitsee.store import Store

if TYPE_CHECKING:
    from torch import nn

    from vitsee.models.load import LoadedModel

# the shared plumbing of the store-facing runners (device, progress, caching with provenance)
from vitsee.analyses.base import AnalyzeConfig, StepFn, emit, resolve_device, save_result
from vitsee.analyses.contract import Analysis, AnalysisOption, DossierEntry, Request, Result, Shape, View

torch = lazy_module("torch")  # imported on first use: a cached ERF view is read without torch
models_mod = lazy_module("vitsee.models.load")

ANALYSIS = "erf"
IDENTITY = ("model", "layers", "n_images")  # any number of averaged images serves a view that asked for none
BATCH = 16  # images per backward pass: the graph of every layer is kept until each layer's gradient is taken
DEFAULT_IMAGES = 32
NO_FIELD_RTOL = 1e-4  # about 1000 fp32 epsilons: a centre sum whose gradient is this small next to the reference's
NO_FIELD = (
    "no receptive field: this layer's centre sum does not depend on the input (its gradient is rounding "
    "noise, e.g. a LayerNorm at random init, whose channels sum to a constant)"
)


# --- the pure core ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tap:
    """Where a layer's output is read (its module, and whether it is that module's input or output) and how
    to reduce it to one scalar per image (`centre`: (B, ...) -> (B,))."""

    module: str
    kind: str
    centre: Callable[[torch.Tensor], torch.Tensor]


def centre_of_tokens(prefix: int, grid: tuple[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Returns (B, tokens, C) -> (B,) the sum over channels of the spatial token at grid (gh // 2, gw // 2)."""
    gh, gw = grid
    index = prefix + (gh // 2) * gw + gw // 2

    def centre(out: torch.Tensor) -> torch.Tensor:
        if out.ndim == 4:  # timm's PatchEmbed can hand out an NHWC grid: tokens as the store keeps them
            out = out.flatten(1, 2)
        return out[:, index, :].sum(dim=-1)

    return centre


def centre_of_map(out: torch.Tensor) -> torch.Tensor:
    """Returns (B, C, H, W) -> (B,) the sum over channels of map position (H // 2, W // 2)."""
    return out[:, :, out.shape[2] // 2, out.shape[3] // 2].sum(dim=1)


def input_gradients(
    model: nn.Module, x: torch.Tensor, taps: dict[str, Tap], reference: dict[str, float] | None = None
) -> dict[str, torch.Tensor]:
    """Returns per layer (B, H, W): |d centre scalar / d x| summed over colour channels, for each image of x.

    One forward with a hook per layer, then one gradient per layer through the kept graph. The images of a
    batch are independent in eval mode, so the gradient of the batch's summed scalars is each image's own.
    reference, if given, gets per layer the summed |gradient| of a fixed random-sign sum of the centre's
    channels: the scale a gradient of this layer has (see NO_FIELD_RTOL).
    """
    outputs: dict[str, torch.Tensor] = {}
    handles = []
    for name, tap in taps.items():
        module = model.get_submodule(tap.module)
        if tap.kind == "input":
            handles.append(
                module.register_forward_pre_hook(lambda _m, args, n=name: outputs.__setitem__(n, _first(args)))
            )
        else:
            handles.append(
                module.register_forward_hook(lambda _m, _a, out, n=name: outputs.__setitem__(n, _first(out)))
            )
    x = x.detach().clone().requires_grad_(True)
    try:
        with torch.enable_grad():
            model(x)
            names = list(taps)
            grads = {}
            for i, name in enumerate(names):
                if reference is not None:
                    reference[name] = _reference_gradient(taps[name], outputs[name], x)
                scalar = taps[name].centre(outputs[name]).sum()
                (grad,) = torch.autograd.grad(scalar, x, retain_graph=i < len(names) - 1, allow_unused=True)
                grads[name] = torch.zeros_like(x[:, 0]) if grad is None else grad.abs().sum(dim=1)  # (B, H, W)
    finally:
        for handle in handles:
            handle.remove()
    return grads


def _reference_gradient(tap: Tap, out: torch.Tensor, x: torch.Tensor) -> float:
    """Returns the summed |d (centre of signs * out) / d x|, signs a fixed random +-1 per channel and position."""
    signs = torch.randint(0, 2, out.shape[1:], generator=torch.Generator().manual_seed(0)).to(out) * 2 - 1
    (grad,) = torch.autograd.grad(tap.centre(out * signs).sum(), x, retain_graph=True, allow_unused=True)
    return 0.0 if grad is None else float(grad.abs().sum())


def no_field(gradient_sum: float, reference_sum: float) -> bool:
    """Returns whether a centre scalar's summed |gradient| is zero to working precision next to the reference's."""
    return gradient_sum <= NO_FIELD_RTOL * reference_sum


def _first(value) -> torch.Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value


def normalised(total: np.ndarray) -> np.ndarray:
    """Returns maps (..., H, W) each divided by its sum (nan where a map is all zero)."""
    sums = total.sum(axis=(-2, -1), keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sums > 0, total / np.where(sums > 0, sums, 1.0), np.nan)


# --- the store-facing runner ----------------------------------------------------------------------------------


def check_reloadable_store(store: Store) -> None:
    """Refuses a streaming store: it keeps no model input to take gradients against."""
    if store.streaming:
        raise VitseeError(streaming_reason(store))


def streaming_reason(store: Store) -> str:
    """Returns why a streaming store has no effective receptive fields: it keeps no model input."""
    return (
        f"{store.path} was extracted with --streaming, which keeps no model input, so effective receptive "
        "fields cannot be computed: re-extract without --streaming into another store"
    )


def features_reason(key: str) -> str:
    """Returns why a model made from another tool's activations (vitsee.from_features) has no ERF."""
    return (
        f"{key} holds another tool's activations, not a model vitsee can rebuild: effective receptive "
        "fields need the model, extracted with `vitsee extract --model NAME`"
    )


def no_centre_reason(key: str) -> str:
    """Returns why a model has no effective receptive field: no stored layer has a centre position."""
    return f"{key} has no layer with a token grid or feature map: effective receptive fields need one"


def centre_taps(store: Store, key: str, info: dict) -> dict[str, Tap]:
    """Returns the layers that have a centre position (tokens on the grid, feature maps) and their taps."""
    taps = {}
    if is_features_model(info):  # vitsee.from_features: no model to take gradients through
        return taps
    for layer in store.layers(key):
        shape = store.layer_shape(key, layer)
        attrs = store.layer_dataset(key, layer).attrs
        module, kind = str(attrs.get("module") or layer), str(attrs.get("kind") or "output")
        if len(shape) == 2 and info.get("grid_size"):
            prefix = store.layer_prefix_tokens(key, layer)
            gh, gw = info["grid_size"]
            if shape[0] == prefix + gh * gw:
                taps[layer] = Tap(module, kind, centre_of_tokens(prefix, (gh, gw)))
        elif len(shape) == 3:
            taps[layer] = Tap(module, kind, centre_of_map)
    return taps


def erf_params(store: Store, model: str, cfg) -> dict:
    """Returns the cache key of erf:MODEL: the model, its layers with a centre, and how many images."""
    check_reloadable_store(store)
    key = store.resolve_model(model)
    info = store.model_info(key)
    if is_features_model(info):
        raise VitseeError(features_reason(key))
    layers = list(centre_taps(store, key, info))
    if not layers:
        raise VitseeError(no_centre_reason(key))
    images = int(getattr(cfg, "erf_images", DEFAULT_IMAGES))
    if images < 1:
        raise VitseeError(f"--erf-images must be at least 1, got {images}")
    return {
        "model": key,
        "layers": layers,
        "n_images": store.n_images,
        "erf_images": min(images, store.n_images),
        "weights_sha256": info["weights"].get("sha256"),
    }


def reload_model(store: Store, key: str, device: torch.device) -> LoadedModel:
    """Returns the model rebuilt exactly as recorded (spec, weights, input size), refusing changed weights."""
    info = store.model_info(key)
    recorded = info["weights"]
    _, h, w = info["data_config"]["input_size"]
    loaded = models_mod.load_model(
        models_mod.parse_model_spec(info["spec"]), img_size=int(h) if h == w else None, device=device
    )
    if recorded.get("sha256") != loaded.weights.get("sha256"):
        raise VitseeError(
            f"the weights of {key} changed since extraction (sha256 {str(recorded.get('sha256'))[:12]} recorded, "
            f"{str(loaded.weights.get('sha256'))[:12]} now in {loaded.weights.get('path')}): put the original file "
            "back, or re-extract the model with these weights"
        )
    if list(loaded.data_config["input_size"]) != list(info["data_config"]["input_size"]):
        raise VitseeError(
            f"{key} rebuilds with input {loaded.data_config['input_size']}, not the recorded "
            f"{info['data_config']['input_size']}: re-extract it with this timm"
        )
    for p in loaded.model.parameters():
        p.requires_grad_(False)  # gradients are taken against the input only
    return loaded


def _check_reproduces(
    store: Store, key: str, model: nn.Module, x: torch.Tensor, taps: dict[str, Tap], rows: np.ndarray
) -> None:
    """Refuses a reloaded model whose forward does not give the stored activations of the first images
    (another timm's random init, say): its ERF would not be the recorded model's."""
    layer = list(taps)[-1]
    seen: dict[str, torch.Tensor] = {}
    tap = taps[layer]
    module = model.get_submodule(tap.module)
    if tap.kind == "input":
        handle = module.register_forward_pre_hook(lambda _m, args: seen.__setitem__("v", _first(args)))
    else:
        handle = module.register_forward_hook(lambda _m, _a, out: seen.__setitem__("v", _first(out)))
    try:
        with torch.inference_mode():
            model(x)
    finally:
        handle.remove()
    got = seen["v"].float().cpu().reshape(len(rows), -1).numpy()
    stored = store.activations(key, layer, rows).reshape(len(rows), -1)
    scale = float(np.abs(stored).max()) or 1.0
    if float(np.abs(got - stored).max()) > 2e-2 * scale + 1e-3:
        raise VitseeError(
            f"{key} rebuilt from its record does not reproduce the stored {layer} activations (timm or weights "
            "differ from extraction): re-extract the model, then compute its ERF"
        )


def run_erf(store: Store, model: str, cfg, progress=None) -> Result:
    """Returns the ERF result (cached or computed): `maps` (layers, H, W), each summing to 1, over the first
    erf_images images of the store."""
    params = erf_params(store, model, cfg)
    key = params["model"]
    store.require_complete(key)
    cached = None if cfg.recompute else Result.load(store, ANALYSIS, params)
    if cached is not None:
        return cached
    device = resolve_device(cfg.device)
    loaded = reload_model(store, key, device)
    taps = {
        layer: tap for layer, tap in centre_taps(store, key, store.model_info(key)).items() if layer in params["layers"]
    }
    n = params["erf_images"]
    total: dict[str, np.ndarray] = {}
    reference: dict[str, float] = {}
    first: dict[str, float] = {}
    starts = list(range(0, n, BATCH))
    for b, start in enumerate(starts):
        rows = np.arange(start, min(start + BATCH, n))
        x = torch.from_numpy(store.model_input(key, slice(int(rows[0]), int(rows[-1]) + 1))).to(device)
        if b == 0:
            _check_reproduces(store, key, loaded.model, x, taps, rows)
        grads = input_gradients(loaded.model, x, taps, reference if b == 0 else None)
        for layer, g in grads.items():
            total[layer] = total.get(layer, 0.0) + g.double().sum(dim=0).cpu().numpy()
            first.setdefault(layer, float(total[layer].sum()))
        emit(progress, f"erf {key}", b + 1, len(starts))
    flat = np.array([no_field(first[layer], reference[layer]) for layer in params["layers"]])
    maps = normalised(np.stack([total[layer] / n for layer in params["layers"]]))  # mean over images, then sum 1
    maps[flat] = np.nan  # rounding noise, not a field
    _, h, w = store.model_info(key)["data_config"]["input_size"]
    return save_result(
        store,
        ANALYSIS,
        params,
        {"maps": maps, "layers": np.array(params["layers"]), "input_hw": np.array([h, w]), "no_field": flat},
    )


# --- the view ---------------------------------------------------------------------------------------------------


def depths(layers: Sequence[str], count: int = 4) -> list[int]:
    """Returns up to `count` layer indices spread from the first to the last (the PNG's panels)."""
    if len(layers) <= count:
        return list(range(len(layers)))
    return sorted({round(i * (len(layers) - 1) / (count - 1)) for i in range(count)})


def half_mass_radius(erf: np.ndarray) -> float:
    """Returns the radius in px around the centre pixel (H // 2, W // 2) holding half of the map's total."""
    h, w = erf.shape
    yy, xx = np.mgrid[0:h, 0:w]
    radius = np.hypot(yy - h // 2, xx - w // 2).ravel()
    order = np.argsort(radius, kind="stable")
    share = np.nan_to_num(erf.ravel()[order]) / np.nansum(erf)
    return float(radius[order][np.searchsorted(np.cumsum(share), 0.5 - 1e-12)])


def erf_lines(view: View) -> list[str]:
    """Returns how spread the layer's effective receptive field is: its half-mass radius and its peak's share."""
    if view.extra.get("no_field"):  # rounding noise, not a map
        return [view.extra["no_field"]]
    erf = np.asarray(view.matrix, dtype=float)
    h, w = erf.shape
    return [
        f"half of |d centre / d input| lies within {half_mass_radius(erf):.1f} px of the centre pixel "
        f"(input {h}x{w}); the peak pixel holds {np.nanmax(erf) / np.nansum(erf):.2%}"
    ]


class ReceptiveFields(Analysis):
    """Effective receptive fields (paper Fig. 6): the gradient of a layer's centre position with respect to the
    input, for every stored layer with a centre; the models are reloaded from their record."""

    name = ANALYSIS
    label = "ERF"
    title = "effective receptive field of every layer's centre position (mean |d centre / d input|)"
    figures = ("6",)
    order = 70
    shape = Shape.PIXEL_MAP
    tooltip = "Show the effective receptive fields"
    option_help = "effective receptive fields of every stored layer (paper Fig. 6); reloads the models"
    options = (AnalysisOption("erf-images", int, "images the ERF averages over (the store's first N) [default: 32]"),)
    by_default = False  # asked for: it reloads every model (from the Hub for pretrained weights)
    cost = 3
    takes_layer = True
    needs = frozenset({"input", "weights"})
    identity = IDENTITY
    dossier_title = "Effective receptive field"
    layer_list_title = "ERF of layer (Enter)"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:  # it reads the stored inputs
            return streaming_reason(store)
        if is_features_model(store.model_info(key)):  # and reloads the model
            return features_reason(key)
        if not centre_taps(store, key, store.model_info(key)):
            return no_centre_reason(key)
        return None

    def layer_choices(self, store: Store, key: str) -> list[str]:
        return [] if store.streaming else list(centre_taps(store, key, store.model_info(key)))

    def layer_missing(self, layer: str) -> str:
        return f"{layer} has no centre position for a receptive field"

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return erf_params(store, request.keys[0], cfg)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_erf(store, request.keys[0], cfg, progress)

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the H x W map of one layer (default: the first), rows / cols pixel indices, and a few depths'
        maps for the PNG."""
        key, layer = request.keys[0], request.layer
        layers = [str(x) for x in result["layers"]]
        layer = layer or layers[0]
        if layer not in layers:
            raise VitseeError(f"no ERF of layer '{layer}' for {key}: it has {', '.join(layers)}")
        maps = np.asarray(result["maps"], dtype=float)
        matrix = maps[layers.index(layer)]
        finite = matrix[np.isfinite(matrix) & (matrix > 0)]
        shown = depths(layers)
        flat = [str(x) for x, f in zip(layers, result.get("no_field", np.zeros(len(layers), bool))) if f]
        extra = {
            "layers": layers,
            "depth_layers": [layers[i] for i in shown],
            "depth_maps": {layers[i]: maps[i] for i in shown},
            "min_positive": float(finite.min()) if finite.size else 0.0,
            "no_field_layers": flat,
            **({"no_field": NO_FIELD} if layer in flat else {}),
        }
        params = dict(result.params, layer=layer)
        params.pop("layers", None)
        h, w = matrix.shape
        return View.of(
            request,
            title=f"Effective receptive field {key} {layer}",
            matrix=matrix,
            rows=[str(i) for i in range(h)],
            cols=[str(j) for j in range(w)],
            value_name="ERF (share of |grad|)",
            vmin=0.0,
            vmax=float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 1.0,
            params=params,
            extra=extra,
            models=[key],
        )

    def dossier_section(self, view: View, layer: str, note: str = "") -> DossierEntry:
        return DossierEntry(layer, erf_lines(view))

"""Mean attention distance (Raghu et al. 2021, Fig. 3-4): how far, in pixels, each head looks.

The pure core (the distances the extraction hooks compute per image) comes first; then the store-facing runner:
the parameters of a result (its cache key) and the per-block summary over the stored per-image statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.lazy import lazy_module
from vitsee.analyses.base import AnalyzeConfig, RunningMoments, StepFn, emit, save_result, with_interval
from vitsee.analyses.contract import Analysis, DossierEntry, Request, Result, Shape, View, features_reason
from vitsee.store.layout import is_features_model

torch = lazy_module("torch")  # reading a cached result needs numpy only; torch is imported by the first computation


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    return int(v), int(v)


@lru_cache(maxsize=16)
def _patch_distance_px_cpu(grid: tuple[int, int], patch: tuple[int, int]) -> torch.Tensor:
    gh, gw = grid
    ph, pw = patch
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([rows.flatten() * ph, cols.flatten() * pw], dim=1).double()  # (P, 2) px
    return torch.cdist(centres, centres)  # (P, P)


def patch_distance_px(grid_size, patch_size, device=None, dtype=None) -> torch.Tensor:
    """Returns the (P, P) pixel distance between the centres of every pair of patches of the grid (float32
    unless dtype says otherwise)."""
    return _patch_distance_px_cpu(_pair(grid_size), _pair(patch_size)).to(device=device, dtype=dtype or torch.float32)


def mean_attention_distance(
    attn: torch.Tensor,
    grid_size,
    patch_size,
    num_prefix_tokens: int = 1,
    renormalise: bool = False,
) -> torch.Tensor:
    """Returns (B, H): per image and head, the attention-weighted query-key patch distance in pixels.

    attn is (B, H, T, T) with softmax rows, T = num_prefix_tokens + grid cells. Prefix tokens (CLS,
    registers, distillation) are dropped as queries and as keys; by default the remaining weights are
    NOT renormalised (the convention of the paper's authors), so attention spent on CLS counts as
    distance zero. renormalise=True rescales each query's spatial weights to sum to one.
    """
    gh, gw = _pair(grid_size)
    n_patches = gh * gw
    t = attn.shape[-1]
    if t != num_prefix_tokens + n_patches:
        raise ValueError(
            f"attention has {t} tokens but the grid {gh}x{gw} plus {num_prefix_tokens} prefix tokens "
            f"makes {num_prefix_tokens + n_patches}"
        )
    spatial = attn[..., num_prefix_tokens:, num_prefix_tokens:].float()  # (B, H, P, P)
    dist = patch_distance_px(grid_size, patch_size, device=attn.device)  # (P, P)
    per_query = (spatial * dist).sum(-1)  # (B, H, P)
    if renormalise:
        per_query = per_query / spatial.sum(-1).clamp_min(torch.finfo(torch.float32).tiny)
    return per_query.mean(-1)  # (B, H)


def uniform_attention_distance_px(grid_size, patch_size) -> float:
    """Returns the mean attention distance of attention spread evenly over every patch of the grid."""
    return float(_patch_distance_px_cpu(_pair(grid_size), _pair(patch_size)).mean())


def mean_window_attention_distance(attn: torch.Tensor, batch: int, map_size, window, token_px) -> torch.Tensor:
    """Returns (B, H): per image and head, the attention-weighted query-key distance in px inside Swin's windows.

    attn is (B * windows, H, A, A) as timm's WindowAttention computes it: the (shifted, then padded) map cut into
    windows of A = wh * ww tokens, image-major, windows row by row. Distances are between token centres inside
    a window (token_px apart), so they never exceed the window's diagonal; in a shifted window the tokens that
    the cyclic shift brings together from opposite borders are masked from each other, so their pairs weigh
    nothing. Queries on the padding (a map the windows do not tile) are left out of the mean.
    """
    wh, ww = _pair(window)
    h, w = _pair(map_size)
    hp, wp = -(-h // wh) * wh, -(-w // ww) * ww
    dist = patch_distance_px((wh, ww), token_px, device=attn.device)  # (A, A)
    per_query = (attn.float() * dist).sum(-1)  # (B * windows, H, A)
    heads = per_query.shape[1]
    per_query = per_query.view(batch, hp // wh, wp // ww, heads, wh, ww)
    per_query = per_query.permute(0, 3, 1, 4, 2, 5).reshape(batch, heads, hp, wp)  # the (shifted) map again
    return per_query[:, :, :h, :w].mean(dim=(-2, -1))


def sort_heads(distances: np.ndarray) -> np.ndarray:
    """Returns per-block head distances sorted ascending along the last axis, as the paper plots them."""
    return np.sort(np.asarray(distances), axis=-1)


__all__ = [
    "mean_attention_distance",
    "mean_window_attention_distance",
    "patch_distance_px",
    "uniform_attention_distance_px",
    "sort_heads",
]


# --- store-facing runner ----------------------------------------------------------------------------


def attention_params(store: Store, key: str, cfg: AnalyzeConfig) -> dict:
    return with_interval({"model": key, "n_images": store.n_images, "bins": 32}, cfg)


def run_attention(store: Store, model: str, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
    """Returns per block: heads' mean distances (sorted), their spread over images, and the histogram
    over heads and images, with the distance of uniform attention for the model's grid."""
    key = store.resolve_model(model)
    store.require_complete(key)
    info = store.model_info(key)
    if "attention_distance" not in store.stats(key):
        raise VitseeError(no_attention_reason(key, info))
    params = attention_params(store, key, cfg)
    bins = params["bins"]
    cached = None if cfg.recompute else Result.load(store, "attention", params)
    if cached is not None:
        return cached
    uniform, max_px = attention_reference(info)
    edges = np.linspace(0.0, max_px, bins + 1)
    plain, renorm = RunningMoments(), RunningMoments()
    hist = 0
    for batch in store.stat_batches(key, ["attention_distance", "attention_distance_renorm"]):
        dist = batch["attention_distance"]  # (b, blocks, heads)
        plain.update(dist)
        renorm.update(batch["attention_distance_renorm"])
        # a Swin block's missing heads (fewer than the widest stage's) are NaN: not counted
        hist = hist + np.stack([np.histogram(_present(dist[:, b, :]), bins=edges)[0] for b in range(dist.shape[1])])
    mean = plain.mean  # (blocks, heads)
    order = np.argsort(mean, axis=1)  # missing heads sort last
    arrays = {
        "mean_px": np.take_along_axis(mean, order, axis=1),  # sorted ascending per block
        "std_px": np.take_along_axis(plain.std, order, axis=1),
        "head_order": order,
        "mean_renorm_px": np.take_along_axis(renorm.mean, order, axis=1),  # the same head in the same column
        "hist_counts": hist,
        "hist_edges": edges,
        "uniform_px": np.array(uniform[-1]),
        "uniform_px_per_block": np.array(uniform),
        "heads_per_block": _heads_per_block(info, mean.shape),
        "blocks": np.array(_attention_block_names(info, mean.shape[0])),
    }
    if "stats" in params:  # Student-t interval of each head's mean over the images
        low, high = stats_mod.mean_interval(mean, plain.std, plain.n, params["stats"]["ci"])
        arrays["ci_low_px"] = np.take_along_axis(low, order, axis=1)
        arrays["ci_high_px"] = np.take_along_axis(high, order, axis=1)
    emit(progress, f"attention {key}", 1, 1)
    return save_result(store, "attention", params, arrays)


def no_attention_reason(key: str, info: dict) -> str:
    """Returns the one line that says why a model has no attention distances."""
    if info.get("family") == "mixer":
        return f"{key} is an MLP-Mixer: it mixes tokens with MLPs, not attention, so it has no attention distances"
    return f"{key} has no attention distances ({info['family']} model): they exist for ViT- and Swin-like models only"


def attention_reference(info: dict) -> tuple[list[float], float]:
    """Returns per block the mean distance of uniform attention (over the grid; for Swin over a window of its
    stage) and the largest distance any head can have (the histogram's range), in px."""
    if info.get("family") == "swin":
        uniform, largest = [], 0.0
        for stage in info["extra"]["stages"]:
            (wh, ww), (ph, pw) = stage["window"], stage["token_px"]
            uniform += [uniform_attention_distance_px((wh, ww), (ph, pw))] * stage["blocks"]
            largest = max(largest, float(np.hypot((wh - 1) * ph, (ww - 1) * pw)))  # a window's diagonal
        return uniform, largest
    gh, gw = info["grid_size"]
    ph, pw = info["patch_size"]  # px per token: input size / grid (a hybrid's stem patch is smaller)
    uniform = uniform_attention_distance_px((gh, gw), (ph, pw))
    return [uniform] * int(info["num_blocks"]), float(np.hypot((gh - 1) * ph, (gw - 1) * pw))


def _present(values: np.ndarray) -> np.ndarray:
    values = values.ravel()
    return values[~np.isnan(values)]


def _heads_per_block(info: dict, shape: tuple[int, int]) -> np.ndarray:
    if info.get("family") == "swin":
        return np.array([st["heads"] for st in info["extra"]["stages"] for _ in range(st["blocks"])])
    return np.full(shape[0], shape[1])


def _attention_block_names(info: dict, n: int) -> list[str]:
    if info.get("family") == "swin":
        return [f"layers.{s}.blocks.{b}" for s, st in enumerate(info["extra"]["stages"]) for b in range(st["blocks"])]
    return [f"blocks.{b}" for b in range(n)]


# --- the view and its dossier section --------------------------------------------------------------------


def block_of(blocks: Sequence[str], layer: str) -> str | None:
    """Returns the block a layer belongs to (blocks.3 for blocks.3 and blocks.3.attn), None outside every block."""
    return next((b for b in blocks if layer == b or layer.startswith(b + ".")), None)


def attention_lines(view: View, block: str) -> list[str]:
    """Returns the block's heads, nearest first, with their mean distance in px and its interval."""
    r = view.rows.index(block)
    order = np.asarray(view.extra["head_order"])[r]
    uniform = np.asarray(view.extra.get("uniform_px_per_block", [view.extra["uniform_px"]] * len(view.rows)))[r]
    heads = []
    for h, distance in enumerate(view.matrix[r]):
        shown = f"{distance:.1f} px" if np.isfinite(distance) else view.cell_text(r, h)
        if view.ci_low is not None and np.isfinite(view.ci_low[r, h]):
            shown += f" [{view.ci_low[r, h]:.1f}, {view.ci_high[r, h]:.1f}]"
        heads.append(f"head {int(order[h]) + 1} {shown}")
    finite = view.matrix[r][np.isfinite(view.matrix[r])]
    mean = f"{finite.mean():.1f} px" if finite.size else "none finite"
    return [f"{len(heads)} heads, mean {mean}; uniform attention {float(uniform):.1f} px", "  ".join(heads)]


class AttentionDistances(Analysis):
    """Mean attention distance per head and block (paper Fig. 3, 4), summarised from the per-image distances the
    extraction recorded."""

    name = "attention"
    label = "Attention"
    short_label = "Attn"
    title = "mean attention distance of every head, per block (ViT- and Swin-like models)"
    figures = ("3", "4")
    order = 20
    shape = Shape.HEADS_BY_BLOCK
    tooltip = "Show the mean attention distances per head and block"
    option_help = "mean attention distances (ViT-like)"
    cost = 0
    needs = frozenset({"statistics"})
    identity = ("model", "n_images", "bins")
    dossier_title = "Attention distances"
    layer_list_title = "Blocks (Enter: go)"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if is_features_model(store.model_info(key)):  # no model at all: its family says nothing here
            return features_reason(key, "attention distances")
        if "attention_distance" not in store.stats(key):
            return no_attention_reason(key, store.model_info(key))
        return None

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return attention_params(store, request.keys[0], cfg)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_attention(store, request.keys[0], cfg, progress)

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns heads' mean distances per block, sorted, with their spread, histograms and uniform reference."""
        r, key = result, request.keys[0]
        heads = r["mean_px"].shape[1]
        blocks = len(r["mean_px"])
        extra = {
            "std_px": r["std_px"],
            "hist_counts": r["hist_counts"],
            "hist_edges": r["hist_edges"],
            "uniform_px": float(r["uniform_px"]),
            "head_order": r["head_order"],
            "mean_renorm_px": r["mean_renorm_px"],
            # Swin: uniform attention inside a window of each stage; its earlier stages have fewer heads (NaN beyond)
            "uniform_px_per_block": r.get("uniform_px_per_block", np.full(blocks, float(r["uniform_px"]))),
            "heads_per_block": r.get("heads_per_block", np.full(blocks, heads)),
        }
        title = f"Mean attention distance {key}"
        if info.get("family") == "swin":
            title += " (inside shifted windows; uniform reference per stage)"
        return View.of(
            request,
            title=title,
            matrix=r["mean_px"],
            rows=[str(b) for b in r["blocks"]],
            cols=[f"head {h + 1}" for h in range(heads)],
            value_name="distance (px)",
            vmin=0.0,
            vmax=float(r["hist_edges"][-1]),
            params=dict(r.params),
            extra=extra,
            models=[key],
            ci_low=r.get("ci_low_px"),
            ci_high=r.get("ci_high_px"),
        )

    def present(self, view: View) -> np.ndarray | None:
        """Returns the cells of heads that exist: a Swin stage's missing heads are no values."""
        if "heads_per_block" not in view.extra:
            return None
        heads = np.asarray(view.extra["heads_per_block"])
        return np.arange(view.matrix.shape[1])[None, :] < heads[:, None]

    def nonfinite_images(self, view: View, store: Store) -> np.ndarray:
        """Returns per head the images whose distance of that head is NaN/Inf."""
        per_head = (~np.isfinite(store.attention_distance(view.models[0]))).sum(axis=0)  # (blocks, heads)
        sorted_counts = np.take_along_axis(per_head, np.asarray(view.extra["head_order"]), axis=1)
        return np.where(view.nonfinite, sorted_counts, -1)

    def dossier_section(self, view: View, layer: str, note: str = "") -> DossierEntry:
        block = block_of(list(view.rows), layer)
        if block is None:
            return DossierEntry(
                layer, [f"{layer} is not an attention block ({view.rows[0]} \u2026 {view.rows[-1]} are)"], False
            )
        return DossierEntry(block, attention_lines(view, block))

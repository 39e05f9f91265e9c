"""Mean attention distance (Raghu et al. 2021, Fig. 3-4): how far, in pixels, each head looks."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


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


def patch_distance_px(grid_size, patch_size, device=None, dtype=torch.float32) -> torch.Tensor:
    """Returns the (P, P) pixel distance between the centres of every pair of patches of the grid."""
    return _patch_distance_px_cpu(_pair(grid_size), _pair(patch_size)).to(device=device, dtype=dtype)


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

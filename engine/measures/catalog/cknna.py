"""Centred kernel nearest-neighbour alignment between layers (Huh et al. 2024, platonic-rep's CKNNA): CKA of the
cosine kernels restricted to the pairs of images that are among each other's k nearest in both layers, so only
the local structure both layers agree on counts.

    K, L: cosine kernels of the L2-normalised rows; M_ij = 1 where j is among i's k nearest in both layers
    CKNNA = HSIC(M * K, M * L) / sqrt(HSIC(M_X * K, M_X * K) HSIC(M_Y * L, M_Y * L))  (platonic-rep's HSIC)

At most 1 (a layer with itself), and it can fall below 0. Nearly but not exactly symmetric (the mutual-neighbour
mask is not), so the matrix of a model with itself is not either, by ~1e-3. Invariant to rotations and isotropic
scales, not to translations.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.lazy import lazy_module
from vitsee.measures.catalog.mknn import KNN_K
from vitsee.measures.grams import LayerGrams, check_rows, neighbour_pool
from vitsee.measures.kernels import MIN_DEBIASED, check_k, cosine_gram, feature_pair, knn_mask
from vitsee.measures.registry import AT_N, Measure

torch = lazy_module("torch")


def masked_hsic(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Returns platonic-rep's hsic_unbiased of two (n, n) kernels, not necessarily symmetric, diagonals zeroed:
    [sum(A * B') + sum(A) sum(B) / ((n-1)(n-2)) - 2/(n-2) 1'AB1] / (n (n-3))."""
    n = a.shape[-1]
    a = a.clone()
    b = b.clone()
    a.diagonal(dim1=-2, dim2=-1).zero_()
    b.diagonal(dim1=-2, dim2=-1).zero_()
    trace = (a * b.transpose(-1, -2)).sum(dim=(-2, -1))
    sums = a.sum(dim=(-2, -1)) * b.sum(dim=(-2, -1)) / ((n - 1) * (n - 2))
    cross = (a.sum(dim=-2) * b.sum(dim=-1)).sum(dim=-1) * (2.0 / (n - 2))  # 1'AB1 = (A'1) . (B1)
    return (trace + sums - cross) / (n * (n - 3))


def cknna_from_kernels(k: torch.Tensor, l: torch.Tensor, mask_k: torch.Tensor, mask_l: torch.Tensor) -> float:
    """Returns CKNNA (Huh et al. 2024, platonic-rep's cknna with unbiased=True) of two cosine kernels and their kNN
    masks: HSIC restricted to mutual neighbours over the geometric mean of each layer's HSIC on its own neighbours."""
    mutual = (mask_k & mask_l).to(k.dtype)
    cross = masked_hsic(mutual * k, mutual * l)
    own_k = masked_hsic(mask_k.to(k.dtype) * k, mask_k.to(k.dtype) * k)
    own_l = masked_hsic(mask_l.to(l.dtype) * l, mask_l.to(l.dtype) * l)
    own = float(own_k) * float(own_l)
    return float(cross) / math.sqrt(own) if own > 0 else math.nan


def cknna(x: Any, y: Any, k: int = KNN_K.default) -> float:
    """Returns centred kernel nearest-neighbour alignment (Huh et al. 2024, platonic-rep's cknna), at most 1.

    K, L: inner products of the L2-normalised rows; M_K, M_L: each row's k nearest others (self excluded). With
    HSIC(A, B) platonic-rep's unbiased estimator (its own centring; A, B need not be symmetric),
    CKNNA = HSIC(M o K, M o L) / sqrt(HSIC(M_K o K, M_K o K) HSIC(M_L o L, M_L o L)), M = M_K o M_L the mutual
    neighbours. platonic-rep adds 1e-6 to the denominator; here it is exact, so a representation and itself give 1
    (NaN when a self term is not positive). Needs 2 <= k < n and n >= 4. Invariant to rotations and isotropic
    scaling, not to translation. Nearly but not exactly symmetric: the mutual-neighbour mask is not symmetric (j among
    i's neighbours in both, not i among j's), so the 1'AB1 term differs from 1'BA1 (by ~1e-3 of the value on 60
    random examples).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(40, 6))
    >>> round(cknna(x, x, k=5), 6)
    1.0
    """
    x, y = feature_pair(x, y, "cknna", MIN_DEBIASED)
    k = check_k(k, x.shape[0], "cknna", least=2)
    kx, ky = cosine_gram(x, "x", "cknna"), cosine_gram(y, "y", "cknna")
    if kx is None or ky is None:
        return math.nan
    return cknna_from_kernels(kx, ky, knn_mask(kx, k), knn_mask(ky, k))


def pairwise_cknna(a: list[LayerGrams], b: list[LayerGrams], k: int) -> np.ndarray:
    """Returns CKNNA of every layer of a against every layer of b, pair by pair from each layer's cosine kernel, kNN
    mask and self term built once."""
    check_rows(a, MIN_DEBIASED, "cknna")
    k = check_k(k, neighbour_pool(a), "cknna", least=2)

    def parts(g: LayerGrams):
        if g.constant:
            return None
        cos, mask = g.cosine(), g.knn(k)
        own = masked_hsic(mask * cos, mask * cos)
        return cos, mask, float(own)

    pa = [parts(g) for g in a]
    pb = pa if b is a else [parts(g) for g in b]
    out = np.full((len(a), len(b)), np.nan)
    for i, x in enumerate(pa):
        for j, y in enumerate(pb):
            if x is None or y is None or not x[2] * y[2] > 0:
                continue
            mutual = (x[1] & y[1]).to(torch.float64)
            out[i, j] = float(masked_hsic(mutual * x[0], mutual * y[0])) / math.sqrt(x[2] * y[2])
    return out


class CKNNA(Measure):
    """CKNNA: CKA over the pairs of images that are near neighbours in both layers."""

    name = "cknna"
    interval_holds = AT_N + " (k neighbours among n images: another n, another number; wider than needed)"
    label = "CKNNA"
    title = "centred kernel nearest-neighbour alignment between layers (Huh et al. 2024)"
    option_help = "CKNNA (CKA over the pairs of images that are near neighbours in both layers) of every pair"
    order = 16
    parameters = (KNN_K,)
    symmetric = False
    value_range = (None, 1.0)  # a kernel alignment: it can fall below 0
    seconds_at_1000 = 8.4
    direct = staticmethod(cknna)
    pairwise = staticmethod(pairwise_cknna)

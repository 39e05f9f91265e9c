"""Mutual k-nearest-neighbour alignment between layers (Huh et al. 2024, "The Platonic Representation
Hypothesis", as platonic-rep measures it): how many of each image's k nearest images are the same in both layers.

    N_X(i): the k images whose L2-normalised features have the largest inner product with image i's (itself excluded)
    mknn(X, Y) = mean_i |N_X(i) & N_Y(i)| / k

1 for a layer with itself, about k / n for unrelated ones. Invariant to rotations and isotropic scales, not to
translations (rows are normalised without centring, as platonic-rep does).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.lazy import lazy_module
from vitsee.measures import floor
from vitsee.measures.grams import LayerGrams, build_parts, neighbour_pool
from vitsee.measures.kernels import check_k, cosine_gram, feature_pair
from vitsee.measures.registry import AT_N, Measure, Parameter

torch = lazy_module("torch")

KNN_K = Parameter(
    "k",
    10,
    "mknn and CKNNA: the neighbours of each image (Huh et al. take 10)",
    option="knn-k",
    check=lambda value, measure, n: check_k(value, n, measure),
)


def mknn(x: Any, y: Any, k: int = KNN_K.default) -> float:
    """Returns mutual k-nearest-neighbour alignment (Huh et al. 2024, platonic-rep's mutual_knn), in [0, 1].

    Rows are L2-normalised (not centred) and each example's k nearest others are those of largest inner product
    (itself excluded; ties to the lower index); the measure is mean_i |N_x(i) & N_y(i)| / k. Symmetric; 1 for a
    representation and itself. Invariant to rotations and isotropic scaling, not to translation (a shift changes
    the angles between examples) and not to other linear maps.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(40, 6))
    >>> mknn(x, 3 * x, k=5)
    1.0
    """
    x, y = feature_pair(x, y, "mknn", 2)
    k = check_k(k, x.shape[0], "mknn")
    kx, ky = floor.both(lambda f, name: cosine_gram(f, name, "mknn"), x, y)
    if kx is None or ky is None:
        return math.nan
    with floor.one_thread_on(kx):
        iy = floor.knn_indices(ky, k)
        return floor.mutual_neighbours(floor.knn_indices(kx, k), floor.mask_from_indices(iy, len(ky)))


def pairwise_mknn(a: list[LayerGrams], b: list[LayerGrams], k: int) -> np.ndarray:
    """Returns mknn of every layer of a against every layer of b: per pair, the column layer's mask read at the row
    layer's n k neighbours (floor.mutual_neighbours), not a product of n x n masks."""
    k = check_k(k, neighbour_pool(a), "mknn")
    build_parts([*a, *b], lambda g: None if g.constant else g.knn(k))
    ia = [None if g.constant else g.knn_indices(k) for g in a]
    mb = [None if g.constant else g.knn(k) for g in b]
    out = np.full((len(a), len(b)), np.nan)
    for i, idx in enumerate(ia):
        for j, mask in enumerate(mb):
            if idx is not None and mask is not None:
                out[i, j] = floor.mutual_neighbours(idx, mask)
    return out


class MutualKNN(Measure):
    """mknn: the share of each image's k nearest images that both layers agree on."""

    name = "mknn"
    interval_holds = AT_N + " (k neighbours among n images: another n, another number; wider than needed)"
    label = "mknn"
    title = "mutual k-nearest-neighbour alignment between layers (Huh et al. 2024)"
    option_help = "mutual k-NN alignment (share of each image's k nearest images that both layers agree on)"
    order = 15
    parameters = (KNN_K,)
    alike = "more shared neighbours"
    seconds_at_1000 = 0.05  # 0.53 before issue 32: 16x at n = 1,000 (--floor)
    direct = staticmethod(mknn)
    pairwise = staticmethod(pairwise_mknn)

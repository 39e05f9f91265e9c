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
from vitsee.measures.grams import LayerGrams, neighbour_pool, stack_products
from vitsee.measures.kernels import check_k, cosine_gram, feature_pair, knn_mask
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
    kx, ky = cosine_gram(x, "x", "mknn"), cosine_gram(y, "y", "mknn")
    if kx is None or ky is None:
        return math.nan
    return float((knn_mask(kx, k) & knn_mask(ky, k)).sum()) / (x.shape[0] * k)


def pairwise_mknn(a: list[LayerGrams], b: list[LayerGrams], k: int) -> np.ndarray:
    """Returns mknn of every layer of a against every layer of b: one product of the layers' flattened kNN masks."""
    k = check_k(k, neighbour_pool(a), "mknn")
    part = lambda g: None if g.constant else g.knn(k).to(torch.float64)  # noqa: E731
    return stack_products(part, a, b, scale=1.0 / (a[0].n * k))


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
    seconds_at_1000 = 0.53
    direct = staticmethod(mknn)
    pairwise = staticmethod(pairwise_mknn)

"""Representational similarity analysis between layers (Kriegeskorte et al. 2008, as rsatoolbox computes it): the
rank correlation of the two layers' dissimilarity matrices over the same images.

    RDM_ij = 1 - Pearson r between images i and j over the layer's features
    RSA(X, Y) = Spearman correlation of the RDMs' upper triangles

Invariant to a shift or scale of one image's features and to isotropic scales, not to rotations or translations of
the feature space (the correlation distance centres each image over its features).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from vitsee.lazy import lazy_module
from vitsee.measures.grams import LayerGrams, check_rows, stack_products
from vitsee.measures.kernels import CONSTANT_RTOL, average_ranks, centred, feature_pair, upper
from vitsee.measures.registry import Measure

torch = lazy_module("torch")


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Returns the Pearson correlation of two vectors (NaN when either is constant)."""
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else math.nan


def correlation_rows(x: torch.Tensor) -> torch.Tensor | None:
    """Returns x's rows centred over their features and L2-normalised (row i . row j = Pearson r of examples i, j),
    or None when an example's features are all equal (its correlation with anything is undefined)."""
    xr = x - x.mean(dim=1, keepdim=True)
    norms = xr.norm(dim=1, keepdim=True)
    if bool((norms <= CONSTANT_RTOL * x.norm(dim=1, keepdim=True)).any()) or bool((norms == 0).any()):
        return None
    return xr / norms


def rsa(x: Any, y: Any) -> float:
    """Returns RSA (Kriegeskorte et al. 2008, as rsatoolbox computes it): the Spearman correlation of two RDMs.

    RDM_ij = 1 - Pearson correlation of examples i and j over their features (rsatoolbox's calc_rdm 'correlation');
    the n (n - 1) / 2 entries above the diagonal of the two RDMs are ranked (ties averaged) and correlated
    (compare 'spearman'). Symmetric. Invariant to isotropic scaling, to a shift or a scale of any one example and to
    permutations of the features; not to rotations or translation of the feature space. NaN, with a warning, when
    an example's features are all equal (its correlation distance is undefined) or the layer is constant.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(20, 6))
    >>> round(rsa(x, 2 * x[:, ::-1]), 6)
    1.0
    """
    x, y = feature_pair(x, y, "rsa", 3)
    vectors = []
    for name, f in (("x", x), ("y", y)):
        if centred(f, name, "rsa") is None:
            return math.nan
        rows = correlation_rows(f)
        if rows is None:
            warnings.warn(
                f"an example of {name} has all its features equal: its correlation distance, and rsa, is nan",
                stacklevel=2,
            )
            return math.nan
        vectors.append(average_ranks(upper(1 - rows @ rows.T)))
    return pearson(*vectors)


def pairwise_rsa(a: list[LayerGrams], b: list[LayerGrams]) -> np.ndarray:
    """Returns RSA of every layer of a against every layer of b: one product of the layers' centred, unit RDM ranks
    (the Pearson correlation of ranks is Spearman's)."""
    check_rows(a, 3, "rsa")

    def part(g: LayerGrams) -> torch.Tensor | None:
        ranks = None if g.constant else g.rdm_ranks()
        if ranks is None:
            return None
        centred = ranks - ranks.mean()
        return centred / centred.norm()

    return stack_products(part, a, b)


class RSA(Measure):
    """RSA: the Spearman correlation of the layers' correlation-distance RDMs."""

    name = "rsa"
    interval_holds = "holds the large-n value"
    label = "RSA"
    title = "RSA between layers: Spearman correlation of their dissimilarity matrices (Kriegeskorte et al. 2008)"
    option_help = "RSA (Spearman correlation of the layers' correlation-distance RDMs) of every pair of layers"
    order = 17
    alike = "more alike RDMs"
    value_range = (None, 1.0)  # a rank correlation: it can fall below 0
    seconds_at_1000 = 0.21
    direct = staticmethod(rsa)
    pairwise = staticmethod(pairwise_rsa)

    def undefined(self, grams: LayerGrams) -> str:
        """'flat': an image whose features are all equal correlates with no other (a layer of one feature)."""
        return "flat" if grams.rdm_ranks() is None else ""

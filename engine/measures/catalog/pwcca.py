"""PWCCA between layers (Morcos et al. 2018): SVCCA's canonical correlations weighted by how much of the row
layer's representation each canonical direction accounts for, so correlations of directions that carry little
of the layer count little.

    rho_i, h_i: canonical correlations and directions of the reduced layers; a_i = sum_j |<h_i, x_j>|, normalised;
    PWCCA(X, Y) = sum_i a_i rho_i

Not symmetric (weighted by the row layer): the matrix of a model with itself is not either. Invariant to rotations,
translations and isotropic scales. The SVD step, CCA and the loop over pairs are SVCCA's (svcca.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.lazy import lazy_module
from vitsee.measures.catalog.svcca import KEEP, canonical_correlations, cca_pairs, check_keep, reduced
from vitsee.measures.grams import LayerGrams
from vitsee.measures.kernels import feature_pair
from vitsee.measures.registry import AT_N, Measure

torch = lazy_module("torch")


def pwcca_from_basis(rho: torch.Tensor, a: torch.Tensor, scales_x: torch.Tensor) -> float:
    """Returns sum(w rho) / sum(w), w_i = sum_j |<h_i, x_j>|: canonical variate h_i = Ux a_i of x (unit norm),
    x_j = scales_x[j] u_j the kept directions of x as its neurons (Morcos et al. 2018's projection weighting)."""
    w = (scales_x[:, None] * a.abs()).sum(dim=0)
    return float((w * rho).sum() / w.sum())


def pwcca(x: Any, y: Any, keep: float = KEEP.default) -> float:
    """Returns PWCCA (Morcos et al. 2018): the canonical correlations of the SVD-reduced x and y, weighted by how much
    of x each canonical direction accounts for.

    After SVCCA's SVD step and CCA (see svcca), canonical correlation rho_i gets weight w_i = sum_j |<h_i, x_j>|,
    h_i the i-th canonical variate of x (unit norm) and x_j the neurons of the reduced x -- its kept principal
    components s_j u_j -- and PWCCA = sum(w rho) / sum(w). Not symmetric: the weights come from x (the paper's
    definition; google/svcca's pwcca.py takes them from whichever side keeps fewer directions). Morcos et al.
    weight by raw neurons, not rotation-invariant; on the reduced features the weights are, so PWCCA here is
    invariant to rotations, isotropic scaling and translation, not to other linear maps.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(60, 5))
    >>> round(pwcca(x, -2 * x + 1), 6)
    1.0
    """
    keep = check_keep(keep, "pwcca")
    x, y = feature_pair(x, y, "pwcca", 2)
    rx, ry = reduced(x, "x", "pwcca", keep), reduced(y, "y", "pwcca", keep)
    if rx is None or ry is None:
        return math.nan
    rho, a = canonical_correlations(rx[0], ry[0])
    return pwcca_from_basis(rho, a, rx[1])


def pairwise_pwcca(a: list[LayerGrams], b: list[LayerGrams], keep: float) -> np.ndarray:
    """Returns PWCCA of every layer of a (the weights' side) against every layer of b."""
    return cca_pairs(a, b, keep, "pwcca", pwcca_from_basis, symmetric=False)


class PWCCA(Measure):
    """PWCCA: canonical correlations weighted by the row layer's projection onto them."""

    name = "pwcca"
    interval_holds = AT_N + " (biased by O(1/sqrt(n)) where layers share few directions; wider than needed)"
    label = "PWCCA"
    title = "projection-weighted CCA between layers, weighted by the row layer (Morcos et al. 2018)"
    option_help = "PWCCA (canonical correlations weighted by the row layer's projection) of every pair of layers"
    order = 14
    parameters = (KEEP,)
    symmetric = False
    alike = "more correlated"
    seconds_at_1000 = 20.1
    cubic = True
    direct = staticmethod(pwcca)
    pairwise = staticmethod(pairwise_pwcca)

"""SVCCA between layers (Raghu et al. 2017): each layer reduced by SVD to the directions that keep 99% of its
variance over the images, then the mean canonical correlation of the two reduced representations.

    X -> its top principal directions keeping a fraction `keep` of the variance; rho_i: the canonical
    correlations of the two reductions; SVCCA = mean(rho)

Invariant to rotations, translations and isotropic scales (with keep = 1, to any invertible linear map of
full-rank features). The SVD step comes free from the layer's Gram (its eigenvectors are the thin SVD). The SVD
step, CCA and the loop over pairs here serve PWCCA (pwcca.py) too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.measures.grams import LayerGrams, check_rows, small_lapack
from vitsee.measures.kernels import feature_pair, principal
from vitsee.measures.registry import AT_N, Measure, Parameter

torch = lazy_module("torch")


def check_keep(keep: float, measure: str) -> float:
    """Returns keep if it is a variance fraction in (0, 1]; raises otherwise."""
    if not 0.0 < float(keep) <= 1.0:
        raise VitseeError(f"{measure} keep={keep} is not a fraction of variance: use a number in (0, 1], e.g. 0.99")
    return float(keep)


KEEP = Parameter(
    "keep",
    0.99,
    "SVCCA and PWCCA: the fraction of each layer's variance the SVD step keeps (Raghu et al. keep 0.99)",
    option="cca-keep",
    check=lambda value, measure, n: check_keep(value, measure),
)


def keep_rank(spectrum: torch.Tensor, keep: float) -> int:
    """Returns how many leading directions of a descending variance spectrum (eigenvalues >= 0) hold a fraction
    `keep` of the total: the smallest r with sum(spectrum[:r]) >= keep * sum (Raghu et al. 2017's 99%)."""
    total = float(spectrum.sum())
    cum = torch.cumsum(spectrum, 0) / total
    return min(int((cum < keep * (1 - 1e-12)).sum()) + 1, len(spectrum))


def canonical_correlations(ux: torch.Tensor, uy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rho, A): the canonical correlations (descending, min(rx, ry) of them) of two centred orthonormal
    bases (n, rx), (n, ry), and x's canonical weights A (rx, min(rx, ry)) in its basis, from the SVD of Ux' Uy."""
    a, rho, _ = torch.linalg.svd(ux.T @ uy, full_matrices=False)
    return rho.clamp(0, 1), a


def reduced(x: torch.Tensor, name: str, measure: str, keep: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Returns (U, s): the SVD step of SVCCA, x's leading centred directions holding `keep` of the variance (n, r)
    and their singular values (r,); None when x is constant."""
    p = principal(x, name, measure)
    if p is None:
        return None
    u, lam = p
    r = keep_rank(lam, keep)
    return u[:, :r], lam[:r].sqrt()


def reduction(g: LayerGrams, keep: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Returns reduced()'s (U, s) from a layer's Grams (its spectrum is the thin SVD), None for a constant layer."""
    if g.constant:
        return None
    u, lam = g.spectrum()
    r = keep_rank(lam, keep)
    return u[:, :r], lam[:r].sqrt()


def cca_pairs(
    a: list[LayerGrams],
    b: list[LayerGrams],
    keep: float,
    name: str,
    score: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], float],
    symmetric: bool,
) -> np.ndarray:
    """Returns score(rho, A, s) of every layer of a against every layer of b: the canonical correlations rho and x's
    canonical weights A of the two SVD-reduced layers, s the row layer's kept singular values; for a layer set
    against itself and a symmetric score, the upper triangle only, mirrored."""
    keep = check_keep(keep, name)
    check_rows(a, 2, name)
    ra = [reduction(g, keep) for g in a]
    rb = ra if b is a else [reduction(g, keep) for g in b]
    out = np.full((len(a), len(b)), np.nan)
    mirror = b is a and symmetric  # SVCCA: the upper triangle, mirrored (PWCCA is not symmetric)
    for i, x in enumerate(ra):
        for j, y in enumerate(rb):
            if x is None or y is None or (mirror and j < i):
                continue
            with small_lapack(max(x[0].shape[1], y[0].shape[1]), x[0].device):
                rho, w = canonical_correlations(x[0], y[0])
            out[i, j] = score(rho, w, x[1])
    if mirror:
        lower = np.tril_indices(len(a), -1)
        out[lower] = out.T[lower]
    return out


def svcca(x: Any, y: Any, keep: float = KEEP.default) -> float:
    """Returns SVCCA (Raghu et al. 2017): the mean canonical correlation of the SVD-reduced x and y, in [0, 1].

    Each representation, centred over examples, is reduced to its leading singular directions that hold a
    fraction `keep` of its variance (sum of squared singular values); the canonical correlations of the two
    reduced representations are the singular values of Ux' Uy (orthonormal bases of their column spaces), and
    SVCCA is their mean over all min(rx, ry) of them (google/svcca's get_cca_similarity()["mean"] drops the
    trailing ones that hold the last 2% of their sum; the paper's mean is over all). Invariant to rotations,
    isotropic scaling and translation; with keep=1, to any invertible linear map.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(60, 5))
    >>> round(svcca(x, x @ np.random.default_rng(1).normal(size=(5, 5)), keep=1.0), 6)
    1.0
    """
    keep = check_keep(keep, "svcca")
    x, y = feature_pair(x, y, "svcca", 2)
    rx, ry = reduced(x, "x", "svcca", keep), reduced(y, "y", "svcca", keep)
    if rx is None or ry is None:
        return math.nan
    return float(canonical_correlations(rx[0], ry[0])[0].mean())


def pairwise_svcca(a: list[LayerGrams], b: list[LayerGrams], keep: float) -> np.ndarray:
    """Returns SVCCA of every layer of a against every layer of b."""
    return cca_pairs(a, b, keep, "svcca", lambda rho, weights, scales: float(rho.mean()), symmetric=True)


class SVCCA(Measure):
    """SVCCA: the mean canonical correlation of the layers' top principal directions."""

    name = "svcca"
    interval_holds = AT_N + " (biased by O(1/sqrt(n)) where layers share few directions; wider than needed)"
    label = "SVCCA"
    title = "SVCCA between layers: mean canonical correlation after an SVD to 99% variance (Raghu et al. 2017)"
    option_help = "SVCCA (mean canonical correlation of the layers' top principal directions) of every pair of layers"
    order = 13
    parameters = (KEEP,)
    alike = "more correlated"
    seconds_at_1000 = 10.2
    cubic = True
    direct = staticmethod(svcca)
    pairwise = staticmethod(pairwise_svcca)

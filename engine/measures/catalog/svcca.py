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
from vitsee.measures import floor
from vitsee.measures.grams import LayerGrams, build_parts, check_rows
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
    bases (n, rx), (n, ry), and x's canonical weights A (rx, min(rx, ry)) in its basis, from the SVD of Ux' Uy.

    Only A is used (PWCCA), but the one factor from the eigenvectors of M M' ran no faster (0.93 s against 0.94 s
    for numpy's SVD and 1.2 s for torch's on the demo store's 144 pairs) and squares the condition of the small
    correlations; numpy's SVD (1.3x) is not taken either: where the bases share directions (rx + ry > n: rho = 1,
    repeated) A is any orthonormal basis of that eigenspace and PWCCA's weights |<h_i, x_j>| depend on which, so
    another LAPACK moved PWCCA there by up to 4.6e-4 (the measure's ill-posedness there, not a route's error).
    """
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
    score: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], float] | None,
    symmetric: bool,
) -> np.ndarray:
    """Returns score(rho, A, s) of every layer of a against every layer of b: the canonical correlations rho and x's
    canonical weights A of the two SVD-reduced layers, s the row layer's kept singular values; for a layer set
    against itself and a symmetric score, the upper triangle only, mirrored. score None: the mean of rho (SVCCA),
    from the singular values alone, ||Ux' Uy||_* / min(rx, ry) (floor.nuclear_norm: eigvalsh of the smaller side's
    symmetric product, svdvals where one is at rounding level), no singular vectors.

    The layers' spectra are built first as tasks, then each pair is one task, on one thread each on the CPU
    (floor.run_tasks: the same bits at any --threads)."""
    keep = check_keep(keep, name)
    check_rows(a, 2, name)
    build_parts([*a, *b], lambda g: None if g.constant else g.spectrum())
    ra = [reduction(g, keep) for g in a]
    rb = ra if b is a else [reduction(g, keep) for g in b]
    out = np.full((len(a), len(b)), np.nan)
    mirror = b is a and symmetric  # SVCCA: the upper triangle, mirrored (PWCCA is not symmetric)
    pairs = [
        (i, j)
        for i, x in enumerate(ra)
        for j, y in enumerate(rb)
        if x is not None and y is not None and not (mirror and j < i)
    ]

    def value(ij: tuple[int, int]) -> float:
        (ux, sx), (uy, _) = ra[ij[0]], rb[ij[1]]
        if score is None:
            return floor.nuclear_norm(ux.T @ uy) / min(ux.shape[1], uy.shape[1])
        rho, w = canonical_correlations(ux, uy)
        return score(rho, w, sx)

    cpu = bool(pairs) and floor.on_cpu(ra[pairs[0][0]][0])
    for (i, j), v in zip(pairs, floor.run_tasks(value, pairs, cpu=cpu)):
        out[i, j] = v
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
    rx, ry = floor.both(lambda f, name: reduced(f, name, "svcca", keep), x, y)
    if rx is None or ry is None:
        return math.nan
    with floor.one_thread_on(rx[0]):
        return floor.nuclear_norm(rx[0].T @ ry[0]) / min(rx[0].shape[1], ry[0].shape[1])  # the mean of rho


def pairwise_svcca(a: list[LayerGrams], b: list[LayerGrams], keep: float) -> np.ndarray:
    """Returns SVCCA of every layer of a against every layer of b."""
    return cca_pairs(a, b, keep, "svcca", None, symmetric=True)


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
    seconds_at_1000 = 3.6  # 10.2 before issue 32: 2.8x at n = 1,000 (--floor)
    cubic = True
    direct = staticmethod(svcca)
    pairwise = staticmethod(pairwise_svcca)

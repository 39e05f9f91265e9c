"""Angular Procrustes distance between layers (Williams et al. 2021, netrep): the angle between two layers'
representations of the same images once each is centred, scaled to unit Frobenius norm and the best rotation
between them is applied; a true metric, 0 for layers alike up to a rotation, at most pi/2.

    d(X, Y) = arccos ||X' Y||_*  (nuclear norm, X and Y centred and normalised; from the layers' Grams in the dual
              form: the sum of the square roots of the eigenvalues of Kx Ky)

`alpha` partially whitens each layer first (netrep's LinearMetric): 1 is Procrustes, 0 the CCA distance (invariant
to any invertible linear map), between the two a mix. Invariant to rotations, translations and isotropic scales.
A distance: low means alike, and its permutation p-value asks whether the layers are closer than chance.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.measures.grams import CHUNK_BYTES, LayerGrams, check_rows, small_lapack
from vitsee.measures.kernels import feature_pair, principal
from vitsee.measures.registry import AT_N, Measure, Parameter

torch = lazy_module("torch")

WHITEN_FLOOR = 1e-7  # netrep's eigval_tol: variance fractions below this are whitened only up to it


def check_alpha(alpha: float) -> float:
    """Returns alpha if it is a whitening weight in [0, 1]; raises otherwise."""
    if not 0.0 <= float(alpha) <= 1.0:
        raise VitseeError(f"procrustes alpha={alpha} is outside [0, 1]: use 1 (Procrustes), 0 (CCA) or a value between")
    return float(alpha)


ALPHA = Parameter(
    "alpha",
    1.0,
    "Procrustes' partial whitening: 1 Procrustes, 0 the CCA distance, between the two a mix (netrep's alpha)",
    option="procrustes-alpha",
    check=lambda value, measure, n: check_alpha(value),
)


def whitened_scales(spectrum: torch.Tensor, alpha: float) -> torch.Tensor:
    """Returns each principal direction's scale after netrep's partial whitening, from the variance fractions
    (eigenvalues of X'X / ||X||_F^2, descending, rounding-level ones already dropped):
    sqrt(lam) (alpha + (1 - alpha) / sqrt(max(lam, 1e-7))) -- 1 = no whitening, 0 = every direction at length 1."""
    lam = spectrum.clamp_min(0)
    return lam.sqrt() * (alpha + (1 - alpha) / lam.clamp_min(WHITEN_FLOOR).sqrt())


def nuclear_similarity(px: torch.Tensor, py: torch.Tensor) -> torch.Tensor:
    """Returns ||Px' Py||_* / (||Px||_F ||Py||_F) for (..., n, rx), (..., n, ry): the cosine of the angle between two
    representations after the best rotation of one onto the other (the Procrustes similarity)."""
    m = px.transpose(-1, -2) @ py
    return torch.linalg.svdvals(m).sum(dim=-1) / (px.norm(dim=(-2, -1)) * py.norm(dim=(-2, -1)))


def angle(similarity: float) -> float:
    """Returns arccos of a cosine clipped to [-1, 1] (rounding can push a cosine of 1 to 1 + 1e-16)."""
    return math.acos(min(1.0, max(-1.0, similarity)))


def procrustes(x: Any, y: Any, alpha: float = ALPHA.default) -> float:
    """Returns the angular Procrustes distance (Williams et al. 2021, netrep's LinearMetric) in radians, in [0, pi/2].

    Centre each representation over examples, divide by its Frobenius norm, partially whiten it with netrep's
    whiten(): X Z, Z = V diag(alpha + (1 - alpha) / sqrt(max(lam, 1e-7))) V' from X'X = V diag(lam) V'; then
    d = arccos(||Xw' Yw||_* / (||Xw||_F ||Yw||_F)), the angle left after the best rotation of one onto the other.
    alpha = 1 is Procrustes: d = arccos ||X' Y||_*, invariant to rotations, isotropic scaling and translation, not
    to other linear maps. alpha = 0 whitens fully: d = arccos(sum(rho) / sqrt(rx ry)) with rho the canonical
    correlations and rx, ry the ranks -- arccos of the mean canonical correlation when the ranks are equal --
    invariant to any invertible linear map (and 0 whenever n - 1 <= the ranks: CCA needs more examples than
    dimensions). netrep whitens before dividing by the norm, so for 0 < alpha < 1 its value changes with the scale
    of the data; here the norm comes first and alpha means the same at any scale (equal to netrep's on
    Frobenius-normalised inputs). It is a metric: symmetric, and it obeys the triangle inequality.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(30, 6))
    >>> q = np.linalg.qr(np.random.default_rng(1).normal(size=(6, 6)))[0]
    >>> round(procrustes(x, 2 * x @ q + 5), 6), round(procrustes(x, x @ np.diag([1, 2, 3, 4, 5, 6.])), 3)
    (0.0, 0.456)
    """
    alpha = check_alpha(alpha)
    x, y = feature_pair(x, y, "procrustes", 2)
    px, py = principal(x, "x", "procrustes"), principal(y, "y", "procrustes")
    if px is None or py is None:
        return math.nan
    ax = px[0] * whitened_scales(px[1], alpha)  # (n, rx): U diag(scale), the whitened X up to a rotation
    ay = py[0] * whitened_scales(py[1], alpha)
    return angle(float(nuclear_similarity(ax, ay)))


def _scaled_basis(g: LayerGrams, alpha: float) -> torch.Tensor | None:
    """Returns U diag(G) / ||G||: the layer's partially whitened, Frobenius-normalised features up to a rotation."""
    if g.constant:
        return None
    u, lam = g.spectrum()
    scales = whitened_scales(lam, alpha)
    return u * (scales / scales.norm())


def pairwise_procrustes(a: list[LayerGrams], b: list[LayerGrams], alpha: float) -> np.ndarray:
    """Returns the Procrustes distance of every layer of a against every layer of b: per row layer, one batched SVD
    of its whitened basis against the column layers' (the upper triangle only, mirrored, for a layer set against
    itself)."""
    alpha = check_alpha(alpha)
    check_rows(a, 2, "procrustes")
    pa, pb = [_scaled_basis(g, alpha) for g in a], ([_scaled_basis(g, alpha) for g in b] if b is not a else None)
    pb = pa if pb is None else pb
    cols = [j for j, p in enumerate(pb) if p is not None]
    out = np.full((len(a), len(b)), np.nan)
    if not cols:
        return out
    width = max(pb[j].shape[1] for j in cols)
    n = a[0].n
    per = max(1, CHUNK_BYTES // (8 * max(n, width) * width))
    within = b is a  # symmetric: the upper triangle is computed and mirrored, half the SVDs
    for i, p in enumerate(pa):
        if p is None:
            continue
        mine = [j for j in cols if j >= i] if within else cols
        for c0 in range(0, len(mine), per):
            chunk = mine[c0 : c0 + per]
            stacked = torch.stack([torch.nn.functional.pad(pb[j], (0, width - pb[j].shape[1])) for j in chunk])  # zero
            with small_lapack(width, p.device):
                sims = torch.linalg.svdvals(p.T @ stacked).sum(dim=-1)  # (chunk,) padded columns: zero singular values
            out[i, chunk] = [angle(float(s)) for s in sims.cpu()]
    if within:
        lower = np.tril_indices(len(a), -1)
        out[lower] = out.T[lower]
    return out


class Procrustes(Measure):
    name = "procrustes"
    interval_holds = AT_N + " (biased by O(1/sqrt(n)) where layers share few directions)"
    label = "Procrustes"
    title = "angular Procrustes distance between layers (Williams et al. 2021)"
    option_help = "angular Procrustes distance (radians; low: alike up to a rotation) of every pair of layers"
    order = 12
    parameters = (ALPHA,)
    higher_is_similar = False
    alike = "closer"
    value_name = "Procrustes (rad)"
    value_range = (0.0, math.pi / 2)
    seconds_at_1000 = 117.0
    cubic = True
    direct = staticmethod(procrustes)
    pairwise = staticmethod(pairwise_procrustes)

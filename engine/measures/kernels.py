"""What the measures of catalog/ share: their inputs, their conventions and the small kernels on Gram matrices.

Every measure's direct form takes two representations of the same n examples -- numpy arrays or torch tensors
(n, ...), rows the examples, each example's features flattened as CKA reads them (ViT: tokens x channels, CNN:
C x H x W) -- and returns a Python float, computed in float64: a torch tensor on its own device, a numpy array on the
CPU. Both go through torch's kernels (on the CPU the same LAPACK numpy calls), so one code path gives one set of
numbers; torch is imported at the first call, not with this module.

| function     | kind       | rotation | isotropic scale | translation | invertible linear map |
|--------------|------------|----------|-----------------|-------------|-----------------------|
| linear_cka   | similarity | yes      | yes             | yes         | no                    |
| rbf_cka      | similarity | yes      | yes (1)         | yes         | no                    |
| procrustes   | distance   | yes      | yes             | yes         | only at alpha = 0     |
| svcca        | similarity | yes      | yes             | yes         | no (2)                |
| pwcca        | similarity | yes      | yes             | yes         | no (2)                |
| mknn         | similarity | yes      | yes             | no (3)      | no                    |
| cknna        | similarity | yes      | yes             | no (3)      | no                    |
| rsa          | similarity | no (4)   | yes             | no (4)      | no                    |

(1) the bandwidth is a multiple of the median distance, so it scales with the features. (2) the SVD step keeps the
directions of 99% of the variance, which an invertible map changes; with keep=1 SVCCA is CCA and invariant to any
invertible map of full-rank features, PWCCA's weights are not. (3) rows are L2-normalised without centring, as
platonic-rep measures them: a shift of every example changes the angles. (4) the correlation distance centres and
scales each example over its features, so it is invariant to a shift or scale of one example, to permutations of the
features, but not to a rotation or a shift of the feature space. tests/test_measures.py checks every cell.

Conventions shared by all measures:
- A layer whose examples are all the same (zero variance across examples, to rounding) has no similarity to
  anything: the measure is NaN and a warning says which input, as MinibatchCKA.result() does for a zero-norm layer.
- Non-finite values, different row counts, too few examples, a parameter out of range: a VitseeError naming the
  bad value and the way out.

The kernels below are the ones more than one measure, or a measure and measures/grams.py, use; a kernel of one
measure lives in that measure's module.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module

torch = lazy_module("torch")

MIN_DEBIASED = 4  # the unbiased HSIC divides by n (n - 3) and (n - 1)(n - 2)
CONSTANT_RTOL = 64 * np.finfo(np.float64).eps  # centred norm below this x the raw norm: the examples are identical


# ----------------------------------------------------------------------------------------------------------------
# Inputs


def as_features(a: Any, name: str = "x") -> torch.Tensor:
    """Returns a (n, ...) array or tensor as a (n, D) float64 tensor on its device (numpy: the CPU), checked finite."""
    t = a.detach() if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))  # a view if it can be
    if t.ndim < 2:
        raise VitseeError(
            f"{name} must be (examples, features...), got shape {tuple(t.shape)}: add a feature axis ({name}[:, None])"
        )
    t = t.to(torch.float64).reshape(t.shape[0], -1)
    bad = 0 if bool(torch.isfinite(t).all()) else int((~torch.isfinite(t)).sum())
    if bad:
        raise VitseeError(
            f"{name} holds {bad} nan/inf values (fp16 overflow?): re-extract the layer in fp32 "
            "or leave those examples out"
        )
    return t


def feature_pair(x: Any, y: Any, measure: str, min_rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns x and y as (n, Dx), (n, Dy) float64 tensors, checked to hold the same n >= min_rows examples."""
    xf, yf = as_features(x, "x"), as_features(y, "y")
    if xf.shape[0] != yf.shape[0]:
        raise VitseeError(
            f"{measure} needs the same examples in x and y, got {xf.shape[0]} and {yf.shape[0]} rows: "
            "pass activations of the same images in the same order"
        )
    if xf.device != yf.device:
        raise VitseeError(f"{measure}: x is on {xf.device} and y on {yf.device}: move both to one device")
    if xf.shape[0] < min_rows:
        raise VitseeError(f"{measure} needs at least {min_rows} examples, got {xf.shape[0]}: pass more images")
    return xf, yf


def check_k(k: int, n: int, measure: str, least: int = 1) -> int:
    """Returns k if least <= k < n (each example has n - 1 others to be neighbours); raises otherwise."""
    if not least <= int(k) < n:
        raise VitseeError(
            f"{measure} k={k} needs {least} <= k < {n} (the examples): use a k below the number of "
            f"images, e.g. k={max(least, min(10, n - 1))}, or pass more images"
        )
    return int(k)


def is_constant(centred_sq_norm: float, raw_sq_norm: float) -> bool:
    """True when a layer's examples are all the same to rounding: its centred norm is ~eps of its raw norm."""
    return not centred_sq_norm > (CONSTANT_RTOL**2) * raw_sq_norm or centred_sq_norm == 0.0


def warn_constant(name: str, measure: str) -> float:
    """Warns that input `name` does not vary across examples and returns the NaN the measure is then."""
    warnings.warn(f"{name} does not vary across examples (zero variance): its {measure} is nan", stacklevel=3)
    return math.nan


def power_of_two_scale(x: torch.Tensor, within: int) -> torch.Tensor:
    """Returns the power of two that brings the largest |value| of x into [0.5, 1) when it lies outside
    [2^-within, 2^within], else 1 (also for all zeros and for NaN/Inf: a constant stays constant, a non-finite value
    non-finite): a 0-dim tensor of x's dtype on x's device, found without a host sync.

    Multiplying by it is exact, and by 1 changes no bit: a measure invariant to scale that squares or multiplies
    features (Grams, HSIC) keeps layers of tiny or huge values (1e-30, 1e30) from under- or overflowing, and every
    other layer's numbers as they were. `within`: 40 for fp32 products, 60 for fp64 fourth powers."""
    low, high = torch.aminmax(x)
    largest = torch.maximum(-low, high).to(torch.float64)
    bound = 2.0**within
    ordinary = ((largest >= 1 / bound) & (largest <= bound)) | ~torch.isfinite(largest) | (largest == 0)
    limit = int(math.log2(torch.finfo(x.dtype).max)) - 1  # the scaled values stay finite: 126 in fp32
    power = (-torch.frexp(largest).exponent).clamp(-limit, limit)
    one = torch.ones_like(largest)
    return torch.where(ordinary, one, torch.ldexp(one, power)).to(x.dtype)


def centred(x: torch.Tensor, name: str, measure: str) -> torch.Tensor | None:
    """Returns x minus its mean over examples, or None (after a warning) when the examples are all the same."""
    xc = x - x.mean(dim=0)
    if is_constant(float(torch.linalg.vector_norm(xc)) ** 2, float(torch.linalg.vector_norm(x)) ** 2):
        warn_constant(name, measure)
        return None
    return xc


def principal(x: torch.Tensor, name: str, measure: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Returns (U, lam): x's centred principal directions over examples (n, r) and their variance fractions (r,),
    descending, r its numerical rank -- from the thin SVD of the centred features; None when x is constant."""
    xc = centred(x, name, measure)
    if xc is None:
        return None
    u, s, _ = torch.linalg.svd(xc, full_matrices=False)
    lam = s.square()
    r = numerical_rank(lam, *xc.shape)
    return u[:, :r], lam[:r] / lam.sum()


def cosine_gram(x: torch.Tensor, name: str, measure: str) -> torch.Tensor | None:
    """Returns the (n, n) inner products of x's L2-normalised rows, or None (after a warning) when x is constant."""
    if centred(x, name, measure) is None:
        return None
    xn = normalised_rows(x)
    return xn @ xn.T


# ----------------------------------------------------------------------------------------------------------------
# Kernels on Gram matrices (n, n), batched over leading dimensions where it is cheap


def centre_gram(k: torch.Tensor) -> torch.Tensor:
    """Returns H K H (H = I - 11'/n): the Gram of the features centred over examples, for (..., n, n) Grams."""
    rows = k.mean(dim=-1, keepdim=True)
    return k - rows - rows.transpose(-1, -2) + k.mean(dim=(-2, -1), keepdim=True)


def u_centre_gram(k: torch.Tensor) -> torch.Tensor:
    """Returns the U-centred (Szekely & Rizzo 2014; Song et al. 2012) symmetric Gram(s) (..., n, n), zero diagonal.

    <U(K), U(L)>_F / (n (n - 3)) is the unbiased HSIC; the same formulation Kornblith et al.'s center_gram uses.
    """
    n = k.shape[-1]
    kt = k.clone()
    kt.diagonal(dim1=-2, dim2=-1).zero_()
    means = kt.sum(dim=-2) / (n - 2)
    means = means - means.sum(dim=-1, keepdim=True) / (2 * (n - 1))
    kt = kt - means.unsqueeze(-1) - means.unsqueeze(-2)
    kt.diagonal(dim1=-2, dim2=-1).zero_()
    return kt


def cka_from_grams(k: torch.Tensor, l: torch.Tensor, debiased: bool = False) -> float:
    """Returns <C(K), C(L)>_F / (||C(K)|| ||C(L)||): CKA of two (n, n) Grams, C the centring (U-centring if
    debiased)."""
    centre = u_centre_gram if debiased else centre_gram
    kc, lc = centre(k), centre(l)
    return float((kc * lc).sum() / (kc.norm() * lc.norm()))


def squared_distances(gram: torch.Tensor) -> torch.Tensor:
    """Returns ||x_i - x_j||^2 (..., n, n) from the Gram(s) x_i . x_j: K_ii + K_jj - 2 K_ij, >= 0, zero diagonal."""
    diag = gram.diagonal(dim1=-2, dim2=-1)
    d2 = (diag.unsqueeze(-1) + diag.unsqueeze(-2) - 2 * gram).clamp_min_(0)
    d2.diagonal(dim1=-2, dim2=-1).zero_()
    return d2


def normalised_rows(x: torch.Tensor) -> torch.Tensor:
    """Returns x's rows divided by their L2 norms; an all-zero row stays zero (as torch's F.normalize leaves it)."""
    norms = x.norm(dim=-1, keepdim=True)
    return x / torch.where(norms > 0, norms, torch.ones_like(norms))


def knn_mask(similarity: torch.Tensor, k: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the (n, n) bool mask of each row's k most similar other examples (self excluded: every j with
    ids[j] == ids[i], by default j == i); ties go to the lower index, so the mask is deterministic."""
    n = similarity.shape[-1]
    s = similarity.clone()
    same = torch.eye(n, dtype=torch.bool, device=s.device) if ids is None else ids[:, None] == ids[None, :]
    s[same] = -math.inf
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., :k]  # (n, k)
    mask = torch.zeros(n, n, dtype=torch.bool, device=s.device)
    return mask.scatter_(-1, order, True)


def average_ranks(v: torch.Tensor) -> torch.Tensor:
    """Returns the 1-based ranks of v (T,), ties given their average rank, as scipy.stats.rankdata does."""
    order = torch.argsort(v, stable=True)
    sorted_v = v[order]
    starts = torch.ones_like(sorted_v, dtype=torch.bool)
    starts[1:] = sorted_v[1:] != sorted_v[:-1]
    group = torch.cumsum(starts.to(torch.int64), 0) - 1
    counts = torch.bincount(group)
    ends = torch.cumsum(counts, 0).to(torch.float64)  # the last 1-based rank of each tie group
    ranks = torch.empty_like(v, dtype=torch.float64)
    ranks[order] = (ends - (counts.to(torch.float64) - 1) / 2)[group]
    return ranks


def upper(m: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the entries above the diagonal of (n, n) m, row by row (rsatoolbox's RDM vector order), or the
    entries where bool (n, n) `keep` is true and i < j."""
    n = m.shape[-1]
    i, j = torch.triu_indices(n, n, 1, device=m.device)
    if keep is not None:
        sel = keep[i, j]
        i, j = i[sel], j[sel]
    return m[i, j]


def numerical_rank(spectrum: torch.Tensor, n: int, d: int) -> int:
    """Returns how many eigenvalues of a centred Gram (descending) are above rounding: > max(n, d) eps x the largest."""
    if len(spectrum) == 0 or not float(spectrum[0]) > 0:
        return 0
    tol = max(n, d) * float(np.finfo(np.float64).eps) * float(spectrum[0])
    return int((spectrum > tol).sum())

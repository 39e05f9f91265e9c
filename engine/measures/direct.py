"""How alike two layers are, by the measures the field compares beside linear CKA: one function per measure.

Each public function takes two representations of the same n examples -- numpy arrays or torch tensors (n, ...),
rows the examples, each example's features flattened as CKA reads them (ViT: tokens x channels, CNN: C x H x W) --
and returns a Python float, computed in float64: a torch tensor on its own device, a numpy array on the CPU. Both go
through torch's kernels (on the CPU the same LAPACK numpy calls), so one code path gives one set of numbers; torch is
imported at the first call, not with this module.

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

measures/grams.py writes the same measures on one n x n Gram per layer (built once, shared by every measure of every
layer pair); measures/resampling.py adds bootstrap intervals and permutation p-values. The small kernels below
(centring, HSIC, kNN masks, ranks, spectra) are public because both use them.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module

torch = lazy_module("torch")

__all__ = ["linear_cka", "rbf_cka", "procrustes", "svcca", "pwcca", "mknn", "cknna", "rsa"]

MIN_DEBIASED = 4  # the unbiased HSIC divides by n (n - 3) and (n - 1)(n - 2)
WHITEN_FLOOR = 1e-7  # netrep's eigval_tol: variance fractions below this are whitened only up to it
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


def _centred(x: torch.Tensor, name: str, measure: str) -> torch.Tensor | None:
    """Returns x minus its mean over examples, or None (after a warning) when the examples are all the same."""
    xc = x - x.mean(dim=0)
    if is_constant(float(torch.linalg.vector_norm(xc)) ** 2, float(torch.linalg.vector_norm(x)) ** 2):
        warn_constant(name, measure)
        return None
    return xc


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


def median_all(t: torch.Tensor) -> torch.Tensor:
    """Returns the median of all entries of each (..., n, n) matrix, as np.median takes it (mean of the two middle
    values of an even count; torch.median would take the lower one)."""
    flat = t.reshape(*t.shape[:-2], -1)
    count = flat.shape[-1]
    low = flat.kthvalue((count - 1) // 2 + 1, dim=-1).values
    high = flat.kthvalue(count // 2 + 1, dim=-1).values
    return (low + high) / 2


def rbf_gram(d2: torch.Tensor, threshold: float) -> torch.Tensor:
    """Returns exp(-d2 / (2 threshold^2 m)), m the median of d2 over all n^2 entries, zero diagonal included
    (Kornblith et al. 2019's gram_rbf); NaN where m is 0 (most examples identical)."""
    m = median_all(d2)[..., None, None]
    scale = torch.where(m > 0, 2 * threshold**2 * m, torch.full_like(m, math.nan))
    return torch.exp(-d2 / scale)


def check_threshold(threshold: float) -> float:
    """Returns the RBF bandwidth multiple if it is a positive number; raises otherwise."""
    if not float(threshold) > 0 or not math.isfinite(float(threshold)):
        raise VitseeError(
            f"rbf_cka threshold={threshold} is not a positive bandwidth multiple: use e.g. 0.5 "
            "(Kornblith et al.'s choice: sigma = 0.5 x the median distance)"
        )
    return float(threshold)


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


def upper(m: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the entries above the diagonal of (n, n) m, row by row (rsatoolbox's RDM vector order), or the
    entries where bool (n, n) `keep` is true and i < j."""
    n = m.shape[-1]
    i, j = torch.triu_indices(n, n, 1, device=m.device)
    if keep is not None:
        sel = keep[i, j]
        i, j = i[sel], j[sel]
    return m[i, j]


def keep_rank(spectrum: torch.Tensor, keep: float) -> int:
    """Returns how many leading directions of a descending variance spectrum (eigenvalues >= 0) hold a fraction
    `keep` of the total: the smallest r with sum(spectrum[:r]) >= keep * sum (Raghu et al. 2017's 99%)."""
    total = float(spectrum.sum())
    cum = torch.cumsum(spectrum, 0) / total
    return min(int((cum < keep * (1 - 1e-12)).sum()) + 1, len(spectrum))


def check_keep(keep: float, measure: str) -> float:
    """Returns keep if it is a variance fraction in (0, 1]; raises otherwise."""
    if not 0.0 < float(keep) <= 1.0:
        raise VitseeError(f"{measure} keep={keep} is not a fraction of variance: use a number in (0, 1], e.g. 0.99")
    return float(keep)


def check_alpha(alpha: float) -> float:
    """Returns alpha if it is a whitening weight in [0, 1]; raises otherwise."""
    if not 0.0 <= float(alpha) <= 1.0:
        raise VitseeError(f"procrustes alpha={alpha} is outside [0, 1]: use 1 (Procrustes), 0 (CCA) or a value between")
    return float(alpha)


def numerical_rank(spectrum: torch.Tensor, n: int, d: int) -> int:
    """Returns how many eigenvalues of a centred Gram (descending) are above rounding: > max(n, d) eps x the largest."""
    if len(spectrum) == 0 or not float(spectrum[0]) > 0:
        return 0
    tol = max(n, d) * float(np.finfo(np.float64).eps) * float(spectrum[0])
    return int((spectrum > tol).sum())


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


def canonical_correlations(ux: torch.Tensor, uy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rho, A): the canonical correlations (descending, min(rx, ry) of them) of two centred orthonormal
    bases (n, rx), (n, ry), and x's canonical weights A (rx, min(rx, ry)) in its basis, from the SVD of Ux' Uy."""
    a, rho, _ = torch.linalg.svd(ux.T @ uy, full_matrices=False)
    return rho.clamp(0, 1), a


def pwcca_from_basis(rho: torch.Tensor, a: torch.Tensor, scales_x: torch.Tensor) -> float:
    """Returns sum(w rho) / sum(w), w_i = sum_j |<h_i, x_j>|: canonical variate h_i = Ux a_i of x (unit norm),
    x_j = scales_x[j] u_j the kept directions of x as its neurons (Morcos et al. 2018's projection weighting)."""
    w = (scales_x[:, None] * a.abs()).sum(dim=0)
    return float((w * rho).sum() / w.sum())


# ----------------------------------------------------------------------------------------------------------------
# The measures


def linear_cka(x: Any, y: Any, debiased: bool = False) -> float:
    """Returns linear CKA (Kornblith et al. 2019) of x (n, ...) and y (n, ...) over all n examples at once.

    CKA = <Kc, Lc>_F / (||Kc||_F ||Lc||_F), Kc = H X X' H the Gram of the features centred over examples; equal to
    ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F), the form taken when there are more examples than features.
    debiased: the unbiased HSIC (Song et al. 2012) in place of the biased one (needs n >= 4; can be below 0 and
    is not clamped). Invariant to rotations, isotropic scaling and translation of either representation. This is
    the full-batch estimate; vitsee's `cka` view is the minibatch one (Nguyen et al. 2021).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(50, 8))
    >>> round(linear_cka(x, 3 * x @ np.linalg.qr(np.random.default_rng(1).normal(size=(8, 8)))[0] + 1), 6)
    1.0
    """
    x, y = feature_pair(x, y, "linear_cka", MIN_DEBIASED if debiased else 2)
    xc, yc = _centred(x, "x", "linear_cka"), _centred(y, "y", "linear_cka")
    if xc is None or yc is None:
        return math.nan
    xc, yc = xc * power_of_two_scale(xc, 60), yc * power_of_two_scale(yc, 60)  # fourth powers below: see there
    n, dx, dy = xc.shape[0], xc.shape[1], yc.shape[1]
    if debiased or n * n <= dx * dy:  # the (n, n) Grams are the smaller route (and the one the U-statistic needs)
        return cka_from_grams(xc @ xc.T, yc @ yc.T, debiased)
    return float((yc.T @ xc).square().sum() / ((xc.T @ xc).norm() * (yc.T @ yc).norm()))


def rbf_cka(x: Any, y: Any, threshold: float = 0.5, debiased: bool = False) -> float:
    """Returns CKA with a Gaussian kernel (Kornblith et al. 2019 and their Demo.ipynb) of x (n, ...) and y (n, ...).

    K_ij = exp(-||x_i - x_j||^2 / (2 sigma^2)), sigma^2 = threshold^2 x m, m the median of the n x n squared
    distances, the n zeros of the diagonal included (np.median(sq_distances) in their gram_rbf): threshold is a
    fraction of the median distance, 0.5 in the paper. Then CKA of the centred kernels (U-centred if debiased,
    n >= 4, not clamped). Invariant to rotations, translation and isotropic scaling (the bandwidth scales with
    the data); as threshold grows it tends to linear CKA. NaN when the median distance is 0.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(40, 5))
    >>> round(rbf_cka(x, x), 6), round(rbf_cka(x, 10 * x + 3), 6)
    (1.0, 1.0)
    """
    threshold = check_threshold(threshold)
    x, y = feature_pair(x, y, "rbf_cka", MIN_DEBIASED if debiased else 2)
    grams = []
    for name, f in (("x", x), ("y", y)):
        fc = _centred(f, name, "rbf_cka")
        if fc is None:
            return math.nan
        # pairwise differences taken directly, not through the Gram (measures/grams.py takes that route)
        grams.append(rbf_gram(torch.cdist(fc, fc, compute_mode="donot_use_mm_for_euclid_dist").square(), threshold))
    return cka_from_grams(grams[0], grams[1], debiased)


def _principal(x: torch.Tensor, name: str, measure: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Returns (U, lam): x's centred principal directions over examples (n, r) and their variance fractions (r,),
    descending, r its numerical rank -- from the thin SVD of the centred features; None when x is constant."""
    xc = _centred(x, name, measure)
    if xc is None:
        return None
    u, s, _ = torch.linalg.svd(xc, full_matrices=False)
    lam = s.square()
    r = numerical_rank(lam, *xc.shape)
    return u[:, :r], lam[:r] / lam.sum()


def procrustes(x: Any, y: Any, alpha: float = 1.0) -> float:
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
    px, py = _principal(x, "x", "procrustes"), _principal(y, "y", "procrustes")
    if px is None or py is None:
        return math.nan
    ax = px[0] * whitened_scales(px[1], alpha)  # (n, rx): U diag(scale), the whitened X up to a rotation
    ay = py[0] * whitened_scales(py[1], alpha)
    return angle(float(nuclear_similarity(ax, ay)))


def _reduced(x: torch.Tensor, name: str, measure: str, keep: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Returns (U, s): the SVD step of SVCCA, x's leading centred directions holding `keep` of the variance (n, r)
    and their singular values (r,); None when x is constant."""
    p = _principal(x, name, measure)
    if p is None:
        return None
    u, lam = p
    r = keep_rank(lam, keep)
    return u[:, :r], lam[:r].sqrt()


def svcca(x: Any, y: Any, keep: float = 0.99) -> float:
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
    rx, ry = _reduced(x, "x", "svcca", keep), _reduced(y, "y", "svcca", keep)
    if rx is None or ry is None:
        return math.nan
    return float(canonical_correlations(rx[0], ry[0])[0].mean())


def pwcca(x: Any, y: Any, keep: float = 0.99) -> float:
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
    rx, ry = _reduced(x, "x", "pwcca", keep), _reduced(y, "y", "pwcca", keep)
    if rx is None or ry is None:
        return math.nan
    rho, a = canonical_correlations(rx[0], ry[0])
    return pwcca_from_basis(rho, a, rx[1])


def _cosine_gram(x: torch.Tensor, name: str, measure: str) -> torch.Tensor | None:
    """Returns the (n, n) inner products of x's L2-normalised rows, or None (after a warning) when x is constant."""
    if _centred(x, name, measure) is None:
        return None
    xn = normalised_rows(x)
    return xn @ xn.T


def mknn(x: Any, y: Any, k: int = 10) -> float:
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
    kx, ky = _cosine_gram(x, "x", "mknn"), _cosine_gram(y, "y", "mknn")
    if kx is None or ky is None:
        return math.nan
    return float((knn_mask(kx, k) & knn_mask(ky, k)).sum()) / (x.shape[0] * k)


def cknna(x: Any, y: Any, k: int = 10) -> float:
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
    kx, ky = _cosine_gram(x, "x", "cknna"), _cosine_gram(y, "y", "cknna")
    if kx is None or ky is None:
        return math.nan
    return cknna_from_kernels(kx, ky, knn_mask(kx, k), knn_mask(ky, k))


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
        if _centred(f, name, "rsa") is None:
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

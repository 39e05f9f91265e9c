"""CKA with a Gaussian (RBF) kernel between layers (Kornblith et al. 2019, and their released code): how alike two
layers' representations of the same images are when nearby images count more than far ones.

    K_ij = exp(-|x_i - x_j|^2 / (2 sigma^2)),  sigma^2 = threshold^2 x the median squared distance between images
    RBF CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))

A store's RBF CKA uses the unbiased HSIC (Song et al. 2012, the U-centred Grams), as its linear CKA: the biased HSIC
(H K H, Kornblith et al.'s) sits far above the large-n value at small n (measured with X = zA + e, Y = zB + e':
0.725 at n = 100 against 0.625 for the unbiased one, whose mean over draws is within 0.005 of the large-n value), so
`agree` and the zoo would compare measures on different footings. `--rbf-hsic biased` gives Kornblith et al.'s, the
number other packages print, and what rbf_cka(x, y) returns by default (debiased=False); the view's caption says
which one a result used.

Invariant to rotations, translations and isotropic scales of either layer (the bandwidth follows the median
distance); as the threshold grows it tends to linear CKA. The all-pairs form takes the squared distances from the
layer's Gram, the direct form takes them from the features.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.measures.grams import LayerGrams, check_rows, cka_part, stack_products
from vitsee.measures.kernels import MIN_DEBIASED, centred, cka_from_grams, feature_pair, squared_distances
from vitsee.measures.registry import Measure, Parameter

torch = lazy_module("torch")


def check_threshold(threshold: float) -> float:
    """Returns the RBF bandwidth multiple if it is a positive number; raises otherwise."""
    if not float(threshold) > 0 or not math.isfinite(float(threshold)):
        raise VitseeError(
            f"rbf_cka threshold={threshold} is not a positive bandwidth multiple: use e.g. 0.5 "
            "(Kornblith et al.'s choice: sigma = 0.5 x the median distance)"
        )
    return float(threshold)


THRESHOLD = Parameter(
    "threshold",
    0.5,
    "RBF CKA's bandwidth as a multiple of the median distance between images (Kornblith et al. use 0.5)",
    option="rbf-threshold",
    check=lambda value, measure, n: check_threshold(value),
)


def hsic_choice(value: Any) -> bool:
    """Returns True for an unbiased HSIC (`--rbf-hsic unbiased`), False for the biased one; a bool passes as it is."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("unbiased", "debiased"):
        return True
    if text == "biased":
        return False
    raise VitseeError(
        f"'{value}' is not an HSIC estimator: use unbiased (Song et al. 2012) or biased (Kornblith et al.)"
    )


HSIC = Parameter(
    "debiased",
    False,
    "RBF CKA's HSIC: unbiased (Song et al. 2012, as linear CKA's) or biased (Kornblith et al.'s, above the large-n "
    "value at small n)",
    option="rbf-hsic",
    check=lambda value, measure, n: hsic_choice(value),
    store_default=True,
    option_type=str,
    shown_default="unbiased",
)


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


def rbf_cka(x: Any, y: Any, threshold: float = THRESHOLD.default, debiased: bool = HSIC.default) -> float:
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
        fc = centred(f, name, "rbf_cka")
        if fc is None:
            return math.nan
        # pairwise differences taken directly, not through the Gram (measures/grams.py takes that route)
        grams.append(rbf_gram(torch.cdist(fc, fc, compute_mode="donot_use_mm_for_euclid_dist").square(), threshold))
    return cka_from_grams(grams[0], grams[1], debiased)


def pairwise_rbf_cka(a: list[LayerGrams], b: list[LayerGrams], threshold: float, debiased: bool) -> np.ndarray:
    """Returns RBF CKA of every layer of a against every layer of b: each layer's kernel from its Gram's squared
    distances, centred once, one product for all pairs."""
    threshold = check_threshold(threshold)
    check_rows(a, MIN_DEBIASED if debiased else 2, "rbf_cka")
    return stack_products(cka_part(debiased, lambda g: rbf_gram(squared_distances(g.centred()), threshold)), a, b)


class RbfCKA(Measure):
    name = "rbf_cka"
    interval_holds = (
        "holds the large-n RBF CKA with the unbiased HSIC (the default); with --rbf-hsic biased, the value at this n"
    )
    label = "RBF CKA"
    title = "CKA with a Gaussian kernel between layers (Kornblith et al. 2019)"
    option_help = "RBF CKA (Gaussian kernel, bandwidth a multiple of the median distance) of every pair of layers"
    order = 11
    parameters = (THRESHOLD, HSIC)
    seconds_at_1000 = 1.9
    direct = staticmethod(rbf_cka)
    pairwise = staticmethod(pairwise_rbf_cka)

    def undefined(self, grams: LayerGrams) -> str:
        """'median': most pairs of images are the same, so the bandwidth, their median distance, is 0."""
        return "median" if float(median_all(squared_distances(grams.centred()))) == 0 else ""

"""Linear CKA (Kornblith et al. 2019) over all the images at once: the measure the others are compared with.

    CKA = <H K H, H L H> / (|H K H| |H L H|),  K = X X', L = Y Y', H the centring matrix

Its layer x layer view is not this full-batch estimate but the minibatch one of engine/analyses/cka.py (Nguyen et
al. 2021), which has intervals of its own; here it is a measure like the others for arrays you already have
(`vitsee.measures.linear_cka`) and for measures/resampling.py over a set of Grams.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.measures.grams import LayerGrams, check_rows, cka_part, stack_products
from vitsee.measures.kernels import MIN_DEBIASED, centred, cka_from_grams, feature_pair, power_of_two_scale
from vitsee.measures.registry import Measure, Parameter

DEBIASED = Parameter("debiased", False, "the unbiased HSIC (Song et al. 2012) in place of the biased one")


def linear_cka(x: Any, y: Any, debiased: bool = DEBIASED.default) -> float:
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
    xc, yc = centred(x, "x", "linear_cka"), centred(y, "y", "linear_cka")
    if xc is None or yc is None:
        return math.nan
    xc, yc = xc * power_of_two_scale(xc, 60), yc * power_of_two_scale(yc, 60)  # fourth powers below: see there
    n, dx, dy = xc.shape[0], xc.shape[1], yc.shape[1]
    if debiased or n * n <= dx * dy:  # the (n, n) Grams are the smaller route (and the one the U-statistic needs)
        return cka_from_grams(xc @ xc.T, yc @ yc.T, debiased)
    return float((yc.T @ xc).square().sum() / ((xc.T @ xc).norm() * (yc.T @ yc).norm()))


def pairwise_linear_cka(a: list[LayerGrams], b: list[LayerGrams], debiased: bool) -> np.ndarray:
    """Returns linear CKA of every layer of a against every layer of b, one product of their unit centred Grams."""
    check_rows(a, MIN_DEBIASED if debiased else 2, "linear_cka")
    return stack_products(cka_part(debiased, LayerGrams.centred), a, b)


class LinearCKA(Measure):
    name = "linear_cka"
    interval_holds = "holds the large-n value"
    label = "CKA"
    order = 10  # the place of its view, cka.py's
    own_view = False
    parameters = (DEBIASED,)
    direct = staticmethod(linear_cka)
    pairwise = staticmethod(pairwise_linear_cka)

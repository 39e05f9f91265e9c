"""CKA with a Gaussian (RBF) kernel between layers (Kornblith et al. 2019, and their released code): how alike two
layers' representations of the same images are when nearby images count more than far ones.

    K_ij = exp(-|x_i - x_j|^2 / (2 sigma^2)),  sigma^2 = threshold^2 x the median squared distance between images
    RBF CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))

The store computes it with the unbiased HSIC (Song et al. 2012, the U-centred Grams), as its linear CKA: the biased
HSIC (H K H, Kornblith et al.'s) sits far above the large-n value at small n (measured with X = zA + e, Y = zB + e':
0.725 at n = 100 against 0.625 for the unbiased one, whose mean over draws is within 0.005 of the large-n value), so
`agree` and the zoo would compare measures on different footings. `--rbf-hsic biased` gives Kornblith et al.'s, the
number other packages print (and what vitsee.measures.rbf_cka returns by default, debiased=False); the view's
caption says which one a result used.

Invariant to rotations, translations and isotropic scales of either layer (the bandwidth follows the median
distance); as the threshold grows it tends to linear CKA. engine/measures/direct.py rbf_cka is the same number for two
arrays.
"""

from __future__ import annotations

from vitsee.analyses.contract import AnalysisOption
from vitsee.analyses.similarity import GramMeasure


class RbfCKA(GramMeasure):
    """RBF CKA of every pair of stored layers, within a model and across two."""

    name = "rbf_cka"
    label = "RBF CKA"
    title = "CKA with a Gaussian kernel between layers (Kornblith et al. 2019)"
    option_help = "RBF CKA (Gaussian kernel, bandwidth a multiple of the median distance) of every pair of layers"
    order = 11
    parameters = {
        "threshold": AnalysisOption(
            "rbf-threshold",
            float,
            "RBF CKA's bandwidth as a multiple of the median distance between images (default 0.5, Kornblith et al.'s)",
        ),
        "debiased": AnalysisOption(
            "rbf-hsic",
            str,
            "RBF CKA's HSIC: unbiased (default, Song et al. 2012, as linear CKA's) or biased (Kornblith et al.'s, "
            "above the large-n value at small n)",
        ),
    }
    analysis_defaults = {"debiased": True}
    seconds_at_1000 = 1.9

"""CKA with a Gaussian (RBF) kernel between layers (Kornblith et al. 2019, and their released code): how alike two
layers' representations of the same images are when nearby images count more than far ones.

    K_ij = exp(-|x_i - x_j|^2 / (2 sigma^2)),  sigma^2 = threshold^2 x the median squared distance between images
    RBF CKA = <H K H, H L H> / (|H K H| |H L H|)   (biased HSIC, H the centring matrix)

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
        )
    }
    seconds_at_1000 = 1.9

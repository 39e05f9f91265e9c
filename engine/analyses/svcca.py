"""SVCCA between layers (Raghu et al. 2017): each layer reduced by SVD to the directions that keep 99% of its
variance over the images, then the mean canonical correlation of the two reduced representations.

    X -> its top principal directions keeping a fraction `keep` of the variance; rho_i: the canonical
    correlations of the two reductions; SVCCA = mean(rho)

Invariant to rotations, translations and isotropic scales (with keep = 1, to any invertible linear map of
full-rank features). The SVD step comes free from the layer's Gram (its eigenvectors are the thin SVD).
"""

from __future__ import annotations

from vitsee.analyses.contract import AnalysisOption
from vitsee.analyses.similarity import GramMeasure

CCA_KEEP = AnalysisOption(
    "cca-keep",
    float,
    "SVCCA and PWCCA: the fraction of each layer's variance the SVD step keeps (default 0.99, Raghu et al.'s)",
)


class SVCCA(GramMeasure):
    """SVCCA of every pair of stored layers, within a model and across two."""

    name = "svcca"
    label = "SVCCA"
    title = "SVCCA between layers: mean canonical correlation after an SVD to 99% variance (Raghu et al. 2017)"
    option_help = "SVCCA (mean canonical correlation of the layers' top principal directions) of every pair of layers"
    order = 13
    parameters = {"keep": CCA_KEEP}
    seconds_at_1000 = 10.2
    cubic = True

"""PWCCA between layers (Morcos et al. 2018): SVCCA's canonical correlations weighted by how much of the row
layer's representation each canonical direction accounts for, so correlations of directions that carry little
of the layer count little.

    rho_i, h_i: canonical correlations and directions of the reduced layers; a_i = sum_j |<h_i, x_j>|, normalised;
    PWCCA(X, Y) = sum_i a_i rho_i

Not symmetric (weighted by the row layer): the matrix of a model with itself is not either. Invariant to rotations,
translations and isotropic scales.
"""

from __future__ import annotations

from vitsee.analyses.similarity import GramMeasure
from vitsee.analyses.svcca import CCA_KEEP


class PWCCA(GramMeasure):
    """PWCCA of every pair of stored layers (weighted by the row layer), within a model and across two."""

    name = "pwcca"
    label = "PWCCA"
    title = "projection-weighted CCA between layers, weighted by the row layer (Morcos et al. 2018)"
    option_help = "PWCCA (canonical correlations weighted by the row layer's projection) of every pair of layers"
    order = 14
    parameters = {"keep": CCA_KEEP}
    seconds_at_1000 = 20.1
    cubic = True

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

from vitsee.analyses.contract import AnalysisOption
from vitsee.analyses.similarity import GramMeasure


class Procrustes(GramMeasure):
    """The angular Procrustes distance of every pair of stored layers, within a model and across two."""

    name = "procrustes"
    label = "Procrustes"
    title = "angular Procrustes distance between layers (Williams et al. 2021)"
    option_help = "angular Procrustes distance (radians; low: alike up to a rotation) of every pair of layers"
    order = 12
    higher_is_better = False
    value_name = "Procrustes (rad)"
    value_range = (0.0, math.pi / 2)
    parameters = {
        "alpha": AnalysisOption(
            "procrustes-alpha",
            float,
            "Procrustes' partial whitening: 1 Procrustes (default), 0 the CCA distance, "
            "between the two a mix (netrep's alpha)",
        )
    }
    seconds_at_1000 = 117.0
    cubic = True

"""Representational similarity analysis between layers (Kriegeskorte et al. 2008, as rsatoolbox computes it): the
rank correlation of the two layers' dissimilarity matrices over the same images.

    RDM_ij = 1 - Pearson r between images i and j over the layer's features
    RSA(X, Y) = Spearman correlation of the RDMs' upper triangles

Invariant to a shift or scale of one image's features and to isotropic scales, not to rotations or translations of
the feature space (the correlation distance centres each image over its features).
"""

from __future__ import annotations

from vitsee.analyses.similarity import GramMeasure


class RSA(GramMeasure):
    """RSA of every pair of stored layers, within a model and across two."""

    name = "rsa"
    label = "RSA"
    title = "RSA between layers: Spearman correlation of their dissimilarity matrices (Kriegeskorte et al. 2008)"
    option_help = "RSA (Spearman correlation of the layers' correlation-distance RDMs) of every pair of layers"
    order = 17
    value_range = (None, 1.0)  # a rank correlation: it can fall below 0
    seconds_at_1000 = 0.21

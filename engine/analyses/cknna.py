"""Centred kernel nearest-neighbour alignment between layers (Huh et al. 2024, platonic-rep's CKNNA): CKA of the
cosine kernels restricted to the pairs of images that are among each other's k nearest in both layers, so only
the local structure both layers agree on counts.

    K, L: cosine kernels of the L2-normalised rows; M_ij = 1 where j is among i's k nearest in both layers
    CKNNA = HSIC(M * K, M * L) / sqrt(HSIC(M_X * K, M_X * K) HSIC(M_Y * L, M_Y * L))  (platonic-rep's HSIC)

At most 1 (a layer with itself), and it can fall below 0. Nearly but not exactly symmetric (the mutual-neighbour
mask is not), so the matrix of a model with itself is not either, by ~1e-3. Invariant to rotations and isotropic
scales, not to translations.
"""

from __future__ import annotations

from vitsee.analyses.mknn import KNN_K
from vitsee.analyses.similarity import GramMeasure


class CKNNA(GramMeasure):
    """CKNNA of every pair of stored layers, within a model and across two."""

    name = "cknna"
    label = "CKNNA"
    title = "centred kernel nearest-neighbour alignment between layers (Huh et al. 2024)"
    option_help = "CKNNA (CKA over the pairs of images that are near neighbours in both layers) of every pair"
    order = 16
    value_range = (None, 1.0)  # a kernel alignment: it can fall below 0
    parameters = {"k": KNN_K}
    seconds_at_1000 = 8.4

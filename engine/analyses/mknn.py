"""Mutual k-nearest-neighbour alignment between layers (Huh et al. 2024, "The Platonic Representation
Hypothesis", as platonic-rep measures it): how many of each image's k nearest images are the same in both layers.

    N_X(i): the k images whose L2-normalised features have the largest inner product with image i's (itself excluded)
    mknn(X, Y) = mean_i |N_X(i) & N_Y(i)| / k

1 for a layer with itself, about k / n for unrelated ones. Invariant to rotations and isotropic scales, not to
translations (rows are normalised without centring, as platonic-rep does).
"""

from __future__ import annotations

from vitsee.analyses.contract import AnalysisOption
from vitsee.analyses.similarity import GramMeasure

KNN_K = AnalysisOption("knn-k", int, "mknn and CKNNA: the neighbours of each image (default 10, Huh et al.'s)")


class MutualKNN(GramMeasure):
    """Mutual k-NN alignment of every pair of stored layers, within a model and across two."""

    name = "mknn"
    label = "mknn"
    title = "mutual k-nearest-neighbour alignment between layers (Huh et al. 2024)"
    option_help = "mutual k-NN alignment (share of each image's k nearest images that both layers agree on)"
    order = 15
    parameters = {"k": KNN_K}
    seconds_at_1000 = 0.53

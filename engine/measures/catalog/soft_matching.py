"""Soft matching between the units of two layers (Khosla & Williams 2024, "Soft matching distance: a metric on
neural representations that captures single-neuron tuning"): how alike the layers' units are, one unit to another,
when units may be matched to fractions of several others.

A unit's tuning curve is its response to each of the n images (a column of the layer's flattened features), centred
over the images and scaled to unit length, so the inner product of two tuning curves is the Pearson correlation of
the two units across the images. With x_1 .. x_Nx the tuning curves of one layer and y_1 .. y_Ny of the other,

    score(X, Y) = max over P of  sum_ij P_ij r_ij,     r_ij = <x_i, y_j>,
    P in the transportation polytope: P >= 0, each row sums to 1 / Nx, each column to 1 / Ny,

the correlation of matched units averaged under the best soft permutation. Khosla & Williams's distance of these
tuning curves is d^2 = min_P sum_ij P_ij ||x_i - y_j||^2 = 2 (1 - score): the 2-Wasserstein distance between the two
layers' empirical distributions of tuning curves, symmetric and a metric. When Nx = Ny the optimum is a permutation
(Birkhoff-von Neumann), and the score is the mean correlation of units matched one to one: netrep's
PermutationMetric on column-normalised inputs. The score is what the Khosla lab's code reports
(NeuroML-Lab/partial-metric, SoftMatch: centred columns, cost 1 - cosine, ot.emd, 1 - sum(P * cost)); Wu et al. 2025
("Measuring the measures", arXiv:2509.04622) found it separates model families best among the mapping measures.

Units: each flattened feature is a unit (ViT: a channel at a token, CNN: a channel at a position). A unit whose
response does not vary over the images has no tuning curve and is left out (the Khosla lab's code leaves out all-zero
units: dead ReLUs). A layer with more than `units` varying units is represented by a seeded sample of `units` of them
(seed UNIT_SEED, the same sample for a layer in every pair): the score is a Wasserstein distance between distributions
of tuning curves, so a sample of units estimates it, at a cost of O(units^3) per pair instead of O(D^3). A pair
whose exact transport would be a large one (lcm(Nx, Ny) above MAX_REPLICATED, e.g. 960 x 1024 units) compares fewer
units of the larger layer, the first of its seeded sample: as many as keep it an assignment of at most MAX_REPLICATED
rows, at worst as many as the smaller layer has (compared_counts; 960 x 1024 compares 960 x 960). units=0 compares
every varying unit, exactly, at any cost (the direct form only).

Invariant to permutations of the units, to shifting or scaling any unit (a per-unit affine map with a positive
scale), to isotropic scaling, and to duplicating every unit (the distribution of tuning curves is unchanged). Not
invariant to rotations of the feature space, nor to flipping the sign of a unit: that is its point, the tuning of
single units matters. 1 for a layer and any permutation of its units.

Few images inflate it: the matching picks, among many pairs of units, those whose correlations chance made largest,
and chance correlations grow as the images fall (about 1 / sqrt(n)). So two unrelated layers score well above 0 on a
small store, and its interval (the jackknife of measures/resampling.py) holds the value at this n, not the large-n
one. A percentile bootstrap, which repeats images (~63% distinct), scores higher still: on the tiny test store (48
images) a random ViT's patch_embed x a random ResNet's maxpool read 0.590 against a bootstrap interval of [0.624,
0.659]. Its n-curve (analyses/curves.py) says whether the value has settled.

The transport problem is solved exactly: one to one (scipy's linear_sum_assignment) when both sides hold the same
number of units; otherwise as an assignment between the units repeated lcm(Nx, Ny) / Nx and / Ny times when that is
small (an optimal transport of these marginals is a multiple of 1 / lcm); with units=0 and a large lcm, by POT's
network simplex (ot.emd, `pip install pot`) when it is installed, else scipy's linprog (HiGHS; exact, slow).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.measures.grams import KEPT_UNITS, LayerGrams, unit_order, varying_units
from vitsee.measures.kernels import feature_pair, warn_constant
from vitsee.measures.registry import AT_N, Measure, Parameter

torch = lazy_module("torch")

UNITS = KEPT_UNITS  # the units compared per layer by default (a seeded sample of a layer with more)
MAX_REPLICATED = 2048  # largest lcm(Nx, Ny) solved as an assignment of repeated units (~0.3 s at 2048)
MIN_IMAGES = 3  # a correlation over two images is +-1: no tuning to compare
# one pair's assignment at 1,024 units (or of up to MAX_REPLICATED copies for unequal samples) on one busy core:
# 0.25 s on the demo store (595 pairs of 34 layers in 148 s, 2026-12-04), whatever n (the n x U products are small)
SECONDS_A_PAIR = 0.25


def check_units(units: int, measure: str = "soft_matching", most: int | None = None) -> int:
    """Returns units if it is 0 (every unit) or a count of at least 2 (and at most `most`); raises otherwise."""
    bad = isinstance(units, bool) or not isinstance(units, (int, np.integer))
    if bad or (units != 0 and units < 2) or (most is not None and not 2 <= units <= most):
        every = "" if most is not None else ", or 0 for every unit"
        raise VitseeError(
            f"{measure} units={units} is not a number of units to compare: use 2 to {most or 'any'}, e.g. {UNITS} "
            f"(a seeded sample of each layer's units){every}"
        )
    return int(units)


UNITS_PARAMETER = Parameter(
    "units",
    UNITS,
    f"soft matching: the units compared per layer, a seeded sample of a layer with more (2 to {KEPT_UNITS})",
    option="soft-matching-units",
    check=lambda value, measure, n: check_units(value, measure, KEPT_UNITS),
)


def unit_sample(varying: np.ndarray, units: int) -> np.ndarray:
    """Returns the indices of the units compared, ascending: all of `varying` (ascending unit indices) when there
    are at most `units` of them (or units is 0), else the first `units` of their seeded order (grams.unit_order: the
    sample a layer's Grams keep)."""
    if units == 0 or len(varying) <= units:
        return varying
    return np.sort(unit_order(varying)[:units])


def tuning_curves(x: torch.Tensor, units: int = UNITS, name: str = "x", measure: str = "soft_matching"):
    """Returns (n, U) float64: the compared units' responses centred over the n images and scaled to unit length
    (columns), or None (after a warning) when no unit varies over the images."""
    xc = x - x.mean(dim=0)
    norms = torch.linalg.vector_norm(xc, dim=0)
    varying = varying_units(norms, torch.linalg.vector_norm(x, dim=0))
    if len(varying) == 0:
        warn_constant(name, measure)
        return None
    keep = torch.as_tensor(unit_sample(varying, units), device=x.device)
    return xc.index_select(1, keep) / norms.index_select(0, keep)


def best_transport(r: np.ndarray) -> float:
    """Returns max sum_ij P_ij r_ij over the transportation polytope of uniform marginals 1/Nx, 1/Ny, exactly."""
    from scipy.optimize import linear_sum_assignment

    r = np.asarray(r, dtype=np.float64)
    nx, ny = r.shape
    if nx == ny:
        i, j = linear_sum_assignment(r, maximize=True)
        return float(r[i, j].mean())
    g = math.gcd(nx, ny)
    size = nx * ny // g
    if size <= MAX_REPLICATED:
        # unit i of x carries ny/g copies of mass 1/size, unit j of y nx/g: an optimal plan of these integer
        # marginals is integral (a transportation polytope's vertices are), so it is an assignment of the copies
        rep = np.repeat(np.repeat(r, ny // g, axis=0), nx // g, axis=1)
        i, j = linear_sum_assignment(rep, maximize=True)
        return float(rep[i, j].sum() / size)
    a, b = np.full(nx, 1.0 / nx), np.full(ny, 1.0 / ny)
    try:
        import ot
    except ImportError:
        return _linprog_transport(r, a, b)
    plan, log = ot.emd(a, b, np.ascontiguousarray(1.0 - r), numItermax=max(10**7, 50 * nx * ny), log=True)
    if log.get("warning"):
        raise VitseeError(f"soft_matching: the transport of {nx} x {ny} units did not converge ({log['warning']})")
    return float((plan * r).sum())


def _linprog_transport(r: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """Returns the optimal transport value by scipy's HiGHS simplex (exact at a vertex; slow beyond ~300 units)."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    nx, ny = r.shape
    if nx * ny > 300 * 300:
        warnings.warn(
            f"soft_matching of {nx} x {ny} units by scipy's linprog is slow: `pip install pot` solves it in about a "
            "second, or compare fewer units (units=...)",
            stacklevel=3,
        )
    rows = sp.kron(sp.eye(nx), np.ones((1, ny)))  # sum_j P_ij = a_i
    cols = sp.kron(np.ones((1, nx)), sp.eye(ny))  # sum_i P_ij = b_j
    res = linprog(
        -r.ravel(), A_eq=sp.vstack([rows, cols]).tocsr(), b_eq=np.r_[a, b], bounds=(0, None), method="highs-ds"
    )
    if res.status != 0:
        raise VitseeError(f"soft_matching: the transport of {nx} x {ny} units failed ({res.message})")
    return float(-res.fun)


def compared_counts(nx: int, ny: int) -> tuple[int, int]:
    """Returns how many of their sampled units two layers of nx and ny units compare: both counts when the exact
    transport is a small assignment (lcm(nx, ny) <= MAX_REPLICATED, or nx == ny), else the larger count cut to the
    largest m for which it is (at worst as many as the smaller layer's: one to one). A sample of units estimates the
    distance between the layers' distributions of tuning curves either way; the cut keeps every pair an assignment of
    at most MAX_REPLICATED rows instead of a transport solved by POT or linprog (minutes for 960 x 1024 units)."""
    if nx == ny or math.lcm(nx, ny) <= MAX_REPLICATED:
        return nx, ny
    small, large = sorted((nx, ny))
    m = next(m for m in range(large, small - 1, -1) if m == small or math.lcm(small, m) <= MAX_REPLICATED)
    return (small, m) if nx == small else (m, small)


def score_from_curves(cx: torch.Tensor, cy: torch.Tensor) -> float:
    """Returns the soft matching score of two layers' sampled tuning curves (n, Nx) and (n, Ny), columns in their
    seeded order (LayerGrams.tuning_curves): the first compared_counts(Nx, Ny) of each."""
    mx, my = compared_counts(cx.shape[1], cy.shape[1])
    return best_transport((cx[:, :mx].T @ cy[:, :my]).cpu().numpy())


def soft_matching(x: Any, y: Any, units: int = UNITS) -> float:
    """Returns the soft matching score (Khosla & Williams 2024) of x (n, ...) and y (n, ...), in [-1, 1].

    The correlation across the images of the layers' units, matched by the best soft permutation (an optimal
    transport with uniform weights over each layer's units): sum_ij P_ij r_ij. Khosla & Williams's soft matching
    distance of the tuning curves is sqrt(2 (1 - score)). Units that do not vary over the images are left out; a layer
    with more than `units` others is represented by a seeded sample of them (0: all; a pair of unequal samples whose
    exact transport is large compares fewer of the larger: compared_counts). Invariant to permutations,
    shifts and positive scalings of the units and to duplicating them; not to rotations. See the module docstring.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(50, 6))
    >>> round(soft_matching(x, 3 * x[:, ::-1] + 1), 6), round(soft_matching(x, np.hstack([x, x])), 6)
    (1.0, 1.0)
    """
    units = check_units(units)
    x, y = feature_pair(x, y, "soft_matching", MIN_IMAGES)
    cx = tuning_curves(x, units, "x")
    cy = tuning_curves(y, units, "y")
    if cx is None or cy is None:
        return math.nan
    if units:  # a sample of units: the pair compares the first compared_counts of each layer's seeded order
        mx, my = compared_counts(cx.shape[1], cy.shape[1])
        cx = cx if mx == cx.shape[1] else tuning_curves(x, mx, "x")
        cy = cy if my == cy.shape[1] else tuning_curves(y, my, "y")
    return best_transport((cx.T @ cy).cpu().numpy())


def pairwise_soft_matching(a: list[LayerGrams], b: list[LayerGrams], units: int) -> np.ndarray:
    """Returns the soft matching score of every layer of a against every layer of b, from the units each layer's
    Grams keep (LayerGrams.tuning_curves: the first `units` of its seeded sample, centred over these images); one
    transport problem per pair, the upper triangle mirrored for a set of layers against itself."""
    curves_a = [None if g.constant else g.tuning_curves(units) for g in a]
    curves_b = curves_a if b is a else [None if g.constant else g.tuning_curves(units) for g in b]
    out = np.full((len(a), len(b)), np.nan)
    for i, cx in enumerate(curves_a):
        for j, cy in enumerate(curves_b):
            if cx is None or cy is None or (b is a and j < i):
                continue
            out[i, j] = score_from_curves(cx, cy)
    if b is a:
        lower = np.tril_indices(len(a), -1)
        out[lower] = out.T[lower]
    return out


class SoftMatching(Measure):
    """soft_matching: the correlation of the layers' units matched by the best soft permutation."""

    name = "soft_matching"
    label = "soft matching"
    title = "soft matching of the layers' units, optimal transport of their tuning curves (Khosla & Williams 2024)"
    option_help = (
        "soft matching (the correlation of units matched one to another by an optimal transport of their tuning "
        "curves): not invariant to rotations, the tuning of single units counts"
    )
    order = 18
    parameters = (UNITS_PARAMETER,)
    alike = "better matched units"
    value_name = "soft matching score"
    value_range = (None, 1.0)
    seconds_at_1000 = SECONDS_A_PAIR * 23 * 24 / 2  # the 276 pairs of 23 layers, at any n
    faster = "--soft-matching-units 256 (64x less work; its assignments run on the CPU, where a GPU does not help)"

    @classmethod
    def seconds(cls, n: int, layers: int, units: int = UNITS, **params) -> float:
        """Returns about how long all pairs of `layers` layers take: one assignment a pair, O(units^3), not n."""
        return SECONDS_A_PAIR * (min(units or KEPT_UNITS, KEPT_UNITS) / KEPT_UNITS) ** 3 * layers * (layers + 1) / 2

    interval_holds = AT_N + " (chance correlations of the matched units raise it at small n: see its n-curve)"
    direct = staticmethod(soft_matching)
    pairwise = staticmethod(pairwise_soft_matching)

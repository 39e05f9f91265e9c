"""Bootstrap intervals and permutation p-values of any registered measure (catalog/), from the layers' Grams.

The unit resampled is an image, as engine/stats.py says of CKA: an interval says how far the number could move with
another draw of as many images; a p-value how often the measure is as extreme when the images of the column layer
are paired with the wrong images of the row layer. Both are seeded and deterministic, and both index the Grams built
once (LayerGrams.take): no pass over the features.

- Interval: a percentile bootstrap. Replicate r draws n of the n images with replacement (stats.bootstrap_indices)
  and recomputes the measure on those rows of every layer, all layer pairs at once. Linear and RBF CKA, Procrustes,
  SVCCA and PWCCA take the resample as any sample, repeats included (the centring, the RBF median, the spectrum are
  the resample's own). For mknn, cknna and rsa a repeated image is one example seen twice, not two examples at
  distance 0: its copies are never each other's neighbours (they would otherwise fill the top of every kNN list
  in both layers and inflate the agreement) and their pair is left out of the RDMs (two zero dissimilarities tied
  in both RDMs would inflate the rank correlation).
  Measured caveat: a resample holds ~63% distinct images, and the full-sample measures are biased at small n
  (upward for a similarity of unrelated layers), more so in a resample. On 60 pairs of independent 60 x 8 Gaussian
  layers, 200 replicates each, the 95% percentile interval held neither the estimate nor the true value (0 for
  linear and RBF CKA and SVCCA, pi/2 for Procrustes) in any pair; the basic interval (method="basic") held the
  truth in 100% for linear CKA but in 0-2% for RBF CKA, SVCCA and Procrustes, whose bias is not a constant shift.
  For mknn, cknna and rsa the percentile interval holds the estimate (tests/test_measures.py). The permutation
  p-values have no such problem: a permutation test is exact at any n.
- p-value: (1 + #{null at least as extreme}) / (K + 1) over K permutations (stats.batch_permutations), each
  reordering the images of every column layer at once. A similarity's null is compared from below
  (#{null >= observed}: significant when the layers are more alike than chance); a distance's -- Procrustes --
  from above (#{null <= observed}: significant when closer than chance). A permutation moves the Gram's rows, its
  eigenvectors and kNN masks with it, so a permutation costs the pair products only (Procrustes: its SVDs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from vitsee import stats
from vitsee.errors import VitseeError
from vitsee.measures.grams import LayerGrams, pairwise
from vitsee.measures.registry import measure


def bootstrap_replicates(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    replicates: int = stats.BOOTSTRAP_REPLICATES,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> np.ndarray:
    """Returns (replicates, La, Lb): the measure on `replicates` resamples of the images (the same rows for every
    layer of a replicate), seeded; `progress(done, total)` hears after each replicate."""
    return np.stack(list(iter_bootstrap_replicates(grams_a, grams_b, name, replicates, seed, progress, **params)))


def iter_bootstrap_replicates(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    replicates: int = stats.BOOTSTRAP_REPLICATES,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> Iterator[np.ndarray]:
    """Yields bootstrap_replicates' (La, Lb) matrices one at a time, in the same order: what a summary of each
    replicate's whole matrix needs (the zoo's interval of a pair's best match) without holding them all."""
    a = list(grams_a)
    b = None if grams_b is None else list(grams_b)
    n = a[0].n
    if replicates < 1:
        raise VitseeError(f"bootstrap replicates={replicates}: use at least 1, e.g. {stats.BOOTSTRAP_REPLICATES}")
    for r, rows in enumerate(stats.bootstrap_indices(n, replicates, seed)):
        ra = [g.take(rows) for g in a]
        rb = None if b is None else [g.take(rows) for g in b]
        yield pairwise(ra, rb, name, **params)
        if progress is not None:
            progress(r + 1, replicates)


def bootstrap_interval(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    level: float = stats.DEFAULT_CI,
    replicates: int = stats.BOOTSTRAP_REPLICATES,
    seed: int = 0,
    method: str = "percentile",
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (low, high), each (La, Lb): the bootstrap interval of the measure at `level`, over the replicates
    where it is defined (NaN where none is).

    method "percentile": the replicates' quantiles (as engine/stats.py gives CKA). "basic": those quantiles
    reflected about the estimate, [2 m - q_high, 2 m - q_low], which removes the shift a measure's small-sample bias
    puts into the replicates (a resample holds ~63% distinct images, so a full-sample measure that is biased upward
    at small n -- CKA, SVCCA of unrelated layers -- is more biased in its replicates: the percentile interval of two
    unrelated layers can then lie wholly above the estimate).
    """
    level = stats.check_level(level)
    if method not in ("percentile", "basic"):
        raise VitseeError(f"bootstrap method '{method}' is unknown: use percentile or basic")
    reps = bootstrap_replicates(grams_a, grams_b, name, replicates, seed, progress, **params)
    low, high = stats.percentile_interval(reps, level)
    if method == "basic":
        estimate = pairwise(grams_a, grams_b, name, **params)
        low, high = 2 * estimate - high, 2 * estimate - low
    return low, high


def null_values(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    permutations: int = stats.DEFAULT_PERMUTATIONS,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> np.ndarray:
    """Returns (permutations, La, Lb): the measure with the column layers' images permuted, seeded;
    `progress(done, total)` hears after each permutation."""
    a = list(grams_a)
    b = a if grams_b is None else list(grams_b)
    if permutations < 1:
        raise VitseeError(f"permutations={permutations}: use at least 1, e.g. {stats.DEFAULT_PERMUTATIONS}")
    out = []
    for k, p in enumerate(stats.batch_permutations(seed, 0, a[0].n, permutations)):
        out.append(pairwise(a, [g.take(p) for g in b], name, **params))
        if progress is not None:
            progress(k + 1, permutations)
    return np.stack(out)


def permutation_p_value(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    permutations: int = stats.DEFAULT_PERMUTATIONS,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    observed: np.ndarray | None = None,
    **params,
) -> np.ndarray:
    """Returns (La, Lb) p-values (1 + #{null at least as extreme}) / (K + 1): from above for a distance, from below
    for a similarity (each Measure's `significance` says what its small p means); NaN where the measure is.
    `observed`: the measure of the grams as they are, when the caller has it already."""
    observed = pairwise(grams_a, grams_b, name, **params) if observed is None else observed
    null = null_values(grams_a, grams_b, name, permutations, seed, progress, **params)
    reached = (null >= observed) if measure(name).higher_is_similar else (null <= observed)
    p = (1.0 + reached.sum(axis=0)) / (permutations + 1.0)
    return np.where(np.isfinite(observed), p, np.nan)


def pair_statistics(
    grams_x: LayerGrams,
    grams_y: LayerGrams,
    name: str,
    level: float = stats.DEFAULT_CI,
    replicates: int = stats.BOOTSTRAP_REPLICATES,
    permutations: int = stats.DEFAULT_PERMUTATIONS,
    seed: int = 0,
    method: str = "percentile",
    **params,
) -> dict:
    """Returns {value, ci_low, ci_high, p_value, significant_if} of one pair of layers; level 0 or permutations 0
    leaves that part out."""
    out = {
        "value": float(pairwise([grams_x], [grams_y], name, **params)[0, 0]),
        "significant_if": measure(name).significance,
    }
    if level:
        low, high = bootstrap_interval([grams_x], [grams_y], name, level, replicates, seed, method, **params)
        out["ci_low"], out["ci_high"] = float(low[0, 0]), float(high[0, 0])
    if permutations:
        out["p_value"] = float(permutation_p_value([grams_x], [grams_y], name, permutations, seed, **params)[0, 0])
    return out


def is_significant(p_value: float, alpha: float = stats.ALPHA) -> bool:
    """True when a p-value is below the significance level the app marks (NaN is never significant)."""
    return math.isfinite(p_value) and p_value < alpha

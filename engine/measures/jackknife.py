"""Intervals and nulls of the measures of measures/grams.py that a bootstrap gets wrong: a delete-a-group jackknife
over the images, and a null that permutes each model's images, both from the Grams built once (LayerGrams.take).

Interval. The n images are cut into G seeded groups (stats.jackknife_groups; G = n is the delete-one jackknife);
replicate g recomputes the measure on the images outside group g, every layer pair at once, and the interval is the
estimate -/+ t_(G-1) x the jackknife standard deviation sqrt((G-1)/G sum_g (m_g - mean m)^2). No image is ever
repeated, so no pair of copies sits at distance 0 (what pushed a bootstrap's RBF CKA, kNN and RDMs upwards), and the
interval is centred on the estimate, which it therefore always holds.

What it covers, measured (python benchmarks/coverage.py: X = zA + e, Y = zB + e', z in 4 dimensions, 12 and 16
units, unit noise; 95% intervals, 20 groups; the table is in the README's statistics section):
- RBF CKA (unbiased HSIC, the store's default) and RSA estimate their large-n value with a bias far below their
  spread from n = 100 on, and the intervals hold it at about the nominal rate there.
- Procrustes, SVCCA and PWCCA are biased by O(1/sqrt(n)), not O(1/n), when two layers share few directions: the
  sample singular values (canonical correlations) of the directions they do not share are ~ sqrt(d / n), not 0. No
  interval centred on the estimate holds the large-n value at these n, and a jackknife correction (which removes
  O(1/n)) does not either; mknn and CKNNA with a fixed k are a different number at every n by construction. For these
  five the interval is one of the value at this n -- where the estimate of another draw of as many images falls on
  average -- which it holds at or above the nominal rate; the large-n value is printed beside it.
- The jackknife's variance is an overestimate for the kNN measures and SVCCA/PWCCA (the number of neighbours shared,
  and the rank kept for 99% of the variance, move in steps when images leave): their intervals are wider than
  needed (measured coverage above 97%), never narrower.

Null. A null replicate permutes the images of every model by a permutation of its own (the same for all its
layers), so every cross-model cell of the replicate pairs the two models' images at random while each model's own
layers keep their pairing; the within-model blocks are the observed ones. A summary of the cross-model block of each
replicate (the zoo's best match, a layer, a correspondence) is one draw of that summary's null
(engine/zoo/calibration.py). A permutation moves the Gram's rows, its spectrum and kNN masks with it
(LayerGrams.take), so a replicate costs the measure's pair products only -- still one whole computation of the
measure per replicate, which is why the zoo of a measure other than linear CKA asks for its permutations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from vitsee import stats
from vitsee.errors import VitseeError
from vitsee.measures.grams import LayerGrams, pairwise

DEFAULT_GROUPS = 20  # t_19: the interval is 1.07x as wide as a normal one with a known sd; each group one recompute


def iter_jackknife_replicates(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    groups: int = DEFAULT_GROUPS,
    seed: Sequence[int] | int = 0,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> Iterator[np.ndarray]:
    """Yields (La, Lb): the measure with each of min(groups, n) seeded groups of the images left out in turn (the same
    images left out of every layer of a replicate); `progress(done, total)` hears after each."""
    a = list(grams_a)
    b = None if grams_b is None else list(grams_b)
    if groups < 2:
        raise VitseeError(f"jackknife groups={groups}: use at least 2, e.g. {DEFAULT_GROUPS}")
    n = a[0].n
    parts = stats.jackknife_groups(n, groups, seed)
    everyone = np.arange(n)
    for g, left_out in enumerate(parts):
        keep = np.setdiff1d(everyone, left_out)
        ra = [x.take(keep) for x in a]
        rb = None if b is None else [x.take(keep) for x in b]
        yield pairwise(ra, rb, name, **params)
        if progress is not None:
            progress(g + 1, len(parts))


def jackknife_interval(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    level: float = stats.DEFAULT_CI,
    groups: int = DEFAULT_GROUPS,
    seed: Sequence[int] | int = 0,
    estimate: np.ndarray | None = None,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (low, high), each (La, Lb): the delete-a-group jackknife interval of the measure at `level` (see the
    module), centred on `estimate` (the measure of the grams as they are; computed when not given); NaN where the
    measure or a replicate is, and everywhere below stats.MIN_INTERVAL_IMAGES images."""
    level = stats.check_level(level)
    estimate = pairwise(grams_a, grams_b, name, **params) if estimate is None else np.asarray(estimate)
    if list(grams_a)[0].n < stats.MIN_INTERVAL_IMAGES:
        nan = np.full(estimate.shape, np.nan)
        return nan, nan.copy()
    reps = np.stack(list(iter_jackknife_replicates(grams_a, grams_b, name, groups, seed, progress, **params)))
    return stats.jackknife_interval(estimate, reps, level)


def model_permutations(n: int, owners: Sequence[int], permutations: int, seed: Sequence[int] | int) -> np.ndarray:
    """Returns (permutations, models, n): replicate r's permutation of the n images for each model (owners: each
    layer's model index, 0..models-1), seeded by (seed, model) so a model's permutations do not depend on the others."""
    models = int(max(owners)) + 1
    return np.stack([stats.batch_permutations(seed, k, n, permutations) for k in range(models)], axis=1)


def iter_null_replicates(
    grams: Sequence[LayerGrams],
    owners: Sequence[int],
    name: str,
    permutations: int,
    seed: Sequence[int] | int = 0,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> Iterator[np.ndarray]:
    """Yields (L, L): the joint matrix of every layer with each model's images permuted by its own permutation (all its
    layers alike: owners[i] is layer i's model), one replicate at a time; the cross-model blocks are draws of the
    null, the within-model blocks the observed values."""
    layers = list(grams)
    owners = np.asarray(owners, dtype=np.int64)
    if len(owners) != len(layers):
        raise VitseeError(f"{len(owners)} owners for {len(layers)} layers: give each layer its model's index")
    if permutations < 1:
        raise VitseeError(f"permutations={permutations}: use at least 1, e.g. 999")
    perms = model_permutations(layers[0].n, owners, permutations, seed)
    for r in range(permutations):
        moved = [g.take(perms[r, owners[i]]) for i, g in enumerate(layers)]
        yield pairwise(moved, None, name, **params)
        if progress is not None:
            progress(r + 1, permutations)

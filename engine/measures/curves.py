"""A measure's value against the number of images (an n-curve) and, for the kNN measures, against k (a k-curve): does
the value on these images say what the value on more images would?

Koepke, Zverev, Ginosar & Efros (arXiv:2604.18572) show mutual k-NN alignment measured on 1,024 images drifting as the
image pool grows: a kNN score at one n and one k is not comparable across studies. Every measure's finite-sample bias
moves with n too (CKA and SVCCA of unrelated layers sit above 0 at small n; Murphy et al. 2024). A curve shows it:

- n-curve: nested seeded subsets of the images, 250, 500, 1000, ... and then all of them (`subset_sizes`); each
  subset holds the smaller ones (one seeded permutation, its first m images), so the curve moves only by the images
  added. At each size the value on that subset and its percentile bootstrap interval over that subset's images (the
  spread the value would have with another draw of as many images: where the interval stops shrinking past the next
  value, the value has settled).
- k-curve: the value at each k (5, 10, 20, 50, ... below n) on all the images, with its bootstrap interval.

`curve(evaluate, ...)` is the arithmetic for anything computed from a set of image rows (a layer pair's measure, a
whole joint matrix, a zoo's summary of it); `measure_curve` and `k_curve` take layers' Grams (measures/grams.py), so
no feature is read twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from vitsee import stats
from vitsee.errors import VitseeError
from vitsee.measures.grams import LayerGrams, pairwise

FIRST_SIZE = 250  # the smallest subset of an n-curve; each next one doubles, up to all the images
K_VALUES = (5, 10, 20, 50, 100, 200, 500, 1000)
MIN_SIZE = 16
CURVE_REPLICATES = 200  # bootstrap replicates per point: a curve is many intervals, each one cheaper than a cell's


def subset_sizes(n: int, first: int = FIRST_SIZE) -> list[int]:
    """Returns the subset sizes of an n-curve over n images: first, 2 first, 4 first, ... below n, then n."""
    if n < MIN_SIZE:
        raise VitseeError(f"an n-curve needs at least {MIN_SIZE} images, got {n}: pass more images")
    if first < MIN_SIZE:
        raise VitseeError(f"an n-curve's first subset of {first} images is too small: start at {MIN_SIZE} or more")
    sizes, m = [], int(first)
    while m < n:
        sizes.append(m)
        m *= 2
    return [*sizes, n]


def nested_subsets(n: int, sizes: Sequence[int], seed: int = 0) -> list[np.ndarray]:
    """Returns each size's image rows, ascending: the first m of one seeded permutation of the n images, so every
    subset holds the smaller ones."""
    if any(not 0 < m <= n for m in sizes):
        raise VitseeError(f"subset sizes {list(sizes)} must lie between 1 and the {n} images")
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[:m]) for m in sizes]


def k_values(n: int, ks: Sequence[int] = K_VALUES) -> list[int]:
    """Returns the k of a k-curve over n images: those of ks below n / 2 (a bootstrap resample holds ~63% distinct
    images, and an image's copies are never its neighbours, so k must stay well below n)."""
    out = [int(k) for k in ks if 1 <= k < n / 2]
    if not out:
        raise VitseeError(f"no k of {list(ks)} is below half the {n} images: pass more images or smaller k")
    return out


def curve(
    evaluate: Callable[[np.ndarray], np.ndarray | float],
    subsets: Sequence[np.ndarray],
    level: float = stats.DEFAULT_CI,
    replicates: int = CURVE_REPLICATES,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Returns {value, ci_low, ci_high} (S, ...): evaluate(rows) on each subset of image rows, and its percentile
    bootstrap interval at `level` from `replicates` resamples of that subset's rows (evaluate must accept repeated
    rows: a resample). level 0: no interval (NaN)."""
    values, lows, highs = [], [], []
    for s, rows in enumerate(subsets):
        rows = np.asarray(rows)
        value = np.asarray(evaluate(rows), dtype=np.float64)
        values.append(value)
        if not level:
            lows.append(np.full_like(value, np.nan))
            highs.append(np.full_like(value, np.nan))
            continue
        level = stats.check_level(level)
        draws = [
            np.asarray(evaluate(rows[idx]), dtype=np.float64)
            for idx in stats.bootstrap_indices(len(rows), replicates, [seed, s])
        ]
        low, high = stats.percentile_interval(np.stack(draws), level)
        lows.append(low)
        highs.append(high)
    return {"value": np.stack(values), "ci_low": np.stack(lows), "ci_high": np.stack(highs)}


def measure_curve(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    sizes: Sequence[int] | None = None,
    seed: int = 0,
    level: float = stats.DEFAULT_CI,
    replicates: int = CURVE_REPLICATES,
    **params,
) -> dict[str, np.ndarray]:
    """Returns the n-curve of measure `name` between layers grams_a (rows) and grams_b (columns; None: grams_a
    against itself): {sizes (S,), value, ci_low, ci_high (S, La, Lb)} over nested seeded subsets of the images."""
    a = list(grams_a)
    b = None if grams_b is None else list(grams_b)
    sizes = subset_sizes(a[0].n) if sizes is None else list(sizes)

    def evaluate(rows: np.ndarray) -> np.ndarray:
        return pairwise([g.take(rows) for g in a], None if b is None else [g.take(rows) for g in b], name, **params)

    out = curve(evaluate, nested_subsets(a[0].n, sizes, seed), level, replicates, seed)
    return {"sizes": np.asarray(sizes), **out}


def k_curve(
    grams_a: Sequence[LayerGrams],
    grams_b: Sequence[LayerGrams] | None,
    name: str,
    ks: Sequence[int] | None = None,
    seed: int = 0,
    level: float = stats.DEFAULT_CI,
    replicates: int = CURVE_REPLICATES,
    **params,
) -> dict[str, np.ndarray]:
    """Returns the k-curve of a kNN measure (mknn, cknna) between layers on all the images: {k (K,), value, ci_low,
    ci_high (K, La, Lb)}, each k's interval from the same seeded resamples of the images."""
    a = list(grams_a)
    b = None if grams_b is None else list(grams_b)
    if "k" in params:
        raise VitseeError("a k-curve sets k itself: pass the values as ks=[...]")
    ks = k_values(a[0].n) if ks is None else k_values(a[0].n, ks)
    every = np.arange(a[0].n)
    parts = []
    for k in ks:

        def evaluate(rows: np.ndarray, k: int = k) -> np.ndarray:
            return pairwise(
                [g.take(rows) for g in a], None if b is None else [g.take(rows) for g in b], name, k=k, **params
            )

        parts.append(curve(evaluate, [every], level, replicates, seed))
    return {"k": np.asarray(ks), **{key: np.concatenate([p[key] for p in parts]) for key in parts[0]}}

"""Confidence intervals and permutation p-values for the analyses: pure functions, arrays in, arrays out.

What varies is the sample of images; the model (its weights) is fixed. An interval says how far a number could move
with another draw of as many images from the same distribution; a p-value says how often a CKA this large appears
when the images of one layer are paired with the wrong images of the other. Neither says anything about other
seeds, other training runs or other architectures.

CKA (any minibatch CKA: within, across, head-level, spatial) -- from the per-batch terms MinibatchCKA keeps:
- Interval: a percentile bootstrap over minibatches. Each replicate draws B of the B batches with replacement and
  sums their (L, L) unbiased HSIC terms; CKA is finished from those sums. No Gram is recomputed: a replicate is one
  (B,) weight vector times the (B, L*L) per-batch terms. The unit resampled is a batch of images, so an interval from
  fewer than ROUGH_BATCHES batches is flagged rough.
- p-value: (1 + #{null >= observed}) / (K + 1) over K permutations. Permutation r of batch b reorders the images of
  the column ("Y") layer inside the batch; the same permutation applies to every layer of a batch, so a replicate
  pairs X with one wrong pairing of the same images for all layers at once. The U-centred Gram of permuted rows is the
  permuted U-centred Gram, so a permutation costs one gather and one more pair product, not one more Gram.
- With shuffles (several batchings of the same images): the interval is the mean over shuffles of each shuffle's
  endpoints, and the p-value the largest per-shuffle p-value. Shuffles re-use the same images, so pooling their
  bootstrap replicates as if independent would shrink the interval by sqrt(shuffles) with no new information; the
  largest p-value is valid whatever the dependence between shuffles (conservative).

Probes: the exact Clopper-Pearson binomial interval on the test count. Means over images (attention distances, skip
ratios): the Student-t interval mean +- t * s / sqrt(n) with s the sample standard deviation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module

sps = lazy_module("scipy.stats")  # scipy.stats takes ~1 s to import; a cached view needs only the constants

DEFAULT_CI = 0.95
DEFAULT_PERMUTATIONS = 99
BOOTSTRAP_REPLICATES = 1000  # the percentile endpoints of a 95% interval move by ~1% of its width between seeds
ROUGH_BATCHES = 10  # fewer bootstrap units than this: the interval is rough (too few distinct resamples)
ALPHA = 0.05  # the significance level the app and figures mark
_CELL_CHUNK = 4096  # cells finished per bootstrap step: R x chunk fp64 at a time, not R x L x L


def check_level(level: float) -> float:
    """Return level if it is a confidence level in (0, 1); raise the one-line error otherwise."""
    if not 0.0 < float(level) < 1.0:
        raise VitseeError(
            f"--ci {level} is not a confidence level: "
            "use a number between 0 and 1, e.g. --ci 0.9 (0 turns intervals off)"
        )
    return float(level)


def stats_settings(level: float, permutations: int, seed: int) -> dict | None:
    """Return the statistics settings a result records (None when both are off, so old cache keys still match)."""
    if permutations < 0:
        raise VitseeError(f"--permutations {permutations} is negative: use 0 (no p-values) or a count such as 99")
    if not level and not permutations:
        return None
    return {
        "ci": check_level(level) if level else 0.0,
        "bootstrap": BOOTSTRAP_REPLICATES if level else 0,
        "permutations": int(permutations),
        "seed": int(seed),
    }


def interval_settings(level: float) -> dict | None:
    """Return the settings of a closed-form interval (Student-t, Clopper-Pearson) a result records, None when off."""
    return {"ci": check_level(level)} if level else None


# --- CKA from HSIC sums -------------------------------------------------------------------------------


def cka_from_hsic(hsic: np.ndarray, self_hsic: np.ndarray | None = None) -> np.ndarray:
    """Return CKA (..., L, L) from HSIC sums (..., L, L): hsic_ij / sqrt(hsic_ii hsic_jj), self terms from the diagonal
    unless given (..., L)."""
    diag = np.diagonal(hsic, axis1=-2, axis2=-1) if self_hsic is None else self_hsic
    with np.errstate(divide="ignore", invalid="ignore"):
        return hsic / np.sqrt(diag[..., :, None] * diag[..., None, :])


def percentile_interval(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (low, high), each draws.shape[1:]: the percentile interval at `level` of draws (R, ...) over their
    finite values; NaN where no draw is finite."""
    tail = (1.0 - level) / 2
    finite = np.isfinite(draws).any(axis=0)
    low, high = np.full(draws.shape[1:], np.nan), np.full(draws.shape[1:], np.nan)
    if finite.any():
        q = np.nanquantile(draws[:, finite], [tail, 1.0 - tail], axis=0)
        low[finite], high[finite] = q[0], q[1]
    return low, high


def bootstrap_indices(n_batches: int, replicates: int, seed: Sequence[int] | int) -> np.ndarray:
    """Return (replicates, n_batches) batch indices drawn with replacement, seeded."""
    return np.random.default_rng(seed).integers(0, n_batches, size=(replicates, n_batches))


def bootstrap_cka_interval(
    batch_hsic: np.ndarray, level: float, replicates: int, seed: Sequence[int] | int, cells: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return (low, high), each (L, L): the percentile bootstrap interval of CKA over whole minibatches.

    batch_hsic (B, L, L) holds each batch's unbiased HSIC of every layer pair; cells (L, L) bool, if given, limits the
    work to those entries (the others are nan), e.g. the cross block of a cross_at accumulator.
    """
    n, L = batch_hsic.shape[0], batch_hsic.shape[1]
    counts = np.stack([np.bincount(row, minlength=n) for row in bootstrap_indices(n, replicates, seed)]).astype(
        np.float64
    )
    flat = batch_hsic.reshape(n, L * L)
    diag = counts @ flat[:, :: L + 1]  # (R, L): each replicate's self-HSIC sums
    wanted = np.flatnonzero(np.ones(L * L, bool) if cells is None else cells.ravel())
    low, high = np.full(L * L, np.nan), np.full(L * L, np.nan)
    tail = (1.0 - level) / 2
    for s in range(0, len(wanted), _CELL_CHUNK):
        idx = wanted[s : s + _CELL_CHUNK]
        rows, cols = np.divmod(idx, L)
        with np.errstate(divide="ignore", invalid="ignore"):
            reps = (counts @ flat[:, idx]) / np.sqrt(diag[:, rows] * diag[:, cols])  # (R, chunk)
        low[idx], high[idx] = np.quantile(reps, [tail, 1.0 - tail], axis=0)
    return low.reshape(L, L), high.reshape(L, L)


def batch_permutations(seed: Sequence[int] | int, slot: int, m: int, count: int) -> np.ndarray:
    """Return (count, m) permutations of a batch's m images, seeded by (seed, batch slot): the same on any process."""
    rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), int(slot)])
    return rng.permuted(np.tile(np.arange(m), (count, 1)), axis=1)  # each row shuffled independently


def permutation_p_value(null_hsic: np.ndarray, hsic: np.ndarray) -> np.ndarray:
    """Return (L, L) p-values (1 + #{null >= observed}) / (K + 1) from the K permutation null HSIC sums (K, L, L).

    A permutation leaves each layer's self-HSIC unchanged, so null and observed CKA share their denominators.
    """
    observed = cka_from_hsic(hsic)
    null = cka_from_hsic(null_hsic, np.broadcast_to(np.diagonal(hsic), null_hsic.shape[:-1]))
    reached = (null >= observed).sum(axis=0)
    p = (1.0 + reached) / (null_hsic.shape[0] + 1.0)
    return np.where(np.isfinite(observed), p, np.nan)


def symmetric_upper(a: np.ndarray) -> np.ndarray:
    """Return a copy of the square a whose lower triangle mirrors the upper one (row layer before column layer)."""
    out = a.copy()
    lower = np.tril_indices(a.shape[0], -1)
    out[lower] = a.T[lower]
    return out


def pool_shuffles(lows: list[np.ndarray], highs: list[np.ndarray], ps: list[np.ndarray]) -> dict:
    """Return pooled ci_low, ci_high (mean over shuffles of the endpoints) and p_value (largest over shuffles)."""
    out = {}
    if lows:
        out["ci_low"], out["ci_high"] = np.mean(lows, axis=0), np.mean(highs, axis=0)
    if ps:
        out["p_value"] = np.max(ps, axis=0)
    return out


# --- intervals of other numbers ----------------------------------------------------------------------


def clopper_pearson(correct: np.ndarray, n: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (low, high): the exact binomial (Clopper-Pearson) interval of correct / n, elementwise; nan stays nan."""
    k = np.asarray(correct, dtype=np.float64)
    tail = (1.0 - level) / 2
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, sps.beta.ppf(tail, k, n - k + 1), 0.0)
        high = np.where(k < n, sps.beta.ppf(1.0 - tail, k + 1, n - k), 1.0)
    bad = ~np.isfinite(k)
    return np.where(bad, np.nan, low), np.where(bad, np.nan, high)


def mean_interval(
    mean: np.ndarray, std_pop: np.ndarray, n: np.ndarray | int, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return (low, high): the Student-t interval mean +- t * s / sqrt(n) of a mean over n images.

    std_pop is the population standard deviation (ddof=0, what RunningMoments keeps): s = std_pop sqrt(n / (n-1)),
    so the half-width is t * std_pop / sqrt(n - 1). Where n < 2 the interval is nan.
    """
    n = np.asarray(n, dtype=np.float64)
    mean = np.asarray(mean, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        half = sps.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * np.asarray(std_pop) / np.sqrt(n - 1)
    half = np.where(n >= 2, half, np.nan)
    return mean - half, mean + half


def significance_label(p: float, permutations: int) -> str:
    """Return 'p<0.01' / 'p=0.23'-style text for a permutation p-value, '' when there is none.

    When no permutation reached the observed value p is 1 / (K + 1), the smallest a K-permutation test can give:
    it reads 'p<0.01' from K = 99 on (the true p is at most that), 'p<=0.05' for K = 19.
    """
    if p is None or not np.isfinite(p):
        return ""
    floor = 1.0 / (permutations + 1) if permutations else 0.0
    if p <= floor * (1 + 1e-9):
        return "p<0.01" if floor <= 0.01 else f"p<={floor:.2g}"
    return "p<0.01" if p < 0.01 else f"p={p:.2f}"

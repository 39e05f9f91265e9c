"""Confidence intervals and permutation p-values for the analyses: pure functions, arrays in, arrays out.

What varies is the sample of images; the model (its weights) is fixed. An interval says how far a number could move
with another draw of as many images from the same distribution; a p-value says how often a CKA this large appears
when the images of one layer are paired with the wrong images of the other. Neither says anything about other
seeds, other training runs or other architectures.

CKA (any minibatch CKA: within, across, spatial) -- from the terms MinibatchCKA keeps:
- Interval (results from now on, `"interval": "jackknife"` in their statistics settings): the delete-one-image
  jackknife. The unit is an image, not a batch, so a store of one minibatch has an interval too. Leaving image i out
  of its batch b changes that batch's unbiased HSIC, and only it; with U = the batch's U-centred Grams (rows sum to 0,
  and the unbiased HSIC of any subset of the images is the same from U as from the Grams themselves):
      HSIC_b,-i(p, q) = (T_pq - 2 a_pq,i (m-2)/(m-3)) / ((m-1)(m-4)),  T_pq = <U_p, U_q>,  a_pq,i = sum_j U_p,ij U_q,ij
  so the leave-one-out terms of every layer pair cost one batched product (m, L, m) x (m, m, L), as much as the pair
  product itself. The batches' sums are independent, so Cov(S) = sum over batches of each batch's jackknife
  covariance (m-1)/m sum_i (d_i - mean d)(d_i - mean d)' of (S_pq, S_pp, S_qq); CKA's variance is the delta method's
  g' Cov(S) g, g the gradient of S_pq / sqrt(S_pp S_qq); the interval is CKA -/+ t_(n-1) sd. Measured
  (benchmarks/coverage.py, X = zA + e, Y = zB + e', population CKA known in closed form): 95% intervals held the
  population value in 93-96% of draws at n = 30, 100 and 300 images, in one batch or many. Fewer than
  MIN_INTERVAL_IMAGES images: no interval (the normal approximation is not there yet), and the result says so.
  Results cached before (`"bootstrap": R` in their settings) keep their percentile bootstrap over minibatches; one of
  a single minibatch is a point, not an interval, and the views drop it and say how to get one (--recompute).
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
JACKKNIFE = "jackknife"  # the interval method new results record (engine/stats.py's module docstring)
# fewer images than this: no interval. At 30 the jackknife intervals of linear CKA held the population value in
# 93-94% of draws (benchmarks/coverage.py); below 20 the normal approximation of a ratio of U-statistics is not there
MIN_INTERVAL_IMAGES = 20
_LOO_BYTES = 64 << 20  # at most this much of leave-one-out terms (images x layer pairs, fp64) at a time
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
        "interval": JACKKNIFE if level else "",
        "permutations": int(permutations),
        "seed": int(seed),
    }


def interval_method(settings: dict | None) -> str:
    """Returns how a result's intervals were made: "jackknife" (results from now on), "percentile" (a bootstrap: the
    results cached before, whose settings name its replicates), "" without intervals."""
    st = settings or {}
    if not st.get("ci"):
        return ""
    return str(st.get("interval") or "percentile")


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


# --- the delete-one-image jackknife of minibatch CKA ----------------------------------------------------
# The moments MinibatchCKA keeps (one fp64 block of its state, so processes add theirs): LOO_TERMS arrays (L, L) --
# the jackknife covariance of (S_pq, S_pq), of (S_pq, S_pp) and of (S_pp, S_qq) summed over batches -- then the
# number of images they came from, then the number of images in batches too small to leave one out of (m = 4: such a
# batch adds to the HSIC sums, with a large variance the jackknife cannot see, so its result gets no interval).
LOO_TERMS = 3


def loo_size(num_layers: int) -> int:
    """Returns the length of the jackknife block of a MinibatchCKA state for num_layers layers."""
    return LOO_TERMS * num_layers * num_layers + 2


def leave_one_out_products(ucentred, rows=None):
    """Returns (m, L, L') a_pq,i = sum_j U_p,ij U_q,ij of U-centred Grams ucentred (L, m, m) (rows: L' of the layers
    for q, default all), a torch tensor on ucentred's device: the per-image parts of every pair's leave-one-out HSIC."""
    import torch

    u = ucentred.permute(1, 0, 2)  # (m, L, m): image i's row of every layer's Gram
    other = u if rows is None else u[:, rows]
    return torch.bmm(u, other.transpose(1, 2))  # (m, L, L')


def add_leave_one_out(block, ucentred, cross_at: int | None = None) -> None:
    """Adds one batch's delete-one-image jackknife moments (see LOO_TERMS) to `block` (a 1-d fp64 torch view of
    loo_size(L) values) from its U-centred Grams ucentred (L, m, m) fp64. A batch of m = 4 has no leave-one-out HSIC
    (3 images have none): it is counted in the last slot, which leaves the result without an interval. cross_at=k:
    only the cells between layers [:k] and [k:] and the diagonal, as the accumulator keeps them.

    Images are taken in chunks so the (chunk, L, L) leave-one-out terms stay within _LOO_BYTES."""
    import torch

    L, m = int(ucentred.shape[0]), int(ucentred.shape[-1])
    if m < 5:
        block[-1] += m
        return
    moments = block[:-2].view(LOO_TERMS, L, L)
    k = cross_at
    own = (ucentred * ucentred).sum(dim=-1).T  # (m, L): a_pp,i
    own = own - own.mean(dim=0)  # deviations from the batch's mean over images
    scale = (2.0 * (m - 2) / ((m - 3) * (m - 1) * (m - 4))) ** 2 * (m - 1) / m
    cols = None if k is None else torch.arange(k, L, device=ucentred.device)
    width = L if k is None else L - k
    rows_of = slice(None) if k is None else slice(0, k)
    step = max(1, _LOO_BYTES // (8 * L * width))
    mixed = torch.zeros(L if k is None else k, width, dtype=torch.float64, device=ucentred.device)  # Cov(S_pq, S_pp)
    mixed_t = torch.zeros_like(mixed)  # Cov(S_pq, S_qq), kept apart only for a cross block
    totals = torch.zeros_like(mixed)
    squares = torch.zeros_like(mixed)
    for s in range(0, m, step):
        a = leave_one_out_products(ucentred[:, s : s + step], cols)  # (c, L, width)
        a = a[:, rows_of]  # (c, Lr, width)
        totals += a.sum(dim=0)
        squares += (a * a).sum(dim=0)
        o = own[s : s + step]
        mixed += torch.einsum("ipq,ip->pq", a, o[:, rows_of])
        if k is not None:
            mixed_t += torch.einsum("ipq,iq->pq", a, o[:, k:])
    # sum_i (a_i - mean a)^2 = sum a^2 - (sum a)^2 / m; the products with own's deviations need no centring of a
    first = squares - totals * totals / m
    cov_own = own.T @ own  # (L, L) sum_i (a_pp,i - mean)(a_qq,i - mean)
    if k is None:
        moments[0] += scale * first
        moments[1] += scale * mixed
        moments[2] += scale * cov_own
    else:
        moments[0][:k, k:] += scale * first
        moments[1][:k, k:] += scale * mixed
        moments[1][k:, :k] += scale * mixed_t.T  # Cov(S_qp, S_qq) of the cell (q, p)
        moments[2][:k, k:] += scale * cov_own[:k, k:]
        moments[0].diagonal().add_(scale * cov_own.diagonal())
        moments[1].diagonal().add_(scale * cov_own.diagonal())
        moments[2].diagonal().add_(scale * cov_own.diagonal())
    block[-2] += m


def jackknife_cka_sd(sums: np.ndarray, moments: np.ndarray) -> np.ndarray:
    """Returns (L, L) the jackknife standard deviation of CKA S_pq / sqrt(S_pp S_qq) from the HSIC sums (L, L) and the
    jackknife moments (LOO_TERMS, L, L) by the delta method (0 on the diagonal, where CKA is 1 whatever the images)."""
    d = np.diagonal(sums)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(np.outer(d, d))
        cka = sums / root
        g1 = 1.0 / root  # d CKA / d S_pq
        g2 = -cka / (2.0 * d[:, None])  # d CKA / d S_pp
        g3 = -cka / (2.0 * d[None, :])  # d CKA / d S_qq
    m0, m1, m2 = moments
    own = np.diagonal(m0)
    var = (
        g1 * g1 * m0
        + g2 * g2 * own[:, None]
        + g3 * g3 * own[None, :]
        + 2 * g1 * g2 * m1
        + 2 * g1 * g3 * m1.T
        + 2 * g2 * g3 * m2
    )
    sd = np.sqrt(np.clip(var, 0.0, None))
    np.fill_diagonal(sd, 0.0)  # a layer with itself: CKA 1 whatever the images (the delta method's terms cancel)
    return sd


def t_quantile(level: float, df) -> np.ndarray | float:
    """Returns the two-sided Student-t quantile of a `level` interval with df degrees of freedom."""
    return sps.t.ppf(0.5 + level / 2, df)


def jackknife_cka_interval(
    sums: np.ndarray, moments: np.ndarray, n_images: int, level: float, unseen: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (low, high), each (L, L): CKA -/+ t_(n-1) x its jackknife sd (see the module docstring); NaN where CKA
    is, and everywhere when there are fewer than MIN_INTERVAL_IMAGES images or `unseen` images sat in batches of 4."""
    cka = cka_from_hsic(sums)
    if n_images < MIN_INTERVAL_IMAGES or unseen:
        nan = np.full_like(cka, np.nan)
        return nan, nan.copy()
    half = t_quantile(level, n_images - 1) * jackknife_cka_sd(sums, moments)
    return cka - half, cka + half


def no_interval_reason(n_images: int, unseen: int = 0) -> str:
    """Returns why a result of n_images jackknifed images has no interval ('' when it has one); unseen: images in
    batches of 4, which no image can be left out of."""
    if unseen:
        return (
            f"no interval: a batch of {unseen} images has no leave-one-out HSIC (the jackknife needs 5 a batch): "
            "pick --batch-size so that the last batch holds 5 or more, or none"
        )
    if n_images >= MIN_INTERVAL_IMAGES:
        return ""
    return (
        f"no interval: {n_images} images, and a jackknife interval needs at least {MIN_INTERVAL_IMAGES} "
        "(extract more images)"
    )


def leave_one_out_deltas(ucentred, rows: slice = slice(None)):
    """Returns (c, L, L): HSIC_b,-i - HSIC_b, how leaving image i out of a batch moves the unbiased HSIC of every layer
    pair, for the images `rows` of the batch (default all m), from its U-centred Grams ucentred (L, m, m) fp64
    (m >= 5); a torch tensor."""
    L, m = int(ucentred.shape[0]), int(ucentred.shape[-1])
    flat = ucentred.reshape(L, m * m)
    total = flat @ flat.T  # T = <U_p, U_q>
    a = leave_one_out_products(ucentred[:, rows])  # (c, L, L)
    loo = (total - 2.0 * a * (m - 2) / (m - 3)) / ((m - 1) * (m - 4))
    return loo - total / (m * (m - 3))


def jackknife_sd(values: np.ndarray, groups_of: np.ndarray | None = None) -> np.ndarray:
    """Returns the jackknife standard deviation from leave-one-out values (G, ...): sqrt((G-1)/G sum (v - mean)^2).

    groups_of (G,), if given, says which independent batch each value's left-out unit came from: the variance is then
    the sum over batches of each batch's own jackknife variance, (m_b - 1)/m_b sum over its values (what a minibatch
    estimate is: a sum of independent batches' terms). NaN where any value is."""
    v = np.asarray(values, dtype=np.float64)
    if groups_of is None:
        g = len(v)
        return np.sqrt((g - 1) / g * ((v - v.mean(axis=0)) ** 2).sum(axis=0))
    var = np.zeros(v.shape[1:])
    for b in np.unique(groups_of):
        part = v[groups_of == b]
        m = len(part)
        if m > 1:
            var = var + (m - 1) / m * ((part - part.mean(axis=0)) ** 2).sum(axis=0)
    return np.sqrt(var)


def jackknife_interval(
    estimate: np.ndarray, leave_out: np.ndarray, level: float, df: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (low, high): estimate -/+ t_df x the jackknife sd of the delete-a-group values leave_out (G, ...), df
    G - 1 unless given; NaN where the estimate or any leave-out value is."""
    estimate = np.asarray(estimate, dtype=np.float64)
    sd = jackknife_sd(leave_out)
    half = t_quantile(level, (len(leave_out) - 1) if df is None else df) * sd
    return estimate - half, estimate + half


def jackknife_groups(n: int, groups: int, seed: Sequence[int] | int) -> list[np.ndarray]:
    """Returns min(groups, n) disjoint groups of the indices 0..n-1 of (nearly) equal size, seeded: a delete-a-group
    jackknife leaves each out once (groups = n: the delete-one jackknife)."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(g) for g in np.array_split(order, min(int(groups), int(n)))]


# --- the null of a summary -----------------------------------------------------------------------------------


def summary_null(raw: np.ndarray, null: np.ndarray, best: float | np.ndarray = 1.0) -> dict[str, np.ndarray]:
    """Returns null_mean, null_q95, p_value and calibrated, each raw.shape, from a summary's raw values and its
    permutation null (K, ...) (higher = more alike: a distance is passed negated).

    p = (1 + #{null >= raw}) / (1 + K): the chance of a summary at least this high when the models' images are
    paired at random, exact at any K (the raw pairing counts as one draw of the null). calibrated =
    (raw - null mean) / (best - null mean): 0 at chance, 1 for identical representations (best: the summary of a model
    with itself, 1 for CKA-like measures), negative below chance -- the score Gröger et al. 2026 (arXiv:2602.14486)
    set against the raw one. NaN where raw or the null is."""
    raw = np.asarray(raw, dtype=np.float64)
    null = np.asarray(null, dtype=np.float64)
    finite = np.isfinite(null).all(axis=0) & np.isfinite(raw)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = null.mean(axis=0)
        q95 = np.quantile(null, 0.95, axis=0) if len(null) else np.full(raw.shape, np.nan)
        p = (1.0 + (null >= raw).sum(axis=0)) / (1.0 + len(null))
        calibrated = (raw - mean) / (np.asarray(best, dtype=np.float64) - mean)
    nan = np.nan
    return {
        "null_mean": np.where(finite, mean, nan),
        "null_q95": np.where(finite, q95, nan),
        "p_value": np.where(finite, p, nan),
        "calibrated": np.where(finite, calibrated, nan),
    }


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Returns the Benjamini-Hochberg adjusted p-values (q-values) of p (any shape) over its finite entries: a cell is
    significant at false discovery rate alpha when its q < alpha. NaN stays NaN."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    values = p[finite]
    if values.size:
        order = np.argsort(values)
        ranked = values[order] * values.size / np.arange(1, values.size + 1)
        q = np.minimum.accumulate(ranked[::-1])[::-1]  # the step-up: each q the smallest over ranks at or above it
        adjusted = np.empty_like(values)
        adjusted[order] = np.minimum(q, 1.0)
        out[finite] = adjusted
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

"""The zoo's numbers against chance, and their intervals over images: a permutation null of every summary and the
delete-one-image jackknife of the summaries of linear CKA.

Null (Gröger et al. 2026, arXiv:2602.14486: a max over many layer pairs, and width, inflate raw scores). A replicate
permutes the images of every model by a permutation of its own, the same for all its layers, and recomputes the
summary of every pair of models from the permuted joint matrix: what the summary is when the two models see their
images paired at random, with everything else (each model's layers, their widths, the number of pairs the max runs
over) as it is. Per pair: the raw value, the null's mean and 95th percentile, p = (1 + #{null >= raw}) / (1 + K), and
calibrated = (raw - null mean) / (best - null mean) (stats.summary_null): 0 at chance, 1 for a model with itself. The
same replicates give each layer's best match in another model its own p (the layer correspondences). Nothing is
extracted again:
- linear CKA: inside each minibatch (its unbiased HSIC is a sum over batches), from the batch's U-centred Grams, which
  a permutation only re-indexes: <P_A U(K_i) P_A', P_B U(L_j) P_B'> (ZooNull, one gather and one product per
  replicate and batch, in fp32 as the cell p-values' null; half of each Gram, its upper triangle, as both are
  symmetric with a zero diagonal). The Grams come from the activations or from a `--grams` store's stored Grams.
- every other measure: from the whole-image Grams the measure was computed on (measures/jackknife.py
  iter_null_replicates), one computation of the measure per replicate.

Intervals of linear CKA's summaries: each image left out once (stats.leave_one_out_deltas: how the batch's unbiased
HSIC of every layer pair moves without it), the summary of every pair recomputed on the leave-one-out matrix
(ZooJackknife), and the variance summed over the independent batches (stats.jackknife_sd); the interval is the summary
-/+ t_(n-1) sd. A best match is a max, whose leave-one-out values move smoothly while the best partner of each layer
stays the same: benchmarks/coverage.py measures the coverage of the pair's population summary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from vitsee import stats
from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.zoo.summaries import summarise

torch = lazy_module("torch")

NULL_PERMUTATIONS = 999  # p down to 0.001, its 95th percentile from ~50 draws above it
NULL_BYTES = 64 << 20  # permuted Gram triangles gathered at a time (one product per group of replicates)
NULL_MEMORY = 1 << 30  # null HSIC sums (K, L, L) held at once; beyond it the replicates run in rounds, a pass each
_LOO_BYTES = 64 << 20  # leave-one-out matrices (images, L, L) fp64 at a time


# --- summaries of many matrices at once ------------------------------------------------------------------------


def pair_summaries(
    matrices: np.ndarray,
    idx: dict[str, np.ndarray],
    models: Sequence[str],
    summary: str,
    cell: dict[str, int],
) -> np.ndarray:
    """Returns (R, n, n): the summary of every pair of different models' block of each joint matrix (R, L, L),
    symmetric, NaN on the diagonal (a model with itself has no null and no interval of its own here)."""
    matrices = np.asarray(matrices, dtype=np.float64)
    n = len(models)
    out = np.full((len(matrices), n, n), np.nan)
    for a in range(n):
        for b in range(a + 1, n):
            ma, mb = models[a], models[b]
            block = matrices[:, idx[ma]][:, :, idx[mb]]  # (R, La, Lb)
            out[:, a, b] = out[:, b, a] = summarise(block, summary, cell[ma], cell[mb])
    return out


def best_match_rows(matrices: np.ndarray, idx: dict[str, np.ndarray], models: Sequence[str], width: int) -> np.ndarray:
    """Returns (R, n, n, width): for every ordered pair (A, B) of different models, each layer of A's best value in B
    (the row max of the block, NaN-aware; NaN past A's layers and on the diagonal)."""
    matrices = np.asarray(matrices, dtype=np.float64)
    n = len(models)
    out = np.full((len(matrices), n, n, width), np.nan)
    with np.errstate(invalid="ignore"):
        for a in range(n):
            for b in range(n):
                if a != b:
                    block = matrices[:, idx[models[a]]][:, :, idx[models[b]]]
                    clean = np.where(np.isfinite(block), block, -np.inf)
                    best = clean.max(axis=-1)
                    out[:, a, b, : block.shape[1]] = np.where(np.isfinite(best), best, np.nan)
    return out


def match_p_values(raw_rows: np.ndarray, null_rows: np.ndarray) -> np.ndarray:
    """Returns (n, n, width) p = (1 + #{null >= raw}) / (1 + K) of each layer's best match (raw (n, n, width) against
    null (K, n, n, width)); NaN where the raw value is."""
    with np.errstate(invalid="ignore"):
        p = (1.0 + (null_rows >= raw_rows).sum(axis=0)) / (1.0 + len(null_rows))
    return np.where(np.isfinite(raw_rows), p, np.nan)


def null_of_replicates(
    replicates: Iterable[np.ndarray],
    idx: dict[str, np.ndarray],
    models: Sequence[str],
    summary: str,
    cell: dict[str, int],
    width: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (K, n, n) pair summaries and (K, n, n, width) best-match rows of null joint matrices given one at a time
    or in stacks (r, L, L) (a distance's matrices negated by the caller, so that higher is more alike)."""
    summaries, rows = [], []
    for rep in replicates:
        rep = np.asarray(rep, dtype=np.float64)
        rep = rep[None] if rep.ndim == 2 else rep
        summaries.append(pair_summaries(rep, idx, models, summary, cell))
        rows.append(best_match_rows(rep, idx, models, width))
    if not summaries:
        raise VitseeError("no null replicates were made: ask for some, e.g. --zoo-permutations 999")
    return np.concatenate(summaries), np.concatenate(rows)


# --- linear CKA: the null from the batches' Grams --------------------------------------------------------------


class ZooNull:
    """Accumulates over minibatches the unbiased HSIC sums of every layer pair with each model's images permuted
    inside each batch (replicates [first, first + count) of `permutations`), from the batches' U-centred Grams.

    Called as a MinibatchCKA observer: `null(ucentred (L, m, m) fp64, slot)`. owners: each layer's model index. Model
    k's permutations of batch `slot` are stats.batch_permutations([*seed, k], slot, m, permutations), so a replicate
    does not depend on the other models, the batch's process or the round it runs in. `sums` (count, L, L) fp32: the
    within-model blocks repeat the observed sums (one permutation for all a model's layers), the cross-model blocks
    are the null's.
    """

    def __init__(
        self,
        owners: Sequence[int],
        permutations: int,
        seed: Sequence[int] | int,
        device=None,
        first: int = 0,
        count: int | None = None,
    ):
        self.owners = np.asarray(owners, dtype=np.int64)
        self.permutations, self.seed = int(permutations), [*np.atleast_1d(seed).tolist()]
        self.first = int(first)
        self.count = self.permutations - self.first if count is None else int(count)
        if self.permutations < 1 or self.count < 1 or self.first + self.count > self.permutations:
            raise VitseeError(f"zoo null replicates {first}..{first + (count or 0)} of {permutations}: use at least 1")
        L = len(self.owners)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.sums = torch.zeros(self.count, L, L, dtype=torch.float32, device=self.device)
        self._layers = [torch.as_tensor(np.flatnonzero(self.owners == k), device=self.device) for k in self._models()]

    def _models(self) -> range:
        return range(int(self.owners.max()) + 1)

    def __call__(self, ucentred, slot: int) -> None:
        L, m = int(ucentred.shape[0]), int(ucentred.shape[-1])
        a, b = torch.triu_indices(m, m, 1, device=ucentred.device)  # (T,) T = m (m - 1) / 2
        flat = ucentred.reshape(L, m * m).to(torch.float32)
        scale = 2.0 / (m * (m - 3))  # the upper triangle is half of <U, U'>; 1 / (m (m - 3)): the unbiased HSIC
        perms = [
            torch.as_tensor(
                stats.batch_permutations([*self.seed, k], slot, m, self.permutations)[
                    self.first : self.first + self.count
                ],
                device=ucentred.device,
            )
            for k in self._models()
        ]  # per model (count, m)
        group = max(1, min(self.count, NULL_BYTES // max(1, 4 * L * len(a))))
        for s in range(0, self.count, group):
            g = min(group, self.count - s)
            permuted = torch.empty(g, L, len(a), dtype=torch.float32, device=ucentred.device)
            for k, layers in zip(self._models(), self._layers):
                p = perms[k][s : s + g]  # (g, m)
                index = (p[:, a] * m + p[:, b]).reshape(-1)  # where entry (a, b) of P U P' sits in U
                permuted[:, layers] = flat[layers][:, index].view(len(layers), g, len(a)).transpose(0, 1)
            self.sums[s : s + g] += torch.bmm(permuted, permuted.transpose(1, 2)) * scale  # (g, L, L)


def null_cka(sums: np.ndarray, null_sums: np.ndarray) -> np.ndarray:
    """Returns (K, L, L) the CKA of each null replicate: its HSIC sums over the observed self-HSIC, which a permutation
    of a model's own images leaves as it is."""
    self_hsic = np.diagonal(np.asarray(sums, dtype=np.float64))
    null = np.asarray(null_sums, dtype=np.float64)
    return stats.cka_from_hsic(null, np.broadcast_to(self_hsic, null.shape[:-1]))


def null_rounds(permutations: int, n_layers: int, memory: int = NULL_MEMORY) -> list[tuple[int, int]]:
    """Returns [(first, count)]: the replicates each pass over the batches runs, so their (count, L, L) fp32 sums stay
    within `memory` bytes."""
    per = max(1, int(memory) // max(1, 4 * n_layers * n_layers))
    return [(s, min(per, permutations - s)) for s in range(0, permutations, per)]


# --- linear CKA: the jackknife of the summaries --------------------------------------------------------------


class ZooJackknife:
    """Accumulates over minibatches the delete-one-image jackknife variance of every pair's summary of linear CKA.

    Called as a MinibatchCKA observer on a second pass over the same batches: `sums` are the HSIC sums (L, L) of the
    first pass, so the leave-one-out CKA matrix of image i of batch b is that of sums + (HSIC_b,-i - HSIC_b). `var`
    (n, n): the sum over batches of (m-1)/m sum_i (v_i - mean v)^2, v_i the pair's summary without image i; `images`
    counts them, `unseen` the images of batches of 4, which have no leave-one-out HSIC (then no interval).
    """

    def __init__(
        self,
        sums: np.ndarray,
        idx: dict[str, np.ndarray],
        models: Sequence[str],
        summary: str,
        cell: dict[str, int],
    ):
        self.sums = np.asarray(sums, dtype=np.float64)
        self.idx, self.models, self.summary, self.cell = idx, list(models), summary, cell
        n = len(self.models)
        self.var = np.zeros((n, n))
        self.images = self.unseen = 0

    def __call__(self, ucentred, slot: int) -> None:
        L, m = int(ucentred.shape[0]), int(ucentred.shape[-1])
        if m < 5:
            self.unseen += m
            return
        values = []
        step = max(1, _LOO_BYTES // (8 * L * L))
        for s in range(0, m, step):
            deltas = stats.leave_one_out_deltas(ucentred, rows=slice(s, s + step)).cpu().numpy()  # (c, L, L)
            values.append(pair_summaries(stats.cka_from_hsic(self.sums + deltas), *self._layout()))
        v = np.concatenate(values)  # (m, n, n)
        self.var += (m - 1) / m * ((v - v.mean(axis=0)) ** 2).sum(axis=0)
        self.images += m

    def _layout(self):
        return self.idx, self.models, self.summary, self.cell

    def interval(self, values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
        """Returns (low, high) (n, n): values -/+ t_(n-1) sd; NaN on the diagonal, and everywhere with fewer than
        stats.MIN_INTERVAL_IMAGES images or images in batches of 4."""
        if self.unseen or self.images < stats.MIN_INTERVAL_IMAGES:
            nan = np.full(self.var.shape, np.nan)
            return nan, nan.copy()
        half = stats.t_quantile(level, self.images - 1) * np.sqrt(self.var)
        np.fill_diagonal(half, np.nan)
        return values - half, values + half

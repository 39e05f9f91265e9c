"""The linear probes' pure core (Raghu et al. 2021, Fig. 11, 13): ridge regression to {-1, 1} one-hot targets, test
accuracy. Arrays in, arrays out: no store, no printing; engine/analyses/probes.py is the store-facing runner.

Three layers, each usable alone:
- `ridge_predict` / `ridge_probe`: one fit on arrays in memory. The reference: it predicts what scikit-learn's
  `RidgeClassifier(alpha=l2)` predicts.
- `RidgeAccumulator` -> `RidgePath`: sufficient statistics of P probes that share labels, streamed batch by
  batch, then solved for a grid of L2 penalties with one eigendecomposition per probe. That is the primal
  (D x D feature space) form; `ExampleAccumulator` is the dual (n x n example space) form of the same ridge
  fit, for fewer examples than features (32 images of 768 channels), and `new_accumulator` picks the smaller.
- `fit_probes`: seeded split, L2 chosen on a held-out part of the training split, refit on the whole training
  split, test accuracy. It reads every example exactly once, through a `batches(mask)` function the store
  runner provides (see `BatchesFn`).

And what a fit costs before it starts (`probe_flops`, `matmul_flops_per_s`), which the runner's time estimate uses.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module

torch = lazy_module("torch")  # reading a cached result needs numpy only; torch is imported by the first computation

# Penalties are searched relative to the mean eigenvalue of the centred X'X (= n * mean feature variance), so
# the same grid fits features of any scale and any number of images: l2 = ratio * trace(Xc'Xc) / D.
L2_RATIOS = np.logspace(-6, 5, 12)
# ExampleAccumulator keeps x minus the mean of the first batch's first rows: near enough to the mean to keep fp64
# Grams from cancelling on a large shared offset, and a small read (CKA shifts its batches the same way).
REFERENCE_ROWS = 16

# batches(mask) yields (x, y) for exactly the examples where mask (n,) is True, in any order and batch size:
# x (b, P, D) float (numpy or torch, any dtype and device; (b, D) when P == 1), y (b,) int labels in [0, K).
BatchesFn = Callable[[np.ndarray], Iterable[tuple]]
ProgressFn = Callable[[int, int], None]  # (examples read, examples in all)


# ---------------------------------------------------------------------------------------------------------------
# One-shot reference


def ridge_probe(x_train, y_train, x_test, y_test, l2: float, device="cpu") -> float:
    """Return the test accuracy of a ridge classifier fitted to (x_train, y_train) with penalty l2."""
    predicted = ridge_predict(x_train, y_train, x_test, l2, device=device)
    return float(np.mean(predicted == _to_numpy(y_test)))


def ridge_predict(x_train, y_train, x_test, l2: float, device="cpu") -> np.ndarray:
    """Return the labels (m,) that ridge regression to {-1, 1} one-hot targets predicts for x_test.

    Features are centred on the training mean and targets on theirs, so the intercept is not penalised; the
    primal (D x D) or dual (n x n) system is solved in float64, whichever is smaller. x is (n, ...) and is
    flattened per example. Two classes give two target columns that are exact negatives of each other, so the
    argmax (first maximum on ties) picks the same label as scikit-learn's single column thresholded at > 0.
    """
    _check_l2(l2)
    x = _as_float64(x_train, device).flatten(1)  # (n, D)
    x_test = _as_float64(x_test, device).flatten(1)  # (m, D)
    classes, y_index = np.unique(_to_numpy(y_train), return_inverse=True)
    _check_classes(len(classes), len(y_index), "training split")
    targets = 2.0 * _one_hot(torch.as_tensor(y_index, device=x.device), len(classes)) - 1.0  # (n, K)

    mean_x, mean_y = x.mean(0), targets.mean(0)  # (D,), (K,)
    xc, yc = x - mean_x, targets - mean_y
    n, d = xc.shape
    if d <= n:
        coef = torch.linalg.solve(xc.T @ xc + l2 * _eye(d, x), xc.T @ yc)  # (D, K)
    else:
        coef = xc.T @ torch.linalg.solve(xc @ xc.T + l2 * _eye(n, x), yc)  # (D, K)
    intercept = mean_y - mean_x @ coef  # (K,)
    scores = x_test @ coef + intercept  # (m, K)
    return classes[scores.argmax(1).cpu().numpy()]


# ---------------------------------------------------------------------------------------------------------------
# Streaming: accumulate, then solve


class RidgeAccumulator:
    """Streamed sufficient statistics of P ridge probes sharing one set of labels; `solve` returns a RidgePath.

    State (float64, on `device`): count, class counts (K,), means of x (P, D) and of the {-1, 1} targets (K,),
    and the centred co-moments X'X (P, D, D) and X'Y (P, D, K). Batches are merged with Chan et al.'s pairwise
    update rather than kept as raw sums, so activations with a large shared offset lose no precision to the
    subtraction n * mean * mean'. Sized by the first batch; memory does not grow with the number of images.
    """

    def __init__(self, n_classes: int, device="cpu"):
        self.n_classes = int(n_classes)
        self.device = torch.device(device)
        self.count = 0
        self.class_counts = torch.zeros(self.n_classes, dtype=torch.int64, device=self.device)
        self.mean_y = torch.zeros(self.n_classes, dtype=torch.float64, device=self.device)
        self.mean_x = self.xx = self.xy = None  # (P, D), (P, D, D), (P, D, K) once the first batch arrives

    @property
    def n_probes(self) -> int:
        return self.mean_x.shape[0]

    @property
    def n_features(self) -> int:
        return self.mean_x.shape[1]

    def update(self, x, y) -> RidgeAccumulator:
        """Return self after adding a batch: x (b, P, D) or (b, D) for one probe, y (b,) labels in [0, K)."""
        x, y = _check_batch(x, y, self.n_classes, self.device)
        if len(y) == 0:
            return self
        targets = 2.0 * _one_hot(y, self.n_classes) - 1.0  # (b, K)
        batch_mean_x, batch_mean_y = x.mean(0), targets.mean(0)  # (P, D), (K,)
        xc = (x - batch_mean_x).transpose(0, 1)  # (P, b, D)
        yc = targets - batch_mean_y  # (b, K)
        self._ensure_shape(*batch_mean_x.shape)
        self.xx.baddbmm_(xc.mT, xc)  # adds the batch's centred X'X without materialising it
        self._combine(len(y), batch_mean_x, batch_mean_y, xc.mT @ yc, torch.bincount(y, minlength=self.n_classes))
        return self

    def merge(self, other: RidgeAccumulator) -> RidgeAccumulator:
        """Return self after adding the examples another accumulator has seen (e.g. a held-out part)."""
        if other.count == 0:
            return self
        self._ensure_shape(*other.mean_x.shape)
        self.xx += other.xx
        self._combine(other.count, other.mean_x, other.mean_y, other.xy, other.class_counts)
        return self

    def feature_scale(self) -> torch.Tensor:
        """Return (P,) the mean eigenvalue of the centred X'X, trace / D: the unit of the L2 grid (1 if zero)."""
        scale = torch.diagonal(self.xx, dim1=1, dim2=2).sum(1) / self.n_features  # (P,)
        return torch.where(scale > 0, scale, torch.ones_like(scale))  # constant features: any unit will do

    def solve(self, l2) -> RidgePath:
        """Return the ridge solutions of all P probes for penalties l2: (L,) shared by all probes, or (P, L)."""
        l2 = _check_solvable(self, l2)  # (P, L)
        eigvals, eigvecs = _eigh(self.xx)  # (P, D), (P, D, D)
        return RidgePath(
            mean_x=self.mean_x.clone(),  # the path stays valid while this accumulator keeps updating
            mean_y=self.mean_y.clone(),
            eigvals=eigvals.clamp_min(0),  # PSD in exact arithmetic; rounding can leave -1e-15
            eigvecs=eigvecs,
            projected_xy=eigvecs.mT @ self.xy,  # (P, D, K)
            l2=l2,
        )

    def _ensure_shape(self, n_probes: int, n_features: int) -> None:
        if self.mean_x is None:
            f64 = dict(dtype=torch.float64, device=self.device)
            self.mean_x = torch.zeros(n_probes, n_features, **f64)
            self.xx = torch.zeros(n_probes, n_features, n_features, **f64)
            self.xy = torch.zeros(n_probes, n_features, self.n_classes, **f64)
        elif (n_probes, n_features) != tuple(self.mean_x.shape):
            raise ValueError(f"batch has (P, D) = {(n_probes, n_features)}, earlier batches {tuple(self.mean_x.shape)}")

    def _combine(self, n_b, mean_x_b, mean_y_b, xy_b, class_counts_b) -> None:
        # Chan et al. 1979: M = M_a + M_b + (n_a n_b / n) d d', d the difference of the means. The caller has
        # already added M_b of X'X (in place, as it is the big one).
        n_a, n = self.count, self.count + n_b
        dx = mean_x_b - self.mean_x  # (P, D)
        dy = mean_y_b - self.mean_y  # (K,)
        weight = n_a * n_b / n
        self.xx.baddbmm_(dx[:, :, None], dx[:, None, :], alpha=weight)
        self.xy += xy_b + weight * dx[:, :, None] * dy
        self.mean_x += dx * (n_b / n)
        self.mean_y += dy * (n_b / n)
        self.class_counts += class_counts_b
        self.count = n


class ExampleAccumulator:
    """The examples of P ridge probes sharing one set of labels; `solve` returns the same RidgePath in dual form.

    The dual of RidgeAccumulator, for fewer examples n than features D: it keeps the examples (n, P, D) instead
    of X'X (P, D, D) and solves through the centred Gram G = Xc Xc' (P, n, n). With G = U diag(s) U', the
    nonzero eigenvalues s are those of X'X and its eigenvectors are V = Xc'U diag(s)^-1/2, so the weights
    Xc'(G + l2 I)^-1 Yc = (Xc'U) diag(1 / (s + l2)) (U'Yc): the RidgePath with basis Xc'U (kept as its two
    factors) and projected targets U'Yc scores exactly what the primal path scores.

    The work is a few passes over memory, so each example is touched as little as possible: kept once,
    probe-major, minus a reference (the mean of the first batch's first rows, which keeps fp64 from losing
    digits to a large shared offset); the Gram of those is grown by the examples added since the last solve
    (the refit on fit + holdout adds the holdout's rows) and centred exactly by H G H, H = I - 11'/n.
    Memory grows with the number of examples, so `new_accumulator` uses it only where n < D.
    """

    def __init__(
        self, n_classes: int, device="cpu", reference: torch.Tensor | None = None, workspace: Workspace | None = None
    ):
        self.n_classes = int(n_classes)
        self.workspace = workspace  # where the kept blocks' buffers come from (None: new ones)
        self.device = torch.device(device)
        self.count = 0
        self.class_counts = torch.zeros(self.n_classes, dtype=torch.int64, device=self.device)
        self.blocks: list[torch.Tensor] = []  # (P, b, D) float64 batches minus reference
        self.y: list[torch.Tensor] = []  # (b,) labels
        self.reference = reference  # (P, D); given: another accumulator's, so merging into it shifts nothing
        self.gram: torch.Tensor | None = None  # (P, m, m) of the examples of the first `gram_blocks` blocks
        self.gram_blocks = 0
        self.centred_gram: torch.Tensor | None = None  # H gram H, for the same blocks (feature_scale and solve)
        # block index -> (P, b, m) its products with the first m examples, already computed when it was scored
        self.known_cross: dict[int, torch.Tensor] = {}

    @property
    def n_probes(self) -> int:
        return self.blocks[0].shape[0]

    @property
    def n_features(self) -> int:
        return self.blocks[0].shape[2]

    def update(self, x, y) -> ExampleAccumulator:
        """Return self after keeping a batch: x (b, P, D) or (b, D) for one probe, y (b,) labels in [0, K)."""
        x = _as_tensor(x, self.device)
        x = x[:, None, :] if x.ndim == 2 else x  # (b, P, D)
        y = _check_labels(x, y, self.n_classes, self.device)
        if len(y) == 0:
            return self
        if self.reference is None:  # taken from the float64 copy: a second read of a strided float32 view cost more
            block = _kept(x, out=self._buffer(x))
            self.reference = block[:, :REFERENCE_ROWS].mean(1)  # (P, D)
            return self._keep(block.sub_(self.reference[:, None]), y)
        return self._keep(_kept(x, self.reference, out=self._buffer(x)), y)

    def _buffer(self, x: torch.Tensor) -> torch.Tensor | None:
        """Return the workspace's (b, P, D) float64 buffer for the batch x (b, P, D), or None without one."""
        return None if self.workspace is None else self.workspace.take(tuple(x.shape), x.device)

    def update_scored(self, path: RidgePath, x, y) -> tuple[torch.Tensor, torch.Tensor]:
        """Return path.evaluate(x, y) after keeping the batch, its products with the path's examples computed
        once for both (the path must be solved from the accumulator whose reference this one shares)."""
        self.update(x, y)
        block = self.blocks[-1]
        cross = path.cross(block)  # (P, b, n) with the path's training examples, minus the same reference
        self.known_cross[len(self.blocks) - 1] = cross
        return path.evaluate_cross(cross, y)

    def merge(self, other: ExampleAccumulator) -> ExampleAccumulator:
        """Return self after adding the examples another accumulator has kept (e.g. a held-out part)."""
        if self.reference is None:
            self.reference = other.reference
        shared = other.reference is self.reference  # then the products it computed against self's examples hold
        first, seen = len(self.blocks), self.count
        for j, (block, y) in enumerate(zip(other.blocks, other.y)):
            self._keep(block if shared else block + (other.reference - self.reference)[:, None], y)
            cross = other.known_cross.get(j)
            if shared and cross is not None and cross.shape[2] == seen and self.gram_blocks == first:
                self.known_cross[first + j] = cross
        return self

    def feature_scale(self) -> torch.Tensor:
        """Return (P,) the mean eigenvalue of the centred X'X, trace / D: the unit of the L2 grid (1 if zero)."""
        scale = torch.diagonal(self._centred_gram(), dim1=1, dim2=2).sum(1) / self.n_features  # tr(Xc'Xc) = tr(Xc Xc')
        return torch.where(scale > 0, scale, torch.ones_like(scale))

    def solve(self, l2, factor: str = "eigh") -> RidgePath:
        """Return the ridge solutions of all P probes for penalties l2: (L,) shared by all probes, or (P, L).

        factor 'eigh' keeps the eigenbasis of the Gram, one decomposition for any number of penalties;
        'cholesky' solves (G + l2 I) A = Yc once per penalty, far cheaper for the one penalty of a refit.
        """
        l2 = _check_solvable(self, l2)  # (P, L)
        gram = self._centred_gram()  # (P, n, n)
        targets = 2.0 * _one_hot(torch.cat(self.y), self.n_classes) - 1.0  # (n, K)
        mean_y = targets.mean(0)
        dual_coef = _cholesky_dual_coef(gram, targets - mean_y, l2) if factor == "cholesky" else None
        if dual_coef is None:  # asked for, or a penalty too small against the Gram for Cholesky in float64
            eigvals, eigvecs = _eigh(gram)  # (P, n), (P, n, n)
            eigvals = eigvals.clamp_min(0)  # the centring direction (1, .., 1) has eigenvalue 0, give or take 1e-15
            projected_xy = eigvecs.mT @ (targets - mean_y)  # (P, n, K), U'Yc
        else:
            eigvals = eigvecs = projected_xy = None
        return RidgePath(
            mean_x=None,  # reference + the examples' mean, computed from the examples if asked for
            mean_y=mean_y,
            eigvals=eigvals,
            eigvecs=eigvecs,
            projected_xy=projected_xy,
            l2=l2,
            examples=tuple(self.blocks),
            reference=self.reference,
            dual_coef=dual_coef,
            workspace=self.workspace,
            gram_row_mean=self.gram.mean(2),  # (P, n): each example's product with the examples' mean
            gram_mean=self.gram.mean((1, 2)),  # (P,): the mean's with itself
        )

    def _keep(self, block: torch.Tensor, y: torch.Tensor) -> ExampleAccumulator:
        if self.blocks and block.shape[::2] != self.blocks[0].shape[::2]:
            raise ValueError(
                f"batch has (P, D) = {tuple(block.shape[::2])}, earlier batches {tuple(self.blocks[0].shape[::2])}"
            )
        self.blocks.append(block)
        self.y.append(y)
        self.count += len(y)
        self.class_counts += torch.bincount(y, minlength=self.n_classes)
        return self

    def _centred_gram(self) -> torch.Tensor:
        """Return (P, n, n) the Gram of the centred examples, after growing the kept Gram (self.gram, of the
        examples minus the reference) by the new blocks."""
        if self.gram_blocks < len(self.blocks):
            old = 0 if self.gram is None else self.gram.shape[1]
            gram = torch.empty(self.n_probes, self.count, self.count, dtype=torch.float64, device=self.device)
            if self.gram is not None:
                gram[:, :old, :old] = self.gram
            starts = np.cumsum([0] + [len(y) for y in self.y])
            for j in range(self.gram_blocks, len(self.blocks)):  # new block j against every block up to it
                cols = slice(starts[j], starts[j + 1])
                known = self.known_cross.pop(j, None)  # (P, b_j, old): scored against the old blocks already
                if known is not None:
                    gram[:, cols, :old] = known
                    gram[:, :old, cols] = known.mT
                for i in range(self.gram_blocks if known is not None else 0, j + 1):
                    rows = slice(starts[i], starts[i + 1])
                    cross = _products(self.blocks[i], self.blocks[j])  # (P, b_i, b_j)
                    gram[:, rows, cols] = cross
                    gram[:, cols, rows] = cross.mT
            self.gram, self.gram_blocks = gram, len(self.blocks)
            self.centred_gram = _centred(gram)  # once per growth: feature_scale and solve both ask for it
        return self.centred_gram


def _cholesky_dual_coef(gram: torch.Tensor, yc: torch.Tensor, l2: torch.Tensor) -> torch.Tensor | None:
    """Return (P, L, n, K) A = (G + l2 I)^-1 Yc for each probe's L penalties, or None where G + l2 I is not
    numerically positive definite (then the caller falls back to the eigendecomposition)."""
    eye = _eye(gram.shape[-1], gram)
    coefs = []
    for j in range(l2.shape[1]):
        factor, info = torch.linalg.cholesky_ex(gram + l2[:, j, None, None] * eye)  # (P, n, n)
        if bool((info != 0).any()):
            return None
        coefs.append(torch.cholesky_solve(yc.expand(gram.shape[0], -1, -1), factor))  # (P, n, K)
    return torch.stack(coefs, dim=1)


# Products of at least this many entries per probe go through numpy's BLAS on CPU (see _products).
NUMPY_PRODUCTS_MIN = 100


def _products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return a @ b.mT (P, m, n) for float64 batches a (P, m, D) and b (P, n, D).

    On CPU, numpy's stacked product of these small, wide matrices is faster than torch's bmm where m x n is
    not tiny (197 x 21 x 768 by its transpose: 6.6 against 9.5 ms; 5 x 5: 1.5 against 0.5 ms).
    """
    if a.device.type != "cpu" or a.shape[1] * b.shape[1] < NUMPY_PRODUCTS_MIN:
        return a @ b.mT
    x, y = a.numpy(), b.numpy().transpose(0, 2, 1)
    out = np.empty((x.shape[0], x.shape[1], y.shape[2]))
    threads, blas = torch.get_num_threads(), blas_controller()
    if blas is None:
        np.matmul(x, y, out=out)
        return torch.from_numpy(out)
    # each product on one BLAS thread: OpenBLAS spreads every 21 x 21 x 768 product over its own threads at a
    # loss; with two or more compute threads, one share of the probes per thread instead (197: 5.9 ms in one
    # call with OpenBLAS's threads, 3.1 ms in two shares)
    with blas.limit(limits=1, user_api="blas"):
        if threads < 2 or len(x) < 2 * PRODUCTS_CHUNK:
            np.matmul(x, y, out=out)
        else:
            step = -(-len(x) // threads)
            shares = [slice(i, i + step) for i in range(0, len(x), step)]
            list(_compute_pool(threads).map(lambda s: np.matmul(x[s], y[s], out=out[s]), shares))
    return torch.from_numpy(out)


# A batch of fewer than twice this many probes has its products computed on one thread.
PRODUCTS_CHUNK = 16
_BLAS: list = []


def blas_controller():
    """Return threadpoolctl's controller of numpy's BLAS threads, or None without threadpoolctl (then the
    products are not split over threads)."""
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController  # installed with scikit-learn
        except ImportError:
            _BLAS.append(None)
        else:
            _BLAS.append(ThreadpoolController())
    return _BLAS[0]


def _centred(gram: torch.Tensor) -> torch.Tensor:
    """Return H G H (P, n, n), H = I - 11'/n: the Gram of the examples less their mean."""
    return gram - gram.mean(1, keepdim=True) - gram.mean(2, keepdim=True) + gram.mean((1, 2), keepdim=True)


def solve_space(n_examples: int, n_features: int) -> str:
    """Return 'dual' where the n x n example space is smaller than the D x D feature space, else 'primal'.

    Both give the same ridge solution; the dual costs O(P n^2 D) and keeps the examples, the primal O(P n D^2
    + P D^3) and keeps (P, D, D).
    """
    return "dual" if n_examples < n_features else "primal"


class Workspace:
    """Float64 buffers for the examples the dual keeps, handed from one fit_probes call to the next (run_probes'
    layers): writing a new 25 MB buffer first costs ~10 ms of page faults, five times the copy into it.

    `begin` starts a fit: the buffers the previous fit took become free to take again (that fit's arrays must
    no longer be in use), in the same order by shape; any it did not take again are dropped at the next begin.
    """

    def __init__(self):
        self.free: dict[tuple, list[torch.Tensor]] = {}
        self.taken: dict[tuple, list[torch.Tensor]] = {}

    def begin(self) -> None:
        self.free, self.taken = self.taken, {}

    def take(self, shape: tuple[int, ...], device) -> torch.Tensor:
        """Return a float64 buffer of `shape` on device, not handed out since the last begin."""
        key = (tuple(shape), str(device))
        free = self.free.get(key)
        buffer = free.pop(0) if free else torch.empty(shape, dtype=torch.float64, device=device)
        self.taken.setdefault(key, []).append(buffer)
        return buffer


def new_accumulator(
    n_classes: int,
    n_examples: int,
    n_features: int,
    device="cpu",
    space: str = "auto",
    workspace: Workspace | None = None,
):
    """Return an empty accumulator for probes of n_features over n_examples, in `space` ('auto': the smaller);
    a dual one takes its buffers from `workspace` where given."""
    if space == "auto":
        space = solve_space(n_examples, n_features)
    if space not in ("primal", "dual"):
        raise ValueError(f"space must be 'auto', 'primal' or 'dual', got {space!r}")
    return (
        ExampleAccumulator(n_classes, device, workspace=workspace)
        if space == "dual"
        else RidgeAccumulator(n_classes, device)
    )


# RidgePath scores this many values of z (P, b, R) times penalties at once, at most (2**22: 32 MB of float64).
SCORE_CHUNK_VALUES = 2**22


@dataclass
class RidgePath:
    """Ridge solutions of P probes at L penalties each, kept in the eigenbasis of the centred X'X.

    With X'X = V diag(s) V', the weights at penalty l2 are W = V diag(1 / (s + l2)) V'X'Y, so each penalty of
    the grid costs a diagonal scaling, and predicting never needs the (P, L, D, K) weights themselves. The
    basis has R = D columns (primal: V, and V'X'Y) or R = n (dual: Xc'U and U'Y, see ExampleAccumulator).
    A dual path solved by Cholesky (`ExampleAccumulator.solve(l2, factor='cholesky')`, the refit's one penalty)
    keeps A = (Gc + l2 I)^-1 Yc per penalty instead of an eigenbasis: the same scores, kernel @ A, no basis().
    A class absent from training scores exactly -1 and is never predicted, as in scikit-learn: the scores of the
    present classes sum to 2 - K_present for every input (a linear fit keeps the targets' constant row sum),
    so the largest is at least -1 + 2 / K_present.
    """

    mean_x: torch.Tensor | None  # (P, D); None in dual form: feature_mean() computes it from the examples
    mean_y: torch.Tensor  # (K,)
    eigvals: torch.Tensor | None  # (P, R)
    eigvecs: torch.Tensor | None  # (P, D, R) primal: V; (P, n, n) dual: U
    projected_xy: torch.Tensor | None  # (P, R, K), V'X'Y or U'Y
    l2: torch.Tensor  # (P, L)
    # dual form: the training examples as (P, b, D) blocks, less any shift
    examples: tuple[torch.Tensor, ...] | None = None
    reference: torch.Tensor | None = None  # (P, D) what the examples are less
    gram_row_mean: torch.Tensor | None = None  # (P, n) and (P,): means of the Gram of the examples as kept,
    gram_mean: torch.Tensor | None = None  # which centre a query's products with them (kernel centring)
    # dual form solved by Cholesky instead (no eigenbasis): (P, L, n, K) A = (Gc + l2 I)^-1 Yc per penalty
    dual_coef: torch.Tensor | None = None
    workspace: Workspace | None = None  # dual form: where the float64 copy of a batch to score is written

    @property
    def device(self) -> torch.device:
        return self.mean_y.device

    def feature_mean(self) -> torch.Tensor:
        """Return (P, D) the mean of the training features."""
        return self.mean_x if self.examples is None else self.reference + self._examples_mean()

    def _examples_mean(self) -> torch.Tensor:
        # the mean of the kept examples, less the reference: per block sums, then their sum
        return torch.stack([block.sum(1) for block in self.examples]).sum(0) / sum(b.shape[1] for b in self.examples)

    def basis(self) -> torch.Tensor:
        """Return (P, D, R) the directions the penalties shrink along: V (primal) or Xc'U (dual, eigh)."""
        if self.examples is None:
            return self.eigvecs
        return self._centred_examples().mT @ self.eigvecs

    def _centred_examples(self) -> torch.Tensor:
        return torch.cat(self.examples, dim=1) - self._examples_mean()[:, None]  # (P, n, D), Xc

    def coef(self) -> torch.Tensor:
        """Return the weights (P, L, D, K): scores = x @ coef + intercept."""
        if self.dual_coef is not None:
            return self._centred_examples().mT[:, None] @ self.dual_coef  # Xc'A
        shrink = 1.0 / (self.eigvals[:, None, :] + self.l2[:, :, None])  # (P, L, R)
        return self.basis()[:, None] @ (shrink[..., None] * self.projected_xy[:, None])  # (P, L, D, K)

    def intercept(self) -> torch.Tensor:
        """Return the intercepts (P, L, K), unpenalised: mean target minus mean feature times weights."""
        return self.mean_y - (self.feature_mean()[:, None, None, :] @ self.coef()).squeeze(-2)  # (P, L, K)

    def _scores(self, x) -> Iterator[torch.Tensor]:
        """Yields, penalty by penalty, the class scores (P, b, K) of a batch x (b, P, D) or (b, D)."""
        x = _as_tensor(x, self.device)
        x = x[:, None, :] if x.ndim == 2 else x  # (b, P, D)
        if self.examples is None:
            z = _kept(x, self.mean_x) @ self.eigvecs  # (P, b, D): centred x in the eigenbasis
            yield from self._scores_in_basis(z)
        else:
            buffer = None if self.workspace is None else self.workspace.take(tuple(x.shape), x.device)
            yield from self._scores_from_cross(self.cross(_kept(x, self.reference, out=buffer)))

    def cross(self, block: torch.Tensor) -> torch.Tensor:
        """Return (P, b, n) the products of a block (P, b, D), less the reference, with the kept examples (dual)."""
        return torch.cat([_products(block, examples) for examples in self.examples], dim=2)

    def evaluate_cross(self, cross: torch.Tensor, y) -> tuple[torch.Tensor, torch.Tensor]:
        """Return evaluate(x, y) for the batch x whose products with the kept examples are cross (dual)."""
        return self._evaluate(self._scores_from_cross(cross), y)

    def _scores_from_cross(self, cross: torch.Tensor) -> Iterator[torch.Tensor]:
        # the kernel with the centred examples, (x - m)'(x_j - m), from the products with the kept ones: less
        # x'm (the row's mean), m'x_j (the Gram's row mean) plus m'm, rather than through a (P, D, n) basis
        kernel = cross - cross.mean(2, keepdim=True) - self.gram_row_mean[:, None, :] + self.gram_mean[:, None, None]
        if self.dual_coef is not None:
            for j in range(self.l2.shape[1]):
                yield kernel @ self.dual_coef[:, j] + self.mean_y  # (P, b, K)
        else:
            yield from self._scores_in_basis(kernel @ self.eigvecs)  # (P, b, n)

    def _scores_in_basis(self, z: torch.Tensor) -> Iterator[torch.Tensor]:
        # as many penalties at once as keep the scaled copies of z within SCORE_CHUNK_VALUES (a Mixer layer's
        # holdout: all 12 in three products instead of 36 small calls), then penalty by penalty
        n_l2 = self.l2.shape[1]
        step = max(1, min(n_l2, SCORE_CHUNK_VALUES // max(1, z.numel())))
        for start in range(0, n_l2, step):
            l2 = self.l2[:, start : start + step]  # (P, c)
            shrink = 1.0 / (self.eigvals[:, None, :] + l2[:, :, None])  # (P, c, R)
            scores = (z[:, None] * shrink[:, :, None, :]) @ self.projected_xy[:, None] + self.mean_y  # (P, c, b, K)
            yield from scores.unbind(1)  # (P, b, K) each

    def predict(self, x) -> torch.Tensor:
        """Return predicted class indices (b, P, L) for a batch x (b, P, D) or (b, D)."""
        return torch.stack([scores.argmax(-1).T for scores in self._scores(x)], dim=-1)  # (b, P, L)

    def count_correct(self, x, y) -> torch.Tensor:
        """Return (P, L) int64: how many examples of the batch each probe gets right at each penalty."""
        return self.evaluate(x, y)[0]

    def evaluate(self, x, y) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (correct (P, L) int64, squared error (P, L) fp64 against the {-1, 1} one-hot targets)."""
        return self._evaluate(self._scores(x), y)

    def _evaluate(self, penalty_scores: Iterator[torch.Tensor], y) -> tuple[torch.Tensor, torch.Tensor]:
        y = _as_labels(y, self.device)  # (b,)
        targets = 2.0 * _one_hot(y, len(self.mean_y)) - 1.0  # (b, K)
        correct, errors = [], []
        for scores in penalty_scores:
            correct.append((scores.argmax(-1) == y).sum(-1))  # (P,)
            errors.append((scores - targets).square().sum((-2, -1)))  # (P,)
        return torch.stack(correct, dim=-1), torch.stack(errors, dim=-1)  # (P, L)


# ---------------------------------------------------------------------------------------------------------------
# Driver: split, choose L2, refit, test


@dataclass(frozen=True)
class ProbeSplit:
    """Sorted, disjoint example indices: fit + holdout make the training split; test is apart from both."""

    n_examples: int
    seed: int
    fit: np.ndarray  # chooses nothing: fitted at every L2 of the grid
    holdout: np.ndarray  # scores the grid to choose L2
    test: np.ndarray  # reported accuracy, after refitting on fit + holdout

    @property
    def train(self) -> np.ndarray:
        return np.union1d(self.fit, self.holdout)

    def mask(self, part: str) -> np.ndarray:
        """Return the (n,) boolean mask of one part: 'fit', 'holdout', 'train' or 'test'."""
        mask = np.zeros(self.n_examples, dtype=bool)
        mask[getattr(self, part)] = True
        return mask


def split_examples(
    n_examples: int, seed: int = 0, test_fraction: float = 0.2, holdout_fraction: float = 0.2
) -> ProbeSplit:
    """Return a seeded random split of n examples: test_fraction for test, then the last holdout_fraction of the
    shuffled training examples held out to choose L2."""
    for name, fraction in (("test_fraction", test_fraction), ("holdout_fraction", holdout_fraction)):
        if not 0 < fraction < 1:
            raise VitseeError(f"{name}={fraction} must lie strictly between 0 and 1; pass e.g. 0.2")
    order = np.random.default_rng(seed).permutation(n_examples)
    n_test = max(1, round(n_examples * test_fraction))
    train = order[n_test:]
    n_holdout = max(1, round(len(train) * holdout_fraction))
    if len(train) - n_holdout < 2:
        raise VitseeError(f"{n_examples} images are too few to split into fit, holdout and test parts; use more images")
    return ProbeSplit(
        n_examples=n_examples,
        seed=seed,
        fit=np.sort(train[:-n_holdout]),
        holdout=np.sort(train[-n_holdout:]),
        test=np.sort(order[:n_test]),
    )


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of P probes fitted on one layer: the split, the L2 choice and the test accuracy, all numpy."""

    split: ProbeSplit
    n_classes: int
    l2_ratios: np.ndarray  # (L,) the grid, in units of the mean eigenvalue of the centred X'X
    holdout_accuracy: np.ndarray  # (P, L) fitted on split.fit, scored on split.holdout
    l2_ratio: np.ndarray  # (P,) chosen from the grid
    l2: np.ndarray  # (P,) the absolute penalty of the refit on split.train: l2_ratio * its feature scale
    test_accuracy: np.ndarray  # (P,) refitted on split.train, scored on split.test


def fit_probes(
    batches: BatchesFn,
    labels,
    *,
    l2_ratios=L2_RATIOS,
    seed: int = 0,
    test_fraction: float = 0.2,
    holdout_fraction: float = 0.2,
    device="cpu",
    progress: ProgressFn | None = None,
    space: str = "auto",
    workspace: Workspace | None = None,
) -> ProbeResult:
    """Return a ProbeResult for P probes over the n examples whose labels (n,) are given.

    Three passes read every example once: the fit part is accumulated and solved for the whole L2 grid; the
    holdout part scores the grid (each probe keeps the ratio with the best accuracy, the largest ratio on ties)
    and is merged into the statistics, which are solved again at the chosen penalties; the test part is scored.
    `space` 'auto' solves in the feature space (D x D) or the example space (n x n) of the training split,
    whichever is smaller (D from the first batch); 'primal' or 'dual' forces one. Both give the same solution.
    A `workspace` lends the dual its buffers; it reuses those of the previous call given it (see Workspace).
    """
    labels = _to_numpy(labels).astype(np.int64)  # (n,)
    if labels.ndim != 1:
        raise ValueError(f"labels must be (n,), got {labels.shape}")
    if labels.size and labels.min() < 0:  # how unlabelled images are stored
        raise VitseeError(
            f"label {labels.min()} marks unlabelled images; probes need labels: use a labelled data set "
            "(digits, synthetic, an image folder with one sub-folder per class)"
        )
    n_classes = int(labels.max()) + 1 if labels.size else 0
    split = split_examples(len(labels), seed, test_fraction, holdout_fraction)
    for part in ("train", "fit"):
        _check_classes(len(np.unique(labels[getattr(split, part)])), len(getattr(split, part)), f"{part} split")
    ratios = np.unique(np.asarray(l2_ratios, dtype=np.float64))  # (L,) ascending, so ties go to the last
    for ratio in ratios:
        _check_l2(ratio)
    read = _ProgressCounter(progress, len(labels))
    if workspace is not None:
        workspace.begin()

    fit = None
    for x, y in batches(split.mask("fit")):
        if fit is None:  # the first batch tells the width; the training split's size is known from the split
            fit = new_accumulator(n_classes, len(split.train), np.shape(x)[-1], device, space, workspace)
        fit.update(x, y)
        read(len(y))
    fit = fit if fit is not None else new_accumulator(n_classes, len(split.train), 1, device, space)
    _check_pass("fit", fit, labels[split.fit])
    holdout, holdout_accuracy, best = _score_holdout(fit, batches, split, labels, ratios, device, workspace, read)

    train = fit.merge(holdout)
    l2 = torch.as_tensor(ratios[best], device=train.device) * train.feature_scale()  # (P,)
    # one penalty per probe: the dual refit factors G + l2 I by Cholesky rather than decomposing G again
    dual = isinstance(train, ExampleAccumulator)
    final = train.solve(l2[:, None], factor="cholesky") if dual else train.solve(l2[:, None])  # (P, 1)
    correct = torch.zeros_like(l2, dtype=torch.int64)
    n_test = 0
    for x, y in batches(split.mask("test")):
        correct += final.count_correct(x, y)[:, 0]
        n_test += len(y)
        read(len(y))
    if n_test != len(split.test):
        raise ValueError(f"batches yielded {n_test} test examples for a mask of {len(split.test)}")

    return ProbeResult(
        split=split,
        n_classes=n_classes,
        l2_ratios=ratios,
        holdout_accuracy=holdout_accuracy,
        l2_ratio=ratios[best],
        l2=l2.cpu().numpy(),
        test_accuracy=correct.cpu().numpy() / n_test,
    )


def _score_holdout(fit, batches: BatchesFn, split: ProbeSplit, labels: np.ndarray, ratios, device, workspace, read):
    """Returns (the holdout part accumulated in fit's form, its accuracy (P, L) at every penalty of the grid fitted
    on the fit part, and per probe the index of the penalty chosen). The grid's eigenvectors (P, D, R) are freed on
    return, before the refit needs its own."""
    n_classes = fit.n_classes
    grid = fit.solve(torch.as_tensor(ratios, device=fit.device) * fit.feature_scale()[:, None])  # (P, L)
    correct = torch.zeros(grid.l2.shape, dtype=torch.int64, device=fit.device)  # (P, L)
    squared = torch.zeros(grid.l2.shape, dtype=torch.float64, device=fit.device)  # (P, L)
    if isinstance(fit, ExampleAccumulator):  # kept once; its products with the fit part serve scoring and refit
        holdout = ExampleAccumulator(n_classes, device, reference=fit.reference, workspace=workspace)
        score_and_keep = lambda x, y: holdout.update_scored(grid, x, y)  # noqa: E731
    else:
        holdout = RidgeAccumulator(n_classes, device)  # merged into fit below: the same form
        score_and_keep = lambda x, y: (grid.evaluate(x, y), holdout.update(x, y))[0]  # noqa: E731
    for x, y in batches(split.mask("holdout")):
        right, error = score_and_keep(x, y)
        correct += right
        squared += error
        read(len(y))
    _check_pass("holdout", holdout, labels[split.holdout])
    holdout_accuracy = correct.cpu().numpy() / len(split.holdout)  # (P, L)
    return holdout, holdout_accuracy, best_ratio(holdout_accuracy, squared.cpu().numpy())


# ---------------------------------------------------------------------------------------------------------------
# What a fit costs, before it starts

# torch.linalg.eigh with eigenvectors (LAPACK syevd) is about 4 n^3 flops but runs far below matrix-product
# speed, on one thread (see _eigh): counted as this many product-speed flops per n^3 (6.4 measured on 768 x 768
# fp64 against a 2-thread 512 x 512 product on the loaded 2-core development machine).
EIGH_FLOPS_PER_N3 = 8.0
# Every feature value of every example passes through HDF5, casts, copies and means a few times; on the same
# machine that cost as much as this many product flops per value (32 Mixer images, 196 tokens x 768).
VALUE_FLOPS = 250.0


def probe_flops(
    n_examples: int,
    n_features: int,
    n_probes: int = 1,
    n_classes: int = 10,
    n_l2: int = len(L2_RATIOS),
    space: str = "auto",
) -> float:
    """Return the matrix-product flops fit_probes spends on P probes of D features over n examples.

    Counts what dominates, with the default split (64% fit, 16% holdout, 20% test): the statistics, the two
    eigendecompositions (fit, then fit + holdout), and scoring the holdout at every penalty and the test part.
    """
    n, d, p, k = float(n_examples), float(n_features), float(n_probes), float(n_classes)
    n_fit, n_holdout, n_test = 0.64 * n, 0.16 * n, 0.2 * n
    space = solve_space(int(0.8 * n), n_features) if space == "auto" else space
    if space == "primal":  # X'X (P, D, D) from every training example; eigh of D x D twice; R = D
        build = 2 * 0.8 * n * p * d * d
        eigh = 2 * EIGH_FLOPS_PER_N3 * p * d**3
        rank = d
    else:  # Grams (P, n, n) and the basis Xc'U (P, D, n), for the fit part and the training split; R = n
        build = sum(4 * p * m * m * d for m in (n_fit, 0.8 * n))
        eigh = EIGH_FLOPS_PER_N3 * p * (n_fit**3 + (0.8 * n) ** 3)
        rank = 0.8 * n
    score = 2 * (n_holdout + n_test) * p * d * rank + 2 * (n_l2 * n_holdout + n_test) * p * rank * k
    return build + eigh + score + VALUE_FLOPS * n * p * d


def matmul_flops_per_s(device="cpu") -> float:
    """Return the fp64 matrix-product rate this process gets now on `device`, from a 512 x 512 product."""
    device = torch.device(device)
    a = torch.randn(512, 512, dtype=torch.float64, device=device)
    best = float("inf")
    for _ in range(3):  # the first call pays for warming up the library
        _synchronize(device)
        start = time.perf_counter()
        a @ a
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * 512**3 / max(best, 1e-9)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------------------------
# Small helpers


def best_ratio(accuracy: np.ndarray, squared_error: np.ndarray) -> np.ndarray:
    """Return per probe the grid index with the best held-out accuracy (P, L) -> (P,).

    On a small held-out part many penalties tie on accuracy (8 images score 0/8 .. 8/8); the tie goes to the
    lowest squared error of the scores against the {-1, 1} targets, the loss ridge itself minimises, and
    only then to the most regularised penalty.
    """
    # all probes at once (197 per Mixer layer): the error only counts where the accuracy ties for best
    tied = accuracy == accuracy.max(1, keepdims=True)  # (P, L)
    error = np.where(tied, squared_error, np.inf)
    lowest = tied & (error == error.min(1, keepdims=True))  # (P, L), at least one per row
    return accuracy.shape[1] - 1 - np.argmax(lowest[:, ::-1], axis=1)  # the last, i.e. the largest penalty


# A batch of fewer than twice this many eigenproblems is decomposed on one thread.
EIGH_CHUNK = 16


def _eigh(matrices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return torch.linalg.eigh of a batch of symmetric matrices, one CPU thread per call.

    On CPU a batch of small eigenproblems gains nothing from threads inside each one, and on a loaded
    machine the thread hand-offs cost far more than the work (measured on 2 busy cores: 17 x 64x64 fp64
    took 1.33 s with 2 threads, 0.013 s with 1).
    """
    from vitsee.threads import torch_threads

    if matrices.device.type != "cpu":
        return torch.linalg.eigh(matrices)
    threads = torch.get_num_threads()
    with torch_threads(1):
        if threads < 2 or len(matrices) < 2 * EIGH_CHUNK:
            return torch.linalg.eigh(matrices)
        # torch loops over the batch on one thread: the compute threads it was given take a share each
        # (torch releases the GIL; the shares give exactly what one call over the batch gives)
        chunks = matrices.split(-(-len(matrices) // threads))
        parts = list(_compute_pool(threads).map(torch.linalg.eigh, chunks))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


_COMPUTE_POOLS: dict[int, ThreadPoolExecutor] = {}


def _compute_pool(threads: int) -> ThreadPoolExecutor:
    """Return the process's pool of `threads` workers for _eigh and _products, started once: starting threads
    for every call cost ~4.5 ms a layer, about as much as the decompositions themselves."""
    if threads not in _COMPUTE_POOLS:
        _COMPUTE_POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="vitsee-probes")
    return _COMPUTE_POOLS[threads]


class _ProgressCounter:
    def __init__(self, progress: ProgressFn | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


def _check_pass(part: str, acc, expected_labels: np.ndarray) -> None:
    # A mismatch is a bug in the batches function, not something the user can fix.
    expected = np.bincount(expected_labels, minlength=acc.n_classes)
    if acc.count != len(expected_labels) or not np.array_equal(acc.class_counts.cpu().numpy(), expected):
        raise ValueError(
            f"batches yielded {acc.count} {part} examples whose labels differ from the mask's {len(expected_labels)}"
        )


def _check_batch(x, y, n_classes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Return a batch as x (b, P, D) float64 and y (b,) int64 on device, after checking shapes and labels."""
    x = _as_float64(x, device)
    x = x[:, None, :] if x.ndim == 2 else x  # (b, P, D)
    return x, _check_labels(x, y, n_classes, device)


def _check_labels(x: torch.Tensor, y, n_classes: int, device) -> torch.Tensor:
    """Return y (b,) int64 on device, after checking it matches x (b, P, D) and lies in [0, K)."""
    y = _as_labels(y, device)  # (b,)
    if x.ndim != 3 or y.shape != x.shape[:1]:
        raise ValueError(f"expected x (b, P, D) and y (b,), got x {tuple(x.shape)} and y {tuple(y.shape)}")
    if len(y) and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}), got {y.min().item()}..{y.max().item()}")
    return y


def _kept(x: torch.Tensor, minus: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return x (b, P, D) of any float dtype as float64 minus `minus` (P, D), written into out (a (b, P, D)
    float64 buffer, where given) and viewed probe-major (P, b, D): how the dual keeps its examples, and what
    both forms score.

    The products take the strided view as it is (each probe's (b, D) rows are still contiguous), so the
    examples are never transposed. A copy, then the subtraction in place: the same float64(x) - minus, bit for
    bit, as torch.sub of the two dtypes, whose mixed-dtype loop took 1.5x as long (21 x 197 x 768 values).
    """
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float64, device=x.device)
    out.copy_(x)  # then subtract in float64: ~1.5x faster on CPU than torch.sub's mixed-dtype loop
    return (out if minus is None else out.sub_(minus)).transpose(0, 1)


def _check_solvable(acc, l2) -> torch.Tensor:
    """Return l2 as (P, L) float64 after checking the accumulator has enough examples and the penalties are valid."""
    if acc.count == 0:
        raise VitseeError("the training split holds 0 images; use more images")
    _check_classes(int((acc.class_counts > 0).sum()), acc.count, "training split")
    l2 = torch.as_tensor(l2, dtype=torch.float64, device=acc.device)
    l2 = l2.expand(acc.n_probes, -1) if l2.ndim == 1 else l2  # (P, L)
    if l2.ndim != 2 or l2.shape[0] != acc.n_probes:
        raise ValueError(f"l2 must be (L,) or ({acc.n_probes}, L), got {tuple(l2.shape)}")
    if not bool(torch.isfinite(l2).all() and (l2 > 0).all()):  # one check: P x L values, per-token probes
        _check_l2(next(v for v in l2.flatten().tolist() if not (np.isfinite(v) and v > 0)))
    return l2


def _check_classes(n_classes: int, n_examples: int, where: str) -> None:
    if n_classes < 2:
        raise VitseeError(
            f"the {where} has {n_classes} class(es) among {n_examples} images; a probe needs at least 2: "
            "use more images or another --shuffle-seed"
        )


def _check_l2(l2: float) -> None:
    if not (np.isfinite(l2) and l2 > 0):
        raise VitseeError(f"l2={l2} must be a positive finite penalty; pass e.g. 1.0")


def _to_numpy(a) -> np.ndarray:
    return a.detach().cpu().numpy() if torch.is_tensor(a) else np.asarray(a)


def _as_labels(y, device) -> torch.Tensor:
    y = y if torch.is_tensor(y) else torch.as_tensor(np.asarray(y))
    return y.to(device).long()


def _as_tensor(x, device) -> torch.Tensor:
    x = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    return x.to(device)  # any dtype: fp16 activations cross the bus at half the bytes


def _as_float64(x, device) -> torch.Tensor:
    x = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    return x.to(device).to(torch.float64)  # move first: fp16 activations cross the bus at half the bytes


def _one_hot(index: torch.Tensor, n_classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(index, n_classes).to(torch.float64)


def _eye(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(n, dtype=like.dtype, device=like.device)

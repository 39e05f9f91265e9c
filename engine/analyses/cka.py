"""Linear CKA between layer representations: full-batch, and minibatch over all layer pairs at once.

Raghu et al. 2021 (Fig. 1, 2) compare every layer of a model with every layer of the same or another model by
linear CKA (Kornblith et al. 2019), estimated over minibatches with the unbiased HSIC of Song et al. 2012 as in
Nguyen et al. 2021:

    CKA(X, Y) = sum_b HSIC1(K_b, L_b) / sqrt(sum_b HSIC1(K_b, K_b) * sum_b HSIC1(L_b, L_b)),

with K_b = X_b X_b^T the Gram matrix of batch b of the flattened representation (ViT: tokens x channels,
CNN: H x W x C). HSIC1 of one batch is a Frobenius inner product of U-centred Grams, so the HSIC of all layer pairs
of a batch is one matrix product of the stacked, flattened, U-centred Grams (the shape of Google's
efficient_CKA.py). The first part of this module is the pure numerical core (arrays in, arrays out, no store, no
printing); the second is the store-facing runner: the result's parameters (its cache key), the run over the store,
and the CKA a streaming extraction accumulates as it goes.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.zoo.streamed import batch_grams, gram_batch_size, keeps_grams
from vitsee.analyses.base import (
    MIN_BATCH,
    AnalyzeConfig,
    LazyBatch,
    Prefetch,
    StepFn,
    batch_plan,
    check_ready,
    emit,
    read_batch,
    resolve_device,
    save_result,
    with_stats,
)
from vitsee.analyses.contract import Request, Result
from vitsee.analyses.similarity import LayerMatrix, matrix_block
from vitsee.lazy import lazy_module
from vitsee.measures.kernels import power_of_two_scale

torch = lazy_module("torch")  # reading a cached result needs numpy only; torch is imported by the first computation

SHIFT_ROWS = 16  # the features of a batch are shifted by the mean of its first SHIFT_ROWS examples (see _centred)
BLOCK_GRAM_MIN = 256  # from this batch size on, gram() multiplies out only the upper block-triangle
PERMUTED_BYTES = 64 << 20  # at most this much of permuted U-centred Grams at a time (the p-value's null)
NULL_DTYPE = "float32"  # the permutation null's gather and product (see MinibatchCKA._add_permuted)
GRAM_WORKERS_BYTES = 512 << 20  # at most this much of spare buffers for the layer Grams' workers (see _gram_workers)
GRAM_WORKERS_MIN_VALUES = 1 << 16  # layers of a batch this large on average (m x D values) go to the workers
PAIR_ROWS = 64  # the pair products are cut into blocks of this many rows, each one product on one thread

# Bit for bit at any thread count. A matrix product that torch splits over its intra-op threads can sum in another
# order with another count: MKL's fp64 pair product (L, m*m) @ (m*m, L), whose inner dimension is long and output
# small, moved CKA by up to 7.8e-15 between --threads 1 and 2, and the fp32 null product p-values' terms by 3e-5
# relative; the Grams, the U-centring and the shift did not (every shape tried, 1 to 16 threads). So on the CPU
# every step of an update runs on one torch thread, as --threads 1 always did: the Grams on the task workers (a
# layer each) or one after another, the pair products in blocks of PAIR_ROWS rows shared out to the workers. The
# blocks are cut by shape alone, so the sums are the same whoever computes them; with up to PAIR_ROWS rows (every
# within-model CKA of up to 64 layers) the product is the one unsplit product of before.

# Precision, chosen by measurement (python benchmarks/cka.py --accuracy; CPU, 1,024 synthetic images in batches of
# 256, 12 ViT-like (197 x 192) and 14 ResNet-like maps, max |CKA - numpy fp64 reference| over the 26 x 26 matrix):
#   Gram fp32, U-centring + pair product fp64: 2.4e-09 (2.5e-09 with +300 on every unit)
#   Gram fp32, U-centring + pair product fp32: 2.4e-07 (2.7e-07)  -- the m*m-term sums in fp32 are what hurts
#   Gram fp64, U-centring + pair product fp64: 6.8e-15 (1.2e-14), at 2-5x the CPU time, 1/64 rate on consumer GPUs
# Once the features are shifted to about their batch mean, the fp32 Gram is accurate to ~1e-8 in CKA; without the
# shift the error grows with the offset (8e-8 on these features, 3e-2 with +300, on 512 of them). U-centring and the
# pair product are O(L m^2) and O(L^2 m^2) against O(L m^2 D) for the Grams, so they run in fp64 at no visible cost.
GRAM_DTYPE = "float32"
PAIR_DTYPE = "float64"


# ----------------------------------------------------------------------------------------------------------------
# Small, checkable pieces


def _dtype(name_or_dtype):
    """Returns the torch dtype a module constant names ("float32"), or the dtype itself (set by benchmarks)."""
    return getattr(torch, name_or_dtype) if isinstance(name_or_dtype, str) else name_or_dtype


def gram(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return the linear-kernel Gram matrix x x^T of x (m, D) as (m, m), written into `out` if given.

    K is symmetric, so only rows [:h] against all rows and rows [h:] against themselves are multiplied out and
    the lower-left block is mirrored: 3/4 of the FLOPs of x @ x.T. On 2 CPU cores that took 7% less CPU time at
    m = 256 and 9-17% at m = 512-1024, but more at m = 128, where the half-size products run less efficiently.
    """
    m = x.shape[0]
    h = m // 2
    k = x.new_empty(m, m) if out is None else out
    if m < BLOCK_GRAM_MIN:  # smaller batches: one product is faster
        return torch.mm(x, x.T, out=k)
    torch.mm(x[:h], x.T, out=k[:h])  # (h, m); a block of whole rows is contiguous, so mm writes in place
    k[h:, h:] = x[h:] @ x[h:].T  # (m - h, m - h)
    k[h:, :h] = k[:h, h:].T
    return k


def cka_ratio(sums: np.ndarray, self_hsic: np.ndarray) -> np.ndarray:
    """Returns sums_ij / sqrt(self_i self_j), the CKA of HSIC sums; where the product of two self-HSICs under- or
    overflows fp64 (layers of values below ~1e-40 or above ~1e38), as sums_ij / (sqrt(self_i) sqrt(self_j))."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        denominator = np.sqrt(np.outer(self_hsic, self_hsic))
        lost = ((denominator == 0) | np.isinf(denominator)) & np.isfinite(self_hsic)[:, None]
        if lost.any():
            root = np.sqrt(self_hsic)
            denominator = np.where(lost, np.outer(root, root), denominator)
        return sums / denominator


def u_centre(k: torch.Tensor) -> torch.Tensor:
    """Return the U-centred Gram matrix (Song et al. 2012) of k (m, m), m >= 4, with a zero diagonal.

    U(K)_ij = Kt_ij - (Kt 1)_i / (m-2) - (1'Kt)_j / (m-2) + 1'Kt1 / ((m-1)(m-2)) for i != j, 0 on the diagonal,
    with Kt = K with its diagonal zeroed; then <U(K), U(L)>_F / (m (m-3)) is the unbiased HSIC estimator.
    """
    return u_centre_(k.clone())


def u_centre_(k: torch.Tensor) -> torch.Tensor:
    """U-centre symmetric Grams k (..., m, m) in place (see u_centre) and return k."""
    m = k.shape[-1]
    k.diagonal(dim1=-2, dim2=-1).zero_()
    means = k.sum(dim=-2) / (m - 2)  # (..., m) column sums; K is symmetric so these are the row sums too
    means -= means.sum(dim=-1, keepdim=True) / (2 * (m - 1))
    k.sub_(means.unsqueeze(-1)).sub_(means.unsqueeze(-2))
    k.diagonal(dim1=-2, dim2=-1).zero_()
    return k


def unbiased_hsic(k: torch.Tensor, l: torch.Tensor) -> float:
    """Return the unbiased HSIC (Song et al. 2012) of two (m, m) Gram matrices, by its explicit formula, in fp64.

    [tr(Kt Lt) + (1'Kt1)(1'Lt1) / ((m-1)(m-2)) - 2/(m-2) 1'Kt Lt 1] / (m (m-3)), Kt, Lt the diagonal-zeroed Grams.
    """
    m = k.shape[0]
    if m < MIN_BATCH:
        raise VitseeError(f"unbiased HSIC needs at least {MIN_BATCH} examples, got {m}: use a larger batch")
    kt = torch.as_tensor(k, dtype=torch.float64).clone()
    lt = torch.as_tensor(l, dtype=torch.float64).clone()
    kt.fill_diagonal_(0)
    lt.fill_diagonal_(0)
    trace = (kt * lt).sum()  # tr(Kt Lt), both symmetric
    sums = kt.sum() * lt.sum() / ((m - 1) * (m - 2))
    cross = 2.0 / (m - 2) * (kt.sum(dim=0) @ lt.sum(dim=1))  # 1'Kt Lt 1
    return float((trace + sums - cross) / (m * (m - 3)))


def linear_cka(x: Any, y: Any, device: str | torch.device | None = None) -> float:
    """Return the full-batch linear CKA (Kornblith et al. 2019, biased HSIC) of x (n, ...) and y (n, ...), in fp64.

    CKA = ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F) with Xc, Yc the features centred over examples. When there
    are fewer examples than features the same number is taken through the n x n Grams, <Kc, Lc>_F / (||Kc|| ||Lc||).
    """
    xc = _flat_fp64(x, "x", device)
    yc = _flat_fp64(y, "y", device)
    if xc.shape[0] != yc.shape[0]:
        raise VitseeError(
            f"linear_cka needs the same examples in x and y, got {xc.shape[0]} and {yc.shape[0]} rows: "
            "pass activations of the same images in the same order"
        )
    xc = xc - xc.mean(dim=0)
    yc = yc - yc.mean(dim=0)
    n, dx, dy = xc.shape[0], xc.shape[1], yc.shape[1]
    if n * n <= dx * dy:  # (n, n) Grams are the smaller route
        kc, lc = xc @ xc.T, yc @ yc.T
        num, den = (kc * lc).sum(), kc.norm() * lc.norm()
    else:
        num, den = (yc.T @ xc).square().sum(), (xc.T @ xc).norm() * (yc.T @ yc).norm()
    return float(num / den)


def _flat_fp64(a: Any, name: str, device: str | torch.device | None) -> torch.Tensor:
    t = torch.as_tensor(a).detach().to(device or "cpu", torch.float64)
    if t.ndim < 2:
        raise VitseeError(f"{name} must be (examples, features...), got shape {tuple(t.shape)}: add a feature axis")
    return t.reshape(t.shape[0], -1)


@contextlib.contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """Run the enclosed matrix products in full fp32 (no TF32 / bf16 shortcuts), restoring the caller's settings.

    TF32 keeps 10 mantissa bits: a Gram in TF32 is off by ~1e-3 relative, far outside CKA's 1e-6 target. PyTorch
    raises if the legacy (allow_tf32 / set_float32_matmul_precision) and the newer (fp32_precision) switches are
    mixed, so this speaks whichever one the process already uses. The switches are process-global.
    """
    try:
        legacy = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # the process uses the newer per-backend fp32_precision API
        legacy = None
    if legacy is not None:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(legacy[0])
            torch.backends.cuda.matmul.allow_tf32 = legacy[1]
        return
    backends = [torch.backends.cuda.matmul, torch.backends.mkldnn.matmul]
    saved = [b.fp32_precision for b in backends]
    for b in backends:
        b.fp32_precision = "ieee"
    try:
        yield
    finally:
        for b, p in zip(backends, saved):
            b.fp32_precision = p


# ----------------------------------------------------------------------------------------------------------------
# The accumulator


class MinibatchCKA:
    """Accumulates unbiased HSIC of all pairs of L layers over minibatches; `result()` gives the (L, L) CKA matrix.

    Stack every layer of every model into one list: within-model and cross-model CKA are then blocks of one
    L x L matrix, and each layer's Gram is built once per batch. The whole state is `state`, one fp64 tensor
    [HSIC sums (L*L, row-major), batch count], so processes can combine theirs with one all_reduce (or `merge`)
    and the result does not depend on how the batches were shared out.

    cross_at=k accumulates only the block between layers [:k] and [k:] (and each layer's own HSIC, which CKA
    needs): the pair product shrinks from L^2 to k(L-k) + L inner products per batch, which is what dominates when
    there are hundreds of small layers (spatial localisation: every token against every patch). The other
    entries of result() are nan.

    For the statistics (engine/stats.py) the state grows, still one fp64 tensor that sums across processes:
    batch_slots > 0 keeps each batch's (L, L) HSIC terms in slot `update(..., slot=s)` (a batch's index in its
    batching, so slots filled on different processes add up to the full list); permutations=K adds K null HSIC sums,
    the column layers' images permuted inside each batch by stats.batch_permutations(seed, slot, m, K); jackknife=True
    adds the delete-one-image jackknife moments of stats.add_leave_one_out (the intervals of new results).
    `observers`: callables given each batch's U-centred Grams (L, m, m) fp64 and its slot after they are added (the
    zoo's null and intervals, engine/zoo/calibration.py, read them there instead of building them again).
    """

    def __init__(
        self,
        num_layers: int,
        device: str | torch.device | None = None,
        cross_at: int | None = None,
        batch_slots: int = 0,
        permutations: int = 0,
        seed: Sequence[int] | int = 0,
        jackknife: bool = False,
    ):
        if num_layers < 1:
            raise VitseeError(f"MinibatchCKA needs at least one layer, got num_layers={num_layers}")
        if cross_at is not None and not 0 < cross_at < num_layers:
            raise VitseeError(
                f"cross_at={cross_at} does not split {num_layers} layers into two groups: use 1..{num_layers - 1}"
            )
        self.num_layers = num_layers
        self.cross_at = cross_at
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.batch_slots, self.permutations, self.seed = int(batch_slots), int(permutations), seed
        self.jackknife = bool(jackknife)
        self.observers: list[Callable[[torch.Tensor, int], None]] = []
        LL = num_layers * num_layers
        # [HSIC sums (L*L), batch count, per-batch HSIC (slots * L*L), null HSIC sums (K * L*L), jackknife moments]
        loo = stats_mod.loo_size(num_layers) if self.jackknife else 0
        self.state = torch.zeros(
            LL + 1 + (self.batch_slots + self.permutations) * LL + loo, dtype=torch.float64, device=self.device
        )
        # Buffers kept between batches, sized by _reserve (and the upper-triangle indices, by _upper).
        self._scratch = self._gram = self._grams = torch.empty(0, device=self.device)
        self._unscale = torch.empty(0, dtype=torch.float64, device=self.device)
        self._spare: list[tuple[torch.Tensor, torch.Tensor]] = []  # (scratch, Gram) of the workers beyond the first
        self._upper_m, self._upper_ab = 0, (self._scratch, self._scratch)

    @property
    def hsic_sums(self) -> torch.Tensor:
        """Return a (L, L) view of the summed per-batch unbiased HSIC of every layer pair."""
        L = self.num_layers
        return self.state[: L * L].view(L, L)

    @property
    def batch_hsic(self) -> torch.Tensor:
        """Return a (slots, L, L) view of each batch slot's unbiased HSIC terms (empty without batch_slots)."""
        L = self.num_layers
        start = L * L + 1
        return self.state[start : start + self.batch_slots * L * L].view(self.batch_slots, L, L)

    @property
    def null_hsic(self) -> torch.Tensor:
        """Return a (K, L, L) view of the HSIC sums with permuted column-layer images (empty without permutations)."""
        L = self.num_layers
        start = L * L + 1 + self.batch_slots * L * L
        return self.state[start : start + self.permutations * L * L].view(self.permutations, L, L)

    @property
    def loo_block(self) -> torch.Tensor:
        """Return the jackknife moments' block of the state (stats.loo_size values; empty without jackknife)."""
        L = self.num_layers
        start = L * L + 1 + (self.batch_slots + self.permutations) * L * L
        return self.state[start:]

    @property
    def batches(self) -> int:
        """Return how many batches have been accumulated (skipped ones not counted)."""
        return int(self.state[self.num_layers * self.num_layers].item())

    def update(self, feats: Sequence[Any], slot: int | None = None) -> None:
        """Add one batch: feats holds L arrays or tensors (m, ...) of the same m examples, in layer order.

        slot: the batch's index in its batching, where its per-batch terms go and what seeds its permutations
        (default: the number of batches accumulated so far).
        """
        feats = list(feats)
        if len(feats) != self.num_layers:
            raise VitseeError(
                f"update got {len(feats)} layers but this MinibatchCKA was made for {self.num_layers}: "
                "pass every layer of every model, in the same order, for each batch"
            )
        m = int(feats[0].shape[0])
        for i, f in enumerate(feats):
            if int(f.shape[0]) != m:
                raise VitseeError(
                    f"layer {i} has {f.shape[0]} examples in this batch but layer 0 has {m}: "
                    "every layer must hold the same images of the batch"
                )
        if m < MIN_BATCH:
            warnings.warn(
                f"skipping a batch of {m} examples: unbiased HSIC needs at least {MIN_BATCH} per batch "
                "(choose a batch size that leaves a last batch of 4 or more)",
                stacklevel=2,
            )
            return

        with torch.no_grad(), full_fp32_matmul(), self._one_thread():  # see PAIR_ROWS: the same sums at any --threads
            sizes = [int(np.prod(f.shape)) for f in feats]
            largest = max(sizes)
            workers = self._gram_workers(largest, sum(sizes) / len(sizes))
            self._reserve(m, largest, workers)
            if workers > 1:
                self._layer_grams(feats, m, workers)
            else:
                for i, f in enumerate(feats):
                    self._layer_gram_into(i, *self._centred(f, m), self._gram)  # (m, D_i) -> (m, m)
            self._add_grams(m, slot)

    def layer_gram(self, f: Any) -> torch.Tensor:
        """Return one layer's batch f (m, ...) as the (m, m) GRAM_DTYPE Gram update() builds for it (shifted to about
        its batch mean first), a new tensor on the device: what update_grams() takes, e.g. from a store."""
        m = int(f.shape[0])
        with torch.no_grad(), full_fp32_matmul(), self._one_thread():
            self._reserve(m, int(np.prod(f.shape)))
            x, scale = self._centred(f, m)
            k = gram(x)
            # ordinary values: / 1, the Gram as it was; a tiny or huge layer's fp32 Gram may under- or overflow here
            return (k.double() / scale.square()).to(k.dtype)

    def update_grams(self, grams: Sequence[Any], slot: int | None = None) -> None:
        """Add one batch from its L layer Grams (m, m) as layer_gram() returns them, in layer order: the sums update()
        of the features they came from adds, bit for bit (the same fp64 arithmetic from the same fp32 Grams)."""
        grams = list(grams)
        if len(grams) != self.num_layers:
            raise VitseeError(
                f"update_grams got {len(grams)} Grams but this MinibatchCKA was made for {self.num_layers} "
                "layers: pass every layer of every model, in the same order, for each batch"
            )
        m = int(grams[0].shape[0])
        if any(tuple(g.shape) != (m, m) for g in grams):
            raise VitseeError(
                f"update_grams needs every layer's ({m}, {m}) Gram of the same batch, got shapes "
                f"{sorted({tuple(g.shape) for g in grams})}"
            )
        if m < MIN_BATCH:
            warnings.warn(
                f"skipping a batch of {m} examples: unbiased HSIC needs at least {MIN_BATCH} per batch", stacklevel=2
            )
            return
        with torch.no_grad(), full_fp32_matmul():
            self._reserve(m, 1)
            for i, g in enumerate(grams):
                self._grams[i].copy_(torch.as_tensor(g))  # fp32 -> its fp64 slot, as update() does
            self._unscale.fill_(1.0)
            self._add_grams(m, slot)

    def _layer_gram_into(self, i: int, x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
        """Builds layer i's Gram of its centred batch x (m, D), scaled by `scale` (a power of two, _centred), into
        its fp64 slot; the factor that undoes the scale in the layer's HSIC terms goes to self._unscale[i] (1 for
        every ordinary layer: its Gram and sums bit for bit as without the scaling).

        The Gram is fp32: a layer of values ~1e-30 squares to ~1e-60 there, which is 0, and its CKA came out NaN,
        though CKA does not change when a layer is multiplied by a number. A power of two rescales exactly."""
        self._grams[i].copy_(gram(x, out=out))  # (m, m) fp32 -> its fp64 slot
        self._unscale[i] = scale.to(torch.float64).square().reciprocal()  # no host sync: stays on the device

    def _add_grams(self, m: int, slot: int | None) -> None:
        """Add the batch whose layer Grams fill self._grams (L, m, m, fp64, not yet U-centred)."""
        L = self.num_layers
        with torch.no_grad(), full_fp32_matmul(), self._one_thread():
            u_centre_(self._grams)  # (L, m, m), all layers at once
            grams = self._grams.view(L, m * m)  # (L, m*m)
            # HSIC1 of a pair is <U(K_i), U(K_j)>_F / (m (m-3)): all pairs are one product of the stacked Grams.
            sums, scale = self.hsic_sums, 1.0 / (m * (m - 3))
            slot = self.batches if slot is None else int(slot)
            if self.batch_slots and not 0 <= slot < self.batch_slots:
                raise VitseeError(
                    f"batch slot {slot} is outside the {self.batch_slots} this MinibatchCKA keeps: "
                    "make it with batch_slots = the number of batches"
                )
            own = self.batch_hsic[slot] if self.batch_slots else None
            unscale = self._unscale  # (L,) 1 for every layer of ordinary values (see _layer_gram_into)
            if self.cross_at is None:
                pairs = self._pair_product(grams, grams).to(torch.float64) * scale  # (L, L)
                pairs *= torch.outer(unscale, unscale)
                sums += pairs
                if own is not None:
                    own += pairs
            else:
                k = self.cross_at
                pairs = self._pair_product(grams[:k], grams[k:]).to(torch.float64) * scale  # (k, L - k)
                pairs *= torch.outer(unscale[:k], unscale[k:])
                sums[:k, k:] += pairs
                diag = torch.bmm(grams.unsqueeze(1), grams.unsqueeze(2)).view(L)  # (L,) row dot products, no temp
                diag = diag.to(torch.float64) * scale * unscale.square()
                sums.diagonal().add_(diag)
                if own is not None:
                    own[:k, k:] += pairs
                    own.diagonal().add_(diag)
            if self.permutations:
                self._add_permuted(grams, m, slot, scale)
            if self.jackknife:
                stats_mod.add_leave_one_out(self.loo_block, self._grams, self.cross_at)
            for observe in self.observers:
                observe(self._grams, slot)
            self.state[L * L] += 1

    def _one_thread(self) -> contextlib.AbstractContextManager:
        """Return a context running its body on one torch thread on the CPU (see PAIR_ROWS), as it is on a GPU."""
        from vitsee.threads import torch_threads

        return torch_threads(1) if self.device.type == "cpu" else contextlib.nullcontext()

    def _pair_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Return a @ b.T (a: (R, n), b: (C, n)) as (R, C): on the CPU in blocks of PAIR_ROWS rows of a, each one
        product on one thread, shared out to the task workers, so its sums do not depend on the thread count."""
        if self.device.type != "cpu" or len(a) <= PAIR_ROWS:
            return a @ b.T
        from vitsee.threads import task_workers

        out = a.new_empty(len(a), len(b))
        starts = range(0, len(a), PAIR_ROWS)

        def block(start: int) -> None:
            torch.mm(a[start : start + PAIR_ROWS], b.T, out=out[start : start + PAIR_ROWS])  # rows: contiguous

        workers = min(task_workers(), len(starts))
        if workers == 1:
            for start in starts:
                block(start)
        else:  # the caller holds torch at one thread, which the workers' first product picks up
            with ThreadPoolExecutor(workers, thread_name_prefix="vitsee-cka-pairs") as pool:
                list(pool.map(block, starts))
        return out

    def _add_permuted(self, grams: torch.Tensor, m: int, slot: int, scale: float) -> None:
        """Add each permutation's null HSIC: <U(K_i), P U(K_j) P'>, the column layers' images permuted by P.

        U-centring commutes with permuting the examples, so P U(K_j) P' is the U-centred Gram of the permuted
        features: one gather of the stacked Grams and one more pair product per permutation, no new Gram. Both
        Grams are symmetric with a zero diagonal, so the product is twice that of their upper triangles: half the
        gather and half the product. The null runs in NULL_DTYPE: the gather (memory-bound) and its product were
        about 2x the Grams' time in fp64 at the defaults; fp32's ~1e-7 relative error in a null value can only move a
        p-value when a permutation lands that close to the observed CKA. Permutations go in groups whose gathered
        Grams fit in PERMUTED_BYTES (one small op per permutation costs more than the product on small batches).
        """
        from vitsee.stats import batch_permutations

        k = self.cross_at or 0
        unscale = torch.outer(self._unscale if self.cross_at is None else self._unscale[:k], self._unscale[k:])
        a, b = self._upper(m)  # (T,) row and column of each upper-triangle entry, T = m (m - 1) / 2
        perms = torch.as_tensor(batch_permutations(self.seed, slot, m, self.permutations), device=self.device)
        cols = grams[k:].to(_dtype(NULL_DTYPE))  # (Lc, m*m): the layers whose images are permuted
        rows = (
            (grams if self.cross_at is None else grams[:k]).index_select(1, a * m + b).to(_dtype(NULL_DTYPE))
        )  # (Lr, T)
        group = max(1, min(self.permutations, PERMUTED_BYTES // max(len(cols) * len(a) * cols.element_size(), 1)))
        null = self.null_hsic if self.cross_at is None else self.null_hsic[:, :k, k:]  # (K, Lr, Lc)
        for s in range(0, self.permutations, group):
            p = perms[s : s + group]  # (g, m)
            index = (p[:, a] * m + p[:, b]).reshape(-1)  # (g*T,) where entry (a, b) of each P U P' sits in U
            permuted = cols.index_select(1, index).view(len(cols) * len(p), len(a))  # (Lc*g, T), layer-major
            pairs = (rows @ permuted.T).view(len(rows), len(cols), len(p))  # (Lr, Lc, g): one plain GEMM
            null[s : s + group] += pairs.permute(2, 0, 1).to(torch.float64) * (2.0 * scale) * unscale  # (g, Lr, Lc)

    def _upper(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the (row, column) indices of the strict upper triangle of an m x m matrix, kept between batches."""
        if self._upper_m != m:
            self._upper_m = m
            self._upper_ab = tuple(torch.triu_indices(m, m, 1, device=self.device))
        return self._upper_ab

    def _reserve(self, m: int, largest_layer: int, workers: int = 1) -> None:
        """Size the buffers kept between batches: fresh ones per layer cost more in CPU page faults than their use.
        With several workers, each beyond the first has its own centred features and Gram (self._spare)."""
        L = self.num_layers
        if self._grams.shape != (L, m, m) or self._grams.dtype != _dtype(PAIR_DTYPE):
            self._grams = torch.empty(L, m, m, dtype=_dtype(PAIR_DTYPE), device=self.device)  # U-centred Grams
            self._unscale = torch.ones(L, dtype=torch.float64, device=self.device)  # see _layer_gram_into
            self._gram = torch.empty(m, m, dtype=_dtype(GRAM_DTYPE), device=self.device)  # one layer's Gram
            self._spare = []
        if self._scratch.numel() < largest_layer or self._scratch.dtype != _dtype(GRAM_DTYPE):
            self._scratch = torch.empty(largest_layer, dtype=_dtype(GRAM_DTYPE), device=self.device)  # centred features
            self._spare = []
        while len(self._spare) < workers - 1:
            self._spare.append((torch.empty_like(self._scratch), torch.empty_like(self._gram)))

    def _gram_workers(self, largest_layer: int, mean_layer: float | None = None) -> int:
        """Return how many threads build a batch's layer Grams: on CPU, task_workers() where there are layers
        to share, they hold GRAM_WORKERS_MIN_VALUES values on average (smaller ones cost more in hand-offs
        than a worker gives: 200 layers of 48 x 64 took 11 ms a batch one after another on one thread and 21 ms
        on two workers; 26 layers of 64 x 1088 took 19 and 16 ms) and the spare buffers stay within
        GRAM_WORKERS_BYTES."""
        from vitsee.threads import task_workers

        workers = min(task_workers(), self.num_layers) if self.device.type == "cpu" else 1
        if mean_layer is not None and mean_layer < GRAM_WORKERS_MIN_VALUES:
            return 1
        while workers > 1 and (workers - 1) * largest_layer * _dtype(GRAM_DTYPE).itemsize > GRAM_WORKERS_BYTES:
            workers -= 1
        return workers

    def _layer_grams(self, feats: list[Any], m: int, workers: int) -> None:
        """Build every layer's Gram into self._grams on `workers` threads, one torch thread each.

        Each worker takes the next layer as it comes free, so one sharing a core with another process does less
        of the work instead of holding up the rest. Layers are taken, and lazily read inputs (the store's
        prefetch queue) materialised, in layer order; each layer is computed as the one-thread loop computes it.
        """
        lock, taken = threading.Lock(), itertools.count()

        def work(worker: int) -> None:
            scratch, out = (self._scratch, self._gram) if worker == 0 else self._spare[worker - 1]
            with torch.no_grad():  # grad mode is per thread
                while True:
                    with lock:
                        i = next(taken)
                        if i >= len(feats):
                            return
                        f = (
                            feats[i]
                            if isinstance(feats[i], torch.Tensor)
                            else torch.from_numpy(np.ascontiguousarray(np.asarray(feats[i])))
                        )
                    self._layer_gram_into(i, *self._centred(f, m, scratch), out)  # (m, D_i) -> (m, m)

        from vitsee.threads import torch_threads

        with (
            torch_threads(1),
            ThreadPoolExecutor(workers, thread_name_prefix="vitsee-cka-grams") as pool,
        ):  # inherits nice
            for future in [pool.submit(work, w) for w in range(workers)]:
                future.result()

    def _centred(self, f: Any, m: int, scratch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return one layer's batch (m, ...) as (m, D) GRAM_DTYPE on the device, shifted to about its batch mean
        (written into scratch, default self._scratch), and the power of two it was scaled by (a 0-dim fp64 tensor,
        1 for ordinary values)."""
        if not isinstance(f, torch.Tensor):  # numpy, or an array-like read only now (a store batch read lazily)
            f = torch.from_numpy(np.ascontiguousarray(np.asarray(f)))
        x = f.to(self.device).reshape(m, -1)  # (m, D), any float dtype (fp16 from the store)
        out = (self._scratch if scratch is None else scratch)[: x.numel()].view(x.shape)
        # Centring leaves HSIC1 unchanged (U-centring removes any shift of the features exactly) and keeps a
        # shared offset (+300 on every unit, a ViT's position embedding) from swamping the fp32 Gram with a huge
        # rank-one term. The shift only has to be close to the mean: the mean of the first SHIFT_ROWS examples is
        # within ~1/4 of the spread of it, costs 1/16 of a pass to compute, and the subtraction is the one pass
        # over the batch that also writes the fp32 copy the Gram reads.
        # A batch of tiny or huge values is first scaled by a power of two (see _layer_gram_into), before the shift:
        # values near fp32's largest overflowed in the subtraction. fp16 values lie within [2^-24, 65504]: never.
        if x.dtype == torch.float16:  # from the store: convert once, then shift in place
            x = out.copy_(x)
            return x.sub_(x[:SHIFT_ROWS].mean(dim=0, keepdim=True)), torch.ones(
                (), dtype=torch.float64, device=x.device
            )
        scale = power_of_two_scale(x, 40)  # 1 for every ordinary batch: what follows is then the plain shift
        if x.dtype != _dtype(GRAM_DTYPE):  # fp64 (or bf16) given: scaled in its own precision, then converted
            x = out.copy_(x * scale)
            return x.sub_(x[:SHIFT_ROWS].mean(dim=0, keepdim=True)), scale
        shift = (x[:SHIFT_ROWS] * scale).mean(dim=0, keepdim=True)  # of the scaled rows: 16 x 3e38 overflows fp32
        return torch.addcmul(-shift, x, scale, out=out), scale  # x * scale - shift, one pass

    def merge(self, other: MinibatchCKA | torch.Tensor) -> None:
        """Add another accumulator (or its `state`) for the same layers into this one, e.g. from another process."""
        other_state = other.state if isinstance(other, MinibatchCKA) else torch.as_tensor(other)
        if other_state.shape != self.state.shape:
            raise VitseeError(
                f"cannot merge a CKA state of shape {tuple(other_state.shape)} into one for {self.num_layers} layers "
                f"(state shape {tuple(self.state.shape)}): merge accumulators built over the same layer list"
            )
        self.state += other_state.to(self.device, torch.float64)

    def result(self, nonfinite: str = "raise") -> np.ndarray:
        """Return the (L, L) CKA matrix; not clamped, since the unbiased estimate can be slightly negative.

        A layer whose activations held NaN/Inf is refused (nonfinite="raise"), or its row and column are NaN
        (nonfinite="nan": what the store's views show as non-finite, the other pairs unaffected).
        """
        if self.batches == 0:
            raise VitseeError(
                f"no batch of at least {MIN_BATCH} examples was accumulated: give CKA more images or a larger batch"
            )
        sums = self.hsic_sums.cpu().numpy().copy()  # a copy: on CPU .numpy() would share the state
        self_hsic = np.diag(sums).copy()  # a squared Frobenius norm per layer, so >= 0 up to rounding
        bad = np.flatnonzero(~np.isfinite(self_hsic))
        if bad.size and nonfinite == "nan":
            sums[bad, :] = sums[:, bad] = self_hsic[bad] = np.nan
        elif bad.size:
            raise VitseeError(
                f"layers {bad.tolist()} have nan/inf activations (fp16 overflow?): "
                "re-extract them in fp32 or leave those layers out"
            )
        flat = np.flatnonzero(self_hsic <= 0)
        if flat.size:
            warnings.warn(
                f"layers {flat.tolist()} do not vary across examples (zero self-HSIC): their CKA is nan",
                stacklevel=2,
            )
        if self.cross_at is not None:  # only the cross block and the diagonal were accumulated
            k, kept = self.cross_at, np.eye(self.num_layers, dtype=bool)
            kept[:k, k:] = kept[k:, :k] = True
            sums[k:, :k] = sums[:k, k:].T
            sums[~kept] = np.nan
        return cka_ratio(sums, self_hsic)

    def statistics(self, level: float = 0.95, replicates: int | None = None, seed: Sequence[int] | int = 0) -> dict:
        """Return {ci_low, ci_high, p_value} (each (L, L) like result(), nan where there is none) and n_batches.

        The interval (level 0: none) is the delete-one-image jackknife (needs jackknife=True; with fewer than
        stats.MIN_INTERVAL_IMAGES images it is NaN and "ci_note" says why), else the percentile bootstrap over the
        filled batch slots (needs batch_slots: how results cached before were made); the p-value the permutation test
        over `permutations` (see engine/stats.py). Symmetric like result(): a cell below the diagonal repeats the one
        above it, whose column layer is the permuted one.
        """
        from vitsee import stats

        L, k = self.num_layers, self.cross_at
        cells = np.triu(np.ones((L, L), dtype=bool))
        if k is not None:  # only the cross block was accumulated
            cells[:] = False
            cells[:k, k:] = True
        out: dict = {}
        batch_hsic = self.batch_hsic.cpu().numpy()
        filled = batch_hsic[np.abs(np.diagonal(batch_hsic, axis1=1, axis2=2)).sum(axis=1) > 0]  # skipped slots stay 0
        out["n_batches"] = len(filled) if self.batch_slots else self.batches
        if level and self.jackknife:
            L2 = self.num_layers
            block = self.loo_block.cpu().numpy()
            n_images, unseen = int(block[-2]), int(block[-1])
            low, high = stats.jackknife_cka_interval(
                self.hsic_sums.cpu().numpy(), block[:-2].reshape(stats.LOO_TERMS, L2, L2), n_images, level, unseen
            )
            out["ci_low"], out["ci_high"] = np.where(cells, low, np.nan), np.where(cells, high, np.nan)
            out["ci_low"], out["ci_high"] = stats.symmetric_upper(out["ci_low"]), stats.symmetric_upper(out["ci_high"])
            out["n_images"], out["unseen_images"] = n_images, unseen
        elif level and self.batch_slots:
            low, high = stats.bootstrap_cka_interval(
                filled, level, replicates or stats.BOOTSTRAP_REPLICATES, seed, cells
            )
            out["ci_low"], out["ci_high"] = stats.symmetric_upper(low), stats.symmetric_upper(high)
        if self.permutations:
            hsic = self.hsic_sums.cpu().numpy()
            p = stats.permutation_p_value(self.null_hsic.cpu().numpy(), hsic)
            out["p_value"] = stats.symmetric_upper(np.where(cells, p, np.nan))
        return out


# ----------------------------------------------------------------------------------------------------------------
# The whole job: per-layer activations (or a stream of batches) in, CKA matrix out


def minibatch_cka(
    feats_a: Sequence[Any] | Iterable[Sequence[Any]],
    feats_b: Sequence[Any] | Iterable[Sequence[Any]] | None = None,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Return minibatch linear CKA between every layer of feats_a and every layer of feats_b, as (La, Lb).

    feats_a / feats_b: a list of per-layer arrays (n, ...) -- numpy, torch or anything sliceable with a shape, such
    as h5py datasets -- cut into consecutive batches of batch_size in the given order; or an iterable that yields,
    per batch, the list of that batch's layer arrays (then batch_size is not used). feats_b=None compares feats_a
    with itself (symmetric, unit diagonal up to rounding). A last batch under 4 examples is dropped with a warning.
    progress, if given, is called with the number of examples accumulated so far after each batch.
    """
    if batch_size < MIN_BATCH:
        raise VitseeError(f"batch_size={batch_size} is too small: unbiased HSIC needs at least {MIN_BATCH}")
    if feats_b is not None and _is_layer_list(feats_a) and _is_layer_list(feats_b):
        if int(feats_a[0].shape[0]) != int(feats_b[0].shape[0]):
            raise VitseeError(
                f"feats_a has {feats_a[0].shape[0]} examples but feats_b has {feats_b[0].shape[0]}: "
                "compare activations of the same images in the same order"
            )
    batches_a, n_layers_a = _batches(feats_a, batch_size, "feats_a")
    if feats_b is None:
        acc = MinibatchCKA(n_layers_a, device)
        pairs = ((batch, ()) for batch in batches_a)
    else:
        batches_b, n_layers_b = _batches(feats_b, batch_size, "feats_b")
        acc = MinibatchCKA(n_layers_a + n_layers_b, device, cross_at=n_layers_a)
        pairs = _zip_same_length(batches_a, batches_b)

    done = 0
    for batch_a, batch_b in pairs:
        acc.update([*batch_a, *batch_b])
        done += int(batch_a[0].shape[0])
        if progress is not None:
            progress(done)
    cka = acc.result()
    return cka if feats_b is None else cka[:n_layers_a, n_layers_a:]


def _is_layer_list(feats: Any) -> bool:
    return isinstance(feats, Sequence) and len(feats) > 0 and all(hasattr(f, "shape") for f in feats)


def _batches(feats: Any, batch_size: int, name: str) -> tuple[Iterator[list[Any]], int]:
    """Return an iterator over per-batch layer lists, and the number of layers."""
    if _is_layer_list(feats):
        n = int(feats[0].shape[0])
        for i, f in enumerate(feats):
            if int(f.shape[0]) != n:
                raise VitseeError(
                    f"{name}[{i}] has {f.shape[0]} examples but {name}[0] has {n}: "
                    "every layer must hold the same images"
                )
        starts = range(0, n, batch_size)
        return ([f[s : s + batch_size] for f in feats] for s in starts), len(feats)
    if isinstance(feats, Sequence) and len(feats) == 0:
        raise VitseeError(f"{name} is empty: pass at least one layer of activations")
    stream = iter(feats)
    first = next(stream, None)
    if first is None:
        raise VitseeError(f"{name} yielded no batches: pass per-layer arrays or a non-empty batch stream")
    first = list(first)
    return itertools.chain([first], (list(b) for b in stream)), len(first)


def _zip_same_length(a: Iterator[list[Any]], b: Iterator[list[Any]]) -> Iterator[tuple[list[Any], list[Any]]]:
    sentinel = object()
    for batch_a, batch_b in itertools.zip_longest(a, b, fillvalue=sentinel):
        if batch_a is sentinel or batch_b is sentinel:
            raise VitseeError("feats_a and feats_b hold different numbers of batches: both must cover the same images")
        if int(batch_a[0].shape[0]) != int(batch_b[0].shape[0]):
            raise VitseeError(
                f"a batch has {batch_a[0].shape[0]} examples in feats_a but {batch_b[0].shape[0]} in feats_b: "
                "both must cover the same images in the same batches"
            )
        yield batch_a, batch_b


# ----------------------------------------------------------------------------------------------------------------
# Store-facing runner


def cka_params(store: Store, cfg: AnalyzeConfig) -> dict:
    models = store.models
    batch_size = min(cfg.batch_size, store.n_images)
    params = {
        "models": models,
        "layers": {m: store.layers(m) for m in models},
        "batch_size": batch_size,
        "shuffles": cfg.shuffles,
        "seed": cfg.seed if cfg.shuffles else None,
        "n_images": store.n_images,
    }
    return with_stats(params, cfg, cfg.permutations)


def cka_slots(params: dict) -> int:
    """Returns how many batches one pass (shuffle) over the images has: the per-batch slots of the statistics."""
    return -(-params["n_images"] // params["batch_size"])


def cka_accumulator(n_layers: int, device, params: dict, shuffle: int) -> MinibatchCKA:
    """Returns the accumulator of one shuffle, keeping per-batch terms and permutations when params ask for them."""
    st = params.get("stats")
    if st is None:
        return MinibatchCKA(n_layers, device)
    method = stats_mod.interval_method(st)
    return MinibatchCKA(
        n_layers,
        device,
        batch_slots=cka_slots(params) if method == "percentile" else 0,  # a result cached before: its bootstrap
        permutations=st["permutations"],
        seed=[st["seed"], shuffle],
        jackknife=method == stats_mod.JACKKNIFE,
    )


def compute_cka(
    store: Store,
    params: dict,
    device: torch.device,
    progress: StepFn | None = None,
    share: tuple[int, int] | None = None,
    observers: Callable[[int], list] | None = None,
) -> dict:
    """Returns the joint (L, L) CKA over every stored layer of every model, averaged over the shuffles.

    One pass over the store per batch: every layer of every model is read once, its Gram built once, and
    all pairs come from one product inside MinibatchCKA. `share` (rank, world) gives this process every
    world-th batch from its rank on; the per-shuffle accumulator states are returned for an all-reduce.
    observers(k): the MinibatchCKA observers of shuffle k's accumulator (the zoo's null and intervals).
    """
    models = params["models"]
    columns = [(m, layer) for m in models for layer in params["layers"][m]]
    datasets = [store.layer_dataset(m, layer) for m, layer in columns]
    full_plan = batch_plan(params["n_images"], params["batch_size"], params["shuffles"], params["seed"] or 0)
    slots = cka_slots(params)
    plan = [(k, rows, i % slots) for i, (k, rows) in enumerate(full_plan)]  # slot: the batch's index in its shuffle
    if share is not None:
        plan = plan[share[0] :: share[1]]
    n_shuffles = max(1, params["shuffles"])
    accumulators = [cka_accumulator(len(columns), device, params, k) for k in range(n_shuffles)]
    for k, acc in enumerate(accumulators if observers is not None else []):
        acc.observers = list(observers(k))
    pinned = device.type == "cuda"
    jobs = ((rows, lambda r, ds=ds: read_batch(ds, r, pinned)) for _, rows, _ in plan for ds in datasets)
    prefetch = Prefetch(jobs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a short last batch is reported once below, not per shuffle
            for b, (k, rows, slot) in enumerate(plan):
                if len(rows) < MIN_BATCH:  # skipped by the estimator: drain its reads
                    for _ in datasets:
                        prefetch.get()
                else:
                    accumulators[k].update(
                        [LazyBatch((len(rows), *ds.shape[1:]), prefetch) for ds in datasets], slot=slot
                    )
                emit(progress, "cka", b + 1, len(plan))
    finally:
        prefetch.close()
    states = torch.stack([acc.state for acc in accumulators])  # (K, L*L + 1)
    return {"states": states, "columns": columns}


def finish_cka(states: torch.Tensor, columns: list[tuple[str, str]], params: dict) -> dict:
    """Returns the cached arrays of a CKA result from the (merged) per-shuffle accumulator states, with the
    intervals and p-values when params ask for them (pooled over shuffles as engine/stats.py says)."""
    matrices, per_shuffle = [], []
    st = params.get("stats")
    for k, state in enumerate(states):
        acc = cka_accumulator(len(columns), "cpu", params, k)
        acc.state = state.cpu().to(torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            matrices.append(acc.result(nonfinite="nan"))  # a layer with NaN/Inf activations: NaN cells
            if st is not None:
                per_shuffle.append(acc.statistics(st["ci"], st.get("bootstrap"), [st["seed"], k]))
    matrix = np.mean(matrices, axis=0)
    last = params["n_images"] % params["batch_size"]
    dropped = last if 0 < last < MIN_BATCH else 0
    arrays = {
        "matrix": matrix,
        "model": np.array([params["models"].index(m) for m, _ in columns]),
        "layer": np.array([layer for _, layer in columns]),
        "shuffle_std": np.std(matrices, axis=0) if len(matrices) > 1 else np.zeros_like(matrix),
        "dropped_per_shuffle": np.array(dropped),
        "undefined": undefined_layers(states, len(columns)),
    }
    return arrays | pooled_stats(per_shuffle)


def undefined_layers(states: torch.Tensor, n_layers: int) -> np.ndarray:
    """Returns per layer why its CKA is undefined, as the codes the views put in words (similarity.UNDEFINED):
    'nonfinite' (NaN/Inf activations), 'self_hsic' (its unbiased HSIC with itself is not above 0: a constant layer,
    or one that differs in too few images), '' (defined)."""
    L = n_layers
    own = states[:, : L * L].reshape(len(states), L, L).diagonal(dim1=1, dim2=2).cpu().numpy().sum(axis=0)
    return np.array(["nonfinite" if not np.isfinite(h) else "self_hsic" if h <= 0 else "" for h in own])


def pooled_stats(per_shuffle: list[dict]) -> dict:
    """Returns the statistics arrays of a CKA-like result from each shuffle's `MinibatchCKA.statistics()`."""
    if not per_shuffle:
        return {}
    out = stats_mod.pool_shuffles(
        [s["ci_low"] for s in per_shuffle if "ci_low" in s],
        [s["ci_high"] for s in per_shuffle if "ci_high" in s],
        [s["p_value"] for s in per_shuffle if "p_value" in s],
    )
    out["n_batches"] = np.array(min(s["n_batches"] for s in per_shuffle))  # bootstrap units per shuffle
    images = [s["n_images"] for s in per_shuffle if "n_images" in s]
    if images:  # the jackknife's units: images
        out["n_interval_images"] = np.array(min(images))
        note = stats_mod.no_interval_reason(min(images), max(s["unseen_images"] for s in per_shuffle))
        if note:
            out["ci_note"] = np.array([note])
    return out


def run_cka(store: Store, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
    """Returns the CKA result (cached or computed): `matrix` (L, L) over all models' layers."""
    check_ready(store, store.models)
    params = cka_params(store, cfg)
    cached = None if cfg.recompute else Result.load(store, "cka", params)
    if cached is not None:
        return cached
    if store.streaming:
        return _streamed_cka(store, cfg, params)
    if params["n_images"] % params["batch_size"] and params["n_images"] % params["batch_size"] < MIN_BATCH:
        warnings.warn(
            f"the last batch of {params['n_images'] % params['batch_size']} images is dropped from each pass: "
            f"unbiased HSIC needs at least {MIN_BATCH}; pick --batch-size to avoid it",
            stacklevel=2,
        )
    out = compute_cka(store, params, resolve_device(cfg.device), progress)
    arrays = finish_cka(out["states"], out["columns"], params)
    return save_result(store, "cka", params, arrays)


def _streamed_cka(store: Store, cfg: AnalyzeConfig, params: dict) -> Result:
    """Returns the CKA a streaming extraction cached, when the asked-for settings allow it; without the
    activations no other estimate can be made."""
    streamed = streamed_cka_params(store)
    if cfg.any_cka_estimate and not cfg.recompute:
        return Result.load(store, "cka", streamed) or save_streamed_cka(store)
    raise VitseeError(
        f"{store.path} was extracted with --streaming: its CKA was computed during extraction with batch size "
        f"{streamed['batch_size']} in store order, without intervals or p-values "
        f"(--batch-size {streamed['batch_size']} "
        "--shuffles 0 --ci 0 --permutations 0) and other settings need the activations, which were not stored: "
        "re-extract without --streaming into another store"
    )


def cka_block(
    result: Result, model_a: str, model_b: str | None = None, key: str = "matrix"
) -> tuple[np.ndarray, list[str], list[str]]:
    """Returns (matrix, row layers, col layers) of model_a x model_b of a CKA result (see similarity.matrix_block)."""
    return matrix_block(result, model_a, model_b, key)


# --- streamed (extract --streaming) ----------------------------------------------------------------


def streamed_cka_params(store: Store) -> dict:
    """Returns the parameters of a streaming store's CKA: those of `analyze --cka --shuffles 0` with the
    extraction's batch size, so views and the app find it like any cached CKA."""
    batch_size = (
        gram_batch_size(store) if keeps_grams(store) else int(store.file["streaming/cka_state"].attrs["batch_size"])
    )
    # the stream kept no per-batch terms or permutations: its CKA carries no statistics
    return cka_params(store, AnalyzeConfig(batch_size=batch_size, shuffles=0, ci=0, permutations=0))


def cka_from_grams(
    store: Store,
    columns: Sequence[tuple[str, str]],
    device=None,
    cross_at: int | None = None,
    batch_slots: bool = False,
    observers: Sequence[Callable] = (),
) -> MinibatchCKA:
    """Returns the accumulator of the CKA of the columns [(model, layer)] over a Gram-keeping store's batches (`extract
    --grams`, zoo/streamed.py), each batch added from its stored Grams: the sums `update` of the activations gives.

    cross_at: only the block of columns [:k] against [k:] (a model appended to a zoo against the others: its new
    pairs only); batch_slots: keep each batch's terms, for the bootstrap (engine/stats.py); observers: see
    MinibatchCKA.
    """
    n_batches = -(-store.n_images // gram_batch_size(store))
    acc = MinibatchCKA(len(columns), device, cross_at=cross_at, batch_slots=n_batches if batch_slots else 0)
    acc.observers = list(observers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a last batch under 4 images is skipped, as analyze does
        for b, grams in batch_grams(store, columns):
            acc.update_grams(grams, slot=b)
    return acc


def save_streamed_cka(store: Store) -> Result:
    """Caches the CKA of a finished streaming run, from the accumulator it stored (or the Grams it kept)."""
    if keeps_grams(store):
        params = streamed_cka_params(store)
        columns = [(m, layer) for m in params["models"] for layer in params["layers"][m]]
        state = cka_from_grams(store, columns).state
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return save_result(store, "cka", params, finish_cka(state[None], columns, params))
    saved = store.streamed_cka_state()
    if saved is None:
        raise VitseeError(
            f"{store.path} has no finished batch to compute CKA from: "
            "rerun the same `vitsee extract --streaming` command"
        )
    state, columns = saved
    params = streamed_cka_params(store)
    if [tuple(c) for c in columns] != [(m, layer) for m in params["models"] for layer in params["layers"][m]]:
        raise VitseeError(
            f"{store.path}: the streamed CKA's layers do not match the store's models: re-extract it with --overwrite"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a batch under 4 images was skipped; the result records it
        arrays = finish_cka(torch.as_tensor(state)[None], columns, params)
    return save_result(store, "cka", params, arrays)


def streaming_accumulator(store: Store, n_columns: int, device, first: int) -> MinibatchCKA:
    """Returns the all-pairs accumulator of a streaming extraction, resumed from the store's copy of it when
    `first` (the first batch still to run) is past the start."""
    acc = MinibatchCKA(n_columns, device)
    saved = store.streamed_cka_state()
    if first > 0 and saved is not None:
        acc.state.copy_(torch.as_tensor(saved[0]))
    return acc


def stream_batch(acc: MinibatchCKA, feats: list) -> torch.Tensor:
    """Adds one streamed batch (every layer of every model, in column order); returns a snapshot of the
    state to write while the next batch adds to the accumulator in place."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a last batch under 4 images is skipped, as analyze does
        acc.update(feats)
    return acc.state.clone()


# --- the analysis ----------------------------------------------------------------------------------


class LinearCKA(LayerMatrix):
    """Linear CKA between every pair of layers of the store's models (paper Fig. 1, 2): one joint matrix,
    estimated over minibatches, with jackknife intervals and permutation p-values when asked for."""

    name = "cka"
    label = "CKA"
    title = "linear CKA between layers, within a model and across two (minibatch, unbiased HSIC)"
    figures = ("1", "2")
    order = 10
    tooltip = "Show the CKA heatmap"
    option_help = "CKA within every model and across every pair"
    cost = 1

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return cka_params(store, cfg)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_cka(store, cfg, progress)

    def batch_hsic(
        self, store: Store, result: Result, device: str = "auto", progress: StepFn | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Returns the HSIC sums and per-batch terms of the CKA result's own batches (its batch size, shuffles and
        seed): one pass over the activations keeping every batch's terms, no permutations; from the Grams of a
        `--grams` store; None for a streaming store without Grams (nothing left to resample)."""
        params = result.params
        columns = [(m, layer) for m in params["models"] for layer in params["layers"][m]]
        if keeps_grams(store):  # its CKA is the Grams' own estimate: store order, the Grams' batches
            acc = cka_from_grams(store, columns, batch_slots=True)
            return acc.hsic_sums.numpy()[None].copy(), acc.batch_hsic.numpy()[None].copy()
        if store.streaming:
            return None
        terms = {
            **{k: v for k, v in params.items() if k != "stats"},
            "stats": {"ci": 1.0, "bootstrap": 0, "permutations": 0, "seed": 0},
        }  # keep each batch's terms
        states = compute_cka(store, terms, resolve_device(device), progress)["states"]
        sums, batches = [], []
        for k, state in enumerate(states):
            acc = cka_accumulator(len(columns), "cpu", terms, k)
            acc.state = state.cpu().to(torch.float64)
            sums.append(acc.hsic_sums.numpy().copy())
            batches.append(acc.batch_hsic.numpy().copy())
        return np.stack(sums), np.stack(batches)

    def observe_batches(
        self,
        store: Store,
        result: Result,
        observers: Callable[[int], list],
        device: str = "auto",
        progress: StepFn | None = None,
    ) -> np.ndarray | None:
        """Returns the HSIC sums (K, L, L) of the CKA result's own batches (its batch size, shuffles and seed; a
        `--grams` store's stored Grams) after one more pass over them that hands each batch's U-centred Grams
        (L, m, m) and its slot to observers(k), shuffle k's callables (the zoo's null and intervals,
        engine/zoo/calibration.py); None for a streaming store without Grams (nothing left to pass over)."""
        params = result.params
        columns = [(m, layer) for m in params["models"] for layer in params["layers"][m]]
        if keeps_grams(store):  # its CKA is the Grams' own estimate: store order, the Grams' batches
            acc = cka_from_grams(store, columns, resolve_device(device), observers=observers(0))
            return acc.hsic_sums.cpu().numpy()[None].copy()
        if store.streaming:
            return None
        bare = {k: v for k, v in params.items() if k != "stats"}
        states = compute_cka(store, bare, resolve_device(device), progress, observers=observers)["states"]
        L = len(columns)
        return np.stack([state.cpu().numpy()[: L * L].reshape(L, L) for state in states])

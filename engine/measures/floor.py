"""The steps under the measures at their floor: the least work each needs, on the faster backend, the same bits at any
thread count.

| step                        | before                                | here                                       |
|-----------------------------|---------------------------------------|--------------------------------------------|
| symmetric product X X'      | torch mm (MKL dgemm), 2 n^2 D flops   | numpy (OpenBLAS dsyrk): half of them (*)   |
| eigenvalues, eigenvectors   | torch (MKL dsyevd)                    | numpy (OpenBLAS dsyevd) (*)                |
| nuclear norm of M (a x b)   | svdvals, padded to the widest rank    | sqrt(eigvalsh(M M')), smaller side          |
| each row's k neighbours     | a full sort of every row, n^2 log n   | topk, n^2, ties to the lower index          |
| CKNNA's HSIC of a pair      | dense n x n masks, several passes     | the k neighbours of each row, O(n k)        |
| mutual kNN of a pair        | a product of flattened n x n masks    | the k neighbours of each row, O(n k)        |

(*) In the direct functions only. A layer's Gram and spectrum in grams.LayerGrams stay torch's product and eigh (on
one thread): numpy's other rounding moved stored values past issue 32's bar of 1e-12 where a measure is not
determined to that precision by its inputs -- RSA by 5.6e-7 on collapsed layers (RDM entries 1 - r, r ~ 1, reorder)
and PWCCA by 9.3e-4 where two layers share directions (canonical correlations of 1, repeated: its weights depend on
which basis of that eigenspace LAPACK returns).

Why the backend: on this project's CPU (2 shared cores, AVX-512), numpy's OpenBLAS ran X X' 2.0-2.9x faster than
torch's MKL (numpy calls syrk for x @ x.T), eigvalsh 1.0-1.9x and eigh 1.3x (benchmarks/README.md "The measures
at their floor"); on a GPU every step stays in torch. Why one thread: OpenBLAS's products and both libraries'
decompositions sum in another order with another thread count (max differences 8.5e-14 for X X', 1.3e-11 for
eigvalsh of a 700 x 700 Gram between one thread and two), so on the CPU every step here runs on one thread and the
work is shared out as whole tasks (a layer's Gram, a layer's eigendecomposition, a pair of layers) to
vitsee.threads.task_workers() threads: a task's arithmetic does not depend on who runs it or how many run, so a
measure is bit-identical at --threads 1 and 2, and a worker sharing a core with another job takes fewer tasks
instead of holding up a parallel region (two threads with a busy neighbour were 1.2-5x slower than one for every
factorisation, issue 32).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from vitsee.lazy import lazy_module

torch = lazy_module("torch")

EPS = float(np.finfo(np.float64).eps)
# nuclear_norm takes svdvals where an eigenvalue of M M' is within this many x eps x the largest of zero
ROUNDING_MULTIPLE = 10.0


# ----------------------------------------------------------------------------------------------------------------
# One thread per task, tasks shared out


_CONTROLLER: list = []


def _blas_controller():
    """Returns threadpoolctl's controller of the BLAS libraries loaded (found once: finding them walks the loaded
    libraries, ~ms a call)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


_DEPTH = [0]  # one_thread() bodies open: inside one (a task worker), the settings are already made
_DEPTH_LOCK = threading.Lock()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Runs the body with torch and the BLAS libraries numpy loaded (OpenBLAS) on one thread each (process-wide;
    nested, e.g. in a task of run_tasks, it changes nothing: the settings are made once, by the outermost)."""
    from vitsee.threads import torch_threads

    with _DEPTH_LOCK:
        outer = _DEPTH[0] == 0
        _DEPTH[0] += 1
    try:
        if not outer:
            yield
            return
        with _blas_controller().limit(limits=1, user_api="blas"), torch_threads(1):
            yield
    finally:
        with _DEPTH_LOCK:
            _DEPTH[0] -= 1


def on_cpu(t: Any) -> bool:
    """True for a numpy array or a torch tensor on the CPU: the steps here then run through numpy."""
    return not isinstance(t, torch.Tensor) or t.device.type == "cpu"


def one_thread_on(t: Any) -> contextlib.AbstractContextManager:
    """Returns one_thread() for a tensor or array on the CPU, else a context that does nothing: a direct function's
    steps after its two sides' tasks run on one thread too (torch's 2-thread elementwise steps on 500 x 500 Grams
    waited 4x as long as one thread's with a busy second core, issue 32)."""
    return one_thread() if on_cpu(t) else contextlib.nullcontext()


def run_tasks(fn: Callable[[Any], Any], items: Sequence[Any], cpu: bool = True) -> list:
    """Returns [fn(item) for item in items], on the CPU shared out to task_workers() threads, each task on one
    thread (the caller's thread settings are restored after); on a GPU one after another, as queued kernels."""
    items = list(items)
    if not cpu:
        return [fn(item) for item in items]
    from vitsee.threads import task_workers

    workers = min(task_workers(), len(items))
    with one_thread():
        if workers <= 1:
            return [fn(item) for item in items]
        # torch.set_num_threads reaches OpenMP per thread: a new worker would run torch's reductions on every core
        with ThreadPoolExecutor(workers, thread_name_prefix="vitsee-measures", initializer=_one_torch_thread) as pool:
            return list(pool.map(fn, items))


def _one_torch_thread() -> None:
    """Sets a task worker's own OpenMP thread count (torch's reductions, MKL) to one."""
    torch.set_num_threads(1)


def both(fn: Callable[[Any, str], Any], x: Any, y: Any) -> tuple[Any, Any]:
    """Returns (fn(x, "x"), fn(y, "y")): a direct function's two sides as two tasks of one thread (run_tasks)."""
    fx, fy = run_tasks(lambda side: fn(*side), [(x, "x"), (y, "y")], cpu=on_cpu(x))
    return fx, fy


# ----------------------------------------------------------------------------------------------------------------
# Products and decompositions


def symmetric_product(m: Any) -> Any:
    """Returns m @ m.T (a x a) for m (a, b): on the CPU through numpy's syrk (half the multiply-adds of a product,
    one triangle computed, the other mirrored: exactly symmetric), on a GPU through torch."""
    if isinstance(m, torch.Tensor):
        if m.device.type == "cpu":
            return torch.from_numpy(symmetric_product(m.numpy()))
        g = m @ m.T
        return (g + g.T) / 2
    return m @ m.T  # numpy recognises a @ a.T and calls syrk


def eigh(k: Any) -> tuple[Any, Any]:
    """Returns (eigenvalues ascending, eigenvectors) of a symmetric matrix: numpy's LAPACK on the CPU, torch on a
    GPU, in k's type."""
    if isinstance(k, torch.Tensor):
        if k.device.type == "cpu":
            lam, u = np.linalg.eigh(k.numpy())
            return torch.from_numpy(lam), torch.from_numpy(u)
        return torch.linalg.eigh(k)
    return np.linalg.eigh(k)


def eigvalsh(k: Any) -> Any:
    """Returns the eigenvalues (ascending) of a symmetric matrix: numpy's LAPACK on the CPU, torch on a GPU."""
    if isinstance(k, torch.Tensor):
        if k.device.type == "cpu":
            return torch.from_numpy(np.linalg.eigvalsh(k.numpy()))
        return torch.linalg.eigvalsh(k)
    return np.linalg.eigvalsh(k)


def nuclear_norm(m: Any, graded: bool = False, floor_multiple: float = ROUNDING_MULTIPLE) -> float:
    """Returns ||m||_* (nuclear_norm_route's value)."""
    return nuclear_norm_route(m, graded, floor_multiple)[0]


def nuclear_norm_route(m: Any, graded: bool = False, floor_multiple: float = ROUNDING_MULTIPLE) -> tuple[float, str]:
    """Returns (||m||_*, the route taken: "eigvalsh" or "svdvals"): the sum of the singular values of m (a, b),
    from the eigenvalues of the symmetric product on
    its smaller side -- min(a, b)^2 max(a, b) multiply-adds (syrk) and one eigvalsh, where svdvals bidiagonalises
    m (4 a b min(a, b) - 4/3 min^3 flops, half of them memory-bound) -- unless an eigenvalue sits at rounding level.

    The eigenvalues mu_i = sigma_i^2 of M M' carry rounding of about delta = eps x mu_max each in the worst case,
    which leaves a sigma_i with mu_i near delta anywhere up to sqrt(delta) = 1.5e-8 sigma_max: so in general a product
    with an eigenvalue within floor_multiple x delta of zero takes svdvals(m) instead (error eps x sigma_max in every
    value). But a graded m -- rows and columns scaled by descending factors, D1 Q D2, as Procrustes' Px' Py with the
    bases in descending order of variance -- keeps its small eigenvalues to high relative accuracy through the
    tridiagonal reduction: on 20 random ones with scales down to 1e-9 the route was off by 3.2e-15 where the same
    singular values rotated out of order were off by 7.9e-9; on real layers (the demo store's 561 pairs, 66 of a
    2,000-image store at n = 1,000, 40-60% with eigenvalues at rounding level) by at most 2.8e-14. graded=True
    says m is such a product and skips the guard; the worst-case sum of the rounding, sum(delta / sigma_i), is no
    guide either way (it read 8e-11 to 7e-7 on those pairs).
    """
    a, b = m.shape[-2:]
    if min(a, b) == 0:
        return 0.0, "eigvalsh"
    g = symmetric_product(m if a <= b else m.T)
    mu = eigvalsh(g)
    mu = np.asarray(mu.cpu() if isinstance(mu, torch.Tensor) else mu, dtype=np.float64)
    top = float(mu[-1])
    if not top > 0:
        return 0.0, "eigvalsh"
    if graded or float(mu[0]) > floor_multiple * EPS * top:
        return float(np.sqrt(np.maximum(mu, 0.0)).sum()), "eigvalsh"
    if isinstance(m, torch.Tensor) and m.device.type != "cpu":
        return float(torch.linalg.svdvals(m).sum()), "svdvals"
    m = m.numpy() if isinstance(m, torch.Tensor) else m
    return float(np.linalg.svd(m, compute_uv=False).sum()), "svdvals"  # OpenBLAS: 1.6x torch's at n = 2000 here


# ----------------------------------------------------------------------------------------------------------------
# Neighbours


def knn_indices(similarity: torch.Tensor, k: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Returns (n, k) the column indices of each row's k most similar other examples, in increasing column order:
    the columns measures.knn_mask marks (self excluded -- every j with ids[j] == ids[i], by default j == i -- ties at
    the k-th value to the lower index, as a stable descending sort takes them), by topk in O(n^2) and no sort."""
    n = similarity.shape[-1]
    s = similarity.clone()
    same = torch.eye(n, dtype=torch.bool, device=s.device) if ids is None else ids[:, None] == ids[None, :]
    s[same] = -math.inf
    kth = torch.topk(s, k, dim=-1).values[:, -1:]  # (n, 1) the k-th largest value of each row
    above = s > kth
    tied = s == kth
    need = k - above.sum(dim=-1, keepdim=True)  # how many of the tied values each row still takes, lowest first
    chosen = above | (tied & (torch.cumsum(tied, dim=-1) <= need))
    return chosen.nonzero()[:, 1].view(n, k)  # nonzero() walks row-major: each row's columns in increasing order


def mask_from_indices(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Returns the (n, n) bool mask with row i true at columns idx[i]."""
    return torch.zeros(n, n, dtype=torch.bool, device=idx.device).scatter_(-1, idx, True)


def mutual_neighbours(idx_x: torch.Tensor, mask_y: torch.Tensor) -> float:
    """Returns mean_i |N_x(i) & N_y(i)| / k (mknn) from x's (n, k) neighbour indices and y's (n, n) mask: O(n k)."""
    n, k = idx_x.shape
    return float(mask_y.gather(-1, idx_x).sum()) / (n * k)


def sparse_masked_hsic(
    kernel_x: torch.Tensor,
    kernel_y: torch.Tensor,
    idx: torch.Tensor,
    keep: torch.Tensor,
    keep_t: torch.Tensor,
) -> float:
    """Returns platonic-rep's unbiased HSIC of A = M o Kx and B = M o Ky (measures.masked_hsic) where M, zero on the
    diagonal, is true only at (i, idx[i, t]) with keep[i, t] (a subset of the k neighbours of each row), from
    those n k entries: [sum(A o B') + sum(A) sum(B) / ((n-1)(n-2)) - 2/(n-2) 1'AB1] / (n (n-3)).

    keep_t[i, t] says whether M is true at the transposed entry (idx[i, t], i): A o B' needs B at (j, i).
    """
    n = kernel_x.shape[-1]
    a = kernel_x.gather(-1, idx) * keep  # (n, k) the nonzero entries of A, row by row
    b = kernel_y.gather(-1, idx) * keep
    b_t = kernel_y.T.gather(-1, idx) * keep_t  # B at (idx[i, t], i)
    trace = (a * b_t).sum()
    sums = a.sum() * b.sum() / ((n - 1) * (n - 2))
    col_a = torch.zeros(n, dtype=a.dtype, device=a.device).scatter_add_(0, idx.reshape(-1), a.reshape(-1))  # A'1
    cross = (col_a * b.sum(dim=-1)).sum() * (2.0 / (n - 2))  # (A'1) . (B1)
    return float((trace + sums - cross) / (n * (n - 3)))


def cknna_terms(
    kernel_x: torch.Tensor, kernel_y: torch.Tensor, idx_x: torch.Tensor, mask_x: torch.Tensor, mask_y: torch.Tensor
) -> float:
    """Returns HSIC(M o Kx, M o Ky), M = mask_x & mask_y the mutual neighbours (CKNNA's numerator), in O(n k) from
    x's neighbour indices (every true entry of M is among them) and both (n, n) masks."""
    both = mask_x & mask_y
    keep = both.gather(-1, idx_x).to(kernel_x.dtype)  # M at (i, idx_x[i, t])
    keep_t = both.T.gather(-1, idx_x).to(kernel_x.dtype)  # M at (idx_x[i, t], i)
    return sparse_masked_hsic(kernel_x, kernel_y, idx_x, keep, keep_t)

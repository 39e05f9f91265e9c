"""Independent fp64 references the tests compare the engine with, written from the formulas."""

from __future__ import annotations

import numpy as np


def unbiased_hsic(k: np.ndarray, l: np.ndarray) -> float:
    """Returns the unbiased HSIC (Song et al. 2012) of two (m, m) Grams by its explicit formula."""
    m = len(k)
    kt, lt = k.copy(), l.copy()
    np.fill_diagonal(kt, 0)
    np.fill_diagonal(lt, 0)
    return ((kt * lt).sum() + kt.sum() * lt.sum() / ((m - 1) * (m - 2)) - 2 / (m - 2) * kt.sum(0) @ lt.sum(1)) / (
        m * (m - 3)
    )


def reference_cka(x: np.ndarray, y: np.ndarray, batches: list[np.ndarray]) -> float:
    """Minibatch CKA by the explicit formula, fp64: sum_b HSIC(K, L) / sqrt(sum_b HSIC(K, K) sum_b HSIC(L, L))."""
    kl = kk = ll = 0.0
    for rows in batches:
        a, b = x[rows].astype(np.float64), y[rows].astype(np.float64)
        k, l = a @ a.T, b @ b.T
        kl, kk, ll = kl + unbiased_hsic(k, l), kk + unbiased_hsic(k, k), ll + unbiased_hsic(l, l)
    return kl / np.sqrt(kk * ll)

"""engine/measures/floor.py: each least-work step against a plain fp64 reference on small inputs, its guard where the
cheap route would lose precision, and the same bits whatever the number of workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitsee.measures import kernels as ms
from vitsee.measures.catalog.cknna import cknna, masked_hsic
from vitsee.measures import floor


def _decaying(rows: int, cols: int, seed: int, low: float = 1e-3) -> np.ndarray:
    """Returns a (rows, cols) matrix with singular values spread from 1 down to `low`."""
    rng = np.random.default_rng(seed)
    r = min(rows, cols)
    u = np.linalg.qr(rng.normal(size=(rows, r)))[0]
    v = np.linalg.qr(rng.normal(size=(cols, r)))[0]
    return (u * np.geomspace(1.0, low, r)) @ v.T


def _loop_product(m: np.ndarray) -> np.ndarray:
    a = len(m)
    return np.array([[sum(m[i, t] * m[j, t] for t in range(m.shape[1])) for j in range(a)] for i in range(a)])


def test_symmetric_product_is_m_m_transpose_and_exactly_symmetric():
    m = np.random.default_rng(0).normal(size=(7, 11)) + 3.0
    for arg in (m, torch.from_numpy(m)):
        g = np.asarray(floor.symmetric_product(arg))
        np.testing.assert_allclose(g, _loop_product(m), rtol=1e-13, atol=1e-12)
        assert np.array_equal(g, g.T)


@pytest.mark.parametrize("shape", [(6, 9), (9, 6), (8, 8)])
def test_nuclear_norm_is_the_sum_of_singular_values(shape):
    m = _decaying(*shape, seed=1)
    reference = np.linalg.svd(m, compute_uv=False).sum()
    assert floor.nuclear_norm(m) == pytest.approx(reference, abs=1e-13)
    assert floor.nuclear_norm(torch.from_numpy(m)) == pytest.approx(reference, abs=1e-13)


def test_nuclear_norm_of_a_product_with_singular_values_near_zero_takes_the_exact_route():
    # 30 of 40 singular values at 1e-12 of the largest: their squares are below eigvalsh's rounding (eps x mu_max),
    # so sqrt(eigvalsh(M M')) would read each as anything up to sqrt(eps) = 1.5e-8 -- ~1e-7 in all. The guard sees
    # it and answers from svdvals.
    rng = np.random.default_rng(2)
    u, v = np.linalg.qr(rng.normal(size=(40, 40)))[0], np.linalg.qr(rng.normal(size=(50, 40)))[0]
    s = np.concatenate([np.linspace(1.0, 0.1, 10), np.full(30, 1e-12)])
    m = (u * s) @ v.T
    mu = np.sqrt(np.maximum(np.linalg.eigvalsh(m @ m.T), 0))
    naive_error = abs(mu.sum() - s.sum())
    assert floor.nuclear_norm(m) == pytest.approx(s.sum(), abs=1e-13)
    assert naive_error > 1e-11  # the cheap route really is off here: the guard matters


def test_nuclear_norm_of_a_graded_product_keeps_its_small_singular_values_on_the_cheap_route():
    # Procrustes' Px' Py: rows and columns scaled by descending factors down to 1e-9 (bases in order of variance).
    # Its tiny eigenvalues are at rounding level, yet the tridiagonal reduction keeps them to relative accuracy; the
    # same singular values in an ungraded matrix would be off by ~1e-8 (the test above).
    rng = np.random.default_rng(4)
    sx, sy = np.geomspace(1.0, 1e-9, 60), np.geomspace(1.0, 1e-9, 80)
    qx, qy = (np.linalg.qr(rng.normal(size=(150, r)))[0] for r in (60, 80))  # two bases in 150 dimensions
    m = (sx[:, None] * (qx.T @ qy)) * sy[None, :]
    value, route = floor.nuclear_norm_route(m, graded=True)
    assert route == "eigvalsh"
    assert value == pytest.approx(np.linalg.svd(m, compute_uv=False).sum(), abs=1e-14)
    assert floor.nuclear_norm_route(m)[1] == "svdvals"  # not said to be graded: the guard takes the exact route


def _similarity_with_ties(n: int, seed: int) -> torch.Tensor:
    """Cosine-like similarities with many exact ties: integer values, and two examples that are copies."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, size=(n, 4)).astype(np.float64)
    x[5] = x[2]
    s = x @ x.T
    return torch.from_numpy(s)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_knn_indices_mark_what_the_stable_sort_marks_ties_included(k):
    s = _similarity_with_ties(30, seed=k)
    mask = floor.mask_from_indices(floor.knn_indices(s, k), 30)
    assert torch.equal(mask, ms.knn_mask(s, k))
    ids = torch.arange(30) // 2  # a resample: rows 2i and 2i+1 are one image, never each other's neighbour
    mask = floor.mask_from_indices(floor.knn_indices(s, k, ids), 30)
    assert torch.equal(mask, ms.knn_mask(s, k, ids))


def _cosine(x: np.ndarray) -> torch.Tensor:
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    return torch.from_numpy(xn @ xn.T)


def test_mknn_and_cknna_terms_from_neighbour_lists_equal_the_dense_masks():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 6))
    y = x @ rng.normal(size=(6, 8)) + 0.7 * rng.normal(size=(40, 8))
    kx, ky, k = _cosine(x), _cosine(y), 5
    mx, my = ms.knn_mask(kx, k), ms.knn_mask(ky, k)
    idx_x = floor.knn_indices(kx, k)
    mutual = (mx & my).to(torch.float64)
    assert floor.mutual_neighbours(idx_x, my) == float((mx & my).sum()) / (40 * k)
    dense = float(masked_hsic(mutual * kx, mutual * ky))
    assert floor.cknna_terms(kx, ky, idx_x, mx, my) == pytest.approx(dense, rel=1e-12, abs=1e-15)
    own = float(masked_hsic(mx * kx, mx * kx))
    assert floor.cknna_terms(kx, kx, idx_x, mx, mx) == pytest.approx(own, rel=1e-12, abs=1e-15)
    # and CKNNA itself, as measures.cknna computes it densely
    own_y = float(masked_hsic(my * ky, my * ky))
    sparse = floor.cknna_terms(kx, ky, idx_x, mx, my) / np.sqrt(
        floor.cknna_terms(kx, kx, idx_x, mx, mx) * floor.cknna_terms(ky, ky, floor.knn_indices(ky, k), my, my)
    )
    assert sparse == pytest.approx(dense / np.sqrt(own * own_y), rel=1e-12)
    assert sparse == pytest.approx(cknna(x, y, k=k), rel=1e-12)


def test_tasks_give_the_same_bits_on_one_worker_and_two(monkeypatch):
    import vitsee.threads as threads

    mats = [_decaying(120, 90, seed=s, low=1e-4) + 1.0 for s in range(4)]

    def task(m):
        return floor.eigvalsh(floor.symmetric_product(m)), floor.nuclear_norm(m)

    runs = []
    for workers in (1, 2):
        monkeypatch.setattr(threads, "_TASK_WORKERS", [workers])
        runs.append(floor.run_tasks(task, mats))
    for (ev1, nn1), (ev2, nn2) in zip(*runs):
        assert np.array_equal(ev1, ev2) and nn1 == nn2


def _every_measure_at(workers: int, layers: list[np.ndarray], monkeypatch) -> dict[str, np.ndarray]:
    import vitsee.threads as threads
    from vitsee.measures import grams as mg
    from vitsee.measures.registry import REGISTRY

    monkeypatch.setattr(threads, "_TASK_WORKERS", [workers])
    with threads.torch_threads(workers):
        grams = mg.layer_grams(layers)
        return {name: mg.pairwise(grams, None, name) for name in REGISTRY}


def test_every_measure_gives_the_same_bits_on_one_thread_and_two(monkeypatch):
    # big enough that torch splits a reduction over two threads (its grain is 32,768 values): the Grams, spectra,
    # pairs and the steps between them each run on one thread, shared out as tasks
    rng = np.random.default_rng(3)
    base = rng.normal(size=(260, 40))
    layers = [np.tanh(base @ rng.normal(size=(40, d)) + 0.3 * rng.normal(size=(260, d))) for d in (30, 120, 300, 50)]
    one, two = (_every_measure_at(w, layers, monkeypatch) for w in (1, 2))
    for name in one:
        assert np.array_equal(one[name], two[name], equal_nan=True), name

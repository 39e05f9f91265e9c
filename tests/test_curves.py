"""n- and k-curves: nested seeded subsets, each point against the measure computed directly on that subset's
features and its bootstrap interval against one written out here; a curve of linear CKA settling on the population
value that theory gives."""

from __future__ import annotations

import numpy as np
import pytest

from vitsee import stats
from vitsee.errors import VitseeError
from vitsee.measures import curves
from vitsee import measures as ms
from vitsee.measures import grams as mg


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


def _layers(n, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 3))
    x = z @ rng.normal(size=(3, 10)) + rng.normal(size=(n, 10))
    y = np.tanh(z @ rng.normal(size=(3, 8))) + 0.5 * rng.normal(size=(n, 8))
    return x, y


def test_sizes_and_nested_subsets():
    assert curves.subset_sizes(1797) == [250, 500, 1000, 1797]
    assert curves.subset_sizes(359) == [250, 359]
    assert curves.subset_sizes(100) == [100]
    assert curves.subset_sizes(1000, first=125) == [125, 250, 500, 1000]
    subsets = curves.nested_subsets(300, [20, 80, 300], seed=4)
    assert [len(s) for s in subsets] == [20, 80, 300]
    assert set(subsets[0]) <= set(subsets[1]) <= set(subsets[2]) == set(range(300))
    assert all(np.all(np.diff(s) > 0) for s in subsets)
    again = curves.nested_subsets(300, [20, 80, 300], seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(subsets, again))
    assert curves.k_values(60) == [5, 10, 20]
    with pytest.raises(VitseeError, match="at least 16 images"):
        curves.subset_sizes(10)
    with pytest.raises(VitseeError, match="below half"):
        curves.k_values(8)


def test_each_point_is_the_measure_on_its_subset_with_its_bootstrap():
    x, y = _layers(120)
    ga, gb = mg.layer_grams([x]), mg.layer_grams([y])
    out = curves.measure_curve(ga, gb, "mknn", sizes=[30, 60, 120], seed=2, level=0.9, replicates=40, k=5)
    subsets = curves.nested_subsets(120, [30, 60, 120], seed=2)
    for s, rows in enumerate(subsets):
        assert out["value"][s, 0, 0] == pytest.approx(ms.mknn(x[rows], y[rows], k=5), abs=1e-12)
        draws = [
            mg.pair(mg.layer_grams([x])[0].take(rows[i]), mg.layer_grams([y])[0].take(rows[i]), "mknn", k=5)
            for i in stats.bootstrap_indices(len(rows), 40, [2, s])
        ]
        low, high = np.quantile(draws, [0.05, 0.95])
        assert (out["ci_low"][s, 0, 0], out["ci_high"][s, 0, 0]) == pytest.approx((low, high), abs=1e-12)
    assert list(out["sizes"]) == [30, 60, 120]
    full = mg.pairwise(ga, gb, "mknn", k=5)
    assert out["value"][-1] == pytest.approx(full, abs=1e-15)


def test_k_curve_is_the_measure_at_each_k():
    x, y = _layers(80, seed=1)
    out = curves.k_curve(mg.layer_grams([x, y]), None, "cknna", level=0.9, replicates=20)
    assert list(out["k"]) == [5, 10, 20]
    assert out["value"].shape == (3, 2, 2)
    for i, k in enumerate(out["k"]):
        assert out["value"][i, 0, 1] == pytest.approx(ms.cknna(x, y, k=int(k)), abs=1e-12)
        assert out["ci_low"][i, 0, 1] <= out["ci_high"][i, 0, 1]
    with pytest.raises(VitseeError, match="sets k itself"):
        curves.k_curve(mg.layer_grams([x]), None, "mknn", k=5)


def test_linear_cka_settles_on_its_population_value():
    """X = z A + e, Y = z B + e' (unit noise): population CKA ||A'B||^2 / (||A'A + I|| ||B'B + I||) (DESIGN.md).
    Over four draws of 480 images the curve ends nearer the truth than it starts (the biased estimator sits above it
    at 30 images), the last interval holds the truth, and the intervals narrow about as 1/sqrt(n)."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 12)) * 0.8, rng.normal(size=(4, 9)) * 0.8
    truth = np.linalg.norm(a.T @ b) ** 2 / (np.linalg.norm(a.T @ a + np.eye(12)) * np.linalg.norm(b.T @ b + np.eye(9)))
    first, last, held, widths = [], [], 0, []
    for _ in range(4):
        z = rng.normal(size=(480, 4))
        x, y = z @ a + rng.normal(size=(480, 12)), z @ b + rng.normal(size=(480, 9))
        out = curves.measure_curve(
            mg.layer_grams([x]), mg.layer_grams([y]), "linear_cka", sizes=[30, 120, 480], replicates=30
        )
        error = np.abs(out["value"][:, 0, 0] - truth)
        width = out["ci_high"][:, 0, 0] - out["ci_low"][:, 0, 0]
        first.append(error[0])
        last.append(error[-1])
        held += out["ci_low"][-1, 0, 0] <= truth <= out["ci_high"][-1, 0, 0]
        widths.append(width)
    assert np.mean(last) < np.mean(first) / 2 and np.mean(last) < 0.03
    assert held >= 3
    mean_width = np.mean(widths, axis=0)
    assert np.all(np.diff(mean_width) < 0) and mean_width[0] / mean_width[-1] > 2.5, mean_width  # sqrt(16) = 4

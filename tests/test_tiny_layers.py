"""A measure that does not change when a layer is multiplied by a number gives the same value for a layer of tiny or
huge values: CKA of 1e-30 * X equals CKA of X, for every layer x layer measure of a store and every measure function.

Linear CKA's fp32 Grams squared 1e-30 to 0, and its cells came out NaN ("non-finite, from NaN/Inf in the stored
activations" that were not there); now a layer outside [2^-40, 2^40] is scaled by a power of two before its Gram.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitsee
import vitsee.measures as measures_mod
from vitsee.analyses.cka import MinibatchCKA, linear_cka
from vitsee.analyses.driver import AnalyzeConfig, run_analyses

MEASURES = ["cka", "rbf_cka", "procrustes", "svcca", "pwcca", "mknn", "cknna", "rsa"]
SCALES = [1e-30, 1e30, 1e-38, 2.0**-41, 2.0**41]


def _pair(n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 20))
    return x, x @ rng.normal(size=(20, 30)) + rng.normal(size=(n, 30))


@pytest.fixture(scope="module")
def scaled_stores(tmp_path_factory) -> dict[float, vitsee.Store]:
    """Returns per scale a store of layers x, y and scale * x, scale * y (float32, as from_features stores them),
    every measure computed."""
    x, y = _pair()
    out = {}
    for scale in SCALES:
        path = tmp_path_factory.mktemp("scaled") / "s.h5"
        vitsee.from_features(path, {"m": {"x": x, "y": y, "sx": scale * x, "sy": scale * y}})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no layer here is constant: a warning would say one was taken for it
            run_analyses(path, MEASURES, AnalyzeConfig(device="cpu", batch_size=32, shuffles=0))
        out[scale] = vitsee.open(path)
    return out


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("measure", MEASURES)
def test_a_measure_of_a_scaled_layer_pair_equals_its_value_on_the_layers(measure, scale, scaled_stores):
    matrix = scaled_stores[scale].view(f"{measure}:m")._view.matrix  # rows/cols: x, y, sx, sy
    assert np.isfinite(matrix).all(), matrix
    # float32 storage rounds scale * x apart from x by ~6e-8 relative (subnormal 1e-38 values by more)
    tol = 2e-5 if scale == 1e-38 else 1e-6
    np.testing.assert_allclose(matrix[2:, 2:], matrix[:2, :2], atol=tol)
    np.testing.assert_allclose(matrix[0, 3], matrix[0, 1], atol=tol)  # x against scale * y


def test_ordinary_layers_give_the_same_cka_bit_for_bit_beside_a_scaled_one():
    """The scaling is by 1 for every ordinary layer: beside a tiny layer its sums, per-batch terms and null are those
    it has beside an ordinary one, to the bit (benchmarks/fingerprint.py compares whole stores with the code before)."""
    x, y = _pair()
    ordinary, mixed = MinibatchCKA(3, permutations=3, batch_slots=2), MinibatchCKA(3, permutations=3, batch_slots=2)
    for s, rows in enumerate((slice(0, 32), slice(32, 64))):
        ordinary.update([x[rows], y[rows], y[rows]], slot=s)
        mixed.update([x[rows], y[rows], 1e-30 * y[rows]], slot=s)
    assert np.array_equal(mixed.result()[:2, :2], ordinary.result()[:2, :2])
    assert torch.equal(mixed.null_hsic[:, :2, :2], ordinary.null_hsic[:, :2, :2])
    assert torch.equal(mixed.batch_hsic[:, :2, :2], ordinary.batch_hsic[:, :2, :2])
    # the tiny layer's terms are y's scaled back (its Gram is y's times 2^-2k exactly, up to fp32's rounding of
    # 1e-30 * y): its CKA, its null and its p-values are y's
    np.testing.assert_allclose(mixed.result(), ordinary.result(), rtol=1e-6)
    factor = torch.tensor([1e60, 1e60, 1e120], dtype=torch.float64)  # HSIC is linear in each Gram (1e-60 of y's)
    np.testing.assert_allclose(mixed.null_hsic[:, :, 2] * factor, ordinary.null_hsic[:, :, 2], rtol=1e-5)
    assert np.array_equal(mixed.statistics()["p_value"], ordinary.statistics()["p_value"])


def test_a_layer_near_the_largest_float32_has_its_cka(tmp_path):
    """Values near 3.4e38 overflowed in the shift to the batch mean, before any Gram: CKA said NaN/Inf."""
    x, y = _pair()
    big = (3e38 / np.abs(y).max()) * y  # within float32, as stored
    store = vitsee.from_features(tmp_path / "b.h5", {"m": {"x": x, "y": y, "big": big}})
    matrix = store.cka("m")._view.matrix
    np.testing.assert_allclose(matrix[0, 2], matrix[0, 1], rtol=1e-6)
    np.testing.assert_allclose(matrix[2, 2], 1.0, rtol=1e-6)


@pytest.mark.parametrize("scale", [1e-30, 1e30, 1e-150, 1e150])
@pytest.mark.parametrize("name", ["linear_cka", "rbf_cka", "procrustes", "svcca", "pwcca", "mknn", "cknna", "rsa"])
def test_each_measure_function_of_scaled_features_equals_its_value_on_the_features(name, scale):
    x, y = _pair()
    f = getattr(measures_mod, name)
    assert f(scale * x, scale * y) == pytest.approx(f(x, y), abs=1e-12)


def test_the_full_batch_cka_of_tiny_features_is_that_of_the_features():
    x, y = _pair()
    assert linear_cka(1e-30 * x, y) == pytest.approx(linear_cka(x, y), abs=1e-12)

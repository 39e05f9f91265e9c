"""Soft matching (Khosla & Williams 2024) against fp64 references: the transport problem written out for scipy's
linprog, POT's exact solver on the Khosla lab's cost (1 - cosine of centred units), and netrep's PermutationMetric
(equal widths, where it installs); its invariances, the metric its distance is, and its errors."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from scipy.stats import ortho_group

from vitsee.errors import VitseeError
from vitsee.measures.catalog import soft_matching as sm


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


def _curves(x: np.ndarray) -> np.ndarray:
    """The reference's tuning curves: every unit centred over the images, unit length."""
    xc = x - x.mean(axis=0)
    return xc / np.linalg.norm(xc, axis=0)


def _transport_ref(x: np.ndarray, y: np.ndarray) -> float:
    """max sum P_ij r_ij over P >= 0 with rows summing to 1/Nx and columns to 1/Ny, by linprog over the Nx*Ny
    entries of P written out constraint by constraint."""
    r = _curves(x).T @ _curves(y)
    nx, ny = r.shape
    a_eq = np.zeros((nx + ny, nx * ny))
    for i in range(nx):
        for j in range(ny):
            a_eq[i, i * ny + j] = 1.0
            a_eq[nx + j, i * ny + j] = 1.0
    b_eq = np.r_[np.full(nx, 1.0 / nx), np.full(ny, 1.0 / ny)]
    res = linprog(-r.ravel(), A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun


def _pair(n=40, dx=7, dy=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dx)) * rng.uniform(0.5, 3, dx) + rng.normal(size=dx)
    y = np.tanh(x @ rng.normal(size=(dx, dy))) + 0.5 * rng.normal(size=(n, dy))
    return x, y


@pytest.mark.parametrize("dx,dy", [(7, 5), (4, 6), (6, 6), (9, 2)])
def test_matches_the_transport_lp(dx, dy):
    x, y = _pair(dx=dx, dy=dy)
    assert sm.soft_matching(x, y, units=0) == pytest.approx(_transport_ref(x, y), abs=1e-10)


def test_every_solver_route_matches_the_lp(monkeypatch):
    """Equal widths go to the assignment, small lcm to the repeated assignment; force POT and linprog too."""
    x, y = _pair(dx=7, dy=5, seed=3)
    ref = _transport_ref(x, y)
    monkeypatch.setattr(sm, "MAX_REPLICATED", 0)
    got_linprog = sm._linprog_transport(
        _curves(x).T @ _curves(y), np.full(7, 1 / 7), np.full(5, 1 / 5)
    )  # scipy's HiGHS on the sparse constraints
    assert got_linprog == pytest.approx(ref, abs=1e-10)
    if sm_has_pot():
        assert sm.soft_matching(x, y, units=0) == pytest.approx(ref, abs=1e-10)  # POT's network simplex


def sm_has_pot() -> bool:
    try:
        import ot  # noqa: F401
    except ImportError:
        return False
    return True


def test_matches_pot_on_the_khosla_lab_cost():
    """NeuroML-Lab/partial-metric's SoftMatch: centred units, cost 1 - cosine, ot.emd with uniform weights, and the
    score 1 - sum(P * cost)."""
    ot = pytest.importorskip("ot")
    for seed, (dx, dy) in enumerate([(11, 7), (5, 13), (8, 8)]):
        x, y = _pair(n=30, dx=dx, dy=dy, seed=seed)
        xc, yc = x - x.mean(0), y - y.mean(0)
        cos = (xc / np.linalg.norm(xc, axis=0)).T @ (yc / np.linalg.norm(yc, axis=0))
        cost = 1 - cos
        plan = ot.emd(np.full(dx, 1 / dx), np.full(dy, 1 / dy), cost)
        assert sm.soft_matching(x, y, units=0) == pytest.approx(1 - (plan * cost).sum(), abs=1e-10)


def test_matches_netreps_permutation_metric_on_equal_widths():
    """With as many units on both sides the soft permutation is a permutation: netrep's PermutationMetric on
    column-normalised inputs (angular score) is arccos of the score."""
    metrics = pytest.importorskip("netrep.metrics")
    for seed in range(3):
        x, y = _pair(n=35, dx=9, dy=9, seed=seed)
        d = metrics.PermutationMetric(center_columns=True, score_method="angular").fit_score(_curves(x), _curves(y))
        assert sm.soft_matching(x, y, units=0) == pytest.approx(math.cos(d), abs=1e-10)


def test_invariances():
    x, y = _pair(dx=8, dy=6, seed=1)
    rng = np.random.default_rng(5)
    base = sm.soft_matching(x, y, units=0)
    same = {
        "permuted units": x[:, rng.permutation(8)],
        "each unit shifted and scaled": x * rng.uniform(0.2, 5, 8) + rng.normal(size=8) * 10,
        "isotropic scale": 7.5 * x,
        "every unit twice": np.hstack([x, x]),
        "a constant unit added": np.hstack([x, np.full((len(x), 1), 3.0)]),
    }
    for what, x2 in same.items():
        assert sm.soft_matching(x2, y, units=0) == pytest.approx(base, abs=1e-12), what
    q = ortho_group.rvs(8, random_state=2)
    assert abs(sm.soft_matching(x @ q, y, units=0) - base) > 1e-3  # a rotation mixes units: not invariant
    flipped = x.copy()
    flipped[:, 0] *= -1
    assert abs(sm.soft_matching(flipped, y, units=0) - base) > 1e-4  # a unit's sign is its tuning
    assert sm.soft_matching(x, x[:, ::-1] * 2 + 1, units=0) == pytest.approx(1.0, abs=1e-12)
    assert sm.soft_matching(x @ q, x, units=0) < 1 - 1e-3  # a layer and its rotation: the point of the measure


def test_symmetric_and_its_distance_is_a_metric():
    rng = np.random.default_rng(7)
    layers = [rng.normal(size=(25, d)) @ rng.normal(size=(d, d)) for d in (4, 6, 5, 3, 6)]
    dist = np.array([[math.sqrt(max(0.0, 2 * (1 - sm.soft_matching(a, b, units=0)))) for b in layers] for a in layers])
    assert np.allclose(dist, dist.T, atol=1e-12)
    assert np.allclose(np.diag(dist), 0, atol=1e-6)
    for i in range(5):
        for j in range(5):
            for k in range(5):
                assert dist[i, k] <= dist[i, j] + dist[j, k] + 1e-9


def test_a_sample_of_units_is_the_score_of_those_units():
    x, y = _pair(n=30, dx=40, dy=25, seed=4)
    got = sm.soft_matching(x, y, units=16)
    kx = sm.unit_sample(np.arange(40), 16)
    ky = sm.unit_sample(np.arange(25), 16)
    assert len(kx) == len(ky) == 16
    assert got == pytest.approx(_transport_ref(x[:, kx], y[:, ky]), abs=1e-10)
    assert sm.soft_matching(x, y, units=16) == got  # seeded: the same sample every time
    assert sm.soft_matching(x, y, units=0) == pytest.approx(_transport_ref(x, y), abs=1e-10)


def test_torch_and_numpy_agree():
    x, y = _pair(seed=2)
    assert sm.soft_matching(torch.from_numpy(x), torch.from_numpy(y)) == sm.soft_matching(x, y)


def test_constant_layer_is_nan_and_bad_values_raise():
    x, _ = _pair()
    with pytest.warns(UserWarning, match="does not vary"):
        assert math.isnan(sm.soft_matching(x, np.ones((len(x), 4))))
    for bad in (1, -2, 2.5, True):
        with pytest.raises(VitseeError, match="units="):
            sm.soft_matching(x, x, units=bad)
    with pytest.raises(VitseeError, match="at least 3"):
        sm.soft_matching(x[:2], x[:2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sm.soft_matching(x, x) == pytest.approx(1.0)


def test_all_pairs_from_the_kept_units_match_the_direct_form():
    """LayerGrams keep the first KEPT_UNITS of each layer's seeded order of varying units; the all-pairs form on the
    first `units` of them is the direct form's sample: equal on all images, a permutation (its cached tuning curves
    move with the rows) and a subset; a resample drops a unit that no longer varies."""
    from vitsee.measures import grams as mg

    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 30))
    layers = [base[:, :12] + 1, np.tanh(base @ rng.normal(size=(30, 50))), rng.normal(size=(40, 8))]
    layers[1][:, 3] = 2.0  # a dead unit: left out on both routes
    grams = mg.layer_grams(layers)
    assert grams[1].units.shape == (40, 49)  # 50 units, one constant
    got = {}
    for units in (16, 1024):
        got[units] = sm.pairwise_soft_matching(grams, grams, units)
        want = np.array([[sm.soft_matching(x, y, units=units) for y in layers] for x in layers])
        assert np.allclose(got[units], want, atol=1e-12, rtol=0)
        assert np.allclose(np.diag(got[units]), 1.0)
    perm = rng.permutation(40)
    moved = [g.take(perm) for g in grams]
    assert np.allclose(sm.pairwise_soft_matching(moved, moved, 16), got[16], atol=1e-12)
    subset = np.sort(rng.choice(40, 25, replace=False))
    part = [g.take(subset) for g in grams]
    want = np.array([[sm.soft_matching(x[subset], y[subset], units=1024) for y in layers] for x in layers])
    assert np.allclose(sm.pairwise_soft_matching(part, part, 1024), want, atol=1e-12)
    assert mg.pair(grams[0], grams[2], "soft_matching", units=16) == pytest.approx(
        sm.soft_matching(layers[0], layers[2], units=16), abs=1e-12
    )


def test_a_large_unequal_pair_compares_fewer_units_of_the_larger():
    """960 x 1024 units would be a transport of lcm 15360 copies (POT or linprog: minutes a pair); a sampled pair
    instead compares the first units of the larger layer's seeded order, as many as keep it a small assignment."""
    assert sm.compared_counts(6, 9) == (6, 9)  # lcm 18: exact
    assert sm.compared_counts(960, 1024) == (960, 960)
    assert sm.compared_counts(1024, 512) == (1024, 512)  # lcm 1024
    assert sm.compared_counts(1024, 100) == (1000, 100)  # lcm(100, 1000) = 1000 <= 2048
    assert sm.compared_counts(5, 5) == (5, 5)
    for nx, ny in [(960, 1024), (768, 1024), (100, 1024), (7, 1024), (1023, 1024)]:
        mx, my = sm.compared_counts(nx, ny)
        assert (mx, my) == (nx, ny) or (min(mx, my) == min(nx, ny) and math.lcm(mx, my) <= sm.MAX_REPLICATED)
        assert mx <= nx and my <= ny and (mx, my) != (0, 0)


def test_the_fewer_units_are_the_first_of_the_larger_layers_sample(monkeypatch):
    monkeypatch.setattr(sm, "MAX_REPLICATED", 60)  # lcm(40, 25) = 200: the 40 units are cut to 25
    x, y = _pair(n=30, dx=40, dy=25, seed=6)
    kx = sm.unit_sample(np.arange(40), 25)
    got = sm.soft_matching(x, y, units=64)
    assert got == pytest.approx(_transport_ref(x[:, kx], y), abs=1e-10)
    assert sm.soft_matching(x, y, units=0) == pytest.approx(_transport_ref(x, y), abs=1e-10)  # every unit: exact
    from vitsee.measures import grams as mg

    grams = mg.layer_grams([x, y])
    assert sm.pairwise_soft_matching(grams, grams, 64)[0, 1] == pytest.approx(got, abs=1e-12)


def test_the_slow_run_warning_counts_its_assignments_not_its_images():
    """Soft matching's cost is one assignment of `units` a layer pair, whatever n: the demo store's 34 layers (595
    pairs) took 148 s at 1,024 units and 359 images, where an n^2 estimate said 22 s."""
    from vitsee.measures.registry import measure

    spec = measure("soft_matching")
    assert spec.seconds(359, 34) == pytest.approx(spec.seconds(10_000, 34)) == pytest.approx(0.25 * 595)
    assert spec.seconds(359, 34, units=512) == pytest.approx(0.25 * 595 / 8)
    assert measure("procrustes").seconds(2000, 23) == pytest.approx(8 * measure("procrustes").seconds(1000, 23))


def test_the_warning_before_a_slow_run_names_what_shortens_it(tiny_store, monkeypatch):
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.config import AnalyzeConfig
    from vitsee.analyses.contract import Request
    from vitsee.measures.registry import measure
    from vitsee.store import Store

    monkeypatch.setattr(type(measure("soft_matching")), "seconds", classmethod(lambda cls, n, layers, **kw: 600.0))
    with Store.open(tiny_store) as store:
        said = REGISTRY["soft_matching"].warning(store, Request("soft_matching", ()), AnalyzeConfig())
        assert "about 10 min on one CPU core; --soft-matching-units 256" in said and "a GPU does not help" in said
        assert REGISTRY["rsa"].warning(store, Request("rsa", ()), AnalyzeConfig()) is None  # tiny: seconds

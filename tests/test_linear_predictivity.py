"""Linear predictivity against an fp64 reference: sklearn's RidgeCV (inner KFold, mean squared error) fitted on the
features of each outer KFold fold, scored by r2_score(variance_weighted); the folds against sklearn's KFold; its
invariances; its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import ortho_group
from sklearn.linear_model import RidgeCV
from sklearn.metrics import r2_score
from sklearn.model_selection import KFold

from vitsee.errors import VitseeError
from vitsee.measures.catalog import linear_predictivity as lp


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


def _reference(x, y, folds=lp.FOLDS, seed=lp.SEED):
    """Cross-validated ridge R^2 as brain-score-like code writes it with sklearn, on the features (primal)."""
    scores = []
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(x):
        xt = x[train]
        scale = ((xt - xt.mean(axis=0)) ** 2).sum() / len(train)  # the mean eigenvalue of the centred Gram
        ridge = RidgeCV(alphas=np.array(lp.ALPHAS) * scale, cv=KFold(folds), scoring="neg_mean_squared_error")
        ridge.fit(xt, y[train])
        scores.append(r2_score(y[test], ridge.predict(x[test]), multioutput="variance_weighted"))
    return float(np.mean(scores))


def _pair(n, dx, dy, seed=0, noise=0.4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dx)) * np.geomspace(3, 0.1, dx) + 2.0
    y = np.tanh(x @ rng.normal(size=(dx, dy)) / math.sqrt(dx)) + noise * rng.normal(size=(n, dy)) - 1.0
    return x, y


@pytest.mark.parametrize(
    "n,dx,dy,folds,seed",
    [(30, 4, 3, 5, 0), (40, 60, 5, 5, 1), (57, 8, 90, 5, 2), (23, 6, 6, 3, 3), (50, 3, 12, 4, 7)],
)
def test_matches_sklearn_ridgecv(n, dx, dy, folds, seed):
    x, y = _pair(n, dx, dy, seed)
    assert lp.linear_predictivity(x, y, folds=folds, cv_seed=seed) == pytest.approx(
        _reference(x, y, folds, seed), abs=1e-10
    )


def test_folds_are_sklearns_kfold_and_keep_copies_together():
    for n, folds, seed in [(23, 5, 0), (40, 3, 9), (10, 5, 4)]:
        mine = lp.kfold(np.arange(n), folds, seed)
        theirs = list(KFold(folds, shuffle=True, random_state=seed).split(np.zeros(n)))
        for (a, b), (c, d) in zip(mine, theirs, strict=True):
            assert np.array_equal(a, c) and np.array_equal(b, d)
        inner = lp.kfold(np.arange(n), folds, None)
        for (a, b), (c, d) in zip(inner, KFold(folds).split(np.zeros(n)), strict=True):
            assert np.array_equal(a, c) and np.array_equal(b, d)
    groups = np.array([3, 1, 3, 0, 2, 1, 4, 4, 0, 2, 5, 5])  # a resample: repeated images
    for train, test in lp.kfold(groups, 3, 0):
        assert not set(groups[train]) & set(groups[test])
        assert sorted([*train, *test]) == list(range(len(groups)))


def test_invariances_and_direction():
    x, y = _pair(45, 6, 7, seed=5)
    base = lp.linear_predictivity(x, y)
    qx, qy = ortho_group.rvs(6, random_state=1), ortho_group.rvs(7, random_state=2)
    for what, (a, b) in {
        "x rotated": (x @ qx, y),
        "x scaled and shifted": (4.0 * x - 9.0, y),
        "y rotated": (x, y @ qy),
        "y scaled and shifted": (x, 0.3 * y + 5.0),
    }.items():
        assert lp.linear_predictivity(a, b) == pytest.approx(base, abs=1e-10), what
    assert abs(lp.linear_predictivity(y, x) - base) > 1e-3  # not symmetric: x from y is another question
    stretch = np.diag([1, 1, 1, 1, 1, 1, 30.0])
    assert abs(lp.linear_predictivity(x, y @ stretch) - base) > 1e-3  # reweighs y's features in the pooled R^2


def test_values_where_the_answer_is_known():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 5))
    assert lp.linear_predictivity(x, x @ rng.normal(size=(5, 9)) + 1) == pytest.approx(1.0, abs=1e-3)
    unrelated = [lp.linear_predictivity(rng.normal(size=(60, 5)), rng.normal(size=(60, 4))) for _ in range(10)]
    assert max(unrelated) < 0.05  # nothing to predict: the chosen ridge shrinks to the mean, R^2 <= ~0


def test_torch_input_constant_layer_and_errors():
    x, y = _pair(30, 4, 3)
    assert lp.linear_predictivity(torch.from_numpy(x), torch.from_numpy(y)) == lp.linear_predictivity(x, y)
    with pytest.warns(UserWarning, match="does not vary"):
        assert math.isnan(lp.linear_predictivity(x, np.ones((30, 2))))
    with pytest.raises(VitseeError, match="folds=1"):
        lp.linear_predictivity(x, y, folds=1)
    with pytest.raises(VitseeError, match="at least 10 images"):
        lp.linear_predictivity(x[:9], y[:9])


def test_all_pairs_from_the_grams_match_the_direct_form():
    """The Gram-level form (each row layer's folds decomposed once) against the direct one on the features, on all
    the images, a permutation of them (a p-value's null) and a subset; a constant layer is a NaN row and column."""
    from vitsee.measures import grams as mg

    rng = np.random.default_rng(0)
    layers = [rng.normal(size=(60, d)) * rng.uniform(0.5, 2, d) + 3 for d in (4, 30, 7)]
    grams = mg.layer_grams(layers)
    perm = rng.permutation(60)
    subset = np.sort(rng.choice(60, 40, replace=False))
    for rows in (None, perm, subset):
        g = grams if rows is None else [x.take(rows) for x in grams]
        feats = layers if rows is None else [x[rows] for x in layers]
        got = lp.pairwise_linear_predictivity(g, g)
        want = np.array([[lp.linear_predictivity(x, y) for y in feats] for x in feats])
        assert np.allclose(got, want, atol=1e-10, rtol=0)
    with_constant = mg.layer_grams([layers[0], np.ones((60, 3))])
    m = lp.pairwise_linear_predictivity(with_constant, with_constant)
    assert np.isnan(m[1]).all() and np.isnan(m[:, 1]).all() and m[0, 0] == pytest.approx(1.0, abs=1e-3)
    resample = [x.take(rng.integers(0, 60, 60)) for x in grams]
    for train, test in lp.kfold(resample[0].ids.numpy(), 5, 0):
        assert not set(resample[0].ids.numpy()[train]) & set(resample[0].ids.numpy()[test])
    assert np.isfinite(lp.pairwise_linear_predictivity(resample, resample)).all()

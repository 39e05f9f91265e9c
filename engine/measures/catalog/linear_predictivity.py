"""Linear predictivity of one layer from another: the cross-validated R^2 of a ridge regression of layer Y's
features on layer X's, the ridge chosen by an inner cross-validation (as brain-score maps a model onto neural
responses, and as Wu et al. 2025, "Measuring the measures", arXiv:2509.04622, compare it with the other measures).

    outer folds: the n images in `folds` folds (seeded shuffle, sklearn's KFold(folds, shuffle=True,
                 random_state=cv_seed) exactly); for each, the other folds train and it tests
    inner folds: the training images in `folds` folds in order (KFold(folds)); each penalty of the grid is scored by
                 the mean over inner folds of the mean squared error of the held-out images (sklearn RidgeCV with
                 cv=KFold(folds), scoring="neg_mean_squared_error"); the best (first of ties) is refitted on all the
                 training images
    the grid:    lambda = ALPHAS x s, s = tr(K_train) / m, the training images' mean squared distance from their mean
                 (the mean eigenvalue of their centred Gram): the grid is relative to the scale of X, so the measure
                 does not change when X is scaled
    the score:   R^2 of each test fold, pooled over Y's features (sklearn's r2_score(..., "variance_weighted"):
                 1 - sum of squared errors / sum of squares about the test fold's mean), averaged over the folds

Every fit has an intercept (X and Y centred on the training images' means). It is computed in the dual (kernel ridge
regression on the Gram of X): the prediction of the test images is K_te,tr (K_tr,tr + lambda I)^-1 Y_tr, and every
squared error is a trace of Grams of Y, so two layers' n x n Grams are all it needs (one eigendecomposition of each
training Gram serves every penalty). Not symmetric: linear_predictivity(x, y) is how well x predicts y. Invariant to
rotations, translations and isotropic scaling of either layer (not to other linear maps of y, which reweigh its
features in the pooled R^2); at most 1, below 0 when a prediction is worse than the test fold's mean.

Resampled images: its interval (measures/resampling.py's jackknife) fits on all but a group of the images, so it
holds the value at this n; fewer training images predict a little worse, so the value rises with n (its n-curve,
analyses/curves.py). A resample that repeats images (a bootstrap) keeps an image's copies in one fold, so no copy
trains while its twin is tested; such a replicate fits on ~63% distinct images and its R^2 sits a little below the
estimate's, and so can the whole percentile interval of a well-predicted pair.

tests/test_linear_predictivity.py checks it against sklearn's RidgeCV on the features, fold by fold.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.measures.grams import LayerGrams, small_lapack
from vitsee.measures.kernels import feature_pair, is_constant, warn_constant
from vitsee.measures.registry import AT_N, Measure, Parameter

torch = lazy_module("torch")

FOLDS = 5
SEED = 0  # the outer folds' shuffle (its own: the store's --seed draws the images)
ALPHAS = tuple(10.0**p for p in range(-4, 5))  # ridge penalties relative to the mean eigenvalue of the training Gram


def check_folds(folds: int, n: int, measure: str = "linear_predictivity") -> int:
    """Returns folds if it is at least 2 and the n images leave every inner fold two training images; raises
    otherwise."""
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise VitseeError(f"{measure} folds={folds} is not a number of folds: use at least 2, e.g. {FOLDS}")
    if n < 2 * folds:
        raise VitseeError(
            f"{measure} with {folds} folds needs at least {2 * folds} images, got {n}: pass more images or fewer folds"
        )
    return int(folds)


def kfold(groups: np.ndarray, folds: int, seed: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Returns [(train rows, test rows)] of `folds` folds over the rows, keeping rows of one group together.

    groups: (n,) each row's group (its image: a bootstrap resample repeats images, and a copy must not be trained on
    while its twin is tested). The groups, in order of first appearance, are split as sklearn's KFold splits
    samples: shuffled by np.random.RandomState(seed) unless seed is None, the first n_groups % folds folds one larger.
    With distinct groups this is KFold(folds, shuffle=seed is not None, random_state=seed) exactly. Rows ascending.
    """
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))  # group -> its order of first appearance
    inverse = rank[inverse]
    order = np.arange(len(first))
    if seed is not None:
        np.random.RandomState(seed).shuffle(order)
    sizes = np.full(folds, len(first) // folds)
    sizes[: len(first) % folds] += 1
    out, start = [], 0
    for size in sizes:
        test_groups = np.zeros(len(first), dtype=bool)
        test_groups[order[start : start + size]] = True
        start += size
        test = test_groups[inverse]
        out.append((np.flatnonzero(~test), np.flatnonzero(test)))
    return out


def centred_on(gram: torch.Tensor, train: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Returns <x_a - m, x_b - m> for a in rows, b in cols, m the mean of the training rows' features, from any Gram of
    the features (centred or not): K_ab - mean_t K_at - mean_t K_tb + mean_tt' K_tt'."""
    k_train = gram.index_select(1, train)
    row_means = k_train.mean(dim=1)  # (n,) mean_t K_at
    grand = row_means.index_select(0, train).mean()
    block = gram.index_select(0, rows).index_select(1, cols)
    return block - row_means.index_select(0, rows)[:, None] - row_means.index_select(0, cols)[None, :] + grand


class RowDecomposition:
    """One training set's centred Gram of X, eigendecomposed once for every penalty and every Y."""

    def __init__(self, k: torch.Tensor, train: torch.Tensor, test: torch.Tensor):
        self.train, self.test = train, test
        k_tt = centred_on(k, train, train, train)
        self.scale = float(k_tt.diagonal().mean())  # tr(K) / m: the mean eigenvalue
        e, u = torch.linalg.eigh((k_tt + k_tt.T) / 2)
        self.e, self.u = e, u
        self.b = centred_on(k, train, test, train) @ u  # (t, m): test rows in the eigenbasis

    def squared_errors(self, l: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
        """Returns (len(lambdas),) the summed squared error over Y's features of the test rows' ridge predictions,
        from Y's Gram l: tr(L_ss) - 2 tr(A L_ts) + tr(A L_tt A'), A = B diag(1/(e + lambda)) U'."""
        l_tt = centred_on(l, self.train, self.train, self.train)
        l_ts = centred_on(l, self.train, self.train, self.test)
        l_ss = centred_on(l, self.train, self.test, self.test).diagonal().sum()
        m = self.u.T @ l_tt @ self.u  # (m, m)
        p = (self.b * (self.u.T @ l_ts).T).sum(dim=0)  # (m,): sum_i B_ik (U' L_ts)_ki
        q = self.b.T @ self.b  # (m, m)
        d = 1.0 / (self.e[None, :] + lambdas[:, None])  # (P, m)
        quad = ((d @ (m * q)) * d).sum(dim=1)
        return l_ss - 2 * (d @ p) + quad


class Fold:
    """An outer fold of X: its training decomposition and each inner fold's, reused for every layer Y."""

    def __init__(self, k: torch.Tensor, train: np.ndarray, test: np.ndarray, groups: np.ndarray, folds: int):
        dev = k.device
        self.outer = RowDecomposition(k, torch.as_tensor(train, device=dev), torch.as_tensor(test, device=dev))
        self.lambdas = torch.tensor(ALPHAS, dtype=torch.float64, device=dev) * self.outer.scale
        self.inner = [
            (
                RowDecomposition(k, torch.as_tensor(train[tr], device=dev), torch.as_tensor(train[te], device=dev)),
                len(te),
            )
            for tr, te in kfold(groups[train], folds, None)
        ]
        self.test = self.outer.test

    def r2(self, l: torch.Tensor) -> float:
        """Returns the test fold's R^2 of Y (Gram l) predicted with the penalty the inner folds choose."""
        mse = torch.stack([inner.squared_errors(l, self.lambdas) / size for inner, size in self.inner]).mean(dim=0)
        best = int(torch.argmin(mse))  # the first of equal scores, as GridSearchCV's rank 1
        sse = self.outer.squared_errors(l, self.lambdas[best : best + 1])[0]
        sst = centred_on(l, self.test, self.test, self.test).diagonal().sum()  # about the test fold's own mean
        return float(1.0 - sse / sst) if float(sst) > 0 else math.nan


def folds_of(k: torch.Tensor, groups: np.ndarray, folds: int, seed: int) -> list[Fold]:
    """Returns the outer folds of X's Gram k (n, n), each with its decompositions (the part shared by every Y)."""
    return [Fold(k, train, test, groups, folds) for train, test in kfold(groups, folds, seed)]


def r2_from_folds(parts: list[Fold], l: torch.Tensor) -> float:
    """Returns the mean over the outer folds of the R^2 of Y (its Gram l) from X (the folds of its Gram)."""
    values = [fold.r2(l) for fold in parts]
    return float(np.mean(values)) if all(math.isfinite(v) for v in values) else math.nan


def linear_predictivity(x: Any, y: Any, folds: int = FOLDS, cv_seed: int = SEED) -> float:
    """Returns the cross-validated ridge R^2 of y (n, ...) predicted from x (n, ...), averaged over `folds` folds.

    Outer folds seeded (KFold(folds, shuffle=True, random_state=cv_seed)), the penalty chosen from ALPHAS x the mean
    eigenvalue of the training Gram by an inner KFold(folds) on mean squared error, R^2 pooled over y's features
    (variance weighted) on each test fold. Not symmetric: swap x and y for the other direction. Invariant to
    rotations, translations and isotropic scaling of either layer; at most 1. See the module docstring.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(60, 5))
    >>> round(linear_predictivity(x, 2 * x @ np.random.default_rng(1).normal(size=(5, 8)) + 3), 3)
    1.0
    """
    x, y = feature_pair(x, y, "linear_predictivity", 2)
    n = x.shape[0]
    folds = check_folds(folds, n)
    xc, yc = x - x.mean(dim=0), y - y.mean(dim=0)
    for name, raw, centred in (("x", x, xc), ("y", y, yc)):
        if is_constant(float(centred.square().sum()), float(raw.square().sum())):
            return warn_constant(name, "linear_predictivity")
    with small_lapack(n, x.device):
        return r2_from_folds(folds_of(xc @ xc.T, np.arange(n), folds, int(cv_seed)), yc @ yc.T)


def pairwise_linear_predictivity(
    a: list[LayerGrams], b: list[LayerGrams], folds: int = FOLDS, cv_seed: int = SEED
) -> np.ndarray:
    """Returns (La, Lb): the R^2 of each layer of b (columns) predicted from each layer of a (rows), from their
    LayerGrams (measures/grams.py). Each row layer's folds are decomposed once and serve every column layer. The
    folds are over a's images (a bootstrap resample's copies of an image stay in one fold)."""
    first = a[0]
    groups = np.arange(first.n) if first.ids is None else first.ids.cpu().numpy()
    folds = check_folds(folds, len(np.unique(groups)))
    out = np.full((len(a), len(b)), np.nan)
    with small_lapack(first.n, first.device):
        for i, ga in enumerate(a):
            if ga.constant:
                continue
            parts = folds_of(ga.gram, groups, folds, int(cv_seed))  # any Gram of the features: centred_on centres it
            for j, gb in enumerate(b):
                if not gb.constant:
                    out[i, j] = r2_from_folds(parts, gb.gram)
    return out


FOLDS_PARAMETER = Parameter(
    "folds",
    FOLDS,
    "linear predictivity: the folds of its outer and inner cross-validation (brain-score's ridge: 5 is usual)",
    option="predictivity-folds",
    check=lambda value, measure, n: check_folds(value, n, measure),
)
CV_SEED = Parameter("cv_seed", SEED, "linear predictivity: the seed of the outer folds' shuffle")


class LinearPredictivity(Measure):
    """linear_predictivity: how much of the column layer a ridge regression on the row layer predicts."""

    name = "linear_predictivity"
    label = "linear predictivity"
    title = "linear predictivity: cross-validated ridge R^2 of the column layer from the row layer"
    option_help = (
        "linear predictivity (cross-validated ridge R^2 of each layer from each other, the ridge chosen by an inner "
        "cross-validation; rows predict columns)"
    )
    order = 18.5  # between the measures (11 ... 18) and their comparison (19)
    parameters = (FOLDS_PARAMETER, CV_SEED)
    symmetric = False
    alike = "better predicted"
    value_name = "R^2"
    value_range = (None, 1.0)
    seconds_at_1000 = 600.0  # 6 decompositions per row layer and fold, an n^3 product per pair
    cubic = True
    interval_holds = AT_N + " (fewer training images predict less: the value rises with n, see its n-curve)"
    direct = staticmethod(linear_predictivity)
    pairwise = staticmethod(pairwise_linear_predictivity)

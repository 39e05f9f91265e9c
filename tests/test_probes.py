"""Linear probes: the closed-form ridge classifier of the paper, matched against scikit-learn."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge, RidgeClassifier

from vitsee.errors import VitseeError
from vitsee.analyses import probes, ridge
from vitsee.analyses.ridge import (
    ExampleAccumulator,
    RidgeAccumulator,
    fit_probes,
    new_accumulator,
    ridge_predict,
    ridge_probe,
    split_examples,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ACCUMULATORS = [RidgeAccumulator, ExampleAccumulator]  # the primal (D x D) and the dual (n x n) form


def random_problem(n, d, k, seed=0, signal=1.0):
    """Return x (n, d) and labels (n,) in [0, k) that depend on x with the given strength."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    logits = signal * x @ rng.normal(size=(d, k)) + rng.normal(size=(n, k))
    return x, logits.argmax(1)


def batches_from(x, y, batch_size=17, reads=None):
    """Return a batches(mask) function over in-memory arrays, as the store runner will provide one."""

    def batches(mask):
        if reads is not None:
            reads.append(mask.copy())
        index = np.flatnonzero(mask)
        for start in range(0, len(index), batch_size):
            rows = index[start : start + batch_size]
            yield torch.as_tensor(x[rows]), torch.as_tensor(y[rows])

    return batches


def targets_pm1(y, k):
    return 2.0 * np.eye(k)[y] - 1.0


# ---------------------------------------------------------------------------------------------------------------
# One-shot reference against scikit-learn


@pytest.mark.parametrize("n, d, k", [(50, 10, 2), (40, 120, 2), (60, 15, 4), (40, 100, 5)])
@pytest.mark.parametrize("l2", [1e-2, 1.0, 100.0])
def test_ridge_probe_predicts_what_sklearn_ridge_classifier_predicts(n, d, k, l2):
    x, y = random_problem(n + 40, d, k, seed=n + d + k)
    labels = np.array([3, 7, 11, 20, 42])[y]  # arbitrary label values, not 0..k-1
    predicted = ridge_predict(x[:n], labels[:n], x[n:], l2)
    expected = RidgeClassifier(alpha=l2).fit(x[:n], labels[:n]).predict(x[n:])
    assert len(np.unique(expected)) > 1  # a constant prediction would make the comparison weak
    np.testing.assert_array_equal(predicted, expected)


def test_ridge_probe_accuracy_equals_sklearn_score_on_torch_images():
    x, y = random_problem(120, 48, 3, seed=1, signal=0.5)
    images = torch.as_tensor(x, dtype=torch.float32).reshape(120, 3, 4, 4)  # (n, C, H, W), flattened per example
    accuracy = ridge_probe(images[:80], torch.as_tensor(y[:80]), images[80:], torch.as_tensor(y[80:]), l2=3.0)
    flat = images.double().flatten(1).numpy()
    expected = RidgeClassifier(alpha=3.0).fit(flat[:80], y[:80]).score(flat[80:], y[80:])
    assert 0 < expected < 1
    assert accuracy == expected


def test_two_classes_tied_at_zero_go_to_the_first_class_like_sklearn():
    x = np.ones((10, 4))  # constant features: every score is the mean target, 0 for balanced classes
    y = np.array([5, 9] * 5)
    expected = RidgeClassifier(alpha=1.0).fit(x, y).predict(x[:3])
    np.testing.assert_array_equal(ridge_predict(x, y, x[:3], 1.0), expected)
    assert (expected == 5).all()


# ---------------------------------------------------------------------------------------------------------------
# Streaming accumulator


@pytest.mark.parametrize("accumulator", ACCUMULATORS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n, d, offset", [(90, 12, 0.0), (30, 50, 0.0), (90, 12, 1e4), (30, 50, 1e4)])
def test_streamed_weights_equal_sklearn_ridge_on_pm1_targets(accumulator, device, n, d, offset):
    x, y = random_problem(n, d, 4, seed=2)
    x = x + offset  # activations often share a large offset; streaming must not lose precision to it
    streamed = accumulator(4, device)
    for start in range(0, n, 13):  # uneven batches, the last one short
        streamed.update(x[start : start + 13], y[start : start + 13])
    one_shot = accumulator(4, device).update(x, y)
    reference = Ridge(alpha=2.0).fit(x, targets_pm1(y, 4))

    for acc in (streamed, one_shot):
        path = acc.solve([2.0])
        np.testing.assert_allclose(path.coef()[0, 0].cpu().numpy(), reference.coef_.T, rtol=0, atol=1e-8)
        # the intercept is mean target - mean x . coef: with a 1e4 offset it is in the thousands
        np.testing.assert_allclose(path.intercept()[0, 0].cpu().numpy(), reference.intercept_, rtol=1e-10, atol=1e-8)
    assert streamed.count == n


def test_merged_accumulators_equal_one_accumulator_over_all_batches():
    x, y = random_problem(80, 9, 3, seed=3)
    x = x + 50.0
    whole = RidgeAccumulator(3).update(x, y)
    merged = RidgeAccumulator(3).update(x[:50], y[:50]).merge(RidgeAccumulator(3).update(x[50:], y[50:]))
    for name in ("mean_x", "mean_y", "xx", "xy"):
        torch.testing.assert_close(getattr(merged, name), getattr(whole, name), rtol=1e-12, atol=1e-9)
    assert merged.class_counts.tolist() == np.bincount(y, minlength=3).tolist()


@pytest.mark.parametrize("accumulator", ACCUMULATORS)
@pytest.mark.parametrize("d", [8, 90])
def test_batched_probes_equal_separate_solves(accumulator, d):
    n, n_probes, k = 70, 5, 3
    rng = np.random.default_rng(4)
    x = rng.normal(size=(n, n_probes, d)) * rng.uniform(0.1, 10, size=(n_probes, 1))  # probes of different scales
    y = rng.integers(0, k, n)
    l2 = rng.uniform(0.1, 10, size=(n_probes, 3))  # (P, L): each probe its own penalties
    together = accumulator(k).update(x, y).solve(l2)
    for p in range(n_probes):
        alone = accumulator(k).update(x[:, p], y).solve(l2[p])  # (b, D): one probe
        torch.testing.assert_close(together.coef()[p], alone.coef()[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(together.intercept()[p], alone.intercept()[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(together.predict(x)[:, p], alone.predict(x[:, p])[:, 0])


def test_a_grid_of_l2_equals_one_solve_per_l2():
    x, y = random_problem(60, 20, 3, seed=5)
    acc = RidgeAccumulator(3).update(x, y)
    grid = [1e-3, 0.5, 7.0, 300.0]
    path = acc.solve(grid)
    for j, l2 in enumerate(grid):
        reference = Ridge(alpha=l2).fit(x, targets_pm1(y, 3))
        np.testing.assert_allclose(path.coef()[0, j].numpy(), reference.coef_.T, atol=1e-8)
    assert not torch.allclose(path.coef()[0, 0], path.coef()[0, -1])  # the penalty matters


def test_eigenbasis_prediction_equals_argmax_of_explicit_weights():
    x, y = random_problem(60, 10, 4, seed=6, signal=0.3)
    x_test = np.random.default_rng(7).normal(size=(25, 2, 10))
    path = RidgeAccumulator(4).update(np.stack([x, -x], axis=1), y).solve([0.1, 10.0])  # P = 2, L = 2
    scores = torch.einsum("bpd,pldk->bplk", torch.as_tensor(x_test), path.coef()) + path.intercept()
    torch.testing.assert_close(path.predict(x_test), scores.argmax(-1))
    correct = path.count_correct(x_test, y[:25])
    torch.testing.assert_close(correct, (scores.argmax(-1) == torch.as_tensor(y[:25])[:, None, None]).sum(0))


@pytest.mark.parametrize("accumulator", ACCUMULATORS)
@pytest.mark.parametrize("d", [6, 120])
def test_classes_absent_from_training_are_never_predicted_like_sklearn(accumulator, d):
    x, y = random_problem(80, d, 4, seed=8)
    keep = y != 1  # class 1 never seen in training
    path = accumulator(4).update(x[keep], y[keep]).solve([0.01])
    predicted = path.predict(x)[:, 0, 0].numpy()
    expected = RidgeClassifier(alpha=0.01).fit(x[keep], y[keep]).predict(x)
    np.testing.assert_array_equal(predicted, expected)
    assert 1 not in predicted


# ---------------------------------------------------------------------------------------------------------------
# The dual (n x n) form against the primal (D x D) one


def numpy_ridge_scores(x_train, y_train, x_test, l2, k):
    """Return fp64 numpy ridge scores (m, K) to {-1, 1} one-hot targets: centred, unpenalised intercept, primal."""
    mean_x, targets = x_train.mean(0), 2.0 * np.eye(k)[y_train] - 1.0
    xc, mean_y = x_train - mean_x, targets.mean(0)
    coef = np.linalg.solve(xc.T @ xc + l2 * np.eye(x_train.shape[1]), xc.T @ (targets - mean_y))  # (D, K)
    return (x_test - mean_x) @ coef + mean_y


@pytest.mark.parametrize("n, d", [(25, 300), (300, 25)])
@pytest.mark.parametrize("offset", [0.0, 500.0])
def test_dual_path_scores_equal_a_numpy_fp64_ridge(n, d, offset):
    x, y = random_problem(n + 40, d, 3, seed=d, signal=0.3)
    x = x + offset
    l2 = [1e-3, 1.0, 50.0]
    path = ExampleAccumulator(3).update(x[:n], y[:n]).solve(l2)
    scores = torch.einsum("bd,ldk->blk", torch.as_tensor(x[n:]), path.coef()[0]) + path.intercept()[0]
    for j, penalty in enumerate(l2):
        expected = numpy_ridge_scores(x[:n], y[:n], x[n:], penalty, 3)
        np.testing.assert_allclose(scores[:, j].numpy(), expected, rtol=0, atol=1e-7 * (1 + offset))
        np.testing.assert_array_equal(path.predict(x[n:])[:, 0, j].numpy(), expected.argmax(1))


@pytest.mark.parametrize("n, d", [(25, 300), (40, 60)])
@pytest.mark.parametrize("offset", [0.0, 500.0])
def test_cholesky_dual_solve_scores_equal_a_numpy_fp64_ridge_and_the_eigenbasis(n, d, offset):
    x, y = random_problem(n + 40, d, 3, seed=d + 1, signal=0.3)
    x = (x + offset).reshape(n + 40, 2, d // 2)  # P = 2 probes
    l2 = torch.tensor([[1e-3, 1.0, 50.0], [1e-2, 3.0, 900.0]], dtype=torch.float64)  # (P, L), its own per probe
    acc = ExampleAccumulator(3).update(x[:n], y[:n])
    chol, eig = acc.solve(l2, factor="cholesky"), acc.solve(l2)
    assert chol.dual_coef is not None and chol.eigvecs is None  # solved without an eigendecomposition
    predicted, scores = chol.predict(x[n:]), list(chol._scores(x[n:]))  # (b, P, L), L x (P, b, K)
    for p in range(2):
        for j in range(3):
            expected = numpy_ridge_scores(x[:n, p], y[:n], x[n:, p], float(l2[p, j]), 3)
            np.testing.assert_allclose(scores[j][p].numpy(), expected, rtol=0, atol=1e-8 * (1 + offset))
            np.testing.assert_array_equal(predicted[:, p, j].numpy(), expected.argmax(1))
    torch.testing.assert_close(chol.coef(), eig.coef(), rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(chol.intercept(), eig.intercept(), rtol=1e-8, atol=1e-9 * (1 + offset))
    correct, squared = chol.evaluate(x[n:], y[n:])
    expected_correct, expected_squared = eig.evaluate(x[n:], y[n:])
    np.testing.assert_array_equal(correct.numpy(), expected_correct.numpy())
    np.testing.assert_allclose(squared.numpy(), expected_squared.numpy(), rtol=1e-9)


def test_cholesky_falls_back_to_the_eigenbasis_where_the_penalty_is_too_small_to_factor():
    x, y = random_problem(20, 50, 2, seed=3)
    acc = ExampleAccumulator(2).update(x, y)
    path = acc.solve([1e-300], factor="cholesky")  # G + l2 I is singular in float64: the centring direction
    assert path.dual_coef is None and path.eigvecs is not None
    torch.testing.assert_close(path.coef(), acc.solve([1e-300]).coef(), rtol=0, atol=0)


def test_dual_and_primal_accumulators_hold_the_same_ridge_path():
    x, y = random_problem(30, 80, 4, seed=21)
    x = x.reshape(30, 2, 40) + 3.0  # P = 2 probes of 40 features
    primal, dual = RidgeAccumulator(4), ExampleAccumulator(4)
    for start in range(0, 30, 7):
        primal.update(x[start : start + 7], y[start : start + 7])
        dual.update(x[start : start + 7], y[start : start + 7])
    torch.testing.assert_close(dual.feature_scale(), primal.feature_scale(), rtol=1e-12, atol=0)
    l2 = primal.feature_scale()[:, None] * torch.tensor([1e-6, 1e-2, 10.0], dtype=torch.float64)  # (P, L)
    p_path, d_path = primal.solve(l2), dual.solve(l2)
    assert d_path.basis().shape == (2, 40, 30) and p_path.basis().shape == (2, 40, 40)  # R = n against R = D
    # at l2 = 1e-6 of the scale the primal's 10 null directions carry rounding of 1e-16 / 1e-6: a 1e-10 difference
    torch.testing.assert_close(d_path.coef(), p_path.coef(), rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(d_path.intercept(), p_path.intercept(), rtol=1e-8, atol=1e-9)


def test_merged_example_accumulators_equal_one_over_all_batches():
    x, y = random_problem(40, 60, 3, seed=22)
    whole = ExampleAccumulator(3).update(x, y).solve([0.5])
    merged = ExampleAccumulator(3).update(x[:25], y[:25]).merge(ExampleAccumulator(3).update(x[25:], y[25:]))
    assert merged.count == 40 and merged.class_counts.tolist() == np.bincount(y, minlength=3).tolist()
    torch.testing.assert_close(merged.solve([0.5]).coef(), whole.coef(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n, d", [(40, 200), (150, 30)])
def test_dual_and_primal_fits_choose_the_same_l2_and_accuracies(seed, n, d):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    # 3 probes: informative, weakly informative with a large offset, unrelated to the labels
    signal = np.eye(4)[y] @ rng.normal(size=(4, d))
    x = np.stack(
        [signal + rng.normal(size=(n, d)), 0.3 * signal + rng.normal(size=(n, d)) + 100.0, rng.normal(size=(n, d))],
        axis=1,
    ).astype(np.float32)
    results = {
        space: fit_probes(batches_from(x, y, batch_size=16), y, seed=seed, space=space) for space in ("primal", "dual")
    }
    primal, dual = results["primal"], results["dual"]
    np.testing.assert_array_equal(dual.holdout_accuracy, primal.holdout_accuracy)
    np.testing.assert_array_equal(dual.l2_ratio, primal.l2_ratio)
    np.testing.assert_allclose(dual.l2, primal.l2, rtol=1e-10)
    np.testing.assert_array_equal(dual.test_accuracy, primal.test_accuracy)
    assert len(np.unique(primal.holdout_accuracy)) > 2  # the penalties make a difference to compare


def test_the_smaller_space_is_chosen_from_the_training_split_and_the_width(monkeypatch):
    assert type(new_accumulator(3, 25, 768)) is ExampleAccumulator
    assert type(new_accumulator(3, 768, 768)) is RidgeAccumulator
    assert type(new_accumulator(3, 25, 768, space="primal")) is RidgeAccumulator
    with pytest.raises(ValueError, match="space must be"):
        new_accumulator(3, 25, 768, space="gram")
    made = []
    monkeypatch.setattr(ridge, "new_accumulator", lambda *a, **kw: made.append(a) or new_accumulator(*a, **kw))
    for d in (30, 60):  # 50 images: a training split of 40
        x, y = random_problem(50, d, 2, seed=d)
        fit_probes(batches_from(x, y), y)
    assert [(n, d) for _, n, d, *_ in made] == [(40, 30), (40, 60)]


# ---------------------------------------------------------------------------------------------------------------
# Split and driver


def test_split_is_seeded_reproducible_and_disjoint():
    split = split_examples(103, seed=7)
    again = split_examples(103, seed=7)
    other = split_examples(103, seed=8)
    for part in ("fit", "holdout", "test"):
        np.testing.assert_array_equal(getattr(split, part), getattr(again, part))
    assert not np.array_equal(split.test, other.test)
    assert len(np.intersect1d(split.train, split.test)) == 0
    assert len(np.intersect1d(split.fit, split.holdout)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([split.fit, split.holdout, split.test])), np.arange(103))
    assert (len(split.test), len(split.holdout), len(split.fit)) == (21, 16, 66)  # 20% test, 20% of the rest held out
    assert split.mask("train").sum() == 82 and not (split.mask("train") & split.mask("test")).any()


@pytest.mark.parametrize("space", ["primal", "dual", "auto"])
@pytest.mark.parametrize("n, d", [(200, 60), (60, 150)])
@pytest.mark.parametrize("device", DEVICES)
def test_l2_selection_picks_the_best_holdout_accuracy_like_a_plain_loop(device, n, d, space):
    n_probes = 3
    rng = np.random.default_rng(9)
    _, y = random_problem(n, d, 3, seed=9)
    # each probe a noisy view of the labels, with many features so the penalty matters
    x = rng.normal(size=(n, n_probes, d)) + 0.6 * np.eye(3)[y][:, None, :].repeat(d // 3, axis=2) * [[1], [0.5], [2]]
    ratios = np.logspace(-4, 3, 8)
    result = fit_probes(batches_from(x, y), y, l2_ratios=ratios, seed=1, device=device, space=space)
    split = result.split

    for p in range(n_probes):
        xp = x[:, p]
        fit_scale = len(split.fit) * xp[split.fit].var(0).mean()  # trace of the centred X'X over D
        accuracy = [
            ridge_probe(xp[split.fit], y[split.fit], xp[split.holdout], y[split.holdout], r * fit_scale) for r in ratios
        ]
        np.testing.assert_allclose(result.holdout_accuracy[p], accuracy, rtol=0, atol=1e-12)
        # ties on accuracy go to the lowest squared error of the scores against the {-1, 1} targets
        targets = 2.0 * np.eye(3)[y] - 1.0
        error = [
            np.square(
                Ridge(alpha=r * fit_scale).fit(xp[split.fit], targets[split.fit]).predict(xp[split.holdout])
                - targets[split.holdout]
            ).sum()
            for r in ratios
        ]
        best = max(range(len(ratios)), key=lambda j: (accuracy[j], -error[j], j))
        assert result.l2_ratio[p] == ratios[best]

        train_scale = len(split.train) * xp[split.train].var(0).mean()
        assert result.l2[p] == pytest.approx(ratios[best] * train_scale, rel=1e-10)
        test_accuracy = ridge_probe(xp[split.train], y[split.train], xp[split.test], y[split.test], result.l2[p])
        assert result.test_accuracy[p] == pytest.approx(test_accuracy, abs=1e-12)
    assert len(np.unique(result.holdout_accuracy)) > 2  # the grid really changes the accuracy


def test_fit_probes_reads_every_example_once_and_reports_progress():
    x, y = random_problem(60, 5, 2, seed=10)
    reads, events = [], []
    fit_probes(batches_from(x, y, reads=reads), y, progress=lambda done, total: events.append((done, total)))
    assert len(reads) == 3
    np.testing.assert_array_equal(np.sum(reads, axis=0), np.ones(60))
    assert events[-1] == (60, 60) and all(a[0] < b[0] for a, b in zip(events, events[1:]))


def test_separable_classes_are_probed_perfectly_and_random_features_at_chance():
    rng = np.random.default_rng(11)
    n, d, k = 1500, 8, 4
    y = rng.integers(0, k, n)
    separable = 20.0 * np.eye(k, d)[y] + rng.normal(size=(n, d))  # class means 20 standard deviations apart
    unrelated = rng.normal(size=(n, d))  # the labels carry no information about these
    x = np.stack([separable, unrelated], axis=1).astype(np.float32)  # (n, P=2, D)
    result = fit_probes(batches_from(x, y, batch_size=128), y, seed=3)
    assert result.test_accuracy[0] == 1.0
    assert abs(result.test_accuracy[1] - 1 / k) < 0.07


# ---------------------------------------------------------------------------------------------------------------
# Errors a user can cause, and runner bugs


def test_a_single_class_in_the_training_split_is_a_user_error():
    x = np.random.default_rng(12).normal(size=(20, 3))
    with pytest.raises(VitseeError, match=r"1 class.*--shuffle-seed"):
        ridge_probe(x[:10], np.zeros(10, int), x[10:], np.ones(10, int), l2=1.0)
    y = np.zeros(20, int)
    y[split_examples(20, seed=0).test] = 1  # every example of class 1 lands in the test split
    with pytest.raises(VitseeError, match=r"train split has 1 class\(es\) among 16 images"):
        fit_probes(batches_from(x, y), y, seed=0)


@pytest.mark.parametrize("l2", [0.0, -1.0, float("nan")])
def test_a_non_positive_l2_is_a_user_error(l2):
    x, y = random_problem(20, 3, 2)
    with pytest.raises(VitseeError, match="l2="):
        ridge_probe(x, y, x, y, l2)
    with pytest.raises(VitseeError, match="l2="):
        RidgeAccumulator(2).update(x, y).solve([l2])


def test_probing_unlabelled_images_is_a_user_error():
    x = np.zeros((30, 2))
    with pytest.raises(VitseeError, match="label -1 marks unlabelled images"):
        fit_probes(batches_from(x, np.full(30, -1)), np.full(30, -1))


def test_too_few_images_to_split_is_a_user_error():
    with pytest.raises(VitseeError, match="3 images are too few"):
        split_examples(3)


def test_batches_that_ignore_the_mask_are_a_bug_not_a_user_error():
    x, y = random_problem(40, 4, 2, seed=13)

    def every_example(mask):
        yield x, y

    with pytest.raises(ValueError, match="batches yielded 40 fit examples"):
        fit_probes(every_example, y)


def test_ties_on_held_out_accuracy_go_to_the_lowest_squared_error_then_the_larger_penalty():
    from vitsee.analyses.ridge import best_ratio

    accuracy = np.array([[0.5, 0.5, 0.5, 0.25], [0.0, 0.0, 0.0, 0.0], [0.1, 0.2, 0.2, 0.1]])
    error = np.array([[3.0, 1.0, 2.0, 0.5], [4.0, 4.0, 4.0, 4.0], [1.0, 9.0, 9.0, 1.0]])
    assert best_ratio(accuracy, error).tolist() == [1, 3, 2]
    # against the plain per-probe rule on many small grids full of ties
    rng = np.random.default_rng(0)
    accuracy, error = rng.integers(0, 4, (500, 6)) / 4, rng.integers(0, 3, (500, 6)).astype(float)
    for p, best in enumerate(best_ratio(accuracy, error)):
        tied = np.flatnonzero(accuracy[p] == accuracy[p].max())
        assert best == tied[error[p, tied] == error[p, tied].min()].max()


# ---------------------------------------------------------------------------------------------------------------
# What a fit is expected to cost


def test_probe_flops_count_the_smaller_space_and_grow_with_the_probes():
    from vitsee.analyses.ridge import EIGH_FLOPS_PER_N3, VALUE_FLOPS, probe_flops

    n, d, p, k = 100, 768, 197, 10
    primal, dual = probe_flops(n, d, p, k, space="primal"), probe_flops(n, d, p, k, space="dual")
    assert probe_flops(n, d, p, k) == dual < primal / 10  # 80 training images of 768 channels: the Gram
    # by hand, 10 images of 4 features, 2 classes, 12 penalties: 6.4 fit, 1.6 holdout, 2 test on average
    x_x, eigh = 2 * 8 * 4 * 4, 2 * EIGH_FLOPS_PER_N3 * 4**3
    scores = 2 * 3.6 * 4 * 4 + 2 * (12 * 1.6 + 2) * 4 * 2  # centred x in the basis, then each penalty's scores
    assert probe_flops(10, 4, 1, 2, space="primal") == pytest.approx(x_x + eigh + scores + VALUE_FLOPS * 10 * 4)
    grams, eigh = 4 * (6.4**2 + 8**2) * 4, EIGH_FLOPS_PER_N3 * (6.4**3 + 8**3)
    scores = 2 * 3.6 * 4 * 8 + 2 * (12 * 1.6 + 2) * 8 * 2
    assert probe_flops(10, 4, 1, 2, space="dual") == pytest.approx(grams + eigh + scores + VALUE_FLOPS * 10 * 4)
    assert probe_flops(n, d, 2 * p, k) == pytest.approx(2 * probe_flops(n, d, p, k))
    assert probe_flops(10_000, d, p, k) == probe_flops(10_000, d, p, k, space="primal")  # 8,000 > 768


def test_the_warning_before_a_long_probe_job_names_the_ways_to_narrow_it(tiny_store, tmp_path, monkeypatch):
    import shutil

    from conftest import VIT
    from vitsee.analyses.probes import estimate_probe_seconds, probe_warning, run_probes
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    path = tmp_path / "copy.h5"
    shutil.copy(tiny_store, path)
    cfg = AnalyzeConfig(device="cpu")
    monkeypatch.setattr(probes, "matmul_flops_per_s", lambda device="cpu": 1e6)  # a very slow machine
    with Store.writer(path) as store:
        seconds = estimate_probe_seconds(store, VIT, cfg)
        widest = max(
            store.layer_shape(store.resolve_model(VIT), layer)[-1] for layer in store.layers(store.resolve_model(VIT))
        )
        warning = probe_warning(store, VIT, cfg)
        assert seconds > 60 and warning is not None and "\n" not in warning
        assert f"about {seconds / 60:.0f} min" in warning
        assert f"--probe-max-dim {widest // 2}" in warning and "--layers" in warning and "x cancels" in warning
        assert probe_warning(store, VIT, cfg, limit_s=2 * seconds) is None
        monkeypatch.setattr(probes, "matmul_flops_per_s", lambda device="cpu": 1e15)
        assert probe_warning(store, VIT, cfg) is None
        monkeypatch.setattr(probes, "matmul_flops_per_s", lambda device="cpu": 1e6)
        run_probes(store, VIT, AnalyzeConfig(device="cpu", probe_tokens=False))
        assert probe_warning(store, VIT, AnalyzeConfig(device="cpu", probe_tokens=False)) is None  # cached: no work


def test_run_probes_gives_each_readout_what_a_fit_of_that_readout_alone_gives(tiny_store, tmp_path):
    """One fit per layer serves CLS, GAP and every token: the same choice and accuracy as fitting each apart."""
    import shutil

    from conftest import VIT
    from vitsee.analyses.probes import run_probes
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    path = tmp_path / "copy.h5"
    shutil.copy(tiny_store, path)
    events = []
    with Store.writer(path) as store:
        key = store.resolve_model(VIT)
        result = run_probes(store, VIT, AnalyzeConfig(device="cpu", recompute=True), progress=events.append)
        labels, layers = store.labels, store.layers(key)
        acts = {layer: store.layer_dataset(key, layer)[:].astype(np.float32) for layer in ("blocks.1", "blocks.4")}
    for layer, a in acts.items():
        li = layers.index(layer)
        readouts = {"cls": a[:, 0], "gap": a[:, 1:].mean(axis=1), "tokens": a}  # one CLS token leads
        alone = {
            name: fit_probes(batches_from(x, labels, batch_size=16), labels, seed=0) for name, x in readouts.items()
        }
        for col, name in enumerate(("cls", "gap")):
            assert result["accuracy"][li, col] == alone[name].test_accuracy[0]
            np.testing.assert_allclose(result["l2"][li, col], alone[name].l2[0], rtol=1e-12)
        np.testing.assert_array_equal(result[f"tokens/{layer}"], alone["tokens"].test_accuracy)
    # progress in images read, per layer and per part (fit, holdout, test), ending at layers x images
    assert events[-1].done == events[-1].total == len(layers) * len(labels)
    assert len(events) >= 3 * len(layers) and all(a.done <= b.done for a, b in zip(events, events[1:]))


@pytest.mark.parametrize("seed", range(3))
def test_dual_fit_on_ill_conditioned_features_chooses_what_the_primal_fit_chooses(seed):
    """Features of rank 3 plus 1e-3 noise, on an offset of 1e3: eigenvalues spread over 1e12, where the grid's
    smallest penalties act; the dual fit (kernel centring, scored products reused) must still agree."""
    rng = np.random.default_rng(seed)
    n, d = 40, 120
    y = rng.integers(0, 3, n)
    low_rank = (np.eye(3)[y] + 0.5 * rng.normal(size=(n, 3))) @ rng.normal(size=(3, d))
    x = (low_rank + 1e-3 * rng.normal(size=(n, d)) + 1e3).astype(np.float32)[:, None, :]
    primal, dual = (fit_probes(batches_from(x, y, batch_size=8), y, seed=seed, space=s) for s in ("primal", "dual"))
    assert len(np.unique(primal.holdout_accuracy)) > 1  # the penalties make a difference to compare
    np.testing.assert_array_equal(dual.holdout_accuracy, primal.holdout_accuracy)
    np.testing.assert_array_equal(dual.l2_ratio, primal.l2_ratio)
    np.testing.assert_array_equal(dual.test_accuracy, primal.test_accuracy)


def test_the_float32_read_of_fp16_activations_is_numpys_exact_cast():
    bits = np.arange(2**16, dtype=np.uint16).view(np.float16).reshape(2, 128, 256)  # every fp16: subnormals, inf, nan
    assert np.isfinite(bits).sum() == 65536 - 2048  # all but the 2 x 1024 infinities and NaNs
    slot = np.empty((2, 130, 256), dtype=np.float32)[:, 2:]  # where a batch keeps its tokens, after CLS and GAP
    cases = [
        (bits, None),
        (bits[:, ::2], None),
        (bits.astype(np.float32), None),
        (bits, slot),
        (bits[:, ::2], slot[:, ::2]),
    ]
    for a, out in cases:  # contiguous, strided, already float32; into a new array or into a strided slot
        got, expected = probes._float32(a, out=out), a.astype(np.float32)
        assert out is None or np.shares_memory(got, out)
        assert got.dtype == np.float32 and got.shape == a.shape
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))  # bit for bit
        np.testing.assert_array_equal(got, expected)  # NaN where NaN (torch may quieten a signalling NaN's payload)


def test_a_batch_of_eigenproblems_split_over_threads_decomposes_as_one_call(monkeypatch):
    rng = np.random.default_rng(5)
    a = torch.as_tensor(rng.normal(size=(70, 21, 30)))
    grams = a @ a.mT  # (70, 21, 21) symmetric, rank-deficient like a centred Gram
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # three shares of 24, 24, 22 matrices
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    pools = []
    monkeypatch.setattr(ridge, "ThreadPoolExecutor", lambda n, **kw: pools.append(n) or ThreadPoolExecutor(n, **kw))
    monkeypatch.setattr(ridge, "_COMPUTE_POOLS", {})
    ridge._eigh(grams[:40])
    eigvals, eigvecs = ridge._eigh(grams)
    assert pools == [3]  # it did split, and the second call reused the pool the first one started
    whole_vals, whole_vecs = torch.linalg.eigh(grams)  # the batch in one call, as before the split
    assert torch.equal(eigvals, whole_vals) and torch.equal(eigvecs, whole_vecs)
    np.testing.assert_allclose((eigvecs * eigvals[:, None]) @ eigvecs.mT, grams, atol=1e-10)


@pytest.mark.parametrize("m, n", [(21, 21), (6, 26), (5, 5)])
def test_the_example_products_equal_a_numpy_fp64_reference(m, n):
    rng = np.random.default_rng(m * n)
    a, b = rng.normal(size=(7, m, 300)) + 40.0, rng.normal(size=(7, n, 300)) + 40.0
    got = ridge._products(torch.as_tensor(a), torch.as_tensor(b))
    assert got.dtype == torch.float64 and got.shape == (7, m, n)
    expected = np.einsum("pid,pjd->pij", a, b)  # every product summed straight, no BLAS
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("space", ["dual", "primal"])
def test_penalties_scored_in_chunks_match_one_at_a_time_and_a_numpy_ridge(monkeypatch, space):
    rng = np.random.default_rng(11)
    n, d, p, k = 14, 9 if space == "primal" else 30, 3, 3
    x, y = rng.normal(size=(n, p, d)) + 5.0, np.arange(n) % k
    query = rng.normal(size=(4, p, d)) + 5.0
    l2 = np.logspace(-3, 3, 7)
    path = ridge.new_accumulator(k, n, d, space=space).update(x, y).solve(l2)
    z_values = p * len(query) * (n if space == "dual" else d)
    one_at_a_time = []
    for chunk in (1, 3, 7):  # 1: penalty by penalty, as before; 3: chunks of 3, 3, 1; 7: all at once
        monkeypatch.setattr(ridge, "SCORE_CHUNK_VALUES", chunk * z_values)
        scores = [s.clone() for s in path._scores(query)]
        assert len(scores) == len(l2)
        if chunk == 1:
            one_at_a_time = scores
        assert all(torch.equal(a, b) for a, b in zip(scores, one_at_a_time))  # the same numbers, bit for bit
    targets = 2.0 * np.eye(k)[y] - 1.0
    for j, penalty in enumerate(l2):  # straightforward fp64 ridge per probe: centred, dual solve, intercept
        for q in range(p):
            xc, yc = x[:, q] - x[:, q].mean(0), targets - targets.mean(0)
            w = xc.T @ np.linalg.solve(xc @ xc.T + penalty * np.eye(n), yc)
            expected = (query[:, q] - x[:, q].mean(0)) @ w + targets.mean(0)
            np.testing.assert_allclose(one_at_a_time[j][q].numpy(), expected, rtol=1e-9, atol=1e-10)


def test_products_split_over_threads_equal_one_call_and_a_numpy_reference(monkeypatch):
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(37, 21, 200)) + 40.0, rng.normal(size=(37, 6, 200)) + 40.0
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    whole = ridge._products(torch.as_tensor(a), torch.as_tensor(b))  # one call, as before the split
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # three shares of 13, 13, 11 probes
    calls = []
    monkeypatch.setattr(ridge, "_compute_pool", lambda n: calls.append(n) or ThreadPoolExecutor(n))
    split = ridge._products(torch.as_tensor(a), torch.as_tensor(b))
    if ridge.blas_controller() is not None:
        assert calls == [3]  # it did split
    assert torch.equal(split, whole)
    np.testing.assert_allclose(split.numpy(), np.einsum("pid,pjd->pij", a, b), rtol=1e-13, atol=0)


def test_fits_sharing_a_workspace_reuse_its_buffers_and_score_what_fresh_ones_do():
    rng = np.random.default_rng(8)
    labels = np.arange(40) % 4
    layers = [rng.normal(size=(40, 3, 90)) + 10.0 * i for i in range(3)]  # dual: 32 training images < 90

    def batches_of(x):
        return lambda mask: ((x[r], labels[r]) for r in np.array_split(np.flatnonzero(mask), 2) if len(r))

    workspace = ridge.Workspace()
    for i, x in enumerate(layers):
        shared = fit_probes(batches_of(x), labels, seed=1, workspace=workspace)
        if i == 0:
            first = {k: [b.data_ptr() for b in v] for k, v in workspace.taken.items()}
        fresh = fit_probes(batches_of(x), labels, seed=1)
        for field in ("holdout_accuracy", "l2_ratio", "l2", "test_accuracy"):
            np.testing.assert_array_equal(getattr(shared, field), getattr(fresh, field))
    # two blocks each of the fit, the holdout and the test part (the float64 copy scored), of the same shapes
    # each time: the same six buffers
    assert {k: [b.data_ptr() for b in v] for k, v in workspace.taken.items()} == first
    assert sum(len(v) for v in first.values()) == 6


# ---------------------------------------------------------------------------------------------------------------
# Layers fitted side by side


def _run_probes_arrays(path, model, threads, workers=None, **kwargs):
    """Return run_probes' arrays (recomputed) on the store at path with torch at `threads` threads, and the
    worker counts _fit_layers was called with (also appended to `workers` where given)."""
    from vitsee.analyses.probes import run_probes
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    from vitsee import threads as threads_mod

    before, workers = (torch.get_num_threads(), list(threads_mod._TASK_WORKERS)), [] if workers is None else workers
    real = probes._fit_layers
    threads_mod.set_compute_threads(threads)  # as `vitsee analyze --threads N`: N threads, N task workers
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(probes, "_fit_layers", lambda fit, n, w, report: (workers.append(w), real(fit, n, w, report))[1])
            with Store.writer(path) as store:
                result = run_probes(store, model, AnalyzeConfig(device="cpu", recompute=True), **kwargs)
        assert torch.get_num_threads() == threads  # the workers' one thread each is undone
    finally:
        torch.set_num_threads(before[0])
        threads_mod._TASK_WORKERS[:] = before[1]
    return {k: np.asarray(v) for k, v in result.items() if not k.startswith("_")}, workers


def test_layers_fitted_side_by_side_give_what_one_at_a_time_gives_bit_for_bit(tiny_store, tmp_path):
    import shutil

    from conftest import RESNET, VIT

    path = tmp_path / "copy.h5"
    shutil.copy(tiny_store, path)
    for model in (VIT, RESNET):
        alone, one = _run_probes_arrays(path, model, threads=1)
        side_by_side, two = _run_probes_arrays(path, model, threads=2)
        assert one == [1] and two == [2]
        assert alone.keys() == side_by_side.keys() and any(k.startswith("tokens/") for k in alone) == (model == VIT)
        for key, value in alone.items():
            assert value.dtype == side_by_side[key].dtype and value.tobytes() == side_by_side[key].tobytes(), key


def test_a_run_cancelled_from_its_progress_stops_every_layer_and_saves_nothing(tiny_store, tmp_path, monkeypatch):
    """The app cancels by raising from the progress callback: with layers on two workers the callback still
    runs on the caller's thread, the run stops within a batch and no worker thread outlives it."""
    import shutil
    import threading

    from conftest import VIT
    from vitsee.analyses.probes import probe_params
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    class Stop(Exception):
        pass

    path = tmp_path / "copy.h5"
    shutil.copy(tiny_store, path)
    with Store.open(path) as store:
        n_images, n_layers = store.n_images, len(store.layers(store.resolve_model(VIT)))
    caller, threads_seen, started, workers = threading.get_ident(), set(), [], []
    real_fit = probes.fit_probes
    monkeypatch.setattr(probes, "fit_probes", lambda *a, **k: (started.append(1), real_fit(*a, **k))[1])

    def progress(step):
        threads_seen.add(threading.get_ident())
        if step.done > n_images:  # past the first layer's worth of images
            raise Stop()

    with pytest.raises(Stop):
        _run_probes_arrays(path, VIT, threads=2, workers=workers, progress=progress)
    assert workers == [2] and threads_seen == {caller}
    assert 2 <= len(started) < n_layers  # two fits ran at once; the rest never started
    assert not [t for t in threading.enumerate() if t.name.startswith("vitsee-probe-layers")]
    with Store.open(path) as store:
        assert (
            store.get_result("probes", probe_params(store, store.resolve_model(VIT), AnalyzeConfig(device="cpu")))
            is None
        )


def test_a_layer_whose_fit_fails_fails_the_run_with_its_own_error(tiny_store, tmp_path, monkeypatch):
    import shutil

    from conftest import VIT

    path = tmp_path / "copy.h5"
    shutil.copy(tiny_store, path)
    calls, real_fit = [], probes.fit_probes

    def fit_or_fail(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise VitseeError("the third layer failed")
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(probes, "fit_probes", fit_or_fail)
    with pytest.raises(VitseeError, match="the third layer failed"):
        _run_probes_arrays(path, VIT, threads=2)


def test_layers_go_side_by_side_only_on_cpu_with_threads_to_spare_and_fits_that_fit_in_memory(monkeypatch):
    from vitsee import threads

    small, big = 40e6, probes.PARALLEL_FIT_BYTES + 1
    monkeypatch.setattr(threads, "task_workers", lambda: 2)
    assert probes._layer_workers("cpu", [small] * 14) == 2
    assert probes._layer_workers("cpu", [small] * 13 + [big]) == 1  # (197, 768, 768) X'X of a primal token fit
    assert probes._layer_workers("cpu", [small]) == 1
    assert probes._layer_workers("cuda", [small] * 14) == 1
    monkeypatch.setattr(threads, "task_workers", lambda: 4)
    assert probes._layer_workers("cpu", [small] * 3) == 3
    monkeypatch.setattr(threads, "task_workers", lambda: 1)
    assert probes._layer_workers("cpu", [small] * 14) == 1
    # what a fit holds: 1,000 images of a 197 x 768 token layer go primal, 32 dual
    ds = np.zeros((1000, 197, 768), dtype=np.float16)
    assert probes._fit_bytes(ds, 1000, 197, 768) > probes.PARALLEL_FIT_BYTES
    assert probes._fit_bytes(ds[:32], 32, 197, 768) < probes.PARALLEL_FIT_BYTES

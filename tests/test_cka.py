"""CKA (Raghu et al. 2021, Fig. 1-2): vitsee's fast all-pairs estimator against the formulas written out plainly.

The references here are deliberately naive numpy float64: Grams of the raw (uncentred) features, Song et al.'s
unbiased HSIC term by term with explicit ones vectors, one layer pair at a time.
"""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from vitsee.analyses.cka import (
    MinibatchCKA,
    SHIFT_ROWS,
    full_fp32_matmul,
    gram,
    linear_cka,
    minibatch_cka,
    u_centre,
    unbiased_hsic,
)
from vitsee.errors import VitseeError


# ----------------------------------------------------------------------------------------------------------------
# Plain references


def song_hsic(k: np.ndarray, l: np.ndarray) -> float:
    """Song et al. 2012: [tr(Kt Lt) + 1'Kt1 1'Lt1 / ((m-1)(m-2)) - 2/(m-2) 1'Kt Lt 1] / (m(m-3))."""
    m = k.shape[0]
    kt, lt = k.copy(), l.copy()
    np.fill_diagonal(kt, 0.0)
    np.fill_diagonal(lt, 0.0)
    one = np.ones(m)
    return (
        np.trace(kt @ lt)
        + (one @ kt @ one) * (one @ lt @ one) / ((m - 1) * (m - 2))
        - 2.0 / (m - 2) * (one @ kt @ lt @ one)
    ) / (m * (m - 3))


def reference_minibatch_cka(layers_a, layers_b, batch_size: int) -> np.ndarray:
    """CKA_ij = sum_b HSIC(K_ib, L_jb) / sqrt(sum_b HSIC(K_ib, K_ib) sum_b HSIC(L_jb, L_jb)), pair by pair."""
    flat_a = [np.asarray(x, dtype=np.float64).reshape(len(x), -1) for x in layers_a]
    flat_b = [np.asarray(y, dtype=np.float64).reshape(len(y), -1) for y in layers_b]
    n = flat_a[0].shape[0]
    out = np.zeros((len(flat_a), len(flat_b)))
    for i, x in enumerate(flat_a):
        for j, y in enumerate(flat_b):
            xy = xx = yy = 0.0
            for s in range(0, n, batch_size):
                xb, yb = x[s : s + batch_size], y[s : s + batch_size]
                if len(xb) < 4:
                    continue
                k, l = xb @ xb.T, yb @ yb.T
                xy, xx, yy = xy + song_hsic(k, l), xx + song_hsic(k, k), yy + song_hsic(l, l)
            out[i, j] = xy / np.sqrt(xx * yy)
    return out


def feature_space_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al. 2019: ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F) on features centred over examples."""
    x = x.reshape(len(x), -1).astype(np.float64)
    y = y.reshape(len(y), -1).astype(np.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def layers(rng: np.random.Generator, n: int, shapes, dtype=np.float32):
    """Correlated layers: each one a random linear map of a shared signal plus its own noise."""
    signal = rng.standard_normal((n, 8))
    out = []
    for shape in shapes:
        d = int(np.prod(shape))
        x = signal @ rng.standard_normal((8, d)) + 0.7 * rng.standard_normal((n, d))
        out.append(x.reshape(n, *shape).astype(dtype))
    return out


SHAPES = [(3, 4), (10,), (2, 2, 2), (5, 6)]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ----------------------------------------------------------------------------------------------------------------
# The pieces


def test_u_centred_inner_product_is_songs_unbiased_hsic(rng):
    x, y = rng.standard_normal((9, 5)), rng.standard_normal((9, 7))
    k, l = x @ x.T, y @ y.T
    kt, lt = torch.from_numpy(k), torch.from_numpy(l)
    via_u = float((u_centre(kt) * u_centre(lt)).sum()) / (9 * 6)
    assert via_u == pytest.approx(song_hsic(k, l), rel=1e-12)
    assert unbiased_hsic(kt, lt) == pytest.approx(song_hsic(k, l), rel=1e-12)


def test_u_centred_gram_has_zero_diagonal_and_zero_row_sums(rng):
    x = torch.from_numpy(rng.standard_normal((8, 3)))
    u = u_centre(x @ x.T)
    assert torch.all(u.diagonal() == 0)
    assert torch.allclose(u.sum(dim=0), torch.zeros(8, dtype=torch.float64), atol=1e-12)


def test_gram_is_x_times_x_transposed(rng):
    x = torch.from_numpy(rng.standard_normal((257, 30)))  # big enough for the block route, odd split
    k = gram(x)
    assert torch.allclose(k, x @ x.T, rtol=1e-12, atol=1e-12)
    assert torch.equal(k[128:, :128], k[:128, 128:].T)  # the mirrored block
    assert torch.allclose(gram(x[:20]), x[:20] @ x[:20].T, rtol=1e-12, atol=1e-12)  # small: one product


@pytest.mark.parametrize("n, dx, dy", [(20, 60, 40), (200, 6, 9)], ids=["fewer-examples", "fewer-features"])
def test_linear_cka_matches_the_feature_space_formula(rng, n, dx, dy):
    x = rng.standard_normal((n, dx))
    y = x[:, : min(dx, dy)] @ rng.standard_normal((min(dx, dy), dy)) + rng.standard_normal((n, dy))
    assert linear_cka(x, y) == pytest.approx(feature_space_cka(x, y), rel=1e-10)
    assert linear_cka(torch.from_numpy(x).float(), y) == pytest.approx(feature_space_cka(x, y), rel=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Minibatch CKA against the per-pair loop


@pytest.mark.parametrize("batch, batches", [(16, 3), (256, 2)], ids=["one-product-grams", "block-grams"])
def test_minibatch_cka_matches_per_pair_song_loop_with_a_short_last_batch(rng, batch, batches):
    feats = layers(rng, batches * batch + 5, SHAPES)  # full batches, then one of 5
    got = minibatch_cka(feats, batch_size=batch)
    assert np.abs(got - reference_minibatch_cka(feats, feats, batch)).max() < 1e-6


def test_last_batch_of_three_is_dropped_with_a_warning(rng):
    feats = layers(rng, 2 * 16 + 3, SHAPES)
    with pytest.warns(UserWarning, match="batch of 3 examples.*at least 4"):
        got = minibatch_cka(feats, batch_size=16)
    assert np.abs(got - reference_minibatch_cka([f[:32] for f in feats], [f[:32] for f in feats], 16)).max() < 1e-6


def test_cross_model_matrix_is_the_block_of_the_joint_matrix(rng):
    feats = layers(rng, 64, SHAPES + [(7,), (2, 9)])
    a, b = feats[:4], feats[4:]
    joint = minibatch_cka(feats, batch_size=16)
    cross = minibatch_cka(a, b, batch_size=16)
    assert cross.shape == (4, 2)
    assert np.abs(cross - joint[:4, 4:]).max() < 1e-12
    assert np.abs(cross - reference_minibatch_cka(a, b, 16)).max() < 1e-6


def test_within_model_matrix_is_symmetric_with_unit_diagonal(rng):
    got = minibatch_cka(layers(rng, 48, SHAPES), batch_size=16)
    assert np.abs(got - got.T).max() < 1e-12
    assert np.abs(np.diag(got) - 1).max() < 1e-12


def test_batch_stream_gives_the_same_matrix_as_layer_arrays(rng):
    feats = layers(rng, 40, SHAPES)
    stream = ([f[s : s + 10] for f in feats] for s in range(0, 40, 10))
    assert np.abs(minibatch_cka(stream) - minibatch_cka(feats, batch_size=10)).max() < 1e-12


def test_torch_inputs_give_the_same_matrix_as_numpy_inputs(rng):
    feats = layers(rng, 40, SHAPES)
    as_torch = [torch.from_numpy(f) for f in feats]
    assert np.abs(minibatch_cka(as_torch, batch_size=10) - minibatch_cka(feats, batch_size=10)).max() < 1e-12


# ----------------------------------------------------------------------------------------------------------------
# What CKA is invariant to, and what it is not


def test_cka_of_a_layer_with_itself_is_one(rng):
    (x,) = layers(rng, 64, [(4, 5)])
    assert minibatch_cka([x], [x], batch_size=16)[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_is_invariant_to_an_orthogonal_transform(rng):
    (x,) = layers(rng, 64, [(20,)])
    q, _ = np.linalg.qr(rng.standard_normal((20, 20)))
    assert minibatch_cka([x], [x @ q], batch_size=16)[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-6)


def test_cka_is_invariant_to_isotropic_scaling(rng):
    (x,) = layers(rng, 64, [(3, 5)])
    assert minibatch_cka([x], [x * 37.5], batch_size=16)[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert linear_cka(x, x * 0.01) == pytest.approx(1.0, abs=1e-9)


def test_cka_is_not_invariant_to_an_anisotropic_scaling(rng):
    (x,) = layers(rng, 64, [(10,)])
    stretched = x * np.array([100.0] + [1.0] * 9, dtype=np.float32)
    assert minibatch_cka([x], [stretched], batch_size=16)[0, 0] < 0.9


def test_cka_of_independent_noise_is_near_zero_and_can_be_negative(rng):
    noise = [rng.standard_normal((2048, 32)).astype(np.float32) for _ in range(6)]
    cross = minibatch_cka(noise[:3], noise[3:], batch_size=256)
    assert np.abs(cross).max() < 0.02
    assert cross.min() < 0  # the unbiased estimate is not clamped to [0, 1]


def test_an_offset_of_300_on_every_unit_leaves_cka_unchanged_in_fp32(rng):
    feats = layers(rng, 96, [(197, 8), (16, 7, 7), (64,)])
    shifted = [f + np.float32(300.0) for f in feats]
    plain = minibatch_cka(feats, batch_size=32)
    offset = minibatch_cka(shifted, batch_size=32)
    assert np.abs(offset - plain).max() < 1e-6
    assert np.abs(offset - reference_minibatch_cka(shifted, shifted, 32)).max() < 1e-6


def test_batches_whose_first_rows_are_atypical_stay_accurate_under_a_large_offset(rng):
    # Each batch is shifted by the mean of its first SHIFT_ROWS rows, not the mean of all: when those rows form
    # their own cluster (a store sorted by class) the shift is off by the cluster's distance, and the fp32 Gram
    # must still hold CKA to 1e-6 of the fp64 reference.
    feats = layers(rng, 128, [(197, 8), (16, 7, 7), (64,)])
    for f in feats:
        for s in range(0, 128, 64):
            f[s : s + SHIFT_ROWS] += np.float32(3.0)
        f += np.float32(300.0)
    got = minibatch_cka(feats, batch_size=64)
    assert np.abs(got - reference_minibatch_cka(feats, feats, 64)).max() < 1e-6


def test_float16_features_work(rng):
    feats = layers(rng, 48, SHAPES, dtype=np.float16)
    got = minibatch_cka(feats, batch_size=16)
    assert got.dtype == np.float64
    assert np.abs(got - reference_minibatch_cka(feats, feats, 16)).max() < 1e-6
    half = [torch.from_numpy(f) for f in feats]
    assert np.abs(minibatch_cka(half, batch_size=16) - got).max() < 1e-12


# ----------------------------------------------------------------------------------------------------------------
# The accumulator's state


def test_merged_accumulators_equal_one_pass_whatever_the_split(rng):
    feats = layers(rng, 64, SHAPES)
    batches = [[f[s : s + 16] for f in feats] for s in range(0, 64, 16)]
    one = MinibatchCKA(len(feats))
    for b in batches:
        one.update(b)
    even, odd = MinibatchCKA(len(feats)), MinibatchCKA(len(feats))
    for i, b in enumerate(batches):
        (even if i % 2 == 0 else odd).update(b)
    even.merge(odd.state)
    assert even.batches == one.batches == 4
    assert np.abs(even.result() - one.result()).max() < 1e-12


def test_cross_only_accumulator_matches_the_joint_matrix_where_it_computes(rng):
    feats = layers(rng, 48, SHAPES + [(7,)])
    joint, cross = MinibatchCKA(5), MinibatchCKA(5, cross_at=2)
    for s in range(0, 48, 16):
        joint.update([f[s : s + 16] for f in feats])
        cross.update([f[s : s + 16] for f in feats])
    full, part = joint.result(), cross.result()
    assert np.abs(part[:2, 2:] - full[:2, 2:]).max() < 1e-12
    assert np.abs(part[2:, :2] - full[2:, :2]).max() < 1e-12
    assert np.abs(np.diag(part) - 1).max() < 1e-12
    assert np.isnan(part[0, 1]) and np.isnan(part[3, 4])
    assert np.array_equal(cross.result(), part, equal_nan=True)  # result() leaves the state alone


def test_cross_at_must_split_the_layers(rng):
    with pytest.raises(VitseeError, match="cross_at=4"):
        MinibatchCKA(4, cross_at=4)


def test_a_too_small_batch_is_skipped_and_not_counted(rng):
    feats = layers(rng, 3, SHAPES)
    acc = MinibatchCKA(len(feats))
    with pytest.warns(UserWarning, match="at least 4"):
        acc.update(feats)
    assert acc.batches == 0
    with pytest.raises(VitseeError, match="no batch"):
        acc.result()


def test_fp32_matmul_settings_are_restored(rng):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with full_fp32_matmul():
            assert torch.get_float32_matmul_precision() == "highest"
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_fp32_matmul_speaks_the_newer_precision_api_when_the_process_uses_it():
    # Mixing the legacy and newer TF32 switches raises in PyTorch, and would poison this process: use a child.
    code = (
        "import torch, numpy as np\n"
        "from vitsee.analyses.cka import minibatch_cka, full_fp32_matmul\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "torch.backends.mkldnn.matmul.fp32_precision = 'bf16'\n"
        "with full_fp32_matmul():\n"
        "    assert torch.backends.cuda.matmul.fp32_precision == 'ieee'\n"
        "    assert torch.backends.mkldnn.matmul.fp32_precision == 'ieee'\n"
        "x = np.random.default_rng(0).standard_normal((64, 10)).astype(np.float32)\n"
        "assert abs(minibatch_cka([x], [2 * x], batch_size=32)[0, 0] - 1) < 1e-6\n"
        "assert torch.backends.cuda.matmul.fp32_precision == 'tf32'\n"
        "assert torch.backends.mkldnn.matmul.fp32_precision == 'bf16'\n"
    )
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("this PyTorch has only the legacy switches")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# ----------------------------------------------------------------------------------------------------------------
# Mistakes a user can make


def test_wrong_number_of_layers_names_both_counts(rng):
    acc = MinibatchCKA(3)
    with pytest.raises(VitseeError, match="got 2 layers.*made for 3"):
        acc.update(layers(rng, 8, SHAPES[:2]))


def test_different_numbers_of_images_are_refused(rng):
    a, b = layers(rng, 40, SHAPES[:1]), layers(rng, 32, SHAPES[:1])
    with pytest.raises(VitseeError, match="40 examples.*32"):
        minibatch_cka(a, b, batch_size=16)


def test_batch_size_under_four_is_refused(rng):
    with pytest.raises(VitseeError, match="batch_size=3"):
        minibatch_cka(layers(rng, 16, SHAPES), batch_size=3)


def test_non_finite_activations_name_the_layer(rng):
    feats = layers(rng, 16, SHAPES)
    feats[2][5] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(VitseeError, match=r"layers \[2\].*nan/inf"):
            minibatch_cka(feats, batch_size=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_the_reference(rng):
    feats = layers(rng, 3 * 64 + 5, [(197, 12), (16, 7, 7), (64,)])
    shifted = [f + np.float32(300.0) for f in feats]
    got = minibatch_cka(shifted, batch_size=64, device="cuda")
    assert np.abs(got - reference_minibatch_cka(shifted, shifted, 64)).max() < 1e-6


class _InOrder:
    """A layer's batch read when asked for, from a queue shared by every layer, like the store's prefetch:
    read out of layer order, a layer would get another's features."""

    def __init__(self, queue: list, shape: tuple):
        self.queue, self.shape = queue, shape

    def __array__(self, dtype=None, copy=None):
        return self.queue.pop(0)


@pytest.mark.parametrize("cross_at", [None, 3])
def test_layer_grams_built_on_workers_give_the_one_thread_state_bit_for_bit(rng, monkeypatch, cross_at):
    from vitsee import threads
    from vitsee.analyses import cka

    monkeypatch.setattr(cka, "GRAM_WORKERS_MIN_VALUES", 0)  # these small layers on the workers too

    shapes = [(17, 24), (9, 9, 5), (300,), (4, 50), (8, 8), (64,)]  # sizes in no order: workers finish out of turn
    batches = [[rng.normal(size=(32, *s)).astype(np.float32) + 5 for s in shapes] for _ in range(3)]
    batches[1][2] = batches[1][2].astype(np.float16)  # store activations
    batches[2][0] = torch.as_tensor(batches[2][0])

    def state(workers):
        monkeypatch.setattr(threads, "task_workers", lambda: workers)
        acc = MinibatchCKA(len(shapes), cross_at=cross_at, batch_slots=3, permutations=2)
        for b, feats in enumerate(batches):
            queue = [np.asarray(f) for f in feats] if b == 1 else []
            acc.update([_InOrder(queue, f.shape) for f in feats] if b == 1 else feats)  # batch 1 read lazily, in order
            assert not queue
        return acc, acc.state.clone()

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one, expected = state(1)
        several, got = state(3)
    finally:
        torch.set_num_threads(before)
    assert len(one._spare) == 0 and len(several._spare) == 2
    assert torch.equal(got, expected)
    assert np.array_equal(several.result(), one.result(), equal_nan=True)


def test_layer_grams_stay_on_one_thread_where_spare_buffers_would_cost_too_much(monkeypatch):
    from vitsee import threads
    from vitsee.analyses import cka

    monkeypatch.setattr(threads, "task_workers", lambda: 4)
    acc = MinibatchCKA(6)
    assert acc._gram_workers(1000) == 4
    assert MinibatchCKA(2)._gram_workers(1000) == 2  # no more workers than layers
    assert acc._gram_workers(2**21, mean_layer=2**20) == 4  # 32 images of a 196 x 768 layer: 4.8M values
    assert acc._gram_workers(2**21, mean_layer=2**16) == 4  # 64 images of 17 x 64 tokens: 70k values
    assert acc._gram_workers(2**21, mean_layer=2**16 - 1) == 1  # smaller: one layer after another, on one thread
    monkeypatch.setattr(cka, "GRAM_WORKERS_BYTES", 8000)  # two spare buffers of 1,000 fp32 values
    assert acc._gram_workers(1000) == 3
    assert acc._gram_workers(10_000) == 1


def test_a_layer_that_fails_on_a_worker_fails_the_update(rng, monkeypatch):
    from vitsee import threads
    from vitsee.analyses import cka

    monkeypatch.setattr(threads, "task_workers", lambda: 2)
    monkeypatch.setattr(cka, "GRAM_WORKERS_MIN_VALUES", 0)

    class Unreadable:  # a store read that fails on the worker that materialises it
        shape = (8, 4)

        def __array__(self, dtype=None, copy=None):
            raise OSError("Can't read data (inflate() failed)")

    feats = [rng.normal(size=(8, 5)), Unreadable(), rng.normal(size=(8, 6))]
    acc, before = MinibatchCKA(3), torch.get_num_threads()
    with pytest.raises(OSError, match="inflate"):
        acc.update(feats)
    assert acc.batches == 0 and torch.get_num_threads() == before and len(acc._spare) == 1  # on the workers


@pytest.mark.parametrize("cross_at", [None, 70])
def test_the_state_is_the_same_bit_for_bit_with_any_number_of_threads(rng, monkeypatch, cross_at):
    """Torch's threads split a long product's sums differently with another count; the accumulator's products run
    on one thread each (the pair products of more than PAIR_ROWS rows in fixed blocks on the workers)."""
    from vitsee import threads
    from vitsee.analyses import cka

    n_layers = 14 if cross_at is None else 140  # 70 rows: two blocks of the pair product
    batches = [[rng.normal(size=(16, 17, 8)).astype(np.float32) + 3 for _ in range(n_layers)] for _ in range(2)]

    def state(torch_threads: int, workers: int) -> torch.Tensor:
        monkeypatch.setattr(threads, "task_workers", lambda: workers)
        acc = MinibatchCKA(n_layers, cross_at=cross_at, batch_slots=2, permutations=5)
        torch.set_num_threads(torch_threads)
        for b, feats in enumerate(batches):
            acc.update(feats, slot=b)
        return acc.state.clone()

    before = torch.get_num_threads()
    try:
        one = state(1, 1)
        for torch_threads, workers in [(2, 1), (2, 2), (4, 3)]:
            assert torch.equal(state(torch_threads, workers), one), (torch_threads, workers)
            assert torch.get_num_threads() == torch_threads  # restored after each update
    finally:
        torch.set_num_threads(before)
    if cross_at is not None:
        assert n_layers - cross_at > cka.PAIR_ROWS and cross_at > cka.PAIR_ROWS

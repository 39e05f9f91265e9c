"""Analyses hold a batch, not the store: per-image statistics are aggregated batch by batch and give what
the whole arrays give."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest

from conftest import RESNET, VIT
from vitsee.analyses import driver as an
from vitsee.analyses.attention import run_attention
from vitsee.analyses.base import RunningMoments
from vitsee.analyses.skip import run_skip
from vitsee.store import Store


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    """A copy of the shared store: results cached here stay out of other modules' way."""
    return shutil.copy(tiny_store, tmp_path_factory.mktemp("memory") / "store.h5")


@pytest.fixture
def small_batches(monkeypatch):
    """Statistics read 5 rows at a time (48 images: 10 batches, a short last one), whole reads refused."""
    original = Store.stat_batches

    def stat_batches(self, model, names, batch_size=1024):
        yield from original(self, model, names, batch_size=5)

    def whole(self, model, name, rows=None):
        if rows is None or (rows.stop or self.rows_done(model)) - (rows.start or 0) > 5:
            raise AssertionError(f"analysis read the whole '{name}' statistic")
        return original_stat(self, model, name, rows)

    original_stat = Store.stat
    monkeypatch.setattr(Store, "stat_batches", stat_batches)
    monkeypatch.setattr(Store, "stat", whole)


def _whole(store_path, model, name):
    with Store.open(store_path) as s:
        return s.model_group(model)["stats"][name][:].astype(np.float64)


def test_attention_aggregates_streamed_in_batches_equal_the_whole_array(store, small_batches):
    with Store.writer(store) as s:
        r = run_attention(s, VIT, an.AnalyzeConfig(recompute=True))
    dist = _whole(store, VIT, "attention_distance")  # (48, blocks, heads)
    order = np.argsort(dist.mean(axis=0), axis=1)
    np.testing.assert_allclose(r["mean_px"], np.take_along_axis(dist.mean(axis=0), order, axis=1), rtol=1e-12)
    np.testing.assert_allclose(r["std_px"], np.take_along_axis(dist.std(axis=0), order, axis=1), rtol=1e-9)
    renorm = _whole(store, VIT, "attention_distance_renorm")
    # in the plain distances' head order, so column k of both is the same head
    np.testing.assert_allclose(r["mean_renorm_px"], np.take_along_axis(renorm.mean(axis=0), order, axis=1), rtol=1e-12)
    edges = r["hist_edges"]
    expected = np.stack(
        [np.histogram(dist[:, b].ravel().astype(np.float32), bins=edges)[0] for b in range(dist.shape[1])]
    )
    np.testing.assert_array_equal(r["hist_counts"], expected)
    assert r["hist_counts"].sum() == dist.size


def test_skip_ratios_streamed_in_batches_equal_the_whole_array_mean_ignoring_inf(store, small_batches):
    with Store.writer(store) as s:
        vit = run_skip(s, VIT, an.AnalyzeConfig(recompute=True))
        resnet = run_skip(s, RESNET, an.AnalyzeConfig(recompute=True))
    attn, mlp = _whole(store, VIT, "skip_ratio_attn"), _whole(store, VIT, "skip_ratio_mlp")
    np.testing.assert_allclose(vit["ratio"][0::2], attn.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(vit["ratio"][1::2], mlp.mean(axis=0), rtol=1e-12)
    block = _whole(store, RESNET, "skip_ratio_block")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanmean(np.where(np.isfinite(block), block, np.nan), axis=0)
    np.testing.assert_allclose(resnet["ratio"][:, 0], expected, rtol=1e-12)


def test_running_moments_merge_batches_of_any_size_exactly_enough():
    x = np.random.default_rng(0).normal(300.0, 2.0, size=(1001, 3))  # a large offset: naive sums would cancel
    moments = RunningMoments()
    for start, stop in ((0, 1), (1, 8), (8, 500), (500, 500), (500, 1001)):
        moments.update(x[start:stop])
    np.testing.assert_allclose(moments.mean, x.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(moments.std, x.std(axis=0), rtol=1e-10)


def test_running_moments_of_an_inf_input_are_nan_there_without_a_warning():
    x = np.ones((6, 3))
    x[2, 1] = np.inf
    moments = RunningMoments()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # `vitsee analyze` on a store with Inf activations printed numpy's warning
        moments.update(x[:3])
        moments.update(x[3:])
    assert np.isnan(moments.std[1]) and moments.std[[0, 2]].tolist() == [0.0, 0.0]
    assert moments.mean[[0, 2]].tolist() == [1.0, 1.0]

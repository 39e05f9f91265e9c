"""Family separability of a zoo (d-prime, silhouette, ROC-AUC with bootstrap intervals over models) against
references written here and sklearn's, the coverage of its intervals in simulated zoos whose population values are
known, and the rank-fusion consensus."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score, silhouette_score

from vitsee.errors import VitseeError
from vitsee.zoo import separability as sp


def _zoo(per_family: int, families: int, shift: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """A zoo whose models are points around their family's centre; similarity exp(-squared distance / 16)."""
    member = np.repeat(np.arange(families), per_family)
    z = rng.normal(size=(families, 8))[member] * shift + rng.normal(size=(len(member), 8))
    d2 = ((z[:, None] - z[None]) ** 2).sum(-1)
    return np.exp(-d2 / 16), np.array([f"family {m}" for m in member])


def _pairs_ref(s, labels):
    within, across = [], []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            (within if labels[i] == labels[j] else across).append(s[i, j])
    return np.array(within), np.array(across)


def test_statistics_match_references():
    rng = np.random.default_rng(0)
    for shift in (0.0, 0.7, 2.0):
        s, labels = _zoo(4, 3, shift, rng)
        s[0, 5] += 0.01  # an asymmetric measure: symmetrised
        sym = (s + s.T) / 2
        out = sp.separability(s, labels, level=0)
        w, a = _pairs_ref(sym, labels)
        assert out["d_prime"] == pytest.approx(
            (w.mean() - a.mean()) / math.sqrt((w.var(ddof=1) + a.var(ddof=1)) / 2), abs=1e-12
        )
        truth = np.r_[np.ones(len(w)), np.zeros(len(a))]
        assert out["auc"] == pytest.approx(roc_auc_score(truth, np.r_[w, a]), abs=1e-12)
        d = 1 - sym
        np.fill_diagonal(d, 0)
        assert out["silhouette"] == pytest.approx(silhouette_score(d, labels, metric="precomputed"), abs=1e-12)
        assert (out["n_within"], out["n_across"], out["n_models"], out["n_groups"]) == (18, 48, 12, 3)


def test_a_distance_is_read_the_other_way():
    rng = np.random.default_rng(1)
    s, labels = _zoo(3, 3, 1.5, rng)
    distance = -np.log(s)  # squared distance / 16: small within families
    as_distance = sp.separability(distance, labels, higher_is_similar=False, level=0)
    as_similarity = sp.separability(-distance, labels, level=0)
    assert as_distance["d_prime"] == pytest.approx(as_similarity["d_prime"])
    assert as_distance["auc"] == pytest.approx(as_similarity["auc"])
    assert as_distance["silhouette"] == pytest.approx(silhouette_score(distance, labels, metric="precomputed"))
    assert as_distance["auc"] > 0.5


def test_copies_of_a_model_are_never_a_pair():
    s = np.array([[1.0, 0.9, 0.2], [0.9, 1.0, 0.3], [0.2, 0.3, 1.0]])
    idx = np.array([0, 0, 2])  # a replicate that drew model 0 twice
    same = idx[:, None] == idx[None, :]
    within, across = sp.pair_values(s[np.ix_(idx, idx)], np.array(["a", "a", "b"])[idx], same)
    assert within.size == 0 and sorted(across) == [0.2, 0.2]
    # each copy of model 0 has no other model of its family and the lone b none either: all score 0
    assert sp.silhouette(1 - s[np.ix_(idx, idx)], np.array(["a", "a", "b"]), same) == 0.0


def _coverage(shift: float, zoos: int, shuffle_labels: bool = False) -> tuple[dict, dict]:
    rng = np.random.default_rng(11)
    big, big_labels = _zoo(150, 3, shift, np.random.default_rng(99))
    truth = sp.separability(big, big_labels, level=0)
    if shuffle_labels:
        truth = {"d_prime": 0.0, "auc": 0.5}
    hits = {k: 0 for k in ("d_prime", "auc", "silhouette")}
    for r in range(zoos):
        s, labels = _zoo(7, 3, shift, rng)
        if shuffle_labels:
            labels = rng.permutation(labels)
        out = sp.separability(s, labels, level=0.95, replicates=150, seed=r)
        for k in truth:
            if k in hits:
                hits[k] += out[f"{k}_low"] <= truth[k] <= out[f"{k}_high"]
    return {k: v / zoos for k, v in hits.items() if k in truth}, truth


def test_intervals_cover_the_population_value():
    """21-model zoos of three families; the population values from a zoo of 450. Measured: d-prime and AUC: 0.95 of
    40 intervals hold the truth (nominal 0.95), silhouette 0.975."""
    rates, truth = _coverage(0.5, 40)
    assert truth["auc"] > 0.55  # a zoo with something to separate
    assert rates["d_prime"] >= 0.85 and rates["auc"] >= 0.85 and rates["silhouette"] >= 0.85, rates


def test_no_family_structure_reads_as_chance():
    """Labels unrelated to the models: d-prime 0 and AUC 0.5 inside the intervals (measured: 40 of 40, conservative:
    the pairs share models, and a bootstrap over models widens the interval for that)."""
    rates, _ = _coverage(1.0, 40, shuffle_labels=True)
    assert rates["d_prime"] >= 0.85 and rates["auc"] >= 0.85, rates


def test_rank_fusion():
    rng = np.random.default_rng(3)
    s, _ = _zoo(3, 2, 1.0, rng)
    dist = -np.log(s) * 3 + 1  # the same order as a distance, other units
    fused = sp.rank_fusion([s, dist, s**5], [True, False, True])
    i, j = np.triu_indices(6, 1)
    ref = (rankdata(s[i, j]) - 1) / (len(i) - 1)
    assert np.allclose(fused[i, j], ref) and np.allclose(fused, fused.T) and np.allclose(np.diag(fused), 1)
    other = rng.random((6, 6))
    mixed = sp.rank_fusion([s, other], [True, True])
    ro = rankdata(((other + other.T) / 2)[i, j])
    assert np.allclose(mixed[i, j], (ref + (ro - 1) / (len(i) - 1)) / 2)
    with_nan = s.copy()
    with_nan[0, 1] = with_nan[1, 0] = np.nan
    partial = sp.rank_fusion([with_nan, s], [True, True])
    assert np.isfinite(partial).all()


def test_labels_and_weights():
    assert sp.trained_label({"kind": "random", "seed": 0}) == "untrained"
    assert sp.trained_label({"kind": "file", "trained": "digits (1438 images, 0 epochs: the seeded init, ...)"}) == (
        "untrained"
    )
    assert sp.trained_label({"kind": "file", "trained": "digits (1438 images, 10 epochs, ...)"}) == "trained"
    assert sp.trained_label({"kind": "pretrained"}) == "trained"
    s = np.eye(4)
    with pytest.raises(VitseeError, match="one of its families"):
        sp.separability(s, ["a"] * 4)
    with pytest.raises(VitseeError, match="no two models share"):
        sp.separability(s, ["a", "b", "c", "d"])
    with pytest.raises(VitseeError, match="3 families for 4 models"):
        sp.separability(s, ["a", "a", "b"])

"""How well a measure tells model families apart, from its zoo: the models x models matrix of one summary per pair.

Wu, Saha, Bo & Khosla 2025 ("Measuring the measures", arXiv:2509.04622) ask of each measure whether pairs of models
of one family (within) are more alike than pairs of different families (across), with three numbers; here each is
computed from a zoo's matrix S (a similarity: higher is more alike; a distance is negated first) and one label per
model (its family, or trained / untrained):

    d-prime     (mean within - mean across) / sqrt((var within + var across) / 2), over the pairs i < j (sample
                variances); 0 when the measure does not separate, large when the two distributions of pairs part
    ROC-AUC     P(a within pair is more alike than an across pair), ties counted half (the Mann-Whitney U over the
                product of the counts): 0.5 at chance, 1 when every within pair beats every across pair
    silhouette  the mean over models of (b - a) / max(a, b), a the mean distance to the other models of its family,
                b the smallest mean distance to another family's models (sklearn's silhouette_score on the
                precomputed distances; 0 for a model alone in its family); distances 1 - S for a similarity (every
                measure here is at most 1; below 0 counts as 0), the distance itself for a distance

An asymmetric S (a measure of X predicting Y) is symmetrised, (S + S') / 2, first; the diagonal is never a pair.

Intervals: a percentile bootstrap over models (the models are the sample; the images are fixed): a replicate draws
n of the n models with replacement, and a model drawn twice is never paired with its own copy (its similarity to
itself is the diagonal, not a pair). A replicate in which a number is undefined (no within pair, one family left) is
left out of that number's interval, and `replicates` says how many were used. With few models the interval is wide
and coarse: six models of three families hold three within pairs.

A consensus matrix fuses several measures' zoos by their ranks (`rank_fusion`): each measure's off-diagonal values
are ranked (ties averaged, a distance reversed), scaled to [0, 1], and averaged over the measures, so no measure
weighs more for its units or its range. Similarity network fusion (Wang et al. 2014, as Bo et al. use it) is not
used: its neighbourhood size K, kernel width mu and iteration count are hyperparameters with no settled values for a
zoo of 6 to 50 models, while a rank mean has none.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError

STATISTICS = ("d_prime", "silhouette", "auc")
WORDS = {"d_prime": "d-prime", "silhouette": "silhouette", "auc": "ROC-AUC"}


def oriented(values: np.ndarray, higher_is_similar: bool = True) -> np.ndarray:
    """Returns the symmetrised similarity of a models x models matrix: (S + S') / 2, negated for a distance."""
    s = np.asarray(values, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise VitseeError(f"separability needs a square models x models matrix, got shape {s.shape}")
    s = (s + s.T) / 2
    return s if higher_is_similar else -s


def distances(similarity: np.ndarray, higher_is_similar: bool = True) -> np.ndarray:
    """Returns the distances the silhouette reads from an oriented similarity: 1 - S (at least 0) for a similarity,
    the distance itself (-S) for a distance; zero diagonal."""
    d = np.clip(1.0 - similarity, 0.0, None) if higher_is_similar else -similarity
    d = d.copy()
    np.fill_diagonal(d, 0.0)
    return d


def d_prime(within: np.ndarray, across: np.ndarray) -> float:
    """Returns (mean within - mean across) / sqrt((var within + var across) / 2), sample variances; nan when a side
    has fewer than two pairs or both are constant."""
    if len(within) < 2 or len(across) < 2:
        return math.nan
    spread = math.sqrt((np.var(within, ddof=1) + np.var(across, ddof=1)) / 2)
    return float((np.mean(within) - np.mean(across)) / spread) if spread > 0 else math.nan


def roc_auc(within: np.ndarray, across: np.ndarray) -> float:
    """Returns P(within > across) + P(within == across) / 2 over every (within, across) pair of values: the
    Mann-Whitney U of the within values over the product of the counts (ranks of the pooled values, ties averaged)."""
    from scipy.stats import rankdata

    nw, na = len(within), len(across)
    if nw == 0 or na == 0:
        return math.nan
    ranks = rankdata(np.concatenate([within, across]))
    return float((ranks[:nw].sum() - nw * (nw + 1) / 2) / (nw * na))


def silhouette(d: np.ndarray, labels: np.ndarray, same: np.ndarray | None = None) -> float:
    """Returns the mean silhouette of the models under distances d (n, n) and labels (n,).

    same: (n, n) True where two entries are the same model (a bootstrap replicate's copies): never each other's
    neighbours. A model with no other model of its family scores 0. nan when fewer than two families are present.
    """
    labels = np.asarray(labels)
    groups, member = np.unique(labels, return_inverse=True)
    if len(groups) < 2:
        return math.nan
    n = len(labels)
    other = ~np.eye(n, dtype=bool) if same is None else ~same
    onehot = np.eye(len(groups))[member]  # (n, g)
    counts = other.astype(np.float64) @ onehot  # (n, g): the other models of each group
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (np.where(other, d, 0.0) @ onehot) / counts  # (n, g): mean distance to each group
    own = np.arange(n), member
    a = means[own]
    elsewhere = means.copy()
    elsewhere[own] = np.inf
    elsewhere[counts == 0] = np.inf
    b = elsewhere.min(axis=1)
    top = np.maximum(a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = np.where(top > 0, (b - a) / top, 0.0)
    scores[counts[own] == 0] = 0.0  # alone in its family: 0, as sklearn scores a singleton cluster
    return float(scores.mean())


def pair_values(similarity: np.ndarray, labels: np.ndarray, same: np.ndarray | None = None):
    """Returns (within, across): the similarities of the pairs i < j of one label and of different labels (pairs of
    one model with its own copy left out)."""
    labels = np.asarray(labels)
    n = len(labels)
    i, j = np.triu_indices(n, 1)
    keep = np.ones(len(i), dtype=bool) if same is None else ~same[i, j]
    i, j = i[keep], j[keep]
    one = labels[i] == labels[j]
    values = similarity[i, j]
    return values[one], values[~one]


def statistics(
    similarity: np.ndarray, labels: Sequence[str], higher_is_similar: bool = True, same: np.ndarray | None = None
) -> dict[str, float]:
    """Returns {d_prime, silhouette, auc} of an oriented similarity (see `oriented`) and one label per model."""
    labels = np.asarray(labels)
    within, across = pair_values(similarity, labels, same)
    return {
        "d_prime": d_prime(within, across),
        "silhouette": silhouette(distances(similarity, higher_is_similar), labels, same),
        "auc": roc_auc(within, across),
    }


def check_labels(labels: Sequence[str], n: int, what: str = "families") -> np.ndarray:
    """Returns the labels as an array if there is one per model and they make a question (two labels or more, one of
    them held by two models); raises naming the way out otherwise."""
    labels = np.asarray([str(x) for x in labels])
    if len(labels) != n:
        raise VitseeError(f"{len(labels)} {what} for {n} models: give one per model")
    counts = {g: int((labels == g).sum()) for g in dict.fromkeys(labels)}
    if len(counts) < 2:
        raise VitseeError(
            f"every model of the zoo has one of its {what} ({labels[0]}): separability compares pairs within "
            "and across groups; set other groups with --families MODEL=FAMILY,..."
        )
    if max(counts.values()) < 2:
        raise VitseeError(
            f"no two models share one of their {what} ({', '.join(counts)}): separability needs a group of two or "
            "more; add models of a family already there, or set groups with --families MODEL=FAMILY,..."
        )
    return labels


def separability(
    values: np.ndarray,
    labels: Sequence[str],
    higher_is_similar: bool = True,
    level: float = stats_mod.DEFAULT_CI,
    replicates: int = stats_mod.BOOTSTRAP_REPLICATES,
    seed: int = 0,
) -> dict:
    """Returns a measure's separability of the labels from its zoo's models x models `values`: each statistic, its
    percentile bootstrap interval over models at `level` (0: none), how many replicates gave it, and the counts of
    models and pairs. See the module docstring."""
    s = oriented(values, higher_is_similar)
    n = s.shape[0]
    labels = check_labels(labels, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        point = statistics(s, labels, higher_is_similar)
    within, across = pair_values(s, labels)
    out: dict = {
        **point,
        "n_models": n,
        "n_groups": len(set(labels)),
        "n_within": len(within),
        "n_across": len(across),
    }
    if not level:
        return out
    level = stats_mod.check_level(level)
    draws = {name: [] for name in STATISTICS}
    rng = np.random.default_rng(seed)
    for _ in range(int(replicates)):
        idx = rng.integers(0, n, size=n)
        same = idx[:, None] == idx[None, :]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rep = statistics(s[np.ix_(idx, idx)], labels[idx], higher_is_similar, same)
        for name in STATISTICS:
            draws[name].append(rep[name])
    tail = (1 - level) / 2
    for name in STATISTICS:
        finite = np.asarray(draws[name])[np.isfinite(draws[name])]
        out[f"{name}_replicates"] = int(finite.size)
        low, high = np.quantile(finite, [tail, 1 - tail]) if finite.size else (math.nan, math.nan)
        out[f"{name}_low"], out[f"{name}_high"] = float(low), float(high)
    return out


def rank_fusion(matrices: Sequence[np.ndarray], higher_is_similar: Sequence[bool]) -> np.ndarray:
    """Returns the consensus models x models similarity of several measures' zoos: each one symmetrised, its
    off-diagonal values ranked (ties averaged; a distance's order reversed) and scaled to [0, 1] (the least alike pair
    0, the most alike 1), then the mean over the measures; 1 on the diagonal. A pair a measure has no value for
    (NaN) takes the mean of the others' ranks."""
    from scipy.stats import rankdata

    if not matrices:
        raise VitseeError("a consensus needs at least one measure's zoo")
    n = np.asarray(matrices[0]).shape[0]
    i, j = np.triu_indices(n, 1)
    ranked = []
    for m, up in zip(matrices, higher_is_similar, strict=True):
        v = oriented(m, up)[i, j]
        r = np.full(len(v), np.nan)
        ok = np.isfinite(v)
        if ok.sum() >= 2:
            r[ok] = (rankdata(v[ok]) - 1) / (ok.sum() - 1)
        ranked.append(r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a pair no measure has: nan
        mean = np.nanmean(np.stack(ranked), axis=0)
    out = np.eye(n)
    out[i, j] = out[j, i] = mean
    return out


def trained_label(weights: dict | str) -> str:
    """Returns 'untrained' for weights that are a seeded init -- a store record's weights of kind `random`, or a file
    `vitsee train` wrote before any step (its record says '0 epochs') -- and 'trained' for any other."""
    if isinstance(weights, str):
        return "untrained" if weights.startswith("random") else "trained"
    if weights.get("kind") == "random" or re.search(r"\b0 epochs\b", str(weights.get("trained") or "")):
        return "untrained"
    return "trained"

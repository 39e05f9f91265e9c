"""Which model is like which, and which layer of one is which layer of another: the zoo's numbers.

A zoo is many models over the same images. Every pair of models A, B has a cross-model layer x layer matrix
M(A_i, B_j) of some similarity measure (linear CKA by default; any measure whose matrix is "higher is more alike"
works). This module turns those matrices into what the zoo shows; it is pure (arrays in, arrays out, no store,
no torch) so a view can be drawn from cached numbers:

- a scalar per pair, the *summary*:
  - `best_match` (the default): S(A, B) = (mean_i max_j M_ij + mean_j max_i M_ij) / 2 -- every layer of A finds its
    best partner in B and every layer of B its best partner in A. Symmetric by construction, and S(A, A) = 1 for
    CKA (the diagonal of a model's own matrix is 1 and no cell exceeds it);
  - `layer`: M at one named layer per model (by default each model's last stored layer, the representation
    nearest its head), i.e. "how alike are the last blocks".
- its interval, by a percentile bootstrap over minibatches of images: each replicate redraws the batches with
  replacement (engine/stats.py's indices, so the same replicates as each CKA cell's interval), rebuilds the
  *whole* layer x layer matrix of the pair from the per-batch HSIC terms, and takes the summary of it. The summary's
  interval therefore carries the dependence between cells (a max over cells is not the max of their intervals). With
  only per-cell intervals there is no honest way to an interval of a max or a mean of cells, so none is given
  (`Zoo.interval` says so). With several shuffles, each shuffle's endpoints are averaged, as stats.pool_shuffles does
  for CKA cells.
- the layer correspondence of A onto B: for each layer of A, its best match in B, as the raw argmax of its row and
  as a monotone path (see `monotone_match`), reported as relative depth of A against relative depth of B.
- a clustering order of the models x models matrix (average linkage on 1 - S, optimal leaf ordering), and each
  model's architecture family from its timm name, to mark the heatmap.

`zoo_from_cka` makes a Zoo from a cached CKA result (the joint matrix over every stored layer of every model, as
`vitsee analyze --cka` caches it); `zoo_from_hsic` from HSIC sums and, for intervals, per-batch HSIC terms (what a
MinibatchCKA with batch slots keeps, or what the Grams a zoo extraction streams give, engine/zoo/streamed.py).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError

SUMMARIES = ("best_match", "layer")


# --- the summary of one pair --------------------------------------------------------------------------------


def best_match_alignment(m: np.ndarray) -> np.ndarray | float:
    """Returns (mean_i max_j M_ij + mean_j max_i M_ij) / 2 of m (..., La, Lb), over the last two axes.

    Non-finite cells (a layer with NaN/Inf activations) are left out of the maxima, and a layer whose cells are all
    non-finite is left out of the means; with no finite cell the result is nan.
    """
    m = np.asarray(m, dtype=np.float64)
    if m.ndim < 2 or m.shape[-1] == 0 or m.shape[-2] == 0:
        raise VitseeError(f"best-match alignment needs a layer x layer matrix, got shape {m.shape}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows and columns give nan, then are skipped
        clean = np.where(np.isfinite(m), m, np.nan)
        rows = np.nanmean(np.nanmax(clean, axis=-1), axis=-1)  # each layer of A: its best layer of B
        cols = np.nanmean(np.nanmax(clean, axis=-2), axis=-1)  # each layer of B: its best layer of A
    out = (rows + cols) / 2
    return float(out) if out.ndim == 0 else out


def summarise(m: np.ndarray, summary: str = "best_match", row: int = -1, col: int = -1) -> np.ndarray | float:
    """Returns the summary of m (..., La, Lb): `best_match` alignment, or `layer`, the cell (row, col)."""
    if summary == "best_match":
        return best_match_alignment(m)
    if summary == "layer":
        value = np.asarray(m, dtype=np.float64)[..., row, col]
        return float(value) if value.ndim == 0 else value
    raise VitseeError(f"unknown zoo summary '{summary}': choose from {', '.join(SUMMARIES)}")


def bootstrap_pair_interval(
    cross: np.ndarray,
    self_a: np.ndarray,
    self_b: np.ndarray,
    counts: np.ndarray,
    level: float,
    summary: str = "best_match",
    row: int = -1,
    col: int = -1,
) -> tuple[float, float]:
    """Returns (low, high), the percentile bootstrap interval of a pair's summary.

    cross (B, La, Lb) holds each batch's unbiased HSIC of A_i with B_j, self_a (B, La) and self_b (B, Lb) each batch's
    self-HSIC; counts (R, B) how often each replicate draws each batch (stats.bootstrap_indices as counts). Each
    replicate's CKA matrix is its weighted HSIC sums over sqrt(self sums), and its summary is one draw.
    """
    n, la, lb = cross.shape
    hsic = (counts @ cross.reshape(n, la * lb)).reshape(-1, la, lb)  # (R, La, Lb)
    da, db = counts @ self_a, counts @ self_b  # (R, La), (R, Lb)
    with np.errstate(divide="ignore", invalid="ignore"):
        replicates = hsic / np.sqrt(da[:, :, None] * db[:, None, :])
    values = np.asarray(summarise(replicates, summary, row, col), dtype=np.float64)  # (R,)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_counts(n_batches: int, replicates: int, seed: Sequence[int] | int) -> np.ndarray:
    """Returns (replicates, n_batches) counts: how often each bootstrap replicate draws each batch (the replicates of
    stats.bootstrap_indices, so of every CKA cell's interval with that seed)."""
    indices = stats_mod.bootstrap_indices(n_batches, replicates, seed)
    return np.stack([np.bincount(row, minlength=n_batches) for row in indices]).astype(np.float64)


# --- which layer is which -------------------------------------------------------------------------------------


def relative_depth(n: int) -> np.ndarray:
    """Returns the relative depth of each of n layers in forward order: i / (n - 1), from 0 to 1 (one layer: 0)."""
    return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(n)


def argmax_match(m: np.ndarray) -> np.ndarray:
    """Returns (La,) the column of each row's largest finite value (the first of equal ones); -1 for a row with none."""
    m = np.asarray(m, dtype=np.float64)
    finite = np.isfinite(m)
    best = np.argmax(np.where(finite, m, -np.inf), axis=1)
    return np.where(finite.any(axis=1), best, -1)


def monotone_match(m: np.ndarray) -> np.ndarray:
    """Returns (La,) the monotone correspondence of rows onto columns: the path f maximising sum_i m[i, f(i)] over
    every non-decreasing f: {0..La-1} -> {0..Lb-1} (f(i) <= f(i+1); endpoints free, columns may repeat or be skipped).

    Each layer of A takes one layer of B, and deeper layers of A never take shallower layers of B than earlier ones
    did: a correspondence that keeps the order of both models' computations. Dynamic programming, O(La Lb):
    best[i, j] = m[i, j] + max over j' <= j of best[i-1, j'], then back from the last row, taking at each step the
    first (shallowest) column of the largest value allowed -- so among optimal paths the one chosen is the smallest
    read from the last row backwards. A non-finite cell costs more than any finite path can gain, so a path avoids
    them when it can (fewest non-finite cells first, then the largest sum); a row with no finite cell adds nothing.
    """
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 2 or 0 in m.shape:
        raise VitseeError(f"a layer correspondence needs a layer x layer matrix, got shape {m.shape}")
    finite = np.isfinite(m)
    scale = float(np.abs(m[finite]).max()) if finite.any() else 0.0
    penalty = -(2.0 * m.shape[0] * scale + 1.0)  # below any difference of two paths' finite sums
    values = np.where(finite, m, penalty)
    values[~finite.any(axis=1)] = 0.0
    la = m.shape[0]
    best = np.empty_like(values)
    best[0] = values[0]
    for i in range(1, la):
        best[i] = values[i] + np.maximum.accumulate(best[i - 1])
    path = np.empty(la, dtype=np.int64)
    j = int(np.argmax(best[-1]))
    path[-1] = j
    for i in range(la - 2, -1, -1):
        j = int(np.argmax(best[i, : j + 1]))
        path[i] = j
    return path


@dataclass(frozen=True)
class Correspondence:
    """Model A's layers mapped onto model B's: `argmax` and `path` (monotone_match) are (La,) column indices."""

    a: str
    b: str
    rows: list[str]  # A's layers, forward order
    cols: list[str]  # B's layers, forward order
    argmax: np.ndarray
    path: np.ndarray

    @property
    def depth_a(self) -> np.ndarray:
        """Returns (La,) the relative depth of each of A's layers."""
        return relative_depth(len(self.rows))

    @property
    def depth_b_argmax(self) -> np.ndarray:
        """Returns (La,) the relative depth in B of each A layer's argmax match (nan where it has none)."""
        depth = relative_depth(len(self.cols))
        return np.where(self.argmax >= 0, depth[np.maximum(self.argmax, 0)], np.nan)

    @property
    def depth_b_path(self) -> np.ndarray:
        """Returns (La,) the relative depth in B of each A layer's match on the monotone path."""
        return relative_depth(len(self.cols))[self.path]

    def as_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "rows": self.rows,
            "cols": self.cols,
            "argmax": self.argmax.tolist(),
            "path": self.path.tolist(),
            "depth_a": self.depth_a.tolist(),
            "depth_b_argmax": [None if not np.isfinite(v) else float(v) for v in self.depth_b_argmax],
            "depth_b_path": self.depth_b_path.tolist(),
        }


def correspondence(m: np.ndarray, a: str, b: str, rows: Sequence[str], cols: Sequence[str]) -> Correspondence:
    """Returns A's layers (rows of m) mapped onto B's (columns), by argmax and by the monotone path."""
    m = np.asarray(m, dtype=np.float64)
    if m.shape != (len(rows), len(cols)):
        raise VitseeError(f"a {m.shape} matrix does not match {len(rows)} layers of {a} x {len(cols)} of {b}")
    return Correspondence(a, b, list(rows), list(cols), argmax_match(m), monotone_match(m))


# --- the models x models matrix -------------------------------------------------------------------------------


def cluster_order(s: np.ndarray) -> list[int]:
    """Returns the order of the models that hierarchical clustering of a models x models similarity s gives.

    Average linkage on the distances 1 - (s + s')/2 (the diagonal ignored), with scipy's optimal leaf ordering, so
    neighbours in the order are as alike as the tree allows; deterministic for a given matrix. Distances below 0
    (a similarity slightly above 1, which an unbiased estimate can give) count as 0; a non-finite similarity counts
    as the largest distance seen (at least 1: unrelated).
    """
    s = np.asarray(s, dtype=np.float64)
    n = s.shape[0]
    if s.shape != (n, n):
        raise VitseeError(f"a clustering order needs a square models x models matrix, got shape {s.shape}")
    if n <= 2:
        return list(range(n))
    from scipy.cluster import hierarchy
    from scipy.spatial.distance import squareform

    d = 1.0 - (s + s.T) / 2
    finite = np.isfinite(d)
    d[~finite] = max(1.0, float(d[finite].max())) if finite.any() else 1.0
    d = np.clip(d, 0.0, None)
    np.fill_diagonal(d, 0.0)
    tree = hierarchy.linkage(squareform(d, checks=False), method="average", optimal_ordering=True)
    return [int(i) for i in hierarchy.leaves_list(tree)]


# --- families -------------------------------------------------------------------------------------------------


# (family, pattern on the timm name without its tag, weights or a tf_/legacy_ port prefix), first match wins: more
# specific names first (resnetv2 before resnet, vitamin before vit, deit before vit).
FAMILY_RULES: tuple[tuple[str, str], ...] = (
    ("DeiT", r"deit"),
    ("BEiT", r"beit"),
    ("EVA", r"eva(02)?_"),
    ("CaiT", r"cait_"),
    ("PiT", r"pit_"),
    ("Swin", r"swin"),
    ("Mixer", r"g?mixer_"),
    ("ResMLP", r"resmlp_"),
    ("gMLP", r"gmlp_"),
    ("XCiT", r"xcit_"),
    ("LeViT", r"levit_"),
    ("CrossViT", r"crossvit_"),
    ("MaxViT", r"(test_)?maxx?vit"),
    ("CoAtNet", r"(test_)?coat(net|next)"),
    ("ViT", r"(vit_|test_vit|flexivit_|samvit_|aimv2_|naflexvit_)"),
    ("ResNetV2/BiT", r"resnetv2_"),
    ("ResNet", r"(test_resnet|resnet\d|resnet[a-z]|resnext|seresnet|seresnext|senet|ecaresnet|ecaresnext|wide_resnet)"),
    ("ConvNeXt", r"(test_)?convnext"),
    ("EfficientNet", r"((test_|gc_)?efficientnet|tinynet_)"),
    ("MobileNet", r"mobilenet"),
    ("RegNet", r"regnet"),
    ("DenseNet", r"densenet"),
    ("VGG", r"vgg\d"),
    ("Inception", r"inception_"),
)
# vitsee's analysis families (models.FAMILIES) name a model's architecture when its timm name does not
ANALYSIS_FAMILIES = {"vit": "ViT", "resnet": "ResNet", "mixer": "Mixer", "swin": "Swin"}
FAMILIES = tuple(dict.fromkeys(f for f, _ in FAMILY_RULES)) + ("other",)


def architecture_family(name: str, analysis_family: str | None = None) -> str:
    """Returns the architecture family of a timm model name or store key (`ViT`, `DeiT`, `Swin`, `ResNetV2/BiT`, ...,
    or `other`), from the name alone (no timm needed).

    The name may carry a tag and weights (`vit_base_patch16_224.augreg_in21k`, `resnet50@random:0`); a model whose
    name says nothing but whose analysis family is known (the store record's `family`: a model registered under a
    name of its own) takes that family's name.
    """
    base = name.partition("@")[0].partition(".")[0].lower()
    base = re.sub(r"^(tf|legacy)_", "", base)
    for family, pattern in FAMILY_RULES:
        if re.match(pattern, base):
            return family
    return ANALYSIS_FAMILIES.get(analysis_family or "", "other")


def family_of_record(record: dict) -> str:
    """Returns the architecture family of a model as its store record describes it (timm name and vitsee family)."""
    return architecture_family(
        str(record.get("name") or record.get("timm_name") or record.get("key", "")), record.get("family")
    )


# --- the zoo --------------------------------------------------------------------------------------------------


@dataclass
class Zoo:
    """The models x models summary of a zoo, with intervals, clustering order, families and correspondences."""

    models: list[str]  # the store's keys, in the store's order
    families: list[str]
    values: np.ndarray  # (n, n) the summary of each pair, symmetric
    ci_low: np.ndarray  # (n, n), nan where there is no interval
    ci_high: np.ndarray
    order: list[int]  # the clustering order (indices into models)
    summary: str  # "best_match" or "layer"
    interval: str  # how the interval was made, or why there is none
    layers: dict[str, str] = field(default_factory=dict)  # summary "layer": the layer of each model
    correspondences: dict[tuple[str, str], Correspondence] = field(default_factory=dict)  # (a, b), a != b

    def as_json(self) -> dict:
        """Returns the zoo as JSON-able data (non-finite numbers as None)."""

        def nums(a: np.ndarray) -> list:
            return [[float(v) if np.isfinite(v) else None for v in row] for row in a]

        return {
            "models": self.models,
            "families": self.families,
            "values": nums(self.values),
            "ci_low": nums(self.ci_low),
            "ci_high": nums(self.ci_high),
            "order": self.order,
            "summary": self.summary,
            "interval": self.interval,
            "layers": self.layers,
            "correspondences": [c.as_json() for c in self.correspondences.values()],
        }


def _blocks(columns: Sequence[tuple[str, str]], models: Sequence[str]) -> dict[str, np.ndarray]:
    """Returns model -> the indices of its layers among the columns."""
    model_of = np.array([m for m, _ in columns], dtype=object)
    out = {m: np.flatnonzero(model_of == m) for m in models}
    missing = [m for m, idx in out.items() if idx.size == 0]
    if missing:
        raise VitseeError(
            f"the CKA result holds no layer of {', '.join(missing)}: recompute it over every model of the store"
        )
    return out


def _summary_cells(
    summary: str, models: Sequence[str], layer_names: dict[str, list[str]], layers: dict[str, str] | None
) -> dict[str, int]:
    """Returns model -> the index (within its layers) of the layer the `layer` summary reads (default: the last)."""
    if summary not in SUMMARIES:
        raise VitseeError(f"unknown zoo summary '{summary}': choose from {', '.join(SUMMARIES)}")
    chosen = {}
    for m in models:
        name = (layers or {}).get(m)
        if name is None:
            chosen[m] = len(layer_names[m]) - 1
        elif name in layer_names[m]:
            chosen[m] = layer_names[m].index(name)
        else:
            raise VitseeError(
                f"no layer '{name}' in {m} for the zoo's layer summary: it has "
                f"{', '.join(layer_names[m][:6])}{' ...' if len(layer_names[m]) > 6 else ''}"
            )
    return chosen


def _columns(result: Any) -> list[tuple[str, str]]:
    """Returns the (model, layer) of each row and column of a cached layer x layer result's joint matrix."""
    models = list(result.params["models"])
    return [(models[int(i)], str(name)) for i, name in zip(result["model"], result["layer"])]


def _layout(
    columns: Sequence[tuple[str, str]], models: list[str], summary: str, layers: dict[str, str] | None
) -> tuple[dict[str, np.ndarray], dict[str, list[str]], dict[str, int]]:
    """Returns (model -> its columns, model -> its layer names, model -> the layer the `layer` summary reads)."""
    idx = _blocks(columns, models)
    names = {m: [columns[i][1] for i in idx[m]] for m in models}
    return idx, names, _summary_cells(summary, models, names, layers)


def _pair_summaries(
    matrix: np.ndarray, idx: dict[str, np.ndarray], models: list[str], summary: str, cell: dict[str, int]
) -> np.ndarray:
    """Returns (n, n): the summary of every pair's block of the joint matrix, symmetric."""
    n = len(models)
    values = np.full((n, n), np.nan)
    for a in range(n):
        for b in range(a, n):
            ma, mb = models[a], models[b]
            block = matrix[np.ix_(idx[ma], idx[mb])]
            values[a, b] = values[b, a] = summarise(block, summary, cell[ma], cell[mb])
    return values


def _build(
    matrix: np.ndarray,
    columns: Sequence[tuple[str, str]],
    models: Sequence[str],
    summary: str,
    layers: dict[str, str] | None,
    families: Sequence[str] | None,
    interval_of,
) -> Zoo:
    models = list(models)
    idx, names, cell = _layout(columns, models, summary, layers)
    n = len(models)
    values = _pair_summaries(matrix, idx, models, summary, cell)
    low, high = np.full((n, n), np.nan), np.full((n, n), np.nan)
    corr: dict[tuple[str, str], Correspondence] = {}
    for a in range(n):
        for b in range(a, n):
            ma, mb = models[a], models[b]
            block = matrix[np.ix_(idx[ma], idx[mb])]
            if interval_of is not None:
                low[a, b], high[a, b] = interval_of(idx[ma], idx[mb], cell[ma], cell[mb])
                low[b, a], high[b, a] = low[a, b], high[a, b]
            if a != b:
                corr[(ma, mb)] = correspondence(block, ma, mb, names[ma], names[mb])
                corr[(mb, ma)] = correspondence(block.T, mb, ma, names[mb], names[ma])
    chosen = {m: names[m][cell[m]] for m in models} if summary == "layer" else {}
    fams = list(families) if families is not None else [architecture_family(m) for m in models]
    return Zoo(models, fams, values, low, high, cluster_order(values), summary, "", chosen, corr)


def zoo_from_cka(
    result: Any,
    summary: str = "best_match",
    layers: dict[str, str] | None = None,
    families: Sequence[str] | None = None,
) -> Zoo:
    """Returns the Zoo of a cached CKA result (or of any layer x layer measure: an analyses.contract.Result, unnamed
    here since engine/analyses/zoo.py imports this module): `matrix` (L, L) over every stored layer of every model,
    `model` (L,) each column's index into `result.params['models']`, `layer` (L,) its layer (what `vitsee analyze
    --cka` caches).

    A cached result keeps per-cell intervals only, from which no interval of a summary can be had honestly (see the
    module docstring): the Zoo's intervals are nan and `interval` says how to get them (zoo_from_hsic).
    families: one per model (e.g. family_of_record of each store record); default from the keys.
    """
    models = list(result.params["models"])
    zoo = _build(
        np.asarray(result["matrix"], dtype=np.float64), _columns(result), models, summary, layers, families, None
    )
    zoo.interval = "none: a summary's interval needs the per-batch HSIC terms (zoo_from_hsic), not per-cell intervals"
    return zoo


def zoo_from_hsic(
    hsic: np.ndarray,
    columns: Sequence[tuple[str, str]],
    models: Sequence[str] | None = None,
    batch_hsic: np.ndarray | None = None,
    summary: str = "best_match",
    layers: dict[str, str] | None = None,
    families: Sequence[str] | None = None,
    level: float = stats_mod.DEFAULT_CI,
    replicates: int = stats_mod.BOOTSTRAP_REPLICATES,
    seed: Sequence[int] | int = 0,
) -> Zoo:
    """Returns the Zoo of HSIC sums hsic (L, L) (or (K, L, L), one per shuffle) over columns [(model, layer)].

    The values are the summaries of the CKA matrix hsic_ij / sqrt(hsic_ii hsic_jj) (averaged over shuffles first, as a
    CKA result is). With batch_hsic (B, L, L) (or (K, B, L, L)), each batch's HSIC terms, each pair's summary gets its
    percentile bootstrap interval at `level` over `replicates` seeded redraws of the batches (a batch slot left empty,
    e.g. a last batch under 4 images, is not a unit); with shuffles, the endpoints are averaged over the shuffles.
    seed: the statistics seed (a CKA result's params.stats.seed): shuffle k draws with [seed, k] as
    analyses/cka.finish_cka does, so the `layer` summary's interval is that CKA cell's interval.
    """
    hsic = np.asarray(hsic, dtype=np.float64)
    per_shuffle = hsic[None] if hsic.ndim == 2 else hsic
    models = list(models) if models is not None else list(dict.fromkeys(m for m, _ in columns))
    matrix = np.mean(stats_mod.cka_from_hsic(per_shuffle), axis=0)
    if batch_hsic is None or not level:
        zoo = _build(matrix, columns, models, summary, layers, families, None)
        zoo.interval = "none: no per-batch HSIC terms were given" if batch_hsic is None else "none: --ci 0"
        return zoo
    level = stats_mod.check_level(level)
    batches = np.asarray(batch_hsic, dtype=np.float64)
    batches = batches[None] if batches.ndim == 3 else batches
    if batches.shape[0] != per_shuffle.shape[0]:
        raise VitseeError(
            f"{batches.shape[0]} shuffles of per-batch HSIC terms for {per_shuffle.shape[0]} of sums: "
            "give both from the same accumulators"
        )
    filled = [b[np.abs(np.diagonal(b, axis1=1, axis2=2)).sum(axis=1) > 0] for b in batches]
    seeds = [[*np.atleast_1d(seed).tolist(), k] for k in range(len(filled))]  # as finish_cka seeds shuffle k
    counts = [bootstrap_counts(len(f), replicates, s) for f, s in zip(filled, seeds)]

    def interval_of(ia, ib, ca, cb):
        ends = []
        for f, c in zip(filled, counts):
            selfs = np.diagonal(f, axis1=1, axis2=2)  # (B, L)
            ends.append(
                bootstrap_pair_interval(
                    f[np.ix_(range(len(f)), ia, ib)], selfs[:, ia], selfs[:, ib], c, level, summary, ca, cb
                )
            )
        return tuple(np.mean(ends, axis=0))

    zoo = _build(matrix, columns, models, summary, layers, families, interval_of)
    zoo.interval = (
        f"{level:g} percentile bootstrap over {min(len(f) for f in filled)} batches, {replicates} replicates"
        + (f", endpoints averaged over {len(filled)} shuffles" if len(filled) > 1 else "")
    )
    return zoo


def zoo_from_replicates(
    result: Any,
    replicates: Iterable[np.ndarray],
    level: float,
    summary: str = "best_match",
    layers: dict[str, str] | None = None,
    families: Sequence[str] | None = None,
    what: str = "",
) -> Zoo:
    """Returns the Zoo of a cached layer x layer result (as zoo_from_cka) with each pair's percentile bootstrap
    interval at `level` from `replicates`: the measure's whole joint (L, L) matrix on each bootstrap resample of the
    images, every cell of a replicate from the same resample (measures_stats.iter_bootstrap_replicates), so the
    summary of a replicate is one draw of the summary and the interval carries the dependence between cells, as
    zoo_from_hsic's does for CKA. The replicates are read one at a time: memory holds (R, n, n) summaries, not
    (R, L, L) matrices. A replicate whose summary is not finite is left out. what: how the replicates were made,
    for `interval`.
    """
    zoo = zoo_from_cka(result, summary, layers, families)
    columns = _columns(result)
    idx, _, cell = _layout(columns, zoo.models, summary, layers)
    draws = []
    for matrix in replicates:
        matrix = np.asarray(matrix, dtype=np.float64)
        if matrix.shape != (len(columns), len(columns)):
            raise VitseeError(
                f"a bootstrap replicate of shape {matrix.shape} for a result of {len(columns)} layers: "
                "give replicates of the same result"
            )
        draws.append(_pair_summaries(matrix, idx, zoo.models, summary, cell))
    if not draws:
        raise VitseeError("no bootstrap replicates were given: ask for some (e.g. --measure-bootstrap 200)")
    level = stats_mod.check_level(level)
    zoo.ci_low, zoo.ci_high = stats_mod.percentile_interval(np.stack(draws), level)  # (R, n, n) draws
    zoo.interval = (
        f"{level:g} percentile bootstrap over {len(draws)} resamples of the images"
        + (f" {what}" if what else "")
        + ", each replicate's summary from the pair's whole matrix"
    )
    return zoo

"""Do the layer x layer measures agree? For one pair of models (or one model with itself), every measure cached
for them side by side, and how alike their rankings of the layer pairs are.

A finding such as "ViT's lower layers are unlike ResNet's" holds under another measure when that measure ranks the
layer pairs the same way. So each two measures are compared by the Spearman correlation of their values over all
layer pairs of the two models (within one model: every pair of two different layers, both orders, as a measure that
is not symmetric -- PWCCA, CKNNA -- tells them apart), a distance (Procrustes) read reversed so that measures that
agree correlate positively whatever their direction. The first part is the pure core (arrays in, numbers out); then
the analysis, whose view has Shape.MEASURES_AGREE: the rank correlations as its matrix, each measure's matrix beside
it (figures.py draws them side by side with the same axes).

The measures are those of the layer-similarity family (similarity.layer_measures) cached for the store, any
estimate of each; CKA, run by default, is computed when missing. Its cache key names each measure's result, so a
measure computed later makes a new comparison.
"""

from __future__ import annotations

import numpy as np

from vitsee.store import Store
from vitsee.analyses.base import AnalyzeConfig, StepFn, emit
from vitsee.analyses.contract import REGISTRY, Analysis, Request, Result, Shape, View, streaming_reason
from vitsee.analyses.similarity import FAMILY, layer_measures, pair_requests

# --- the pure core ---------------------------------------------------------------------------------------------


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Returns the 1-based ranks of a 1-D array, ties given their average rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    for start, count in zip(first, counts):  # a tie: every member gets the mean of the ranks it spans
        if count > 1:
            ranks[order[start : start + count]] = start + (count + 1) / 2
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Returns the Spearman rank correlation of two 1-D arrays over the entries finite in both (NaN with fewer than
    three such entries, or where either is constant)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    if both.sum() < 3:
        return float("nan")
    ra, rb = average_ranks(a[both]), average_ranks(b[both])
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / scale) if scale > 0 else float("nan")


def layer_pairs(shape: tuple[int, int], within: bool) -> np.ndarray:
    """Returns the bool mask of the cells that are layer pairs to compare: every cell across two models, every
    cell off the diagonal within one (a layer with itself is alike by construction)."""
    mask = np.ones(shape, dtype=bool)
    if within:
        np.fill_diagonal(mask, False)
    return mask


def rank_correlations(panels: np.ndarray, higher_is_better: list[bool], within: bool) -> tuple[np.ndarray, int]:
    """Returns ((M, M) Spearman correlations between the measures' values over the layer pairs, the number of
    pairs) for panels (M, rows, cols), a distance's values negated first."""
    mask = layer_pairs(panels.shape[1:], within)
    signed = [(p if up else -p)[mask] for p, up in zip(np.asarray(panels, dtype=np.float64), higher_is_better)]
    m = len(signed)
    out = np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            out[i, j] = out[j, i] = spearman(signed[i], signed[j])
    return out, int(mask.sum())


def pair_rank(matrix: np.ndarray, row: int, col: int, higher_is_better: bool = True, within: bool = False) -> float:
    """Returns the share of the other layer pairs of the matrix that are more alike than (row, col) by this
    measure: 0 for the most alike pair, near 1 for the least (NaN when the cell is)."""
    values = np.asarray(matrix, dtype=np.float64)
    value = values[row, col]
    mask = layer_pairs(values.shape, within) & np.isfinite(values)
    mask[row, col] = False
    if not np.isfinite(value) or not mask.any():
        return float("nan")
    others = values[mask]
    above = (others > value) if higher_is_better else (others < value)
    return float(above.sum() / mask.sum())


def rank_words(share: float) -> str:
    """Returns where a pair ranks in words: 'in the top 10%', 'in the top quarter', 'in the top half', 'in the
    bottom half', 'in the bottom quarter' or 'in the bottom 10%' of the pairs."""
    if not np.isfinite(share):
        return "unranked"
    for limit, words in (
        (0.1, "top 10%"),
        (0.25, "top quarter"),
        (0.5, "top half"),
        (0.75, "bottom half"),
        (0.9, "bottom quarter"),
    ):
        if share < limit:
            return f"in the {words}"
    return "in the bottom 10%"


def agreement_line(ranks: dict[str, float]) -> str:
    """Returns one line on whether the measures (label -> pair_rank share) put a pair in the same half of the
    pairs: 'the measures agree: in the top half by every one (CKA top 10%, ...)', or where they part."""
    known = {label: share for label, share in ranks.items() if np.isfinite(share)}
    if len(known) < 2:
        return "one measure: nothing to compare its rank with"
    words = {label: rank_words(share) for label, share in known.items()}
    groups: dict[str, list[str]] = {}
    for label, text in words.items():
        groups.setdefault(text, []).append(label)
    ordered = sorted(groups.items(), key=lambda item: min(known[label] for label in item[1]))  # most alike first
    halves = {share < 0.5 for share in known.values()}
    if len(halves) == 1:
        half = "top half" if halves.pop() else "bottom half"
        detail = ", ".join(f"{text.removeprefix('in the ')} by {', '.join(labels)}" for text, labels in ordered)
        return f"the measures agree: in the {half} of the pairs by every one ({detail})"
    parts = [
        f"{text if i == 0 else text.removeprefix('in the ')}{' of the pairs' if i == 0 else ''} by {', '.join(labels)}"
        for i, (text, labels) in enumerate(ordered)
    ]
    return "the measures disagree: " + "; ".join(parts)


# --- the analysis ----------------------------------------------------------------------------------------------


class MeasuresAgree(Analysis):
    """The measures cached for the store side by side, and the rank correlations between them for each pair of
    models. One result for the store (every measure's joint matrix, as cached); a view cuts one pair's block out of
    each and correlates them (a few Spearman correlations over at most L x L values)."""

    name = "agree"
    label = "Agree?"
    title = "do the layer x layer measures agree? each one's matrix, and their rank correlations over the layer pairs"
    option_help = (
        "compare the layer x layer measures cached for the store by the rank correlation of their values, "
        "for each pair of models and each model with itself"
    )
    order = 19  # after the measures, which it reads
    shape = Shape.MEASURES_AGREE
    family = FAMILY  # in the CKA tab: `m` cycles the measures and then this
    tab = False
    by_default = False
    cost = 0  # a summary of cached results, computed at once (CKA is the one measure it may compute)
    models = (1, 2)
    model_fields = ("model_a", "model_b")
    identity = ("models", "layers", "measures")  # a measure cached later makes a new comparison
    needs = frozenset({"activations"})  # CKA, when it must be computed
    nonfinite_source = "measures' matrices"
    layer_list_title = "Measures (Enter: go)"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:
            return streaming_reason(store, "no measure beside CKA can be computed to compare it with")
        return None

    def requests(self, store: Store) -> list[Request]:
        return pair_requests(self.name, store.models)

    def jobs(self, store: Store) -> list[Request]:
        """Returns the one job that gathers every measure's joint matrix of the store (none where it applies to
        no model: the driver then says why)."""
        if not store.models or any(self.not_applicable(store, key) for key in store.models):
            return []
        return [Request(self.name, tuple(store.models[:1]), joint=True)]

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        models = store.models
        measures = {}
        for analysis in layer_measures():
            asked = Request(analysis.name, tuple(models[:1]))
            params = analysis.cached_params(store, analysis.params(store, asked, AnalyzeConfig()))
            if params is None and analysis.by_default:  # CKA: computed when missing
                params = analysis.params(store, asked, cfg)
            if params is not None:
                measures[analysis.name] = params
        return {"models": models, "layers": {m: store.layers(m) for m in models}, "measures": measures}

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
        """Returns every measure's joint (L, L) matrix over the store's layers, stacked (M, L, L)."""
        panels, columns = [], None
        for i, (name, measure_params) in enumerate(params["measures"].items()):
            result = Result.load(store, name, measure_params)
            if result is None:  # one run by default, not cached yet
                result = REGISTRY[name].run(store, Request(name, tuple(params["models"][:1])), cfg, progress)
            panels.append(np.asarray(result["matrix"], dtype=np.float64))
            columns = (result["model"], result["layer"])  # every joint matrix: store order, layers in forward order
            emit(progress, self.name, i + 1, len(params["measures"]))
        return {
            "panels": np.stack(panels),
            "measures": np.array(list(params["measures"])),
            "model": np.asarray(columns[0]),
            "layer": np.asarray(columns[1]),
        }

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the rank correlations of the measures over the A x B layer pairs, with each measure's block."""
        a, b = request.keys[0], request.keys[-1]
        models = result.params["models"]
        rows = np.flatnonzero(result["model"] == models.index(a))
        cols = np.flatnonzero(result["model"] == models.index(b))
        layers = [str(x) for x in result["layer"]]
        panels = np.asarray(result["panels"], dtype=np.float64)[:, rows][:, :, cols]
        names = [str(n) for n in result["measures"]]
        measures = [REGISTRY[n] for n in names]
        labels = [m.label for m in measures]
        higher = [m.higher_is_better for m in measures]
        matrix, n_pairs = rank_correlations(panels, higher, a == b)
        extra = {
            "measures": names,
            "panels": panels,
            "panel_rows": [layers[i] for i in rows],
            "panel_cols": [layers[j] for j in cols],
            "panel_names": [m.value_name or m.label for m in measures],
            "higher_is_better": higher,
            "n_pairs": n_pairs,
        }
        if len(names) < 2:
            extra["note"] = (
                f"only {labels[0] if labels else 'no measure'} is cached for these models: "
                "`vitsee analyze STORE --measures all` computes the others"
            )
        params = {k: v for k, v in result.params.items() if k != "layers"}
        title = f"Do the measures agree? {a}" if a == b else f"Do the measures agree? {a} (rows) x {b} (cols)"
        return View.of(
            request,
            title=title,
            matrix=matrix,
            rows=labels,
            cols=labels,
            value_name="rank correlation",
            vmin=-1.0,
            vmax=1.0,
            params=params,
            extra=extra,
            models=[a, b],
        )

    def caption_notes(self, view: View) -> str:
        distances = [label for label, up in zip(view.rows, view.extra["higher_is_better"]) if not up]
        within = len(set(view.models)) == 1
        text = (
            f"; rank correlation: Spearman over the {view.extra['n_pairs']} layer pairs"
            + (" (every two different layers, both orders)" if within else "")
            + (f", {', '.join(distances)} read reversed (a distance: low is alike)" if distances else "")
        )
        return text + (f"; {view.extra['note']}" if view.extra.get("note") else "")

    def command(self, store_path, layer: str | None = None) -> str:
        return f"vitsee analyze {store_path} --measures all --agree"

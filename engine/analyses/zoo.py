"""The zoo as an analysis: which model of the store is like which, from a layer x layer measure's joint matrix.

Every pair of models A, B of the store gets one number, a summary of the cross-model block M(A_i, B_j) of the chosen
measure's cached result (engine/zoo/summaries.py holds the arithmetic):
- `best_match` (the default): (mean over A's layers of their best match in B + mean over B's of theirs in A) / 2;
- `layer`: M at one layer per model (each model's last stored layer unless `--zoo-layers` names others).
With it come each model's layers matched to every other model's (the raw argmax and the monotone path, relative
depth against relative depth) and the clustering order of the models x models matrix.

The measure is linear CKA unless `--zoo-measure` names another analysis of the layer similarity family (any
`LayerMatrix`: one joint matrix over every stored layer of every model). A measure that is a distance (lower is
more alike, e.g. a Procrustes distance) is summarised with minima instead of maxima: best match is then the mean
distance of each layer to its nearest layer of the other model, S(A, A) = 0, and the layers are matched by the
smallest distance; the clustering reads the distances as they are. The values are those of the cached measure
result, as engine/zoo/summaries.py computes them from it.

Chance level (engine/zoo/calibration.py): a permutation null of every pair's summary and of each layer's best match,
each replicate permuting every model's images by its own permutation; per pair the raw value, the null's mean and 95th
percentile, p and the calibrated score (raw - null mean) / (best - null mean). Linear CKA's comes from the batches'
Grams in the pass its intervals make anyway (`--zoo-permutations`, default 999); any other measure's costs one
computation of the measure per replicate, so it is made only when `--zoo-permutations K` asks for it.

Intervals: the delete-one-image jackknife of each pair's summary. Linear CKA's (`LinearCKA.observe_batches`): a second
pass over its result's batches (activations, or a `--grams` store's Grams) in which every image is left out once and
the summary of every pair recomputed on the leave-one-out matrix. A measure with jackknife intervals
(`--measure-bootstrap N`, `GramMeasure.jackknife_matrices`): its own groups of images left out again, the summary of
each whole joint matrix one leave-out value. A measure result cached before with a bootstrap (`bootstrap_matrices`)
keeps the percentile interval of its own resamples (engine/zoo/summaries.py `zoo_from_replicates`). Otherwise the
intervals are NaN and `interval` says why and how to get them (per-cell intervals give no honest interval of a max).

The view names no model (`zoo`): its rows and columns are all of the store's models, in the store's order.
"""

from __future__ import annotations

import numpy as np

from vitsee import stats as stats_mod
from vitsee.zoo import calibration
from vitsee.zoo import summaries as numbers
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.analyses.base import AnalyzeConfig, StepFn, resolve_device, with_stats
from vitsee.analyses.contract import (
    REGISTRY,
    Analysis,
    AnalysisOption,
    Request,
    Result,
    Shape,
    View,
    analyses_of,
    bootstrap_words,
)
from vitsee.analyses.similarity import FAMILY, LayerMatrix, named_measure

DEFAULT_MEASURE = "cka"
NULL_FIELDS = ("null_mean", "null_q95", "p_value", "calibrated")  # (n, n) each, like the values
CALIBRATION_WORDS = (
    "calibrated = (raw - null mean) / (best - null mean): 0 at chance, 1 for a model with itself; p = (1 + #{null >= "
    "raw}) / (1 + K); null: each model's images permuted, all its layers alike (Groger et al. 2026)"
)
SUMMARY_WORDS = {"best_match": "best-match", "layer": "last-layer"}  # the value's name: 'best-match CKA'


def measures() -> list[LayerMatrix]:
    """Returns the analyses a zoo can summarise: the layer similarity family's joint layer x layer matrices."""
    return [a for a in analyses_of(FAMILY) if isinstance(a, LayerMatrix)]


def measure_of(cfg: AnalyzeConfig) -> LayerMatrix:
    """Returns the measure `--zoo-measure` names (linear CKA by default); an unknown one is a VitseeError."""
    return named_measure(cfg, "zoo-measure", DEFAULT_MEASURE, measures(), "a layer x layer measure")


def summary_of(cfg: AnalyzeConfig) -> str:
    """Returns the summary `--zoo-summary` names (best_match by default)."""
    name = str(cfg.options.get("zoo_summary") or "best_match").replace("-", "_")
    if name not in numbers.SUMMARIES:
        raise VitseeError(f"--zoo-summary {name} is not a zoo summary: choose from {', '.join(numbers.SUMMARIES)}")
    return name


def summary_layers(store: Store, cfg: AnalyzeConfig, summary: str) -> dict[str, str]:
    """Returns model -> the layer `--zoo-layers MODEL=LAYER,...` names for the `layer` summary (models not named
    use their last stored layer, and are not listed)."""
    text = str(cfg.options.get("zoo_layers") or "").strip()
    if not text:
        return {}
    if summary != "layer":
        raise VitseeError(f"--zoo-layers {text} names layers for the layer summary: add --zoo-summary layer")
    chosen = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        model, eq, layer = item.rpartition("=")
        if not eq or not model or not layer:
            raise VitseeError(
                f"--zoo-layers: '{item}' is not MODEL=LAYER: write e.g. --zoo-layers 'vit=blocks.11,resnet=layer4'"
            )
        key = store.resolve_model(model.strip())
        if layer.strip() not in store.layers(key):
            raise VitseeError(f"--zoo-layers: {key} has no layer '{layer.strip()}': see `vitsee info {store.path}`")
        chosen[key] = layer.strip()
    return chosen


class ModelZoo(Analysis):
    """Every pair of the store's models summarised from a layer x layer measure: the models x models matrix, its
    intervals and clustering order, the models' families, and each model's layers matched to every other's."""

    name = "zoo"
    label = "Zoo"
    title = "which model is like which: every pair of models, from their layers' best matches"
    order = 75  # after the paper's seven views: tab and key 8
    shape = Shape.MODEL_MATRIX
    family = "zoo"  # with the views that ask which measure to trust on it (separability, n-curves): in its tab
    tooltip = "Show the zoo: every pair of models, clustered, and each model's layers matched to a reference's"
    option_help = (
        "the zoo: a summary of every pair of models' layer x layer matrix (best match by default), "
        "clustered, with jackknife intervals, a permutation null and each model's layers matched to every other's"
    )
    options = (
        AnalysisOption(
            "zoo-measure", str, "the layer x layer measure the zoo summarises (default: cka)", param="measure"
        ),
        AnalysisOption(
            "zoo-summary",
            str,
            "best_match (default: each layer's best match, both ways) or layer "
            "(one layer per model: the last unless --zoo-layers names it)",
            param="summary",
        ),
        AnalysisOption(
            "zoo-layers",
            str,
            "with --zoo-summary layer: MODEL=LAYER,... (others: their last layer)",
            param="summary_layers",
        ),
        AnalysisOption(
            "zoo-permutations",
            int,
            "permutations behind each pair's null, p-value and calibrated score (each model's images permuted; "
            f"default {calibration.NULL_PERMUTATIONS} for CKA, from its Grams; 0 for other measures, where each "
            "recomputes the measure; 0: none)",
            param="stats.null",
        ),
    )
    by_default = False  # asked for: `vitsee analyze --zoo` (the app computes it when its tab opens)
    cost = 1  # intervals: one pass over the activations (or Grams) for the per-batch terms
    models = (0, 0)
    model_fields = ()
    needs = frozenset({"activations"})
    identity = ("measure", "models", "layers", "n_images", "summary", "summary_layers")
    nonfinite_source = "activations"
    layer_list_title = "Models (Enter: go)"
    measure_option = "zoo_measure"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if len(store.models) < 2:
            return (
                f"the zoo compares the models of a store and {store.path.name} holds one: add others with "
                f"`vitsee extract {store.path} -m NAME`"
            )
        return None

    def preference(self, params: dict) -> float:
        st = params.get("stats") or {}  # one with intervals and a null first, then intervals, then the raw values
        return (1.0 if st.get("ci") else 0.0) + (1.0 if st.get("null") else 0.0)

    def command(self, store_path, layer: str | None = None) -> str:
        return f"vitsee analyze {store_path} --zoo"

    def measure_choices(self, store: Store) -> list[str]:
        """Returns the layer x layer measures with a result cached over every stored layer of every model of the
        store (any estimate: the app's zoo takes the one cached), in registry order: those a zoo of them reads at
        once."""
        found = []
        for measure in measures():
            try:
                jobs = measure.jobs(store)
                if jobs and measure.cached_params(store, measure.params(store, jobs[0], AnalyzeConfig())) is not None:
                    found.append(measure.name)
            except VitseeError:  # not applicable to this store (a streaming store's Gram measures, too few images)
                continue
        return found

    def measure_of_view(self, view: View) -> str:
        return str(view.params.get("measure") or DEFAULT_MEASURE)

    def option_paths(self, attr: str) -> list[str]:
        """Its own options, and those of the measures it summarises, kept in the measure's params (`of`)."""
        return super().option_paths(attr) or list(
            dict.fromkeys(f"of.{path}" for measure in measures() for path in measure.option_paths(attr))
        )

    # --- parameters and running -------------------------------------------------------------------------------

    def measure_params(self, store: Store, measure: LayerMatrix, cfg: AnalyzeConfig) -> dict:
        """Returns the cache key of the measure result the zoo summarises: that of cfg's settings, unless no settings
        were asked for (cfg.any_cka_estimate) and another estimate about the same layers is cached: then that one,
        as a view takes any cached estimate."""
        jobs = measure.jobs(store)
        if not jobs:  # the measure does not apply to this store (a streaming store keeps no activations for a Gram)
            reason = next(filter(None, (measure.not_applicable(store, m) for m in store.models)), None)
            raise VitseeError(reason or f"{measure.label} has nothing to compute in {store.path}")
        wanted = measure.params(store, jobs[0], cfg)
        if cfg.recompute or not cfg.any_cka_estimate or Result.load(store, measure.name, wanted) is not None:
            return wanted
        given = [attr for attr in cfg.options if measure.option_paths(attr)]  # `--max-images 64`: made with 64
        return measure.cached_params(store, wanted, given) or wanted

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        measure, summary = measure_of(cfg), summary_of(cfg)
        models = store.models
        params = {
            "measure": measure.name,
            "models": models,
            "layers": {m: store.layers(m) for m in models},
            "n_images": store.n_images,
            "summary": summary,
            "summary_layers": summary_layers(store, cfg, summary),
            "of": self.measure_params(store, measure, cfg),
        }
        params = with_stats(params, cfg)  # the intervals' level and seed (none with --ci 0)
        null = null_permutations(cfg, measure)
        if null:  # an addition: zoos cached before have no null and keep their keys
            params["stats"] = {**(params.get("stats") or {"ci": 0.0, "permutations": 0, "seed": int(cfg.seed)})}
            params["stats"]["null"] = null
        return params

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
        """Returns the zoo of the measure's result (cached, or computed first), with intervals where it has
        per-batch terms."""
        measure: LayerMatrix = REGISTRY[params["measure"]]
        if len(params["models"]) < 2:
            raise VitseeError(self.not_applicable(store, params["models"][0] if params["models"] else ""))
        result = None if cfg.recompute else Result.load(store, measure.name, params["of"])
        if result is None:
            result = measure.run(store, measure.jobs(store)[0], cfg, progress)
        sign = 1.0 if measure.higher_is_better else -1.0  # a distance: minima, read back as distances
        families = [numbers.family_of_record(store.model_info(k)) for k in params["models"]]
        layers = params["summary_layers"] or None
        signed = Result(
            result.analysis, result.params, {**result.arrays, "matrix": sign * np.asarray(result["matrix"])}
        )
        zoo = numbers.zoo_from_cka(signed, params["summary"], layers, families)
        models = params["models"]
        stats_arrays = zoo_statistics(store, measure, result, signed, zoo, params, cfg, sign, progress)
        n, width = len(models), max(len(params["layers"][m]) for m in models)
        argmax = np.full((n, n, width), -1, dtype=np.int64)
        path = np.full((n, n, width), -1, dtype=np.int64)
        for (a, b), c in zoo.correspondences.items():
            i, j = models.index(a), models.index(b)
            argmax[i, j, : len(c.rows)], path[i, j, : len(c.rows)] = c.argmax, c.path
        return {
            "values": sign * zoo.values,
            "order": np.asarray(zoo.order, dtype=np.int64),
            "families": np.array(families),
            "argmax": argmax,
            "path": path,
            **stats_arrays,
        }

    # --- the view ---------------------------------------------------------------------------------------------

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the models x models matrix in the store's order, with the clustering order, families and every
        ordered pair's layer correspondence in `extra`."""
        params = result.params
        models, layers = list(params["models"]), params["layers"]
        measure = REGISTRY.get(params["measure"])
        label = measure.label if measure is not None else params["measure"]
        value_name = f"{SUMMARY_WORDS[params['summary']]} {label}"
        low, high = np.asarray(result["ci_low"], dtype=float), np.asarray(result["ci_high"], dtype=float)
        has_ci = bool(np.isfinite(low).any())
        interval = str(result["interval"][0])
        if has_ci and int(result["n_batches"]) == 1:  # every replicate redraws the one batch: no interval at all
            has_ci, low, high = False, np.full_like(low, np.nan), np.full_like(high, np.nan)
            interval = (
                "none: the CKA it summarises has one minibatch of images, nothing to resample "
                "(a --batch-size under the store's images gives intervals)"
            )
        correspondences = []
        for i, a in enumerate(models):
            for j, b in enumerate(models):
                if i != j:
                    la = len(layers[a])
                    c = numbers.Correspondence(
                        a, b, list(layers[a]), list(layers[b]), result["argmax"][i, j, :la], result["path"][i, j, :la]
                    )
                    correspondences.append(c.as_json())
                    if "match_p" in result:  # each layer's best match in b against the null of its row max
                        correspondences[-1]["p_value"] = [
                            None if not np.isfinite(v) else float(v) for v in result["match_p"][i, j, :la]
                        ]
        extra = {
            "models": models,
            "families": [str(f) for f in result["families"]],
            "order": [int(k) for k in result["order"]],
            "summary": params["summary"],
            "measure": params["measure"],
            "summary_layers": params["summary_layers"],
            "interval": interval,
            "correspondences": correspondences,
        }
        if has_ci:
            if int(result["n_batches"]):  # CKA's minibatches; a measure's resamples of images have none
                extra["n_batches"] = int(result["n_batches"])
        else:  # the JSON still has the fields the zoo promises: null where there is no interval
            extra["ci_low"], extra["ci_high"] = low, high
        nan = np.full(low.shape, np.nan)
        for name in NULL_FIELDS:  # null where the zoo has no null (one cached before, or --zoo-permutations 0)
            extra[name] = np.asarray(result[name], dtype=float) if name in result else nan
        extra["null"] = str(result["null"][0]) if "null" in result else "none: computed before zoo nulls existed"
        extra["null_permutations"] = int(result["null_permutations"]) if "null_permutations" in result else 0
        extra["calibration"] = CALIBRATION_WORDS
        higher = measure.higher_is_better if measure is not None else True
        vmin, vmax = measure.value_range if measure is not None and higher else (None, None)
        view_params = {k: v for k, v in params.items() if k != "layers"}
        view_params["of"] = {k: v for k, v in params["of"].items() if k != "layers"}
        title = f"Zoo: {value_name} of every pair of the store's {len(models)} models"
        return View.of(
            request,
            title=title,
            matrix=np.asarray(result["values"], dtype=float),
            rows=models,
            cols=list(models),
            value_name=value_name,
            vmin=vmin,
            vmax=vmax,
            params=view_params,
            extra=extra,
            models=[],
            ci_low=low if has_ci else None,
            ci_high=high if has_ci else None,
        )

    def interval_words(self, view: View, level: str) -> str:
        words = str(view.extra.get("interval", ""))
        if not view.extra.get("n_batches") or "jackknife" in words:  # the words the computation gave
            return f"{level} {words.split(' ', 1)[-1]}"
        return (
            bootstrap_words(view, level) + ", each replicate's summary taken from the pair's whole layer x layer matrix"
        )


# --- the zoo's statistics: intervals and the null -------------------------------------------------------------


def null_permutations(cfg: AnalyzeConfig, measure: LayerMatrix) -> int:
    """Returns how many replicates the zoo's null takes: `--zoo-permutations`, else NULL_PERMUTATIONS for a measure
    whose null comes from its batches' Grams (linear CKA) and 0 for the others (each replicate recomputes them)."""
    asked = cfg.options.get("zoo_permutations")
    if asked is not None:
        if int(asked) < 0:
            raise VitseeError(f"--zoo-permutations {asked} is negative: use 0 (no null) or a count such as 999")
        return int(asked)
    return calibration.NULL_PERMUTATIONS if hasattr(measure, "observe_batches") else 0


def zoo_statistics(
    store: Store,
    measure: LayerMatrix,
    result: Result,
    signed: Result,
    zoo: numbers.Zoo,
    params: dict,
    cfg: AnalyzeConfig,
    sign: float,
    progress: StepFn | None,
) -> dict[str, np.ndarray]:
    """Returns the arrays of the zoo's intervals and null (see the module docstring): ci_low, ci_high, interval,
    n_batches, and with a null null_mean, null_q95, p_value, calibrated (n, n), match_p (n, n, width), null (its words);
    in the measure's own units (a distance's null_q95 is the null's 5th percentile: its alike end)."""
    st = params.get("stats") or {}
    models = params["models"]
    n, width = len(models), max(len(params["layers"][m]) for m in models)
    columns = numbers._columns(signed)
    idx, _, cell = numbers._layout(columns, models, params["summary"], params["summary_layers"] or None)
    layout = (idx, models, params["summary"], cell)
    level, permutations = float(st.get("ci") or 0.0), int(st.get("null") or 0)
    nan = np.full((n, n), np.nan)
    out: dict[str, np.ndarray] = {"ci_low": nan.copy(), "ci_high": nan.copy(), "n_batches": np.array(0)}
    interval = "none: --ci 0" if not level else f"none: {measure.label} keeps no per-batch terms or resamples"
    null_words = "none: --zoo-permutations 0"
    null = None
    matrix = np.asarray(signed["matrix"], dtype=np.float64)
    if hasattr(measure, "observe_batches") and sign > 0 and (level or permutations):
        found = _cka_statistics(store, measure, result, layout, zoo.values, level, permutations, st, cfg, progress)
        if found is None:
            interval = null_words = "none: a streaming store without Grams keeps nothing to pass over again"
        else:
            low, high, interval, null, null_words, out["n_batches"] = found
            out["ci_low"], out["ci_high"] = low, high
    else:
        if level:
            low, high, interval = _measure_intervals(
                store, measure, result, signed, zoo, layout, level, sign, cfg, params["summary_layers"] or None
            )
            out["ci_low"], out["ci_high"] = low, high
        if permutations:
            reps = measure.null_matrices(store, result, permutations, int(st.get("seed", cfg.seed)), cfg.device)
            if reps is None:
                null_words = "none: every layer holds NaN/Inf"
            else:
                null = calibration.null_of_replicates((sign * r for r in reps), *layout[:2], *layout[2:], width)
                null_words = (
                    f"{permutations} permutations of each model's images (all its layers alike), {measure.label} "
                    f"recomputed on the {len(result['images'])} images of its result for each"
                )
        elif not hasattr(measure, "observe_batches"):
            null_words = (
                f"none: a null of {measure.label} recomputes it once per permutation: add --zoo-permutations 99 "
                "(each takes about as long as the measure)"
            )
    out["interval"] = np.array([interval])
    out["null"] = np.array([null_words])
    if null is not None:
        summaries, rows = null
        best = 1.0 if sign > 0 else 0.0  # the summary of a model with itself: CKA-like 1, a distance 0 (negated: 0)
        calibrated = stats_mod.summary_null(zoo.values, summaries, best)
        raw_rows = calibration.best_match_rows(matrix[None], idx, models, width)[0]
        out.update(
            null_mean=sign * calibrated["null_mean"],
            null_q95=sign * calibrated["null_q95"],
            p_value=calibrated["p_value"],
            calibrated=calibrated["calibrated"],
            match_p=calibration.match_p_values(raw_rows, rows),
            null_permutations=np.array(len(summaries)),
        )
    return out


def _cka_statistics(store, measure, result, layout, values, level, permutations, st, cfg, progress):
    """Returns (ci_low, ci_high, interval words, (null summaries, null rows) or None, null words, n_batches) of linear
    CKA's zoo from passes over its result's batches, None when there are none to pass over."""
    idx, models, summary, cell = layout
    columns = numbers._columns(result)
    owners = [list(models).index(m) for m, _ in columns]
    width = max(len(v) for v in idx.values())
    seed = int(st.get("seed", cfg.seed))
    device = resolve_device(cfg.device)
    nulls: dict[int, list] = {}
    rounds = calibration.null_rounds(permutations, len(columns)) if permutations else [(0, 0)]
    sums = None
    for first, count in rounds:

        def observers(k, first=first, count=count):
            if not count:
                return []
            nulls.setdefault(k, []).append(calibration.ZooNull(owners, permutations, [seed, k], device, first, count))
            return nulls[k][-1:]

        sums = measure.observe_batches(store, result, observers, cfg.device, progress)
        if sums is None:
            return None
    null = null_words = None
    if permutations:
        per_shuffle = [
            np.concatenate([calibration.null_cka(s, z.sums.cpu().numpy()) for z in nulls[k]])
            for k, s in enumerate(sums)
        ]
        cka = np.mean(per_shuffle, axis=0)  # (K, L, L): averaged over the shuffles, as the result's own matrix is
        null = calibration.null_of_replicates([cka], idx, models, summary, cell, width)
        null_words = (
            f"{permutations} permutations of each model's images inside each minibatch (all its layers alike), "
            "from the batches' Grams"
        )
    else:
        null_words = "none: --zoo-permutations 0"
    n = len(models)
    low, high = np.full((n, n), np.nan), np.full((n, n), np.nan)
    interval, n_batches = "none: --ci 0", 0
    if level:
        jacks = {}

        def observers(k):
            jacks[k] = calibration.ZooJackknife(sums[k], idx, models, summary, cell)
            return [jacks[k]]

        measure.observe_batches(store, result, observers, cfg.device, progress)
        parts = [jacks[k] for k in sorted(jacks)]
        if any(j.unseen for j in parts) or min(j.images for j in parts) < stats_mod.MIN_INTERVAL_IMAGES:
            interval = stats_mod.no_interval_reason(min(j.images for j in parts), max(j.unseen for j in parts))
        else:
            sd = np.mean([np.sqrt(j.var) for j in parts], axis=0)  # each shuffle's; the values average them
            half = stats_mod.t_quantile(level, min(j.images for j in parts) - 1) * sd
            np.fill_diagonal(half, np.nan)
            low, high = values - half, values + half
            interval = (
                f"{level:g} jackknife interval, each of the {min(j.images for j in parts)} images left out once and "
                "every pair's summary recomputed on the leave-one-out matrix: summary -/+ t x sd"
                + (f", sd averaged over {len(parts)} shuffles" if len(parts) > 1 else "")
            )
        n_batches = -(-int(result.params["n_images"]) // int(result.params["batch_size"]))
    return low, high, interval, null, null_words, n_batches


def _measure_intervals(store, measure, result, signed, zoo, layout, level, sign, cfg, summary_layers):
    """Returns (ci_low, ci_high, words) of a measure's zoo from its own jackknife groups (or, for a result cached with
    a bootstrap, its own resamples), in the measure's units; NaN with the reason where it has neither."""
    idx, models, summary, cell = layout
    n = len(models)
    nan = np.full((n, n), np.nan)
    jack = measure.jackknife_matrices(store, result, cfg.device) if hasattr(measure, "jackknife_matrices") else None
    if jack is not None:
        matrices, groups, how = jack
        leave_out = np.concatenate(
            [calibration.pair_summaries(sign * m[None], idx, models, summary, cell) for m in matrices]
        )
        low_s, high_s = stats_mod.jackknife_interval(zoo.values, leave_out, level)
        np.fill_diagonal(low_s, np.nan)
        np.fill_diagonal(high_s, np.nan)
        low, high = (low_s, high_s) if sign > 0 else (-high_s, -low_s)
        return low, high, f"{level:g} jackknife interval over {how}, each pair's summary -/+ t_{groups - 1} x sd"
    resamples = measure.bootstrap_matrices(store, result, cfg.device)
    if resamples is not None:  # a result cached with a bootstrap: its own resamples of whole images
        matrices, how = resamples
        boot = numbers.zoo_from_replicates(
            signed, (sign * m for m in matrices), level, summary, summary_layers, None, how
        )
        low, high = (boot.ci_low, boot.ci_high) if sign > 0 else (-boot.ci_high, -boot.ci_low)
        return low, high, boot.interval
    if any(o.name == "measure-bootstrap" for o in measure.options):
        note = "" if len(result["images"]) >= stats_mod.MIN_INTERVAL_IMAGES else f" ({len(result['images'])} images)"
        return (
            nan,
            nan.copy(),
            f"none: {measure.label} was computed without intervals{note}: add --measure-bootstrap 20 to "
            f"`vitsee analyze --zoo --zoo-measure {measure.name}`",
        )
    return nan, nan.copy(), f"none: {measure.label} keeps no per-batch terms or resamples to resample"

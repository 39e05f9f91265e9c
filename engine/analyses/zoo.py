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

Intervals: a percentile bootstrap over minibatches of images of the pair's *summary* (each replicate rebuilds the
pair's whole layer x layer matrix from per-batch terms, engine/zoo/summaries.py `bootstrap_pair_interval`). Only a
measure that can give per-batch HSIC terms (`LayerMatrix.batch_hsic`: linear CKA, from the activations in the batches of
its cached result, or from a `--grams` store's Grams) has them; one pass over the activations or Grams makes them.
A measure computed with bootstrap resamples of whole images (`--measure-bootstrap`: every Gram measure,
`LayerMatrix.bootstrap_matrices`) gives instead its own resamples again, each one the whole joint matrix on one
resample, and each replicate's summary is one draw (engine/zoo/summaries.py `zoo_from_replicates`): the same draws as
its per-cell intervals, at the cost of the measure's bootstrap once more. Otherwise the intervals are NaN and `interval`
says why and how to get them (per-cell intervals give no honest interval of a max).

The view names no model (`zoo`): its rows and columns are all of the store's models, in the store's order.
"""

from __future__ import annotations

import numpy as np

from vitsee.zoo import summaries as numbers
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.analyses.base import AnalyzeConfig, StepFn, with_stats
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
from vitsee.analyses.similarity import FAMILY, LayerMatrix

DEFAULT_MEASURE = "cka"
SUMMARY_WORDS = {"best_match": "best-match", "layer": "last-layer"}  # the value's name: 'best-match CKA'


def measures() -> list[LayerMatrix]:
    """Returns the analyses a zoo can summarise: the layer similarity family's joint layer x layer matrices."""
    return [a for a in analyses_of(FAMILY) if isinstance(a, LayerMatrix)]


def measure_of(cfg: AnalyzeConfig) -> LayerMatrix:
    """Returns the measure `--zoo-measure` names (linear CKA by default); an unknown one is a VitseeError."""
    name = str(cfg.options.get("zoo_measure") or DEFAULT_MEASURE)
    found = next((a for a in measures() if a.name == name), None)
    if found is None:
        raise VitseeError(
            f"--zoo-measure {name} is not a layer x layer measure: choose from {', '.join(a.name for a in measures())}"
        )
    return found


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
        "clustered, with bootstrap intervals and each model's layers matched to every other's"
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
        return 1.0 if (params.get("stats") or {}).get("ci") else 0.0  # one with intervals first

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
        return with_stats(params, cfg)  # the bootstrap's level, replicates and seed (none with --ci 0)

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
        low, high = np.full_like(zoo.values, np.nan), np.full_like(zoo.values, np.nan)
        st = params.get("stats") or {}
        n_batches, interval = 0, f"none: {measure.label} keeps no per-batch terms or resamples to resample"
        if any(o.name == "measure-bootstrap" for o in measure.options):
            interval = (
                f"none: {measure.label} was computed without bootstrap resamples: add --measure-bootstrap "
                f"200 to `vitsee analyze --zoo --zoo-measure {measure.name}`"
            )
        terms = measure.batch_hsic(store, result, cfg.device, progress) if st.get("ci") and sign > 0 else None
        resamples = (
            measure.bootstrap_matrices(store, result, cfg.device, progress) if st.get("ci") and terms is None else None
        )
        if not st.get("ci"):
            interval = "none: --ci 0"
        elif resamples is not None:  # the measure's own resamples of whole images: each one's summary is a draw
            matrices, how = resamples
            boot = numbers.zoo_from_replicates(
                signed, (sign * m for m in matrices), st["ci"], params["summary"], layers, families, how
            )
            low, high = (boot.ci_low, boot.ci_high) if sign > 0 else (-boot.ci_high, -boot.ci_low)
            interval = boot.interval
        elif terms is not None:
            sums, batches = terms
            columns = [(m, layer) for m in result.params["models"] for layer in result.params["layers"][m]]
            boot = numbers.zoo_from_hsic(
                sums,
                columns,
                params["models"],
                batches,
                params["summary"],
                layers,
                families,
                level=st["ci"],
                replicates=st["bootstrap"],
                seed=st["seed"],
            )
            low, high, interval = boot.ci_low, boot.ci_high, boot.interval
            n_batches = min(int((np.abs(np.diagonal(b, axis1=1, axis2=2)).sum(axis=1) > 0).sum()) for b in batches)
        models = params["models"]
        n, width = len(models), max(len(params["layers"][m]) for m in models)
        argmax = np.full((n, n, width), -1, dtype=np.int64)
        path = np.full((n, n, width), -1, dtype=np.int64)
        for (a, b), c in zoo.correspondences.items():
            i, j = models.index(a), models.index(b)
            argmax[i, j, : len(c.rows)], path[i, j, : len(c.rows)] = c.argmax, c.path
        return {
            "values": sign * zoo.values,
            "ci_low": low,
            "ci_high": high,
            "order": np.asarray(zoo.order, dtype=np.int64),
            "families": np.array(families),
            "argmax": argmax,
            "path": path,
            "interval": np.array([interval]),
            "n_batches": np.array(n_batches),
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
        higher = measure.higher_is_better if measure is not None else True
        vmin, vmax = measure.value_range if measure is not None and higher else (None, None)
        view_params = {k: v for k, v in params.items() if k != "layers"}
        view_params["of"] = {k: v for k, v in params["of"].items() if k != "layers"}
        title = f"Zoo: {value_name} of every pair of the store's {len(models)} models"
        return View(
            self.name,
            "",
            title,
            "",
            np.asarray(result["values"], dtype=float),
            models,
            list(models),
            value_name,
            vmin,
            vmax,
            params=view_params,
            extra=extra,
            models=[],
            ci_low=low if has_ci else None,
            ci_high=high if has_ci else None,
        )

    def interval_words(self, view: View, level: str) -> str:
        if not view.extra.get("n_batches"):  # a measure's own resamples of images: zoo_from_replicates said how
            return f"{level} {str(view.extra.get('interval', '')).split(' ', 1)[-1]}"
        return (
            bootstrap_words(view, level) + ", each replicate's summary taken from the pair's whole layer x layer matrix"
        )

"""Has a measure's value settled? A layer x layer measure against the number of images (an n-curve) or, for the kNN
measures, against k (a k-curve), each point with its bootstrap interval (engine/measures/curves.py holds the
arithmetic).

The view `curve:A[:B]` is of one measure (`--curve-measure`, mknn by default: Koepke et al., arXiv:2604.18572,
show mutual k-NN alignment drifting with the image pool) and of either one pair of layers (`--curve-layers
LAYER_A,LAYER_B`) or, by default, the pair of models as the zoo summarises it: the best-match alignment of A's
layers with B's (engine/zoo/summaries.py; for A:A, each layer's best match among its other layers). The images
are the measure's own seeded subset (its `--max-images`), its parameters its own options (`--knn-k`, ...); an
n-curve runs over nested seeded subsets of them (250, 500, 1000, ... all: `--curve-first` the first), a k-curve
(`--curve-over k`) over k = 5, 10, 20, 50, ... on all of them. Each point's interval is a percentile bootstrap
over that subset's images.
"""

from __future__ import annotations

import numpy as np

from vitsee import stats as stats_mod
from vitsee.analyses.base import AnalyzeConfig, StepFn, emit, resolve_device
from vitsee.analyses.contract import REGISTRY, Analysis, AnalysisOption, Request, Result, Shape, View, streaming_reason
from vitsee.analyses.similarity import GramMeasure, named_measure, pair_requests, shared_layer_grams
from vitsee.analyses.separability import WHICH
from vitsee.errors import VitseeError
from vitsee.measures import curves
from vitsee.measures.curves import CURVE_REPLICATES, FIRST_SIZE, k_values, subset_sizes
from vitsee.store import Store

DEFAULT_MEASURE = "mknn"
OVER = ("n", "k")


def gram_measures() -> list[GramMeasure]:
    """Returns the layer x layer measures computed from the layers' Grams (every one but the minibatch CKA)."""
    return [a for a in REGISTRY.values() if isinstance(a, GramMeasure)]


def curve_measure(cfg: AnalyzeConfig) -> GramMeasure:
    """Returns the measure `--curve-measure` names (mknn by default)."""
    return named_measure(cfg, "curve-measure", DEFAULT_MEASURE, gram_measures(), "a measure an n-curve can resample")


def curve_over(cfg: AnalyzeConfig, measure: GramMeasure, values: dict) -> str:
    """Returns what the curve runs over: n (the default) or k (a kNN measure's neighbours)."""
    over = str(cfg.options.get("curve_over") or "n")
    if over not in OVER:
        raise VitseeError(f"--curve-over {over} is not n (images) or k (neighbours)")
    if over == "k" and "k" not in values:
        raise VitseeError(f"--curve-over k: {measure.label} has no k; a k-curve is of mknn or cknna")
    return over


def curve_layers(store: Store, keys: tuple[str, ...], cfg: AnalyzeConfig) -> list[str] | None:
    """Returns [layer of A, layer of B] from `--curve-layers LA,LB` (None: the models' summary)."""
    text = str(cfg.options.get("curve_layers") or "").strip()
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    a, b = keys[0], keys[-1]
    if len(parts) != 2 or not all(parts):
        raise VitseeError(f"--curve-layers {text}: name two layers, one of {a} and one of {b}: LAYER_A,LAYER_B")
    for key, layer in ((a, parts[0]), (b, parts[1])):
        if layer not in store.layers(key):
            raise VitseeError(f"--curve-layers: {key} has no layer '{layer}': see `vitsee info {store.path}`")
    return parts


class Curve(Analysis):
    """A measure against the number of images (or k) for one layer pair or a pair of models' summary."""

    name = "curve"
    label = "n-curve"
    short_label = "Curve"
    title = "a measure against the number of images (or k): has the value settled?"
    order = 77
    shape = Shape.CURVES
    family = WHICH
    tab = False  # in the Zoo's tab, with the separability (the jump list, :, names it)
    option_help = (
        "a layer x layer measure against the number of images (nested seeded subsets) or k, each point with its "
        "bootstrap interval: whether a value has settled"
    )
    options = (
        AnalysisOption(
            "curve-measure",
            str,
            f"the measure (default: {DEFAULT_MEASURE}): any but the minibatch CKA",
            param="measure",
        ),
        AnalysisOption(
            "curve-layers",
            str,
            "LAYER_A,LAYER_B: one layer pair (default: the models' best-match summary)",
            param="layers",
        ),
        AnalysisOption("curve-over", str, "n (images, the default) or k (mknn and cknna's neighbours)", param="over"),
        AnalysisOption(
            "curve-first",
            int,
            "the first subset of an n-curve, doubled up to all images (default 250)",
            param="first",
        ),
    )
    by_default = False
    cost = 2  # the measure on every subset, and on each bootstrap resample of it
    models = (2, 2)  # a pair of models (A:A for two layers of one, with --curve-layers)
    model_fields = ("model_a", "model_b")
    needs = frozenset({"activations"})
    identity = ("measure", "models", "layers", "over", "images")
    nonfinite_source = "activations"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:
            return streaming_reason(store, "no measure can be computed on subsets of its images")
        return None

    def requests(self, store: Store) -> list[Request]:
        if store.streaming:
            return []
        return [r for r in pair_requests(self.name, store.models) if len(r.keys) == 2]

    def jobs(self, store: Store) -> list[Request]:
        return self.requests(store)[:1]  # `vitsee analyze --curve`: the first model's; a view asks for its own

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        measure = curve_measure(cfg)
        of = measure.params(store, Request(measure.name, tuple(store.models[:1]), joint=True), cfg)
        of.pop("stats", None)  # the curve's own intervals, not the measure's
        values = measure.measure_values(of)
        over = curve_over(cfg, measure, values)
        keys = [request.keys[0], request.keys[-1]]
        n = int(of["max_images"])
        first = int(cfg.options.get("curve_first") or FIRST_SIZE)
        x = subset_sizes(n, first) if over == "n" else k_values(n)
        params = {
            "measure": measure.name,
            "models": keys,
            "layers": curve_layers(store, request.keys, cfg),
            "over": over,
            "first": first,
            "x": x,
            "images": {"n_images": of["n_images"], "max_images": n, "seed": of["seed"]},
            "values": values,
        }
        if cfg.ci:
            params["stats"] = {
                "ci": stats_mod.check_level(cfg.ci),
                "bootstrap": CURVE_REPLICATES,
                "seed": int(cfg.seed),
            }
        return params

    def warning(self, store: Store, request: Request, cfg: AnalyzeConfig) -> str | None:
        params = self.params(store, request, cfg)
        measure = REGISTRY[params["measure"]]
        reps = (params.get("stats") or {}).get("bootstrap", 0) + 1
        layers = 2 if params["layers"] else sum(len(store.layers(k)) for k in dict.fromkeys(params["models"]))
        seconds = sum(
            measure.seconds(m, layers, **params.get("values", {})) * reps
            for m in (params["x"] if params["over"] == "n" else [params["images"]["max_images"]] * len(params["x"]))
        )
        if seconds < 60:
            return None
        return (
            f"the {measure.label} curve recomputes the measure {reps} times at each of {len(params['x'])} points: "
            f"about {seconds / 60:.0f} min on one CPU core (--curve-layers one pair, --ci 0 or a GPU shorten it)"
        )

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
        """Returns the value at each point of the x axis and its interval."""
        from vitsee.measures.grams import choose_images, pairwise
        from vitsee.zoo.summaries import best_match_alignment

        measure = REGISTRY[params["measure"]]
        a, b = params["models"]
        im = params["images"]
        rows = choose_images(im["n_images"], im["max_images"], im["seed"] or 0)[0]
        if params["layers"]:
            cols_a, cols_b = [(a, params["layers"][0])], [(b, params["layers"][1])]
        else:
            cols_a, cols_b = [(a, layer) for layer in store.layers(a)], [(b, layer) for layer in store.layers(b)]
        device = resolve_device(cfg.device)
        grams_a = shared_layer_grams(store, cols_a, rows, device, progress, self.name)
        grams_b = grams_a if cols_b == cols_a else shared_layer_grams(store, cols_b, rows, device, progress, self.name)
        bad = [f"{m} {layer}" for (m, layer), g in zip([*cols_a, *cols_b], [*grams_a, *grams_b]) if g is None]
        if bad:
            raise VitseeError(
                f"{', '.join(bad[:3])} hold NaN/Inf activations: a curve of them is not defined; name other layers "
                "with --curve-layers"
            )
        sign = 1.0 if measure.higher_is_better else -1.0
        same = cols_a == cols_b
        st = params.get("stats") or {}
        level, replicates, seed = st.get("ci", 0.0), st.get("bootstrap", 0), st.get("seed", 0)
        done = [0]
        total = len(params["x"]) * (1 + replicates)

        def evaluate(subset: np.ndarray, **values) -> float:
            ga = [g.take(subset) for g in grams_a]
            gb = ga if same else [g.take(subset) for g in grams_b]
            matrix = pairwise(ga, None if same else gb, measure.key, **values)
            done[0] += 1
            emit(progress, f"{self.name} points", done[0], total)
            if params["layers"]:
                return float(matrix[0, 0])
            if same:
                np.fill_diagonal(matrix, np.nan)  # a layer with itself is alike by construction
            return sign * float(best_match_alignment(sign * matrix))

        values = dict(params["values"])
        if params["over"] == "n":
            subsets = curves.nested_subsets(len(rows), params["x"], seed)
            out = curves.curve(lambda s: evaluate(s, **values), subsets, level, replicates, seed)
        else:
            values.pop("k")
            every = np.arange(len(rows))
            parts = [
                curves.curve(lambda s, k=k: evaluate(s, k=k, **values), [every], level, replicates, seed)
                for k in params["x"]
            ]
            out = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        arrays = {"x": np.asarray(params["x"]), "value": out["value"], "images": rows}
        if level:
            arrays.update(ci_low=out["ci_low"], ci_high=out["ci_high"])
        return arrays

    def view(self, result: Result, request: Request, info: dict) -> View:
        params = result.params
        measure = REGISTRY[params["measure"]]
        a, b = params["models"]
        over_n = params["over"] == "n"
        if params["layers"]:
            what = f"{a} {params['layers'][0]} x {b} {params['layers'][1]}"
            series = measure.value_name or measure.label
        else:
            what = f"{a} x {b}" if a != b else f"{a}'s layers with each other"
            series = f"best-match {measure.label}"
        values = {k: v for k, v in params["values"].items() if not (k == "k" and not over_n)}
        setting = ", ".join(f"{k} {v}" for k, v in values.items())
        x = np.asarray(result["x"])
        im = params["images"]
        note = (
            (
                f"nested seeded subsets of the {im['max_images']} images (seed {im['seed'] or 0}): each holds the "
                "smaller ones"
                if over_n
                else f"all {im['max_images']} images, k neighbours of each"
            )
            + (f"; {setting}" if setting else "")
            + "; settled where the next value lies inside this interval and the intervals narrow as 1/sqrt(n)"
        )
        column = lambda key: np.asarray(result[key], dtype=float)[:, None] if key in result else None  # noqa: E731
        return View(
            self.name,
            "",
            f"{series} of {what} against {'the number of images' if over_n else 'k'}",
            "",
            column("value"),
            [str(int(v)) for v in x],
            [series],
            series,
            None,
            None,
            params=params,
            extra={"x": x, "x_label": "images" if over_n else "k (neighbours)", "log_x": True, "note": note},
            models=[a, b],
            ci_low=column("ci_low"),
            ci_high=column("ci_high"),
        )

    def interval_words(self, view: View, level: str) -> str:
        st = view.params.get("stats") or {}
        return f"{level} percentile bootstrap over each subset's images ({st.get('bootstrap')} resamples)"

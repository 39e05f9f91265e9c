"""Which measure tells the store's model families apart? Each layer x layer measure's zoo, scored by how well its
pairs of models of one family stand out from its pairs of different families (Wu, Saha, Bo & Khosla 2025,
"Measuring the measures", arXiv:2509.04622), and the consensus of the measures beside them.

For each measure (every layer x layer measure of the store, or those `--separability-measures` names) the zoo of
the store's models is computed or read (engine/analyses/zoo.py: its summary of every pair of models, best match by
default), and engine/zoo/separability.py gives its d-prime, silhouette and ROC-AUC of within- against across-family
pairs, each with a percentile bootstrap interval over the models. The last row is the consensus zoo: the measures'
zoos fused by their ranks (rank_fusion), scored the same way.

The groups are each model's architecture family (its timm name, engine/zoo/summaries.py), or what `--families
MODEL=FAMILY,...` sets; with `--separate-by trained` they are trained against untrained (random-init or 0-epoch
weights): Bo et al.'s question of whether a measure sees training at all. The view is a table of scores (rows:
measures, columns: the three scores); its figure draws each score with its interval per measure and the consensus
zoo beside.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vitsee import stats as stats_mod
from vitsee.analyses.base import AnalyzeConfig, StepFn, emit
from vitsee.analyses.contract import REGISTRY, Analysis, AnalysisOption, Request, Result, Shape, View
from vitsee.analyses.similarity import GramMeasure, LayerMatrix
from vitsee.analyses.zoo import ModelZoo
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.zoo import separability as sep
from vitsee.zoo import summaries as numbers

WHICH = ModelZoo.family  # the views that ask which measure to trust on the zoo show in the Zoo's tab
GROUPINGS = ("family", "trained")
CONSENSUS = "consensus"
CONSENSUS_LABEL = "consensus (rank fusion)"


def zoo_measures() -> list[LayerMatrix]:
    """Returns the measures a zoo can summarise (engine/analyses/zoo.py), in registry order."""
    from vitsee.analyses.zoo import measures

    return measures()


def measures_of(cfg: AnalyzeConfig) -> list[str]:
    """Returns the measures `--separability-measures a,b,...` names (default: every layer x layer measure)."""
    known = [m.name for m in zoo_measures()]
    text = str(cfg.options.get("separability_measures") or "").strip()
    if not text or text == "all":
        return known
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise VitseeError(
            f"--separability-measures: {', '.join(unknown)} is not a layer x layer measure: choose from "
            f"{', '.join(known)} (or all)"
        )
    return list(dict.fromkeys(chosen))


def grouping_of(cfg: AnalyzeConfig) -> str:
    """Returns what `--separate-by` groups the models by: family (default) or trained."""
    by = str(cfg.options.get("separate_by") or "family")
    if by not in GROUPINGS:
        raise VitseeError(f"--separate-by {by} is not a grouping: use family (the default) or trained")
    return by


def labels_of(store: Store, by: str, families: str = "") -> list[str]:
    """Returns each model's group: its architecture family, or trained / untrained; `families` (MODEL=GROUP,...)
    sets some models' groups by hand."""
    models = store.models
    if by == "trained":
        labels = [sep.trained_label(store.model_info(k)["weights"]) for k in models]
    else:
        labels = [numbers.family_of_record(store.model_info(k)) for k in models]
    for item in filter(None, (part.strip() for part in str(families or "").split(","))):
        model, eq, group = item.rpartition("=")
        if not eq or not model.strip() or not group.strip():
            raise VitseeError(
                f"--families: '{item}' is not MODEL=FAMILY: write e.g. --families 'test_vit@random:1=ViT,resnet18=CNN'"
            )
        labels[models.index(store.resolve_model(model.strip()))] = group.strip()
    return labels


class Separability(Analysis):
    """Each layer x layer measure's power to tell the store's model families apart, from its zoo."""

    name = "separability"
    label = "Separability"
    short_label = "Sep"
    title = "which measure tells the model families apart: d-prime, silhouette and ROC-AUC of each measure's zoo"
    order = 76  # after the zoo
    shape = Shape.SCORE_TABLE
    family = WHICH
    tab = False  # in the Zoo's tab (the jump list, :, names it): the tab row is full at 57 columns
    tooltip = "Show how well each measure separates the model families (d-prime, silhouette, ROC-AUC)"
    option_help = (
        "each layer x layer measure's separability of the model families from its zoo (d-prime, silhouette, "
        "ROC-AUC, bootstrap intervals over models), and the measures' consensus"
    )
    options = (
        AnalysisOption(
            "separability-measures",
            str,
            "the measures whose zoos are scored, a,b,... (default: all; each one's zoo is computed if missing)",
            param="measures",
        ),
        AnalysisOption(
            "families", str, "MODEL=FAMILY,...: set models' groups (default: each one's architecture)", param="families"
        ),
        AnalysisOption(
            "separate-by", str, "family (default) or trained: trained against random-init models", param="by"
        ),
    )
    by_default = False
    cost = 2  # every measure's zoo: each measure over every layer of every model
    models = (0, 0)
    model_fields = ()
    needs = frozenset({"activations"})
    identity = ("measures", "models", "labels", "by", "n_images")
    nonfinite_source = "activations"
    layer_list_title = "Measures"
    what_varies = "the models vary, the images are fixed"

    def not_applicable(self, store: Store, key: str) -> str | None:
        labels = labels_of(store, "family")
        if len(labels) >= 3 and len(set(labels)) >= 2 and len(labels) > len(set(labels)):
            return None
        return (
            f"separability compares pairs of models within and across families, and {store.path.name}'s models "
            f"({', '.join(labels)}) hold no family of two beside another: add models with `vitsee extract "
            f"{store.path} -m NAME`, or set groups with --families MODEL=FAMILY,..."
        )

    def command(self, store_path, layer: str | None = None) -> str:
        return f"vitsee analyze {store_path} --separability"

    def warning(self, store: Store, request: Request, cfg: AnalyzeConfig) -> str | None:
        missing = [m for m in measures_of(cfg) if not self._cached_zoo(store, m, cfg)]
        if not missing:
            return None
        seconds = sum(
            REGISTRY[m].estimate(store, Request(m, ()), self.zoo_config(cfg, m))[0]
            for m in missing
            if isinstance(REGISTRY[m], GramMeasure)  # linear CKA's zoo is the minibatch pass: seconds
        )
        took = f": about {seconds / 60:.0f} min on one CPU core" if seconds >= 60 else ""
        return (
            f"separability computes the zoo of {', '.join(missing)} first (each measure over every layer of every "
            f"model{took}); --separability-measures names fewer"
        )

    # --- parameters and running -------------------------------------------------------------------------------

    @staticmethod
    def zoo_config(cfg: AnalyzeConfig, measure: str) -> AnalyzeConfig:
        """Returns the config of one measure's zoo: its measure, and no intervals of its own (the separability's
        are over models)."""
        return replace(cfg, ci=0.0, permutations=0).with_options({"zoo_measure": measure})

    def _cached_zoo(self, store: Store, measure: str, cfg: AnalyzeConfig) -> bool:
        zoo = REGISTRY["zoo"]
        try:
            params = zoo.params(store, Request("zoo", ()), self.zoo_config(cfg, measure))
        except VitseeError:
            return False
        return Result.load(store, "zoo", params) is not None

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        measures = measures_of(cfg)
        by = grouping_of(cfg)
        labels = labels_of(store, by, cfg.options.get("families") or "")
        sep.check_labels(labels, len(store.models), "families" if by == "family" else "groups (trained/untrained)")
        zoo = REGISTRY["zoo"]
        of = {m: zoo.params(store, Request("zoo", ()), self.zoo_config(cfg, m)) for m in measures}
        params = {
            "measures": measures,
            "models": store.models,
            "labels": labels,
            "by": by,
            "families": str(cfg.options.get("families") or ""),
            "n_images": store.n_images,
            "of": of,
        }
        if cfg.ci:
            params["stats"] = {
                "ci": stats_mod.check_level(cfg.ci),
                "bootstrap": stats_mod.BOOTSTRAP_REPLICATES,
                "seed": int(cfg.seed),
            }
        return params

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
        """Returns each measure's scores (and the consensus's) with their intervals, and the zoos they came from."""
        zoo = REGISTRY["zoo"]
        st = params.get("stats") or {}
        level, replicates, seed = st.get("ci", 0.0), st.get("bootstrap", 0), st.get("seed", 0)
        names = [*params["measures"], CONSENSUS]
        n_rows, n = len(names), len(params["models"])
        values, low, high = (np.full((n_rows, 3), np.nan) for _ in range(3))
        used = np.zeros((n_rows, 3), dtype=np.int64)
        zoos, higher = np.full((n_rows, n, n), np.nan), np.ones(n_rows, dtype=bool)
        for i, measure in enumerate(params["measures"]):
            result = zoo.run(store, Request("zoo", ()), self.zoo_config(cfg, measure), progress)
            zoos[i], higher[i] = np.asarray(result["values"], dtype=np.float64), REGISTRY[measure].higher_is_better
            emit(progress, "separability zoos", i + 1, len(params["measures"]))
        zoos[-1] = sep.rank_fusion(list(zoos[:-1]), list(higher[:-1]))
        counts = (0, 0)
        for i in range(n_rows):
            out = sep.separability(zoos[i], params["labels"], bool(higher[i]), level, replicates, [seed, i])
            counts = (out["n_within"], out["n_across"])
            for j, stat in enumerate(sep.STATISTICS):
                values[i, j] = out[stat]
                if level:
                    low[i, j], high[i, j], used[i, j] = (
                        out[f"{stat}_low"],
                        out[f"{stat}_high"],
                        out[f"{stat}_replicates"],
                    )
        arrays = {
            "values": values,
            "zoos": zoos,
            "higher": higher,
            "measures": np.array(names),
            "n_pairs": np.array(counts),
        }
        if level:
            arrays.update(ci_low=low, ci_high=high, replicates=used)
        return arrays

    # --- the view ---------------------------------------------------------------------------------------------

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the measures x scores table (the consensus last), the consensus zoo as the panel beside."""
        params = result.params
        names = [str(m) for m in result["measures"]]
        rows = [REGISTRY[m].label if m in REGISTRY else m for m in names[:-1]] + [CONSENSUS_LABEL]
        groups = list(params["labels"])
        within, across = (int(v) for v in result["n_pairs"])
        by = "families" if params["by"] == "family" else "trained vs untrained"
        extra = {
            "measures": names,
            "groups": groups,
            "models": list(params["models"]),
            "n_within": within,
            "n_across": across,
            "panel": np.asarray(result["zoos"][-1], dtype=float),
            "panel_title": "consensus zoo (rank fusion)",
            "panel_labels": list(params["models"]),
            "panel_groups": groups,
            "zoos": np.asarray(result["zoos"], dtype=float),
            "note": (
                f"{len(groups)} models in {len(set(groups))} groups by {by} ({within} pairs within, {across} "
                "across); higher is better in every column: d-prime and ROC-AUC of within- against across-group "
                "pairs, mean silhouette; consensus: the mean of the measures' zoos' ranks"
            ),
        }
        if "replicates" in result:
            extra["replicates"] = np.asarray(result["replicates"])
        return View(
            self.name,
            "",
            f"Separability of the {by} by each measure's zoo",
            "",
            np.asarray(result["values"], dtype=float),
            rows,
            [sep.WORDS[s] for s in sep.STATISTICS],
            "separability",
            None,
            None,
            params={k: v for k, v in params.items() if k != "of"},
            extra=extra,
            models=[],
            ci_low=np.asarray(result["ci_low"], dtype=float) if "ci_low" in result else None,
            ci_high=np.asarray(result["ci_high"], dtype=float) if "ci_high" in result else None,
        )

    def interval_words(self, view: View, level: str) -> str:
        st = view.params.get("stats") or {}
        return (
            f"{level} percentile bootstrap over the {len(view.extra.get('groups', []))} models "
            f"({st.get('bootstrap')} resamples, a model never paired with its own copy)"
        )

    def caption_notes(self, view: View) -> str:
        return f"; {view.extra['note']}"

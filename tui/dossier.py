"""What vitsee knows about one pair of layers (the dossier of a layer x layer cell): the section each analysis
declares for those two layers (its `dossier_section`), read from the store's cache, as lines of text; what is not
cached says how to compute it, what does not apply says why (the analysis's own reason).

Runs in thread workers (it opens the store); no Textual here. The screen that draws it is screens/dossier.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vitsee.tui.results import LoadedView, StoreSummary, read_view

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.analyses.views import View


@dataclass
class Section:
    """One analysis of one of the two layers: a title, its numbers as lines, and the full view it opens."""

    kind: str  # the view Enter opens: an analysis with a dossier section (attention, probes, skip, spatial, erf)
    model: str
    layer: str  # where that view's cursor goes (attention: the block)
    title: str
    lines: list[str]
    available: bool  # False: not computed, or not applicable (the lines say which)


@dataclass
class Dossier:
    """The CKA cell and the sections of the row layer (model A) and the column layer (model B)."""

    cka: LoadedView
    row: int
    col: int
    sections: list[Section] = field(default_factory=list)

    @property
    def sides(self) -> list[tuple[str, str]]:
        """Returns (model, layer) of the row and the column, once when they are the same layer."""
        view = self.cka.view
        row = (view.models[0], view.rows[self.row])
        col = (view.models[-1], view.cols[self.col])
        return [row] if row == col else [row, col]


# --- the whole dossier ----------------------------------------------------------------------------------------------


def dossier_analyses() -> list:
    """Returns the registered analyses that have a section in the dossier, in the registry's order."""
    from vitsee.analyses import REGISTRY

    return [a for a in REGISTRY.values() if a.dossier_title]


def read_dossier(
    path: str | Path,
    summary: StoreSummary,
    cka: LoadedView,
    row: int,
    col: int,
    config: Callable[[], AnalyzeConfig],
    known: dict[str, LoadedView] | None = None,
) -> Dossier:
    """Returns the dossier of a layer x layer cell (row, col): per layer the section of every analysis that has one
    (head distances, probes, skip ratios, spatial map, ERF). Views in `known` or the cache are read; the cheap ones
    (cost 0: summaries of statistics recorded at extraction) are computed when missing; the rest say how to
    compute them."""
    from vitsee.models.init_notes import random_init_note
    from vitsee.store import Store
    from vitsee.analyses.views import cached_params, load_view

    from vitsee.tui.results import ACCESS

    path, known = Path(path), dict(known or {})
    dossier = Dossier(cka, row, col)
    dossier.sections.append(measures_section(path, summary, cka, row, col, known))
    wanted = [
        (a, model, layer, _spec(a, model, layer, summary)) for model, layer in dossier.sides for a in dossier_analyses()
    ]
    specs = {spec for *_, (spec, _) in wanted if spec is not None and spec not in known}
    with ACCESS.read(), Store.open(path) as store:  # one open for every check (each open verifies the file)
        cached = {spec for spec in specs if cached_params(store, spec) is not None}
        notes = {m: random_init_note(store.model_info(m)) or "" for m, _ in dossier.sides}
    views: dict[str, View] = {spec: loaded.view for spec, loaded in known.items()}
    cheap = {a.name for a in dossier_analyses() if a.cost == 0}
    for spec in sorted(specs):
        if spec in cached:
            with ACCESS.read():
                views[spec] = load_view(path, spec)
        elif spec.partition(":")[0] in cheap:
            views[spec] = read_view(path, spec, config()).view
    for analysis, model, layer, (spec, why) in wanted:
        kind = analysis.name
        if spec is None:
            dossier.sections.append(Section(kind, model, layer, _title(analysis, model, layer), [why], False))
        elif spec not in views:
            lines = [f"not computed: {analysis.command(summary.path, layer)}"]
            dossier.sections.append(Section(kind, model, layer, _title(analysis, model, layer), lines, False))
        else:
            dossier.sections.append(section_of(analysis, model, layer, views[spec], notes[model]))
    return dossier


MEASURES_TITLE = "Every measure of this pair"


def measures_section(
    path: Path, summary: StoreSummary, cell: LoadedView, row: int, col: int, known: dict[str, LoadedView]
) -> Section:
    """Returns the section of the cell's layer pair in every layer x layer measure cached for its models: each
    value with its interval and where the pair ranks among all pairs of the two models, then one line saying
    whether the measures agree on that rank; what is not cached says how to compute it. Enter opens the
    measures' comparison (the family's view that is no layer matrix), else the cell's own view."""
    from vitsee.analyses.agree import agreement_line, pair_rank, rank_words
    from vitsee.analyses.contract import Shape, analyses_of
    from vitsee.analyses.similarity import layer_measures
    from vitsee.analyses.driver import measures_command
    from vitsee.store import Store
    from vitsee.analyses.views import cached_params, load_view

    from vitsee.tui.results import ACCESS

    view = cell.view
    models = cell.spec.partition(":")[2]  # 'A:B' (or 'A'), as the cell's own view names them
    row_layer, col_layer = view.rows[row], view.cols[col]
    within = len(set(view.models)) == 1
    views: dict[str, View] = {}
    with ACCESS.read(), Store.open(path) as store:
        for analysis in layer_measures():
            spec = f"{analysis.name}:{models}"
            if spec in known:
                views[analysis.name] = known[spec].view
            elif cached_params(store, spec) is not None:
                views[analysis.name] = None  # read below, once the store is closed
    lines, ranks, missing = [], {}, []
    for analysis in layer_measures():
        if analysis.name not in views:
            missing.append(analysis.name)
            continue
        v = views[analysis.name] or load_view(path, f"{analysis.name}:{models}")
        r, c = v.rows.index(row_layer), v.cols.index(col_layer)
        share = pair_rank(v.matrix, r, c, analysis.higher_is_better, within)
        ranks[analysis.label] = share
        value = f"{v.value_name} {v.cell_text(r, c, 3)}{v.interval_or_hint(r, c)}"
        lines.append(f"{value}  ({rank_words(share)} of the pairs)")
    lines.append(agreement_line(ranks))
    if missing:
        lines.append(f"not computed: {', '.join(missing)}: {measures_command(summary.path, missing)}")
    family = analyses_of(view.analysis.family)
    overview = next((a.name for a in family if a.shape is not Shape.LAYER_MATRIX), view.kind)
    return Section(overview, view.models[0], row_layer, MEASURES_TITLE, lines, True)


def _title(analysis, model: str, layer: str) -> str:
    return f"{analysis.dossier_title} \u00b7 {model.partition('@')[0]} {layer}"


def _spec(analysis, model: str, layer: str, summary: StoreSummary) -> tuple[str | None, str]:
    """Returns (the view that holds the analysis's numbers for this layer, '') or (None, why there is none)."""
    info = summary.model(model)
    reason = info.reason(analysis.name)
    if reason:
        return None, reason
    if analysis.takes_layer:
        if layer not in info.layer_choices.get(analysis.name, []):
            return None, analysis.layer_missing(layer)
        return f"{analysis.name}:{model}:{layer}", ""
    return f"{analysis.name}:{model}", ""


def section_of(analysis, model: str, layer: str, view: View, note: str = "") -> Section:
    """Returns one analysis's section for one layer from its view, or why the view has nothing for the layer."""
    entry = analysis.dossier_section(view, layer, note)
    return Section(
        analysis.name, model, entry.layer, _title(analysis, model, entry.layer), entry.lines, entry.available
    )

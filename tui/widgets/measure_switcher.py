"""`m`: the next layer x layer measure of the models shown, the cursor kept on its layer pair; in a view that
summarises a measure (the zoo), the next measure it can summarise. A worker reads which are cached; the switch is a
message to the explorer (ViewWanted, ViewOptionsWanted), and with nothing else cached a note names the command that
computes the others."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from textual import work
from textual.binding import Binding
from textual.widget import Widget

from vitsee.errors import VitseeError
from vitsee.tui.messages import MeasuresFound, Place, ViewOptionsWanted, ViewWanted
from vitsee.tui.widgets.panes import KINDS, TAB_LABELS, VIEW_LABELS, analysis_of, tab_of
from vitsee.tui.widgets.view_pane import ViewPane

MEASURE_BINDING = Binding(
    "m",
    "cycle_measure",
    "Measure",
    show=False,
    id="explorer.measure",
    tooltip="In the CKA view: the next layer x layer measure cached for these models (RBF CKA, "
    "Procrustes, SVCCA, PWCCA, mknn, CKNNA, RSA, then whether they agree), the cursor kept on "
    "its layer pair; in the zoo, the next measure it summarises; with only CKA cached, the "
    "command that computes the others",
)


def family_views(kind: str) -> list[str]:
    """Returns the views of `kind`'s family (CKA, the other layer x layer measures, their comparison), in order."""
    family = analysis_of(kind).family
    return [k for k in KINDS if family and analysis_of(k).family == family]


class MeasureSwitcher(Widget):
    """Finds what `m` switches to for the view shown, and asks the explorer to show it."""

    DEFAULT_CSS = "MeasureSwitcher { display: none; }"

    def __init__(self, path: Path, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.path = Path(path)
        self._current = ""  # the measure the zoo summarises now (what `m` moves on from)

    def cycle(self, pane: ViewPane, spec_for: Callable[[str], str | None], known: Collection[str]) -> None:
        """Starts finding the next view of the pane's family cached for its models (`spec_for(kind)`: that view's
        string for the models shown; `known`: view strings already read), or the next measure a summary can take."""
        kind = pane.kind
        if analysis_of(kind).measure_option:
            if pane.view is None:
                self.notify("nothing to switch yet: wait for the view to load", severity="warning", timeout=4)
                return
            self._current = analysis_of(kind).measure_of_view(pane.view)
            self._find_summarised(kind)
            return
        family = family_views(kind)
        if len(family) < 2:
            first = next((k for k in KINDS if len(family_views(k)) > 1), None)
            where = f": press {list(TAB_LABELS).index(tab_of(first)) + 1} first" if first in TAB_LABELS else ""
            self.notify(
                f"m cycles the layer x layer measures of the {VIEW_LABELS.get(first, 'CKA')} view{where}",
                severity="warning",
                timeout=4,
            )
            return
        specs = {k: spec_for(k) for k in family}
        if specs[kind] is None:
            self.notify("nothing to compare yet: wait for the view to load", severity="warning", timeout=4)
            return
        places: tuple[Place, ...] = ()
        view = pane.view
        if pane.selection is not None and view is not None and view.shape is analysis_of(family[0]).shape:
            row, col = pane.selection  # a layer pair: the next measure keeps it
            places = (Place(view.rows[row]), Place(view.cols[col], "col"))
        self._find_measures(kind, specs, places, set(known))

    @work(thread=True, exclusive=True, group="measures", exit_on_error=False)
    def _find_measures(self, kind: str, specs: dict[str, str | None], places: tuple, known: set[str]) -> None:
        from vitsee.store import Store
        from vitsee.analyses.views import cached_params
        from vitsee.tui.results import ACCESS

        try:
            with ACCESS.read(), Store.open(self.path) as store:
                cached = [
                    k
                    for k, spec in specs.items()
                    if spec is not None and (spec in known or cached_params(store, spec) is not None)
                ]
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        self.post_message(MeasuresFound(kind, cached, places))

    @work(thread=True, exclusive=True, group="measures", exit_on_error=False)
    def _find_summarised(self, kind: str) -> None:
        from vitsee.store import Store
        from vitsee.tui.results import ACCESS

        try:
            with ACCESS.read(), Store.open(self.path) as store:
                choices = analysis_of(kind).measure_choices(store)
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        self.post_message(MeasuresFound(kind, choices, ()))

    def on_measures_found(self, message: MeasuresFound) -> None:
        if message.kind != getattr(self.screen, "kind", message.kind):  # the user moved on meanwhile
            return
        if analysis_of(message.kind).measure_option:
            self._summarise_next(message.kind, message.cached)
        else:
            self._measure_next(message.kind, message.cached, message.places)

    def _measure_next(self, kind: str, cached: list[str], places: tuple) -> None:
        """Asks for the next view of the family that is cached, or says how to cache the others."""
        from vitsee.analyses.driver import measures_command

        family = family_views(kind)
        # cost 0 (the comparison of the cached measures): offered once another measure is cached, computed at once
        measured = [k for k in cached if analysis_of(k).cost > 0]
        cheap = len(measured) > 1
        cycle = [k for k in family if k == kind or k in measured or (analysis_of(k).cost == 0 and cheap)]
        if len(cycle) < 2 or not [k for k in measured if k != kind]:
            missing = [k for k in family if k not in cached and analysis_of(k).cost > 0]
            have = ", ".join(VIEW_LABELS[k] for k in measured) or "nothing"
            self.notify(
                f"only {have} is cached for these models: `{measures_command(self.path, missing)}` "
                "computes the other measures",
                title="measures",
                severity="warning",
                timeout=10,
            )
            return
        nxt = cycle[(cycle.index(kind) + 1) % len(cycle)]
        self.post_message(ViewWanted(nxt, places if analysis_of(nxt).shape is analysis_of(kind).shape else ()))

    def _summarise_next(self, kind: str, choices: list[str]) -> None:
        """Asks for the view read again with the next of the measures cached, or says how to cache others."""
        from vitsee.analyses.driver import measures_command

        analysis, current = analysis_of(kind), self._current
        if not [k for k in choices if k != current]:
            missing = [k for k in family_views(current or KINDS[0]) if analysis_of(k).cost > 0 and k != current]
            self.notify(
                f"only {VIEW_LABELS.get(current, current)} is cached for every model: "
                f"`{measures_command(self.path, missing)}` computes the others, then m shows them here",
                title="measures",
                severity="warning",
                timeout=10,
            )
            return
        others = [k for k in choices if k != current]
        nxt = choices[(choices.index(current) + 1) % len(choices)] if current in choices else others[0]
        self.post_message(ViewOptionsWanted(kind, {analysis.measure_option: nxt}))
        self.notify(f"{analysis.label}: {VIEW_LABELS.get(nxt, nxt)}", timeout=3)

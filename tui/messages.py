"""Messages the app's workers and panes send, kept in one place (the toolong way)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from vitsee.tui.results import LoadedView, StoreSummary


@dataclass
class SummaryLoaded(Message):
    """A store was opened and read: its models, layers and what is cached."""

    bubble = False  # posted by a worker straight to the screen that handles it

    summary: StoreSummary


@dataclass
class SummaryFailed(Message):
    """A store could not be opened (missing, corrupt, not a store)."""

    bubble = False  # posted by a worker straight to the screen that handles it

    path: Path
    error: str


@dataclass
class ViewLoaded(Message):
    """A view's numbers arrived (read from the cache or just computed)."""

    bubble = False  # posted by a worker straight to the screen that handles it

    loaded: LoadedView


@dataclass
class ViewFailed(Message):
    """A view could not be shown: the reason, in one line."""

    bubble = False  # posted by a worker straight to the screen that handles it

    spec: str
    error: str
    busy: bool = False  # another process was writing the store: worth trying again once it has finished


@dataclass
class AnalysisStep(Message):
    """An analysis moved on: `done` of `total` in its own units."""

    bubble = False  # posted by a worker straight to the screen that handles it

    spec: str
    analysis: str
    done: int
    total: int
    message: str = ""


@dataclass
class ResultCached(Message):
    """The background pass over every view has cached one more (views waiting on it can load)."""

    bubble = False  # posted by a worker straight to the screen that handles it

    spec: str


@dataclass
class CachingEnded(Message):
    """The background pass over every view ended: how many views it cached, and whether it was stopped."""

    bubble = False  # posted by a worker straight to the screen that handles it

    cached: int
    total: int
    cancelled: bool = False


@dataclass
class StatusChanged(Message):
    """A pane's selection changed: the status line should read `text`."""

    kind: str
    text: str


@dataclass
class ExportWritten(Message):
    """An export finished: the files written, and a note when the PNG could not be drawn."""

    bubble = False  # posted by a worker straight to the screen that handles it

    json_path: Path
    png_path: Path | None
    note: str | None = None


@dataclass
class FirstViewShown(Message):
    """An explorer's first view is on screen, or says why it cannot be: the work that must not delay it may start."""

    path: Path


@dataclass
class RunEvent(Message):
    """An extraction event: stage 'plan', 'load', 'extract' (done/total images), 'train' (done/total steps of an
    epoch), 'build' (done/total expected seconds of a whole build: the demo's one bar) or 'done'."""

    bubble = False  # posted by a worker straight to the screen that handles it

    stage: str
    done: float = 0
    total: float = 0
    text: str = ""


@dataclass
class RunEnded(Message):
    """An extraction ended: finished, cancelled (resumable) or failed with an error line."""

    bubble = False  # posted by a worker straight to the screen that handles it

    store: Path
    cancelled: bool = False
    error: str | None = None


@dataclass
class ModelsPicked(Message):
    """The side panel's model A or B changed (B is None: the CKA view is within model A)."""

    model_a: str
    model_b: str | None


@dataclass
class PairOpened(Message):
    """A pane opens another view of two models (the zoo's Enter on a cell: that pair's layer x layer view)."""

    kind: str  # the view to show
    model_a: str
    model_b: str  # model_a again: the view of model A with itself


@dataclass
class LayerPicked(Message):
    """A layer was picked in the side panel: the view moves its selection there."""

    layer: str


@dataclass(frozen=True)
class Place:
    """A place a view's cursor can go to: one of its row or column layers, or a layer the side panel picks."""

    name: str  # the layer as timm names it: blocks.7, layer3.0, blocks.1.head.0
    axis: str = "row"  # "row", "col", or "layer" (the spatial and ERF views: the layer the map is of)


@dataclass
class PlaceWanted(Message):
    """The search (n / N, Enter) or a match picked in the side panel's list: the view's cursor goes to `place`."""

    place: Place
    focus: bool = False  # the view takes the keys (a pick in the list: as a layer picked there)


@dataclass
class ViewWanted(Message):
    """A pane or the measure switcher asks the explorer to show another view of the same models (the measures'
    comparison: the measure under the cursor; `m`: the next measure, its cursor at `places`)."""

    kind: str
    places: tuple = ()  # (Place, ...) where the cursor goes once that view is in


@dataclass
class ViewOptionsWanted(Message):
    """The measure switcher asks the explorer to read a view again with other options of its analysis (the zoo's
    measure)."""

    kind: str
    options: dict


@dataclass
class MeasuresFound(Message):
    """Which views of the shown view's family are cached for its models (what `m` cycles), found by a worker."""

    bubble = False  # posted by a worker straight to the screen that handles it

    kind: str  # the view `m` was pressed on
    cached: list[str]
    places: tuple  # where the cursor was (Place, ...): kept on the next view

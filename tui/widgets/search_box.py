"""The explorer's search (`/`): a box in the side panel, the count of what matches under it, and which match the
cursor is on.

The panel hands it the shown view's places (where that view's cursor can go: its rows, its columns across two
models, the layers a map can be of) and the store's models. What it counts is what the panel lists while it is open
(issue 29, 6: `/layer3` counted model B's column layers while the list showed model A's rows only, and `/resnet` said
"no match" beside a listed model). Enter, n and N post PlaceWanted; the explorer moves the cursor there.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label

from vitsee.tui.messages import Place, PlaceWanted

# The explorer's keys for the search (its screen holds them: they work wherever the focus is in it).
SEARCH_BINDINGS: list[BindingType] = [
    Binding(
        "slash",
        "search",
        "Search",
        show=False,
        id="explorer.search",
        tooltip="Search this view's layers and the models (the side panel lists what matches); Enter moves "
        "the cursor to the first match, n / N to the next / previous, Esc closes",
    ),
    # priority, so that n passes the CKA view's n (mark n.s.) while a search is open; the explorer's check_action
    # lets the key through to it (and to the search box, as a letter) otherwise
    Binding(
        "n",
        "step_match(1)",
        "Next match",
        show=False,
        priority=True,
        id="explorer.next_match",
        tooltip="Move the cursor to the next match of the search",
    ),
    Binding(
        "N",
        "step_match(-1)",
        "Previous match",
        show=False,
        priority=True,
        id="explorer.previous_match",
        tooltip="Move the cursor to the previous match of the search",
    ),
    Binding(
        "escape",
        "close_search",
        "Close search",
        show=False,
        id="explorer.close_search",
        tooltip="Close the search and list every layer again",
    ),
]


def matches_query(name: str, query: str) -> bool:
    """Returns whether a layer or model name contains the search text (case does not matter)."""
    return query.strip().lower() in name.lower()


def place_label(place: Place) -> str:
    """Returns how the panel lists a place the search found: the layer, marked (B) when it is a column (model B's)."""
    return f"{place.name} (B)" if place.axis == "col" else place.name


class SearchBox(Vertical):
    """The search text, the count of its matches and the match the cursor is on."""

    DEFAULT_CSS = """
    SearchBox {
        height: auto;
        & > Input { width: 1fr; }
        & > Label { width: 1fr; color: $text-muted; padding: 0 1; }
    }
    """

    @dataclass
    class Changed(Message):
        """The search text changed: the panel lists what it matches now."""

        query: str

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.query_text = ""  # what is searched for ("": no search)
        self.match = -1  # the match the cursor is on (-1: none yet)
        self.places: list[Place] = []
        self.models: list[tuple[str, str]] = []  # (label, key) of the store's models
        self.view_label = ""  # the shown view's name, for the line that says nothing matched

    def compose(self) -> ComposeResult:
        yield Input(placeholder="layer or model", id="search", compact=True)
        yield Label("", id="search-count")

    # --- what is searched -----------------------------------------------------------------------------------

    def set_places(self, places: list[Place], models: list[tuple[str, str]], view_label: str) -> None:
        """Searches these places and models from now on; a new list of places starts again from its first match."""
        if places != self.places or view_label != self.view_label:
            self.match = -1
        self.places, self.models, self.view_label = list(places), list(models), view_label
        self.show_count()

    def matches(self) -> list[Place]:
        """Returns the places whose name holds the search text, in the order n visits them."""
        query = self.query_text
        return [place for place in self.places if matches_query(place.name, query)] if query else []

    def model_matches(self) -> list[tuple[str, str]]:
        """Returns (label, key) of the models whose key holds the search text."""
        query = self.query_text
        return [(label, key) for label, key in self.models if matches_query(key, query)] if query else []

    # --- open, type, step -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Empties the box and gives it the keys."""
        search = self.query_one(Input)
        search.value = ""
        search.focus()

    def clear(self) -> None:
        """Forgets the search (the box empties without a Changed)."""
        self.query_text, self.match = "", -1
        with self.prevent(Input.Changed):
            self.query_one(Input).value = ""
        self.show_count()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.query_text, self.match = event.value.strip(), -1
        self.show_count()
        self.post_message(self.Changed(self.query_text))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_text, self.match = event.value.strip(), -1  # Enter starts again from the first match
        self.step(1, focus=True)  # the view takes the keys: n / N step on from there

    def step(self, step: int, focus: bool = False) -> None:
        """Moves to the next (step 1) or previous (-1) match, around the end, and posts where it is (`focus`: the
        view takes the keys); says where the match is when no place of this view matches."""
        matches = self.matches()
        if not matches:
            models = [key for _, key in self.model_matches()]
            where = f"; model {', '.join(models)} does: pick it in the side panel" if models else ""
            self.notify(
                f"no layer of the {self.view_label} view matches '{self.query_text}'{where}",
                severity="warning",
                timeout=4,
            )
            self.show_count()
            return
        self.match = (self.match + step) % len(matches) if self.match >= 0 or step > 0 else len(matches) - 1
        self.show_count()
        self.post_message(PlaceWanted(matches[self.match], focus=focus))

    def show_count(self) -> None:
        """Says under the box what the panel lists: how many places match, which one the cursor is on, the models."""
        matches, models = self.matches(), self.model_matches()
        if not self.query_text:
            text = ""
        elif not matches:
            many = "s" if len(models) > 1 else ""
            text = f"{len(models)} model{many}, no layer" if models else "no match in this view"
        elif self.match < 0:
            text = f"{len(matches)} match{'es' if len(matches) > 1 else ''} (Enter)"
            text += f" + {len(models)} model{'s' if len(models) > 1 else ''}" if models else ""
        else:
            text = f"{self.match + 1}/{len(matches)} {matches[min(self.match, len(matches) - 1)].name}  n/N"
        self.query_one("#search-count", Label).update(text)

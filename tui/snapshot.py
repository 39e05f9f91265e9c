"""`vitsee-tui STORE --snapshot VIEW --out screen.svg|screen.png`: the screen the app would show for a view, as an SVG
(Textual's screenshot) or a PNG (every cell painted as a terminal shows it, tui/png.py).

The real app runs headless at the asked size and opens the store on the view; an auto-pilot waits until the
view's numbers are on screen (a view not cached yet is computed first, as the app would), then writes the
screenshot and quits. A view that cannot be shown ends the run with the reason the app would show.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vitsee.errors import VitseeError, brief
from vitsee.tui.widgets.panes import VIEW_LABELS

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from vitsee.tui.screens.explorer import ExplorerScreen

SIZE = re.compile(r"(\d+)x(\d+)")
MIN_SIZE = (40, 12)
MAX_SIZE = (1000, 1000)  # a headless screen of C x R cells holds them all: 100000 x 100000 grew past 9.7 GB
POLL_SECONDS = 0.05
FORMATS = (".svg", ".png")


@dataclass
class SnapshotPlan:
    """What to render: a view kind, the models (and layer) it names, where the SVG or PNG goes, at what size."""

    store: Path
    view: str
    kind: str
    keys: list[str]  # resolved store keys; empty: the app's default models
    layer: str | None
    out: Path
    size: tuple[int, int]
    error: str | None = None  # why the view could not be shown (set by the pilot)
    spec: str | None = None  # the view the screenshot shows


def parse_size(text: str) -> tuple[int, int]:
    """Returns (columns, rows) of a size such as 120x40."""
    match = SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise VitseeError(f"--size {text}: give COLUMNSxROWS, such as 120x40")
    size = (int(match[1]), int(match[2]))
    if size[0] < MIN_SIZE[0] or size[1] < MIN_SIZE[1]:
        raise VitseeError(f"--size {text}: the app needs at least {MIN_SIZE[0]}x{MIN_SIZE[1]}")
    if size[0] > MAX_SIZE[0] or size[1] > MAX_SIZE[1]:
        raise VitseeError(
            f"--size {text}: a snapshot is at most {MAX_SIZE[0]}x{MAX_SIZE[1]} (columns x rows); "
            "give a smaller size, such as 200x60"
        )
    return size


def plan_snapshot(store: Path, view: str, out: Path | None, size: str) -> SnapshotPlan:
    """Returns the plan for a snapshot, the view's models resolved in the store (a VitseeError for a bad
    view, size or store)."""
    if out is None:
        raise VitseeError("--snapshot needs --out FILE.svg (or FILE.png): where to write the screenshot")
    if out.suffix.lower() not in FORMATS:
        raise VitseeError(f"--out {out}: a snapshot is an SVG or a PNG: name the file *.svg or *.png")
    if out.is_dir():
        raise VitseeError(f"--out {out} is a folder: name the file to write, such as {out / 'screen.svg'}")
    from vitsee.output.export import check_out_folder

    check_out_folder(out)  # one rule with `vitsee export`: a folder that is not there is not made
    columns_rows = parse_size(size)
    if ":" not in view:
        if view not in VIEW_LABELS:
            raise VitseeError(
                f"--snapshot {view}: unknown view: give a kind ({', '.join(VIEW_LABELS)}) "
                "or a view such as cka:MODEL_A:MODEL_B"
            )
        from vitsee.store import Store

        with Store.open(store):  # a missing or broken store is one line now, not an empty screenshot
            pass
        return SnapshotPlan(store, view, view, [], None, out, columns_rows)
    from vitsee.analyses.views import resolve_view

    request = resolve_view(store, view)
    return SnapshotPlan(store, view, request.name, list(request.keys), request.layer, out, columns_rows)


def prepare(plan: SnapshotPlan, screen: ExplorerScreen) -> None:
    """Sets the explorer, before it opens the store, on the plan's view and models."""
    from vitsee.analyses import REGISTRY

    screen.kind = plan.kind
    if not plan.keys:
        return
    a = screen.model_a = plan.keys[0]
    if REGISTRY[plan.kind].models[1] > 1:  # a view of two models: B as named (cka:A is A with itself)
        screen.model_b = plan.keys[1] if len(plan.keys) > 1 else None
        screen.keep_model_b = True  # not the A x B the app opens on
    if plan.layer:
        screen.picked_layer[(plan.kind, a)] = plan.layer


def _state(plan: SnapshotPlan, screen) -> tuple[str, str]:
    """Returns ('ready' | 'waiting' | 'failed', the view spec or why not) for the explorer's current view."""
    from vitsee.tui.screens.explorer import ExplorerScreen

    if not isinstance(screen, ExplorerScreen):
        return "waiting", ""
    busy = any(w.group in ("summary", "view") and not w.is_finished for w in screen.workers)
    spec, reason = screen.spec_for(plan.kind)
    if spec is None:
        opening = screen.summary is None and screen._failure is None  # the store is still being read
        return ("waiting" if opening or busy else "failed"), reason
    pane = screen.pane(plan.kind)
    if pane.loaded is not None and pane.loaded.spec == spec:
        return "ready", spec
    if busy:
        return "waiting", spec
    return "failed", str(pane.query_one(".pane--message").render())


async def take(plan: SnapshotPlan, pilot: Pilot) -> None:
    """Waits until the view is drawn, writes the SVG or PNG and exits the app (return code 0, or 2 with
    plan.error)."""
    app = pilot.app
    while True:
        await pilot.pause(POLL_SECONDS)
        state, text = _state(plan, app.screen)
        if state == "failed":  # a worker that just finished may have a message on its way: read it first
            await pilot.pause()
            state, text = _state(plan, app.screen)
        if state == "ready":
            break
        if state == "failed":
            plan.error = f"{plan.store}: cannot show {plan.view}: {text}"
            app.exit(return_code=2)
            return
    plan.spec = text
    await pilot.wait_for_scheduled_animations()
    app.clear_notifications()  # toasts ("computed and cached ...") would cover the view in a report
    await pilot.pause()
    if plan.out.suffix.lower() == ".png":
        from vitsee.tui.png import screen_png

        data = screen_png(app)
    else:
        data = app.export_screenshot(title=f"vitsee-tui {plan.store.name} {plan.spec}").encode("utf-8")
    partial = plan.out.with_name(f".{plan.out.name}.{time.time_ns()}.part")
    try:
        partial.write_bytes(data)
        partial.replace(plan.out)  # a reader never sees half a file
    except OSError as exc:  # made a folder, or read-only, while the view was computed
        partial.unlink(missing_ok=True)
        plan.error = f"cannot write {plan.out} ({brief(exc)}): check the path, or give another --out"
        app.exit(return_code=2)
        return
    app.exit(return_code=0)

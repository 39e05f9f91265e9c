"""What the app's tests share: a tiny store with every analysis cached, an app on it, and waiting for it."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from vitsee.analyses.driver import AnalyzeConfig, run_analyses
from vitsee.output.colormap import ColorMode
from vitsee.tui.app import VitseeApp
from vitsee.tui.options import AppOptions
from vitsee.tui.screens.explorer import ExplorerScreen

from conftest import VIT

SIZE = (120, 40)
CACHED = AnalyzeConfig(shuffles=0, batch_size=16)  # what the shared store was analysed with


def analysed_copy(tiny_store: Path, base: Path) -> Path:
    """Returns a copy of the shared tiny store with every analysis cached (built once per session)."""
    path = base / "tui" / "tiny.h5"
    if not path.exists():
        building = base / "tui-building"  # the store and its folder of results move together
        building.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_store, building / "tiny.h5")
        run_analyses(building / "tiny.h5", None, CACHED)
        building.rename(path.parent)
    return path


def make_app(path: Path | None, tmp_path: Path, color: ColorMode = ColorMode.TRUECOLOR, **kwargs) -> VitseeApp:
    options = AppOptions(color_mode=color, export_dir=tmp_path / "exports", folder=tmp_path)
    app = VitseeApp(path, options=options, **kwargs)
    # Every notification the app shows, kept after its timeout: on a loaded machine an 8 s note can expire
    # before the check that looks for it runs (seen with the demo's note in full-suite runs)
    app.notes_seen = []
    shown = app.notify

    def notify(message, **kw):
        app.notes_seen.append((message, kw.get("severity", "information")))
        return shown(message, **kw)

    app.notify = notify
    return app


async def settle(pilot, until=lambda app: True, timeout: float = 30.0, idle: bool = True) -> None:
    """Wait for the workers and the messages they post, until `until(app)` holds (and, with idle, no
    worker runs any more)."""
    app = pilot.app
    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause(0 if idle else 0.1)
        if idle:
            await app.workers.wait_for_complete()
            await pilot.pause()
        if until(app) and not (idle and any(w.is_running for w in app.workers)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"app did not settle within {timeout} s (screen {app.screen})")


async def same_as_a(pilot) -> None:
    """Press b once from the opening A x B: the CKA of model A (the ViT) with itself."""
    await pilot.press("b")
    await settle(pilot, lambda a: a.screen.pane("cka").loaded.spec == f"cka:{VIT}")


def view_shown(kind: str):
    def check(app) -> bool:
        screen = app.screen
        panes = screen.query(f"#pane-{kind}") if isinstance(screen, ExplorerScreen) else []
        return bool(panes) and screen.kind == kind and panes.first().loaded is not None

    return check


def status(app) -> str:
    """Returns the status line's whole text (drawn fitted to its width: tests/test_layout_80x24.py)."""
    return app.screen.query_one("#status-line").text


def cka_status(exported: dict, row: int, col: int) -> str:
    """Returns the status line of a CKA cell as the JSON export has it: value, interval and p-value."""
    text = f"{exported['rows'][row]} x {exported['cols'][col]}  CKA {exported['values'][row][col]:.4f}"
    if "ci_low" in exported:
        text += f" [{exported['ci_low'][row][col]:.3f}, {exported['ci_high'][row][col]:.3f}]"
        few = exported["params"]["n_images"] / exported["params"]["batch_size"] < 10
        bootstrap = (exported["params"].get("stats") or {}).get("interval") != "jackknife"  # over minibatches: rough
        text += " rough" if few and bootstrap else ""
    if "p_value" in exported:
        p = exported["p_value"][row][col]
        text += "  p<0.01" if p <= 0.01 else f"  p={p:.2f}"
    return text


def notifications(app) -> list[tuple[str, str]]:
    """Returns (message, severity) of every notification the app has shown, expired ones included."""
    if hasattr(app, "notes_seen"):
        return list(app.notes_seen)
    return [(n.message, n.severity) for n in app._notifications]

"""The command palette's vitsee commands: open a store, switch view or models, export, zoom, colours."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from textual.command import DiscoveryHit, Hit, Hits, Provider

from vitsee.tui.widgets.side_panel import model_label


class VitseeCommands(Provider):
    """Commands for the explorer (views, models, export, zoom) and the app (open a store, new run, demo)."""

    def _commands(self) -> list[tuple[str, object, str]]:
        from vitsee.tui.screens.explorer import ExplorerScreen
        from vitsee.tui.screens.start import find_stores
        from vitsee.tui.widgets.panes import VIEW_LABELS

        app = self.app
        screen = self.screen
        out: list[tuple[str, object, str]] = []
        if isinstance(screen, ExplorerScreen):
            for kind, label in VIEW_LABELS.items():
                out.append((f"View: {label}", partial(screen.show_view, kind), f"switch to the {label} view"))
            out.append(("Export view to PNG + JSON", screen.action_export, f"write into {screen.options.export_dir}"))
            out.append(("Toggle zoom", screen.action_toggle_zoom, "fit / 1:1 / detail with values"))
            out.append(("Cycle colormap", screen.action_cycle_cmap, "viridis, magma, cividis"))
            out.append(("Toggle side panel", screen.action_toggle_panel, "models and layers"))
            if screen.summary is not None:
                keys = screen.summary.keys
                names = screen.summary.names
                if screen.model_a is not None:
                    out.append(
                        (
                            f"Name model A ({names.get(screen.model_a, screen.model_a)})",
                            screen.action_name_model,
                            "what titles, legends and file names call it, kept in the store",
                        )
                    )
                for key in keys:
                    out.append(
                        (
                            f"Model A: {names.get(key) or model_label(key, width=60)}",
                            partial(screen.query_one("SidePanel").pick, model_a=key),
                            key,
                        )
                    )
                out.append(
                    (
                        "Model B: same as A (CKA within model A)",
                        partial(screen.query_one("SidePanel").pick, same=True),
                        "CKA of model A with itself",
                    )
                )
                for key in keys:
                    out.append(
                        (
                            f"Model B: {names.get(key) or model_label(key, width=60)}",
                            partial(screen.query_one("SidePanel").pick, model_b=key),
                            f"CKA columns from {key}",
                        )
                    )
        folder = getattr(app, "options", None)
        folder = folder.folder if folder is not None else Path.cwd()
        for path in find_stores(folder)[:20]:
            out.append((f"Open store: {path.name}", partial(app.open_store, path), str(path)))
        out.append(("Open store list", app.show_start, f"the stores in {folder}"))
        out.append(("New run", app.new_run, "extract a new store"))
        out.append(("Open demo", app.open_demo, "a small ViT and ResNet over built-in photographs"))
        return out

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)

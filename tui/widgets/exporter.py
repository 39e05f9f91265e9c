"""`e`: the shown view to PNG and JSON in the export folder, the selection marked, in a worker; a note says where the
files went (or why the PNG could not be drawn)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from textual import work
from textual.binding import Binding
from textual.widget import Widget

from vitsee.errors import VitseeError
from vitsee.tui.logs import bug_text
from vitsee.tui.messages import ExportWritten
from vitsee.tui.options import AppOptions
from vitsee.tui.results import export_view
from vitsee.tui.widgets.view_pane import ViewPane

if TYPE_CHECKING:
    from vitsee.analyses.views import View

log = logging.getLogger(__name__)

EXPORT_BINDING = Binding(
    "e",
    "export",
    "Export",
    id="explorer.export",
    tooltip="Export the view to PNG and JSON in the export folder (the cursor's cell marked with "
    "export_marks = true in the config file)",
)


class Exporter(Widget):
    """Writes the view of a pane to the export folder the app's options name."""

    DEFAULT_CSS = "Exporter { display: none; }"

    def __init__(self, options: AppOptions, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.options = options

    def export(self, pane: ViewPane) -> None:
        """Starts writing the pane's view with its selection and colours; says so when there is nothing yet."""
        view = pane.view
        if view is None:
            self.notify("nothing to export yet: wait for the view to load", severity="warning", timeout=4)
            return
        self._export(view, pane.selection, pane.cmap)

    @work(thread=True, group="export", exit_on_error=False)
    def _export(self, view: View, selection: tuple[int, int] | None, cmap: str) -> None:
        try:
            # a paper's figure has no cursor: the PNG marks the cell only when the config asks (export_marks)
            json_path, png_path, note = export_view(
                view, self.options.export_dir, selection, cmap, marks=self.options.export_marks
            )
        except VitseeError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=8)
            return
        except Exception as exc:
            log.exception("exporting %s", view.spec)
            self.app.call_from_thread(self.notify, bug_text("export failed", exc), severity="error", timeout=8)
            return
        self.post_message(ExportWritten(json_path, png_path, note))

    def on_export_written(self, message: ExportWritten) -> None:
        if message.png_path is not None:
            self.notify(f"exported {message.png_path} (+ {message.json_path.name})", title="export", timeout=8)
        else:
            self.notify(f"{message.note}: {message.json_path}", title="export", severity="warning", timeout=8)

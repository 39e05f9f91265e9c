"""The probe table: Textual's DataTable with ids on its cursor keys, so a config file (or the vim preset) can
remap them; Textual's own bindings have none."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import DataTable


class ProbeTable(DataTable):
    """A DataTable whose arrow keys are the bindings probes.up / down / left / right; Enter opens the probe
    detail of the layer under the cursor (the footer says so)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False, id="probes.up", tooltip="Previous layer"),
        Binding("down", "cursor_down", "Down", show=False, id="probes.down", tooltip="Next layer"),
        Binding("left", "cursor_left", "Left", show=False, id="probes.left", tooltip="Previous readout"),
        Binding("right", "cursor_right", "Right", show=False, id="probes.right", tooltip="Next readout"),
        Binding(
            "enter",
            "select_cursor",
            "Select",
            id="probes.select",
            tooltip="Open the layer under the cursor: its readouts and the accuracy of a probe on each token",
        ),
    ]

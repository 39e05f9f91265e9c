"""vitsee.tui.widgets: reusable widgets, one per module."""

from vitsee.tui.widgets.heatmap import Heatmap

__all__ = ["Heatmap"]

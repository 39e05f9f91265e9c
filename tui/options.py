"""What the command line sets for the whole app (colours, where exports go, how to compute)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vitsee.engine.analyze import AnalyzeConfig
from vitsee.engine.colormap import ColorMode

COLORMAPS = ("viridis", "magma", "cividis")


@dataclass
class AppOptions:
    """Settings every screen reads: the heatmaps' colour mode and colormap, the export folder, and
    the configuration for analyses that are not cached yet."""

    color_mode: ColorMode = ColorMode.TRUECOLOR
    export_dir: Path = Path("vitsee-exports")
    cmap: str = "viridis"
    analysis: AnalyzeConfig = field(default_factory=AnalyzeConfig)
    folder: Path = field(default_factory=Path.cwd)  # where the start screen looks for stores

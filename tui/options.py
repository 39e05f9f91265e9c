"""What the command line sets for the whole app (colours, where exports go, how to compute)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

from vitsee.output.colormap import ColorMode

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig

COLORMAPS = ("viridis", "magma", "cividis")


@dataclass
class AppOptions:
    """Settings every screen reads: the heatmaps' colour mode and colormap, the export folder, and
    the configuration for analyses that are not cached yet."""

    color_mode: ColorMode = ColorMode.TRUECOLOR
    export_dir: Path = Path("vitsee-exports")
    cmap: str = "viridis"
    device: str = "auto"  # for analyses that are not cached yet
    folder: Path = field(default_factory=Path.cwd)  # where the start screen looks for stores
    export_marks: bool = False  # `e` draws the cursor's cell into the exported figure (config: export_marks)

    def analysis_config(self) -> AnalyzeConfig:
        """Returns the engine's default analysis parameters (those of `vitsee analyze`) on our device.

        Call it from a worker: the engine imports torch.
        """
        from vitsee.analyses.driver import AnalyzeConfig

        # no estimator settings asked for: what builds on a cached estimate (the zoo on CKA, a streaming store's
        # CKA) takes the one cached, as the views do
        return AnalyzeConfig(device=self.device, any_cka_estimate=True)

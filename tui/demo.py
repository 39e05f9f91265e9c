"""The demo store `vitsee-tui --demo` opens: a small ViT and a ResNet over the built-in photographs.

Built once into the user's cache folder, then reused. Pretrained weights when they are in the local cache
or the Hugging Face Hub answers, seeded random init otherwise; the store's file name says which, so a
store made without weights is not mistaken for one made with them later.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vitsee.engine.analyze import AnalyzeConfig
    from vitsee.engine.extract import ExtractConfig

DEMO_VIT = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
DEMO_RESNET = "resnet18.a1_in1k"


@dataclass(frozen=True)
class DemoPlan:
    """What the demo builds: models by timm name, images, and where the store goes."""

    models: tuple[str, ...] = (DEMO_VIT, DEMO_RESNET)
    dataset: str = "samples"
    # 128 of the 240 sample images: ~460 MB at 224 px and about a minute of extraction on 2 CPU cores;
    # CKA needs a few hundred for tight estimates, but the paper's patterns already show here.
    n_images: int = 128
    batch_size: int = 32
    img_size: int | None = None  # the models' own 224 px: a 14 x 14 grid, as in the paper
    # per-token probes fit one probe per token and layer: minutes on a CPU, so the demo keeps CLS and GAP
    probe_tokens: bool = False


@dataclass(frozen=True)
class DemoChoice:
    """The demo's extraction config and, per model, whether its weights are pretrained."""

    config: ExtractConfig
    pretrained: dict[str, bool]
    analysis: AnalyzeConfig

    @property
    def weights_note(self) -> str:
        """Returns e.g. 'vit_tiny_patch16_224: random init (no cached weights, Hub unreachable)'."""
        parts = []
        for name, ok in self.pretrained.items():
            parts.append(f"{name.partition('.')[0]}: {'pretrained' if ok else 'random init'}")
        note = ", ".join(parts)
        if not all(self.pretrained.values()):
            note += " (no weights in the local cache and the Hugging Face Hub cannot be reached)"
        return note


def cache_dir() -> Path:
    """Returns the per-user folder for the demo store: $XDG_CACHE_HOME/vitsee or ~/.cache/vitsee."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vitsee"


def hub_reachable() -> bool:
    """Returns whether the Hugging Face Hub answers (False at once when HF_HUB_OFFLINE is set)."""
    from vitsee.engine import models

    return models.hub_reachable(timeout_s=2.0)


def choose(plan: DemoPlan | None = None, device: str = "auto", folder: Path | None = None) -> DemoChoice:
    """Returns the demo's run: pretrained where possible (may wait a moment on the network check)."""
    from vitsee.engine.analyze import AnalyzeConfig
    from vitsee.engine.extract import ExtractConfig
    from vitsee.engine.models import cached_pretrained_file

    plan = plan or DemoPlan()
    pretrained: dict[str, bool] = {}
    hub: bool | None = None
    for name in plan.models:
        if cached_pretrained_file(name) is not None:
            pretrained[name] = True
            continue
        if hub is None:
            hub = hub_reachable()
        pretrained[name] = hub
    specs = [name if pretrained[name] else f"{name}@random:0" for name in plan.models]
    kinds = set(pretrained.values())
    label = "pretrained" if kinds == {True} else "random" if kinds == {False} else "mixed"
    folder = folder or cache_dir()
    size = f"-{plan.img_size}px" if plan.img_size else ""
    store = folder / f"demo-{label}-{plan.n_images}{size}.h5"
    config = ExtractConfig(store=store, models=specs, dataset=plan.dataset, n_images=plan.n_images,
                           batch_size=plan.batch_size, device=device, img_size=plan.img_size)
    return DemoChoice(config, pretrained, AnalyzeConfig(device=device, probe_tokens=plan.probe_tokens))

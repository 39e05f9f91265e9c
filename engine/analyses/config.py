"""The parameters every analysis is run with, and the progress events it reports (no analysis here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError


@dataclass
class AnalyzeConfig:
    """Parameters shared by the analyses (each result records the ones it used)."""

    batch_size: int = 256
    shuffles: int = 1
    seed: int = 0
    device: str = "auto"
    recompute: bool = False
    probe_tokens: bool = True
    spatial_layer: str | None = None
    probe_max_dim: int = 1024  # per-token probes keep a (D, D) fp64 matrix per token: wider layers get none
    erf_images: int = 32  # effective receptive fields: the first N images of the store (analyses/erf.py)
    ci: float = stats_mod.DEFAULT_CI  # confidence level of the intervals; 0: none
    permutations: int = stats_mod.DEFAULT_PERMUTATIONS  # permutations behind each CKA p-value; 0: none
    # no estimator settings were asked for: a streaming store answers CKA with the estimate it streamed
    any_cka_estimate: bool = False
    options: dict = field(default_factory=dict)  # the values of analyses' own options that have no field here

    def with_options(self, given: dict | None) -> AnalyzeConfig:
        """Returns a copy with values of the analyses' own options set (attribute -> value, as AnalysisOption.attr
        names them): a field of the config by its name, any other in `options`; itself when none are given."""
        if not given:
            return self
        from dataclasses import fields, replace

        own = {f.name for f in fields(self)} - {"options"}
        return replace(
            self,
            **{k: v for k, v in given.items() if k in own},
            options={**self.options, **{k: v for k, v in given.items() if k not in own}},
        )

    def __post_init__(self):
        # checked where the CLI and the app build the config, before a store is opened
        if self.batch_size < 1:
            raise VitseeError(
                f"--batch-size {self.batch_size} is not a batch size: use at least 4 images per CKA "
                f"minibatch (default {AnalyzeConfig.batch_size})"
            )
        if self.shuffles < 0:
            raise VitseeError(
                f"--shuffles {self.shuffles} is negative: use 0 (store order) or the number of seeded shuffles"
            )
        if self.seed < 0:
            raise VitseeError(f"--seed {self.seed} is negative: use a seed of 0 or more")
        if self.probe_max_dim < 0:
            raise VitseeError(
                f"--probe-max-dim {self.probe_max_dim} is negative: use 0 (no per-token probes) or a "
                f"channel count (default {AnalyzeConfig.probe_max_dim})"
            )


@dataclass
class Step:
    """A progress event: which analysis, how far (done/total in its own units)."""

    analysis: str
    done: int
    total: int
    message: str = ""


StepFn = Callable[[Step], None]

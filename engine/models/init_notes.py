"""Why a randomly initialised timm CNN looks degenerate: its residual branches start at (almost) zero.

timm zero-initialises the last BatchNorm of each ResNet block (`zero_init_last=True`) and starts ConvNeXt's
layer scale at 1e-6, so at random init a block's output is (almost) its input: skip ratios ||z||/||f(z)|| are
infinite or ~1e6 and consecutive blocks have the same representation. Plain data, no torch: the app reads it
from a store's model info before anything is computed.
"""

from __future__ import annotations

ZERO_BRANCH = (
    "\u2016f(z)\u2016 = 0: timm initialises this branch to zero (the last BatchNorm of each ResNet "
    "block, zero_init_last), so at random init a block adds nothing: ratios are not finite and "
    "consecutive blocks look the same in CKA; use trained weights for a meaningful view"
)
TINY_BRANCH = (
    "\u2016f(z)\u2016 \u2248 1e-6 \u2016z\u2016: timm initialises ConvNeXt's layer scale to 1e-6, so at "
    "random init a block adds almost nothing: ratios near 1e6, consecutive blocks look the same in "
    "CKA; use trained weights for a meaningful view"
)


def random_init_note(info: dict) -> str | None:
    """Returns why a random-init model's residual branches add (almost) nothing, from its stored model info;
    None for trained weights and for models timm initialises otherwise."""
    weights = info.get("weights") or {}
    if weights.get("kind") != "random" or info.get("family") != "resnet":
        return None
    name = str(info.get("timm_name") or info.get("name") or "")
    if name.startswith("convnext"):
        return TINY_BRANCH
    if name.startswith("resnetv2"):  # timm's ResNetV2 defaults to zero_init_last=False
        return None
    return ZERO_BRANCH

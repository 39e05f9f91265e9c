"""Tiny models of seven families for the zoo's tests (img_size 64, two blocks, 16-32 channels, random init).

Four are timm architectures shrunk and registered in the timm module of their family under a name whose prefix says
the family (`deit_zoo_tiny` ...), so extraction builds them by name and engine/zoo/summaries.py names their family;
the other three are timm's own test models. `python tests/zoo_driver.py ARGS` runs `vitsee ARGS` with them registered.
"""

from __future__ import annotations

import functools

ZOO_IMG = 64


def _register(name: str, module: str, make) -> str:
    """Registers `name` in timm as an entrypoint of `module` that builds make(**kwargs); returns the name."""
    import importlib

    import timm
    from timm.models import register_model

    if not timm.is_model(name):
        mod = importlib.import_module(f"timm.models.{module}")

        def entry(pretrained=False, **kwargs):
            return make(**kwargs)

        entry.__name__, entry.__qualname__, entry.__module__ = name, name, mod.__name__
        register_model(entry)
    return name


def _timm(variant: str, **fixed):
    import timm

    return lambda **kwargs: timm.create_model(variant, **{**fixed, **kwargs})


def _mixer(**kwargs):
    from timm.models.mlp_mixer import _create_mixer

    return _create_mixer("mixer_s16_224", **{"patch_size": 16, "num_blocks": 2, "embed_dim": 32, **kwargs})


@functools.cache
def zoo_models() -> list[str]:
    """Returns the specs (random init, seed 0) of the seven tiny models, registering those timm lacks."""
    names = [
        "test_vit",
        _register(
            "deit_zoo_tiny", "deit", _timm("deit_tiny_distilled_patch16_224", embed_dim=32, depth=2, num_heads=2)
        ),
        _register(
            "swin_zoo_tiny",
            "swin_transformer",
            _timm("swin_tiny_patch4_window7_224", embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4),
        ),
        _register("mixer_zoo_tiny", "mlp_mixer", _mixer),
        "test_resnet",
        _register(
            "resnetv2_zoo_tiny", "resnetv2", _timm("resnetv2_18", layers=[1, 1, 1, 1], channels=(16, 32, 64, 128))
        ),
        "test_convnext",
    ]
    return [f"{name}@random:0" for name in names]

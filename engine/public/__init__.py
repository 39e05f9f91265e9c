"""vitsee from Python: do vision transformers see like CNNs? — for the timm models you pick, in a notebook.

    import vitsee

    store = vitsee.extract("run.h5", models=["vit_tiny_patch16_224@random", "resnet18@random"],
                           dataset="digits", n_images=256)       # or vitsee.open("run.h5"), or from_features
    vit, resnet = store.models
    cka = store.cka(vit, resnet)         # paper Fig. 2: computed once, then cached in the store
    cka.to_pandas()                      # row, col, value, ci_low, ci_high, p_value
    cka.plot()                           # the figure `vitsee export` draws
    store.attention(vit).plot()          # paper Fig. 3
    store.measure("procrustes", vit, resnet)   # another measure of the same layer pairs
    store.zoo()                          # every pair of the store's models

The public API is what this module exports (`__all__`): `open`, `extract`, `train`, `from_features`, the `Store` and
`Result` they return, `Images`, `measures` (similarity measures for arrays you already have), and `VitseeError`, the
one exception a user can cause (its message is the line the CLI prints). `vitsee.engine` and `vitsee.tui` stay
importable, but are not promised.

Reading a cached view imports no torch: only `extract`, `train` and a view that must be computed do.

This package lives in engine/public/ and is installed as `vitsee` (pyproject.toml's package-dir); it is never
`vitsee.engine.public`.
"""

from __future__ import annotations

if __name__ != "vitsee":  # one module object per module: this folder is the package `vitsee`, nothing else
    raise ImportError(f"{__name__} is the package `vitsee` (engine/public/ in pyproject's package-dir): import vitsee")

from vitsee.engine.errors import VitseeError

from . import measures
from ._features import from_features
from ._progress import VitseeWarning
from ._result import Result
from ._run import extract, train
from ._store import Images, Store, open

__all__ = [
    "Images",
    "Result",
    "Store",
    "VitseeError",
    "VitseeWarning",
    "extract",
    "from_features",
    "measures",
    "open",
    "train",
]


def __getattr__(name: str):
    if name == "__version__":  # read on demand: importlib.metadata scans the installed distributions
        from importlib import metadata

        try:
            return metadata.version("vitsee")
        except metadata.PackageNotFoundError:
            return "unknown"
    raise AttributeError(f"module 'vitsee' has no attribute '{name}'")

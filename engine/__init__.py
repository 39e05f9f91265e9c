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
    vitsee.across_seeds(["s0.h5", "s1.h5", "s2.h5"], "cka:vit").std   # the spread over training seeds

The public API is what this module exports (`__all__`): `open`, `extract`, `train`, `from_features`, the `Store` and
`Result` they return, `Images`, `measures` (similarity measures for arrays you already have), `across_seeds` (a
view's mean and spread over the stores of several training seeds, a `SeedSpread`), and `VitseeError`, the
one exception a user can cause (its message is the line the CLI prints). The sub-packages below stay importable,
but only these names are promised.

Reading a cached view imports no torch: only `extract`, `train` and a view that must be computed do.

This folder (engine/) is the package `vitsee`; its rooms, each a sub-package whose docstring maps it, from the top
floor down (a room imports only from the rooms below it: pyproject.toml's import-linter contracts):

    tui/ (vitsee.tui)  the Textual app: reads results through the rooms below, never computes on its event loop
    cli.py             `vitsee`, the command line: parse, call the engine, render
    library/           what `import vitsee` hands out: Store, Result, extract, train, from_features
    training/          `vitsee train`: small timm classifiers with the paper's interventions
    extraction/        one pass of the images through the models into a store (and a store from features)
    output/            figures (PNG), terminal renderings, exports, colormaps, short layer labels
    analyses/          one module per analysis under one contract, their driver and their views
    zoo/               the zoo's summaries of many models, and the Grams an extraction streams for it
    measures/          how alike two layers are: each measure's direct and all-pairs forms, their resampling
    store/             the HDF5 store: layout, files, the lock, reading, writing, cached results
    models/ data.py    timm models by spec (weights, families, layer points); the image sets
    stats.py           intervals and p-values: pure functions
    errors.py lazy.py threads.py   the one user error, lazy imports, the CPU threads torch uses
"""

from __future__ import annotations

from vitsee import measures
from vitsee.errors import VitseeError
from vitsee.library.features import from_features
from vitsee.library.progress import VitseeWarning
from vitsee.library.result import Result
from vitsee.library.run import extract, train
from vitsee.library.seeds import SeedSpread, across_seeds
from vitsee.library.store import Images, Store, open

__all__ = [
    "Images",
    "Result",
    "SeedSpread",
    "Store",
    "VitseeError",
    "VitseeWarning",
    "across_seeds",
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

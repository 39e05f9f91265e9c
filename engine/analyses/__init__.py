"""One module per analysis, each with a pure core (arrays in, arrays out) and a class that keeps the contract of
contract.py (its name, view, parameters and cache key, its run, to which models it applies, its view's shape and its
dossier section). Importing this package imports every module in it, and each analysis class registers itself:
a new analysis is a new module here, found by being there (see engine/analyses/README.md).

    cka.py         layer x layer minibatch CKA (paper Fig. 1, 2), and the CKA `extract --streaming` accumulates
    attention.py   mean attention distance per head (Fig. 3, 4)
    probes.py      linear probes per layer and readout (Fig. 11, 13); their ridge arithmetic is ridge.py
    skip.py        skip-connection norm ratios (Fig. 7)
    spatial.py     spatial localisation maps (Fig. 9, 10)
    heads.py       head-level CKA against another model (Fig. 5)
    erf.py         effective receptive fields (Fig. 6)
    zoo.py         every pair of the store's models from a layer x layer measure (issue 21; numbers in
                   engine/zoo/summaries.py)
    agree.py       do the measures agree? each one's matrix of a pair of models and their rank correlations
    contract.py    the contract: Analysis, Shape, Request, Result, View, the registry
    similarity.py  what layer x layer measures share (LayerMatrix, LayerPairMeasure, GramMeasure), and one
                   GramMeasure for each measure of engine/measures/catalog/ (RBF CKA, Procrustes, SVCCA, PWCCA,
                   mknn, CKNNA, RSA, ...): each a layer x layer view like CKA's, made from the measure's module
    ridge.py       the probes' pure core: ridge fits streamed batch by batch, the split, the L2 choice, costs
    base.py        plumbing: config, progress events, device, read-ahead, batch plan, parts a run shares

`REGISTRY` (name -> analysis, in the analyses' declared order) is what the driver (engine/analyses/driver.py), the views
(engine/analyses/views.py), `show`/`export`, the figures and the app look analyses up in.
"""

from __future__ import annotations

import importlib
import pkgutil

from vitsee.errors import VitseeError
from vitsee.analyses.contract import REGISTRY, Analysis, Request, Result, Shape, View

__all__ = ["REGISTRY", "Analysis", "Request", "Result", "Shape", "View", "get"]

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def get(name: str) -> Analysis:
    """Returns the registered analysis of that name; an unknown name is a VitseeError naming the known ones."""
    if name not in REGISTRY:
        raise VitseeError(f"unknown analysis '{name}': choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]

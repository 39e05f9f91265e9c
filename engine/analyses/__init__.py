"""One module per analysis, each with a pure core (arrays in, arrays out) and a store-facing runner (its
parameters and cache key, its run, its view and whether it applies to a model), registered here by name.

    cka.py        layer x layer minibatch CKA (paper Fig. 1, 2), and the CKA `extract --streaming` accumulates
    attention.py  mean attention distance per head (Fig. 3, 4)
    probes.py     linear probes per layer and readout (Fig. 11, 13)
    skip.py       skip-connection norm ratios (Fig. 7)
    spatial.py    spatial localisation maps (Fig. 9, 10)
    heads.py      head-level CKA against another model (Fig. 5)
    erf.py        effective receptive fields (Fig. 6)
    base.py       what they share: config, progress events, device, read-ahead, batch plan, saving with provenance

`REGISTRY` is what the driver (engine/analyze.py), the views (engine/views.py), `show`/`export`, the figures and the
app look analyses up in: a new analysis is one module here with a `SPEC`, one pane in the app and a figure function.
`run` is what `vitsee analyze --heads/--erf` calls: it runs those two on every model they apply to.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import VitseeError
from ..store import Store
from . import attention, cka, erf, heads, probes, skip, spatial
from .base import Analysis

REGISTRY: dict[str, Analysis] = {m.SPEC.name: m.SPEC for m in (cka, attention, probes, skip, spatial, heads, erf)}
ANALYSES = ("heads", "erf")  # run by `run` below, after the driver's


def get(name: str) -> Analysis:
    """Returns the registered analysis of that name; an unknown name is a VitseeError naming the known ones."""
    if name not in REGISTRY:
        raise VitseeError(f"unknown analysis '{name}': choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]


def run(path: str | Path, which: Sequence[str], cfg, progress=None) -> list[str]:
    """Runs the named analyses of this package (heads, erf) on every model they apply to; returns what was
    done as ['heads:VIT:OTHER', 'erf:MODEL']. A named analysis that applies to no model is an error."""
    unknown = [a for a in which if a not in ANALYSES]
    if unknown:
        raise VitseeError(f"unknown analysis '{unknown[0]}': choose from {', '.join(ANALYSES)}")
    done: list[str] = []
    with Store.writer(path) as store:
        if "heads" in which:
            pairs = heads.pairs(store)
            for vit, other in pairs:
                heads.run_heads(store, vit, other, cfg, progress)
                done.append(f"heads:{vit}:{other}")
        if "erf" in which:
            erf.check_reloadable_store(store)
            for key in store.models:
                erf.run_erf(store, key, cfg, progress)
                done.append(f"erf:{key}")
    return done

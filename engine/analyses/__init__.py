"""One module per analysis: a pure core (arrays in, arrays out) and a store-facing runner (its parameters,
cache key and view). Head-level CKA (heads.py, paper Fig. 5) and effective receptive fields (erf.py, Fig. 6)
live here; the older analyses are still in engine/analyze.py.

`run` is what `vitsee analyze --heads/--erf` calls: it runs these two on every model they apply to.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import VitseeError
from ..store import Store
from . import erf, heads

ANALYSES = ("heads", "erf")


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

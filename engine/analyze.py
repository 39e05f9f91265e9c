"""The driver of the analyses: runs those that apply to each model of a store (or the named ones) and caches
them. Each analysis lives in its own module under engine/analyses/ (its core, parameters, run and view); under
torchrun the CLI calls `distributed.analyze_sharded`, which shares the CKA out and then calls `run_analyses`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .analyses import REGISTRY
from .analyses.base import AnalyzeConfig, StepFn, _check_ready
from .analyses.cka import run_cka
from .errors import VitseeError
from .store import Store

PER_MODEL = tuple(name for name, spec in REGISTRY.items() if spec.per_model)  # attention, probes, skip, spatial
ANALYSES = ("cka", *PER_MODEL)  # what `vitsee analyze` runs when none is named (heads and erf are asked for)


def applicable(store: Store, model: str) -> list[str]:
    """Returns the per-model analyses that apply to a model of this store."""
    key = store.resolve_model(model)
    return [name for name in PER_MODEL if REGISTRY[name].applies(store, key)]


def check_names(which: Sequence[str] | None) -> None:
    """Raises the one-line VitseeError for an analysis name the driver does not know."""
    unknown = [a for a in (which or []) if a not in ANALYSES]
    if unknown:
        raise VitseeError(f"unknown analysis '{unknown[0]}': choose from {', '.join(ANALYSES)}")


def run_analyses(path: str | Path, which: Sequence[str] | None, cfg: AnalyzeConfig, progress: StepFn | None = None) -> list[str]:
    """Runs the named analyses (None: all that apply) on a store in this process and caches them; returns what
    was done."""
    check_names(which)
    done = []
    with Store.writer(path) as store:
        _check_ready(store, store.models)
        if which is None or "cka" in which:
            run_cka(store, cfg, progress)
            done.append("cka")
        for key in store.models:
            apply = applicable(store, key)
            for name in PER_MODEL:
                if which is not None and name not in which:
                    continue
                run = REGISTRY[name].run
                if name not in apply:
                    needs_acts = store.streaming and name in ("probes", "spatial")
                    if which is not None and (needs_acts or name == "probes" and store.labels is None):
                        run(store, [key], None, cfg, progress)  # raises the clear error saying why not
                    continue
                run(store, [key], None, cfg, progress)
                done.append(f"{name}:{key}")
    return done

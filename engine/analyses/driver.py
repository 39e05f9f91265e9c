"""The driver of the analyses: which results a store needs, in one order, and running them.

`plan` is the one list of jobs: `vitsee analyze` runs it here (`run_analyses`), the app's background pass caches it
view by view, and each job is a Request of a registered analysis (engine/analyses/). Under torchrun the CLI calls
`distributed.analyze_sharded`, which shares the CKA out and then calls `run_analyses` for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vitsee.analyses import REGISTRY
from vitsee.analyses.base import SHARED, AnalyzeConfig, StepFn, check_ready
from vitsee.analyses.contract import SLOW, Request, per_model
from vitsee.errors import VitseeError
from vitsee.store import Store

__all__ = [
    "AnalyzeConfig",
    "applicable",
    "check_names",
    "default_names",
    "measure_names",
    "measures_command",
    "plan",
    "plan_views",
    "run_analyses",
]


def default_names() -> list[str]:
    """Returns the analyses `vitsee analyze` runs when none is named (the others are asked for: heads, erf)."""
    return [name for name, analysis in REGISTRY.items() if analysis.by_default]


def applicable(store: Store, model: str) -> list[str]:
    """Returns the default analyses of one model (attention:MODEL, ...) that apply to a model of this store."""
    key = store.resolve_model(model)
    return [
        name
        for name in default_names()
        if per_model(REGISTRY[name]) and REGISTRY[name].not_applicable(store, key) is None
    ]


def check_names(which: Sequence[str] | None) -> None:
    """Raises the one-line VitseeError for an analysis name the driver does not know."""
    unknown = [a for a in (which or []) if a not in REGISTRY]
    if unknown:
        raise VitseeError(f"unknown analysis '{unknown[0]}': choose from {', '.join(REGISTRY)}")


def measure_names(text: str | None) -> list[str]:
    """Returns the layer x layer measures a `--measures` comma list names ('all': every one), in registry order;
    an unknown one is the one-line VitseeError naming the known ones."""
    from vitsee.analyses.similarity import layer_measures

    if text is None:
        return []
    known = [a.name for a in layer_measures()]
    asked = [part.strip() for part in text.split(",") if part.strip()]
    if asked == ["all"]:
        return known
    unknown = [part for part in asked if part not in known]
    if unknown or not asked:
        what = f"'{unknown[0]}' is no measure" if unknown else "no measure named"
        raise VitseeError(f"--measures {text}: {what}: use a comma list of {', '.join(known)}, or all")
    return [name for name in known if name in asked]


def measures_command(store_path, names: Sequence[str]) -> str:
    """Returns the `vitsee analyze` command that computes the named layer x layer measures (none: all of them)."""
    return f"vitsee analyze {store_path} --measures {','.join(names) if names else 'all'}"


def run_order(analysis) -> tuple:
    """Returns where an analysis runs in the plan: in the registry's order, the slow ones (fits, reloaded models)
    last, cheapest first among them."""
    slow = analysis.cost >= SLOW
    return slow, analysis.cost if slow else 0, analysis.order


def plan(store: Store, which: Sequence[str] | None = None) -> list[Request]:
    """Returns the jobs that compute the named analyses (None: those run by default) on every model they apply to,
    in `run_order`. A named analysis that applies to nothing is the VitseeError saying why, raised before any job
    runs."""
    check_names(which)
    names = default_names() if which is None else list(dict.fromkeys(which))
    jobs: list[Request] = []
    for analysis in sorted((REGISTRY[n] for n in names), key=run_order):
        todo = analysis.jobs(store)
        if not todo and which is not None:
            raise VitseeError(analysis.refusal(store))
        jobs += todo
    return jobs


def plan_views(store: Store, which: Sequence[str] | None = None) -> list[Request]:
    """Returns every view the plan's results serve, in the plan's order (a joint result serves several): what the
    app caches, view by view, after a new run."""
    return [view for job in plan(store, which) for view in job.analysis.served(store, job)]


def run_analyses(
    path: str | Path, which: Sequence[str] | None, cfg: AnalyzeConfig, progress: StepFn | None = None
) -> list[str]:
    """Runs the plan of the named analyses (None: the default ones) on a store in this process and caches each
    result; returns what was done ('cka', 'attention:MODEL', 'heads:VIT:OTHER', ...)."""
    with Store.writer(path) as store, SHARED.run():  # the analyses of this run share their parts (base.SharedParts)
        check_ready(store, store.models)
        done = []
        for job in plan(store, which):
            job.analysis.run(store, job, cfg, progress)
            done.append(job.label)
    return done

"""Views: one analysis result shaped for looking at — a labelled matrix plus what its shape needs.

A view is named by a string NAME:MODEL[:MODEL | :LAYER], NAME a registered analysis (`view_help()` lists their
forms: `cka:MODEL_A[:MODEL_B]`, `attention:MODEL`, `spatial:MODEL[:LAYER]`, `heads:VIT:OTHER`, ...; MODEL is a store
key or a unique prefix of one). The CLI's export and show, and the terminal app, all go through `load_view`, so they
show the same numbers; the analysis builds the View (engine/analyses/contract.py), this module finds its result.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from vitsee.analyses import REGISTRY
from vitsee.analyses.base import AnalyzeConfig
from vitsee.analyses.contract import Request, Result, Shape, View, to_jsonable
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.store.names import weights_word

__all__ = [
    "View",
    "load_view",
    "parse_view",
    "resolve_view",
    "cached_params",
    "compute_view",
    "mark_nonfinite",
    "best_cell",
    "uniform_text",
    "available_views",
    "to_jsonable",
    "view_help",
    "dataset_label",
    "with_names",
    "named_weights",
]


def view_help() -> str:
    """Returns every registered analysis's view string for help and errors ('cka:MODEL_A[:MODEL_B], ... or erf:...')."""
    usages = [a.usage for a in REGISTRY.values()]
    return ", ".join(usages[:-1]) + f" or {usages[-1]}" if len(usages) > 1 else "".join(usages)


def parse_view(text: str) -> tuple[str, list[str]]:
    """Returns (kind, arguments) of a view string."""
    kind, _, rest = text.partition(":")
    if kind not in REGISTRY:
        raise VitseeError(unknown_view(text))
    args = _split_models(rest) if rest else []
    if not args and REGISTRY[kind].models[0] > 0:  # a view of the whole store (models (0, 0)) names none
        raise VitseeError(f"view '{text}' names no model: use {REGISTRY[kind].usage}")
    limit = 2
    if len(args) > limit:
        raise VitseeError(f"view '{text}' has too many parts: use {REGISTRY[kind].usage}")
    return kind, args


def unknown_view(text: str) -> str:
    """Returns the error for a view string of no registered analysis: the kinds closest to it and all of them, in
    a line that fits a terminal's width or two (every view's form in full: `vitsee show --help`)."""
    import difflib

    kind = text.partition(":")[0]
    close = difflib.get_close_matches(kind, list(REGISTRY), n=2, cutoff=0.5)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"unknown view '{text}'{hint}; kinds: {', '.join(REGISTRY)}; `vitsee show --help` gives each form"


def _split_models(rest: str) -> list[str]:
    # model keys hold ':' themselves (test_vit@random:0), so split only where a new part begins: a ':' not
    # followed by a digit run that ends the part (seeds are digits)
    parts: list[str] = []
    for piece in rest.split(":"):
        if parts and (piece.isdigit() or parts[-1].endswith("@random") or parts[-1].endswith("@file")):
            parts[-1] += ":" + piece
        else:
            parts.append(piece)
    return parts


def _subtitle(store: Store, models: list[str], names: dict[str, str]) -> str:
    """Returns the line under a view's title: each model's display name and weights, and the images (no path:
    a figure shows no folder of this machine, only the dataset's own file or folder name)."""
    images = f"{store.n_images} images of {dataset_label(store.dataset_spec)}"
    if not models:  # a view of the whole store: its models are the view's rows
        return f"{len(store.models)} models; {images}"
    return "; ".join(named_weights(names.get(m, m), store.model_info(m)) for m in models) + f"; {images}"


def named_weights(name: str, info: dict) -> str:
    """Returns a model's name and how its weights came about ('ViT (trained here) on digits (1438 images, 15
    epochs, ...)', 'resnet18 (random init), seed 0'), the name's own word not said twice."""
    w = info["weights"]
    word = weights_word(info)
    if w["kind"] == "file" and w.get("trained"):
        desc = "random init, the weights its training started from" if word == "random init" else None
        desc = desc or f"trained here on {w['trained']}"
    else:
        desc = {
            "pretrained": "pretrained",
            "random": f"random init, seed {w.get('seed')}",
            "file": f"weights {Path(w.get('path') or '').name}",
        }.get(w["kind"], str(w["kind"]))
    if word and f"({word})" in name and desc.startswith(word):  # 'ViT (trained here) on digits (...)'
        return name + desc[len(word) :]
    return f"{name}: {desc}"


def dataset_label(spec: str) -> str:
    """Returns a dataset spec with any path cut to its last part ('npz:/home/me/data/test.npz' -> 'npz:test.npz'),
    for figures and titles: the spec in full stays in the store, `vitsee info` and the JSON."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest or ("/" not in rest and "\\" not in rest):
        return spec
    return f"{kind}:{Path(rest.rstrip('/')).name or rest}"


def with_names(text: str, names: dict[str, str]) -> str:
    """Returns text with every model key in it replaced by the model's display name (the longest keys first, so a
    key that starts another, `...-s0` and `...-s0-init`, never takes the other's place)."""
    keys = sorted((k for k, v in names.items() if k != v and k in text), key=len, reverse=True)
    if not keys:
        return text
    return re.sub("|".join(map(re.escape, keys)), lambda m: names[m.group(0)], text)


def request_of(store: Store, text: str) -> Request:
    """Returns what a view string asks of the store: its analysis, resolved model keys and layer."""
    kind, args = parse_view(text)
    analysis = REGISTRY[kind]
    least, most = analysis.models
    if len(args) > 1 and most == 1 and not analysis.takes_layer:
        raise VitseeError(f"view '{text}' takes one model: use {analysis.usage}")
    if len(args) < least:
        raise VitseeError(f"view '{text}' names one model; {kind} names {least}: use {analysis.usage}")
    if args and most == 0 and not analysis.takes_layer:
        raise VitseeError(
            f"view '{text}' names a model, but {kind} is a view of every model of the store: use {analysis.usage}"
        )
    keys = tuple(store.resolve_model(a) for a in (args if most > 1 else args[:1]))
    return Request(kind, keys, args[1] if analysis.takes_layer and len(args) > 1 else None)


def resolve_view(path: str | Path, text: str) -> Request:
    """Returns the Request of a view string for the store at path (model prefixes resolved)."""
    with Store.open(path) as store:
        return request_of(store, text)


def cached_params(
    store: Store, text: str, cfg: AnalyzeConfig | None = None, options: dict | None = None
) -> dict | None:
    """Returns the parameters of the cached result that serves a view, or None when it must be computed.

    With cfg given only an exact match serves; with cfg None the cached result about the same thing (the
    analysis's identity: models, layers, images) that the analysis prefers does, whatever settings (batch size,
    shuffles, seed) made it, the newest first among equals, if it was made with the `options` given: values of the
    analyses' own options (attribute -> value, e.g. {"max_images": 64}). An option the view's analysis does not
    take is a VitseeError: never silently another result than the one asked for.
    """
    request = request_of(store, text)
    analysis = request.analysis
    check_options(analysis, options or {})
    params = analysis.params(store, request, (cfg or AnalyzeConfig()).with_options(options))
    if cfg is not None:
        return params if store.get_result(request.name, params) is not None else None
    return analysis.cached_params(store, params, given=list(options or {}))


def check_options(analysis, options: dict) -> None:
    """Raises the one-line VitseeError for an option given that the analysis (its views) does not take."""
    for attr in options:
        if not analysis.option_paths(attr):
            takes = [a.name for a in REGISTRY.values() if a.option_paths(attr)]
            flag = "--" + next((o.name for a in REGISTRY.values() for o in a.options if o.attr == attr), attr)
            raise VitseeError(
                f"{flag} is no option of {analysis.name} views (it is one of {', '.join(takes) or 'none'}): "
                "leave it out, or ask for one of those views"
            )


def compute_view(store: Store, text: str, cfg: AnalyzeConfig, progress=None) -> None:
    """Computes and caches the result behind a view in a store open for writing (cached: returns at once)."""
    request = request_of(store, text)
    request.analysis.run(store, request, cfg, progress)


def load_view(
    path: str | Path,
    text: str,
    cfg: AnalyzeConfig | None = None,
    progress=None,
    device: str | None = None,
    options: dict | None = None,
) -> View:
    """Returns the view named by `text` for the store at path, computing and caching what is missing.

    cfg None means "no particular estimator settings": any cached result about the same thing serves
    (see cached_params), and a missing one is computed with the defaults, on `device` (where to compute is not
    what to show: it never picks the estimate), from any cached estimate it builds on (the zoo on a cached CKA, a
    streaming store's CKA: AnalyzeConfig.any_cka_estimate). `options`: the analyses' own options that say what the
    view is of (`--zoo-measure`), as `vitsee show` and `export` take them.
    """
    path = Path(path)
    with Store.open(path) as store:
        request = request_of(store, text)
        # the analysis's own reason first, before its parameters (a model from another tool: there is no model)
        reason = request.analysis.not_applicable(store, request.keys[0]) if request.keys else None
        if reason:
            raise VitseeError(reason)
        names = store.display_names()
        subtitle = _subtitle(store, list(dict.fromkeys(request.keys)), names)
        info = store.model_info(request.keys[0]) if request.keys else {}
        n_images = store.n_images
        params = None if cfg is not None and cfg.recompute else cached_params(store, text, cfg, options)
        result = Result.load(store, request.name, params) if params is not None else None
    analysis = request.analysis
    if result is None:
        with Store.writer(path) as store:
            base = cfg or AnalyzeConfig(device=device or AnalyzeConfig.device, any_cka_estimate=True)
            result = analysis.run(store, request, base.with_options(options), progress)
    view = analysis.view(result, request, info)
    view.names = names
    view.title = with_names(view.title, names)
    view.subtitle = subtitle
    view.n_images = n_images
    if not np.isfinite(view.matrix).all() and view.nonfinite is None:  # a view that marks its own is left as it is
        with Store.open(path) as store:
            mark_nonfinite(view, store)
    view.spec = request.spec
    return view


# --- non-finite cells ---------------------------------------------------------------------------------


def mark_nonfinite(view: View, store: Store) -> None:
    """Marks the view's non-finite cells as computed-but-non-finite, with the images behind each one as its
    analysis counts them (the images whose activations, distances or ratios behind the cell hold NaN/Inf)."""
    bad = ~np.isfinite(view.matrix)
    present = view.analysis.present(view)
    if present is not None:  # a cell that holds no value at all is not a non-finite one
        bad &= present
    view.nonfinite = bad
    counts = view.analysis.nonfinite_images(view, store)
    view.nonfinite_images = counts if counts is not None else np.full(view.matrix.shape, -1, dtype=np.int64)


def uniform_text(view: View) -> str:
    """Returns 'uniform attention: 116.5 px', or for Swin the value inside a window of each stage."""
    per_block = np.asarray(view.extra.get("uniform_px_per_block", [view.extra["uniform_px"]]), dtype=float)
    if np.allclose(per_block, per_block[0]):
        return f"uniform attention: {float(view.extra['uniform_px']):.1f} px"
    stages = list(dict.fromkeys(round(float(v), 1) for v in per_block))
    return "uniform attention inside a window: " + ", ".join(f"{v:.1f}" for v in stages) + " px by stage"


def best_cell(view: View) -> tuple[int, int] | None:
    """Returns the cell `vitsee show` reports: the best value (the largest, or the smallest where lower is better),
    off the diagonal of a layer x layer view within one model."""
    values = np.array(view.matrix, dtype=float)
    # a layer (a measure, a model) against itself is alike by construction
    alike = (Shape.LAYER_MATRIX, Shape.MEASURES_AGREE, Shape.MODEL_MATRIX)
    if view.shape in alike and values.shape[0] == values.shape[1] and view.rows == view.cols:
        np.fill_diagonal(values, np.nan)
    if not np.isfinite(values).any():
        return None
    pick = np.nanargmax if view.analysis.higher_is_better else np.nanargmin
    return tuple(int(i) for i in np.unravel_index(pick(values), values.shape))


def available_views(path: str | Path) -> list[str]:
    """Returns every view the store offers (for pickers), in the registry's order: CKA first, then per model."""
    with Store.open(path) as store:
        return [request.spec for analysis in REGISTRY.values() for request in analysis.requests(store)]

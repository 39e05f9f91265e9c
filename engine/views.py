"""Views: one analysis result shaped for looking at — a labelled matrix plus what its kind needs.

A view is named by a string: `cka:MODEL_A[:MODEL_B]`, `attention:MODEL`, `probes:MODEL`, `skip:MODEL`,
`spatial:MODEL[:LAYER]` (MODEL is a store key or a unique prefix of one). The CLI's export and show,
and the terminal app, all go through `load_view`, so they show the same numbers.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import analyze as an
from .errors import VitseeError
from .stats import ALPHA, ROUGH_BATCHES, clopper_pearson, significance_label
from .store import Store

VIEW_KINDS = ("cka", "attention", "probes", "skip", "spatial")
VIEW_HELP = "cka:MODEL_A[:MODEL_B], attention:MODEL, probes:MODEL, skip:MODEL or spatial:MODEL[:LAYER]"


@dataclass
class View:
    """A result ready to draw: `matrix` (rows x cols) with labels, a colour range, and kind extras."""

    kind: str
    spec: str
    title: str
    subtitle: str
    matrix: np.ndarray
    rows: list[str]
    cols: list[str]
    value_name: str
    vmin: float | None = None
    vmax: float | None = None
    params: dict = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    # statistics, each shaped like matrix when present (None: the result has none): see engine/stats.py
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None
    p_value: np.ndarray | None = None

    def value(self, row: int, col: int) -> float:
        return float(self.matrix[row, col])

    @property
    def ci_level(self) -> float:
        """Returns the confidence level of the intervals (0.0 when the result has none)."""
        return float((self.params.get("stats") or {}).get("ci") or 0.0) if self.ci_low is not None else 0.0

    @property
    def permutations(self) -> int:
        """Returns how many permutations make each p-value (0 when the result has none)."""
        return int((self.params.get("stats") or {}).get("permutations") or 0) if self.p_value is not None else 0

    @property
    def rough(self) -> bool:
        """Returns True when a bootstrap interval rests on fewer than stats.ROUGH_BATCHES batches."""
        n = self.extra.get("n_batches")
        return n is not None and self.ci_low is not None and n < ROUGH_BATCHES

    def interval_text(self, row: int, col: int) -> str:
        """Returns ' [0.795, 0.828]  p<0.01' for a cell (with ' rough' for few batches), '' without statistics."""
        text = ""
        if self.ci_low is not None and np.isfinite(self.ci_low[row, col]):
            text += f" [{self.ci_low[row, col]:.3f}, {self.ci_high[row, col]:.3f}]" + (" rough" if self.rough else "")
        if self.p_value is not None:
            label = significance_label(float(self.p_value[row, col]), self.permutations)
            text += f"  {label}" if label else ""
        return text

    def interval_caption(self) -> str:
        """Returns what the intervals and p-values are, in words ('' without them), for captions and legends."""
        if self.ci_low is None and self.p_value is None:
            return ""
        level = f"{self.ci_level:.0%}"
        n_images = self.params.get("n_images")
        parts = []
        if self.ci_low is not None:
            if self.kind in ("cka", "spatial"):
                n = self.extra.get("n_batches")
                parts.append(f"{level} bootstrap interval over {n} minibatches of images"
                             + (f" (rough: under {ROUGH_BATCHES} batches)" if self.rough else ""))
            elif self.kind == "probes":
                parts.append(f"{level} Clopper-Pearson interval on {self.params.get('n_test')} test images")
            else:
                parts.append(f"{level} Student-t interval of the mean over {n_images} images")
        if self.p_value is not None:
            parts.append(f"p: {self.permutations}-permutation test (images of the column layer shuffled)")
        return "; ".join(parts) + "; the images vary, the model is fixed"

    def not_significant(self, alpha: float = ALPHA) -> np.ndarray | None:
        """Returns a bool mask of the cells whose p-value exceeds alpha (None without p-values)."""
        if self.p_value is None:
            return None
        with np.errstate(invalid="ignore"):
            return np.asarray(self.p_value) > alpha

    def to_json(self) -> dict:
        """Returns the numbers with their labels and parameters (JSON-able; NaN becomes null)."""
        out: dict[str, Any] = {"view": self.kind}
        if self.kind == "cka":
            out["model_a"], out["model_b"] = self.models[0], self.models[-1]
        else:
            out["model"] = self.models[0]
        out.update(
            title=self.title, rows=list(self.rows), cols=list(self.cols), value_name=self.value_name,
            values=_nested(self.matrix),
        )
        for name in ("ci_low", "ci_high", "p_value"):  # same shape as values
            if getattr(self, name) is not None:
                out[name] = _nested(np.asarray(getattr(self, name), dtype=float))
        if self.ci_low is not None:
            out["ci_level"] = self.ci_level
        for key, value in self.extra.items():
            out[key] = _nested(value)
        out["params"] = self.params
        return out

    def to_csv(self) -> str:
        """Returns the matrix as CSV: a header of column labels, each row led by its label."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow([self.value_name, *self.cols])
        for label, row in zip(self.rows, self.matrix):
            writer.writerow([label, *[("" if not np.isfinite(v) else repr(float(v))) for v in row]])
        return buf.getvalue()


def _nested(value):
    if isinstance(value, dict):
        return {k: _nested(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            return [_nested(v) for v in value] if value.ndim else _nested(float(value))
        return value.tolist()
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_nested(v) for v in value]
    return value


def parse_view(text: str) -> tuple[str, list[str]]:
    """Returns (kind, arguments) of a view string."""
    kind, _, rest = text.partition(":")
    if kind not in VIEW_KINDS:
        raise VitseeError(f"unknown view '{text}': use {VIEW_HELP}")
    args = _split_models(rest) if rest else []
    if not args:
        raise VitseeError(f"view '{text}' names no model: use {VIEW_HELP}")
    limit = 2
    if len(args) > limit:
        raise VitseeError(f"view '{text}' has too many parts: use {VIEW_HELP}")
    return kind, args


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


def _subtitle(store: Store, models: list[str]) -> str:
    parts = []
    for m in models:
        w = store.model_info(m)["weights"]
        desc = {"pretrained": "pretrained", "random": f"random init (seed {w.get('seed')})", "file": f"weights {Path(w.get('path') or '').name}"}
        parts.append(f"{m}: {desc.get(w['kind'], w['kind'])}")
    return "; ".join(parts) + f"; {store.n_images} images of {store.dataset_spec}"


# parameters that say WHAT a result is about; the others (batch size, shuffles, seed) say HOW it was
# estimated, and any cached estimate of the right thing serves a view that did not ask for a particular one
IDENTITY = {
    "cka": ("models", "layers", "n_images"),
    "attention": ("model", "n_images", "bins"),
    "probes": ("model", "n_images", "tokens"),  # a result with a larger max_token_dim only adds token maps
    "skip": ("model", "n_images"),
    "spatial": ("model", "layer", "n_images"),
}


@dataclass(frozen=True)
class _Request:
    """What a view string asks of the store: the analysis, resolved model keys and its arguments."""

    kind: str
    keys: list[str]
    layer: str | None

    def params(self, store: Store, cfg: an.AnalyzeConfig) -> dict:
        key = self.keys[0]
        if self.kind == "cka":
            return an.cka_params(store, cfg)
        if self.kind == "spatial":
            return an.spatial_params(store, key, cfg, self.layer)
        return {"attention": an.attention_params, "probes": an.probe_params, "skip": an.skip_params}[self.kind](store, key, cfg)

    def run(self, store: Store, cfg: an.AnalyzeConfig, progress) -> dict:
        key = self.keys[0]
        if self.kind == "cka":
            return an.run_cka(store, cfg, progress)
        if self.kind == "spatial":
            return an.run_spatial(store, key, cfg, self.layer, progress)
        runner = {"attention": an.run_attention, "probes": an.run_probes, "skip": an.run_skip}[self.kind]
        return runner(store, key, cfg, progress)


def _request(store: Store, text: str) -> _Request:
    kind, args = parse_view(text)
    if kind not in ("cka", "spatial") and len(args) > 1:
        raise VitseeError(f"view '{text}' takes one model: use {VIEW_HELP}")
    keys = [store.resolve_model(a) for a in (args if kind == "cka" else args[:1])]
    return _Request(kind, keys, args[1] if kind == "spatial" and len(args) > 1 else None)


def cached_params(store: Store, text: str, cfg: an.AnalyzeConfig | None = None) -> dict | None:
    """Returns the parameters of the cached result that serves a view, or None when it must be computed.

    With cfg given only an exact match serves; with cfg None the newest cached result about the same
    models/layers/images does, whatever settings (batch size, shuffles, seed) made it; for probes the one with
    per-token maps for the widest layers first.
    """
    request = _request(store, text)
    params = request.params(store, cfg or an.AnalyzeConfig())
    if cfg is not None:
        return params if store.get_result(request.kind, params) is not None else None
    same = [r for r in store.results(request.kind) if all(r["params"].get(k) == params.get(k) for k in IDENTITY[request.kind])]

    def preference(r: dict) -> tuple:
        wider = r["params"].get("max_token_dim", 0) if request.kind == "probes" else 0  # more token maps, same rest
        return wider, r["provenance"].get("created", ""), r["provenance"].get("created_unix", 0.0)

    best = max(same, key=preference, default=None)
    return best["params"] if best else None


def compute_view(store: Store, text: str, cfg: an.AnalyzeConfig, progress=None) -> None:
    """Computes and caches the result behind a view in a store open for writing (cached: returns at once)."""
    _request(store, text).run(store, cfg, progress)


def load_view(path: str | Path, text: str, cfg: an.AnalyzeConfig | None = None, progress=None) -> View:
    """Returns the view named by `text` for the store at path, computing and caching what is missing.

    cfg None means "no particular estimator settings": any cached result about the same thing serves
    (see cached_params), and a missing one is computed with the defaults.
    """
    path = Path(path)
    with Store.open(path) as store:
        request = _request(store, text)
        subtitle = _subtitle(store, list(dict.fromkeys(request.keys)))
        info = store.model_info(request.keys[0])
        params = None if cfg is not None and cfg.recompute else cached_params(store, text, cfg)
        result = store.get_result(request.kind, params) if params is not None else None
    if result is None:
        with Store.writer(path) as store:
            result = request.run(store, cfg or an.AnalyzeConfig(), progress)
    builder = {"cka": _cka_view, "attention": _attention_view, "probes": _probe_view, "skip": _skip_view, "spatial": _spatial_view}
    view = builder[request.kind](result, request.keys, info)
    view.subtitle = subtitle
    args = request.keys if request.kind == "cka" else request.keys + ([request.layer] if request.layer else [])
    view.spec = f"{request.kind}:{':'.join(args)}"
    return view


def _cka_view(result: dict, keys: list[str], info: dict) -> View:
    a, b = keys[0], keys[-1]
    matrix, rows, cols = an.cka_block(result, result["_params"]["models"], a, b)
    title = f"CKA {a}" if a == b else f"CKA {a} (rows) x {b} (cols)"
    params = dict(result["_params"])
    params.pop("layers", None)
    block = {name: an.cka_block(result, result["_params"]["models"], a, b, key=name)[0]
             for name in ("ci_low", "ci_high", "p_value") if name in result}
    extra = {"n_batches": int(result["n_batches"])} if "n_batches" in result else {}
    return View("cka", "", title, "", matrix, rows, cols, "CKA", 0.0, 1.0, params, extra, [a, b], **block)


def _attention_view(r: dict, keys: list[str], info: dict) -> View:
    key = keys[0]
    heads = r["mean_px"].shape[1]
    extra = {"std_px": r["std_px"], "hist_counts": r["hist_counts"], "hist_edges": r["hist_edges"],
             "uniform_px": float(r["uniform_px"]), "head_order": r["head_order"], "mean_renorm_px": r["mean_renorm_px"]}
    return View("attention", "", f"Mean attention distance {key}", "", r["mean_px"], [str(b) for b in r["blocks"]],
                [f"head {h + 1}" for h in range(heads)], "distance (px)", 0.0, float(r["hist_edges"][-1]),
                dict(r["_params"]), extra, [key], ci_low=r.get("ci_low_px"), ci_high=r.get("ci_high_px"))


def _probe_view(r: dict, keys: list[str], info: dict) -> View:
    key = keys[0]
    layers = [str(x) for x in r["layers"]]
    token_maps = {name.split("/", 1)[1]: v for name, v in r.items() if name.startswith("tokens/")}
    prefix = int(info.get("num_prefix_tokens") or 0)
    gh, gw = info.get("grid_size") or (0, 0)
    if "token_prefix" in r:
        token_prefix = {layer: int(n) for layer, n in zip(layers, r["token_prefix"])}
    else:  # results cached before the count was recorded: a layer holds the prefix tokens or none
        token_prefix = {layer: prefix if len(m) == prefix + gh * gw else 0 for layer, m in token_maps.items()}
    # the token maps hold the prefix tokens first (CLS...): the mean is over the spatial positions only
    token_mean = np.array([np.mean(token_maps[layer][token_prefix[layer]:]) if layer in token_maps else np.nan
                           for layer in layers])
    matrix = np.column_stack([r["accuracy"], token_mean])
    cols = ["CLS", "GAP", "tokens (mean)"]
    keep = [i for i in range(matrix.shape[1]) if np.isfinite(matrix[:, i]).any()]
    params = dict(r["_params"], split_seed=r["_params"]["seed"], n_train=int(len(r["split_train"])), n_test=int(len(r["split_test"])))
    extra = {"token_maps": {k: np.asarray(v) for k, v in token_maps.items()}, "chance": float(r["chance"]), "l2": r["l2"],
             "grid": list(info.get("grid_size") or []), "prefix_tokens": prefix,
             "token_prefix": {layer: token_prefix[layer] for layer in token_maps},
             "tokens_too_wide": [str(x) for x in np.atleast_1d(r.get("tokens_too_wide", []))]}
    ci = {}
    if "ci_low" in r:  # the token mean: Clopper-Pearson on its mean count, at least as wide as an average of rates
        n_test, level = params["n_test"], float(r["_params"]["stats"]["ci"])
        t_low, t_high = clopper_pearson(np.round(token_mean * n_test), n_test, level)
        ci = {"ci_low": np.column_stack([r["ci_low"], t_low])[:, keep], "ci_high": np.column_stack([r["ci_high"], t_high])[:, keep]}
    return View("probes", "", f"Linear probe test accuracy {key}", "", matrix[:, keep], layers, [cols[i] for i in keep],
                "accuracy", 0.0, 1.0, params, extra, [key], **ci)


def best_cell(view: View) -> tuple[int, int] | None:
    """Returns the cell `vitsee show` reports: the largest value, off the diagonal of a within-model CKA view."""
    values = np.array(view.matrix, dtype=float)
    if view.kind == "cka" and values.shape[0] == values.shape[1] and view.rows == view.cols:
        np.fill_diagonal(values, np.nan)  # a layer against itself is 1 by construction
    if not np.isfinite(values).any():
        return None
    return tuple(int(i) for i in np.unravel_index(np.nanargmax(values), values.shape))


def too_wide_note(view: View) -> str:
    """Returns, for a probes view, '; no per-token maps for ...' naming the layers left out for width, else ''."""
    wide = view.extra.get("tokens_too_wide") or []
    if not wide:
        return ""
    return (f"; no per-token maps for {len(wide)} layer(s) wider than {view.params.get('max_token_dim')} channels "
            f"({', '.join(wide[:3])}{', ...' if len(wide) > 3 else ''}): vitsee analyze STORE --probes --probe-max-dim N")


def _skip_view(r: dict, keys: list[str], info: dict) -> View:
    key = keys[0]
    ratio = np.asarray(r["ratio"], dtype=float)
    finite = ratio[np.isfinite(ratio)]
    extra = {"cls": r["cls"], "spatial_mean": r["spatial_mean"]}
    for name in ("cls_ci_low", "cls_ci_high", "spatial_ci_low", "spatial_ci_high"):
        if name in r:
            extra[name] = r[name]
    return View("skip", "", f"Skip-connection norm ratio ||z||/||f(z)|| {key}", "", ratio, [str(x) for x in r["rows"]],
                [str(x) for x in r["cols"]], "ratio", float(finite.min()) if finite.size else 0.0,
                float(finite.max()) if finite.size else 1.0, dict(r["_params"]), extra, [key],
                ci_low=r.get("ci_low"), ci_high=r.get("ci_high"))


def _spatial_view(r: dict, keys: list[str], info: dict) -> View:
    key = keys[0]
    gh, gw = (int(v) for v in r["grid"])
    cells = [f"r{i}c{j}" for i in range(gh) for j in range(gw)]
    params = dict(r["_params"])
    return View("spatial", "", f"Spatial localisation {key} {params['layer']}", "", r["maps"], [f"token {c}" for c in cells],
                [f"patch {c}" for c in cells], "CKA", 0.0, 1.0, params,
                {"grid": [gh, gw], "patch_px": int(r["patch_px"]), **({"n_batches": int(r["n_batches"])} if "n_batches" in r else {})}, [key],
                ci_low=r.get("ci_low"), ci_high=r.get("ci_high"))


def available_views(path: str | Path) -> list[str]:
    """Returns every view that applies to the store (for pickers): CKA pairs first, then per model."""
    with Store.open(path) as store:
        models = store.models
        out = [f"cka:{m}" for m in models]
        out += [f"cka:{a}:{b}" for i, a in enumerate(models) for b in models[i + 1 :]]
        for m in models:
            out += [f"{kind}:{m}" for kind in an.applicable(store, m)]
    return out


def write_view(view: View, out: str | Path, selection: tuple[int, int] | None = None, cmap: str = "viridis") -> Path:
    """Writes the view to .png (a figure), .json or .csv, by the file's extension; returns the path."""
    out = Path(out)
    suffix = out.suffix.lower()
    if not out.parent.exists():
        raise VitseeError(f"folder {out.parent} does not exist: create it or choose another --out")
    if suffix == ".json":
        payload = view.to_json()
        if selection is not None:
            payload["selection"] = {"row": selection[0], "col": selection[1], "row_label": view.rows[selection[0]],
                                    "col_label": view.cols[selection[1]], "value": _nested(view.matrix[selection])}
            for name in ("ci_low", "ci_high", "p_value"):
                if getattr(view, name) is not None:
                    payload["selection"][name] = _nested(getattr(view, name)[selection])
        out.write_text(json.dumps(payload, indent=1))
    elif suffix == ".csv":
        out.write_text(view.to_csv())
    elif suffix == ".png":
        from .figures import save_png

        save_png(view, out, selection=selection, cmap=cmap)
    else:
        raise VitseeError(f"cannot export to '{out.name}': use a .png, .json or .csv file name")
    return out

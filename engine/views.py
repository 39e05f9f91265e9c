"""Views: one analysis result shaped for looking at — a labelled matrix plus what its kind needs.

A view is named by a string: `cka:MODEL_A[:MODEL_B]`, `attention:MODEL`, `probes:MODEL`, `skip:MODEL`,
`spatial:MODEL[:LAYER]`, `heads:VIT:OTHER`, `erf:MODEL[:LAYER]` (MODEL is a store key or a unique prefix of one). The CLI's export and show,
and the terminal app, all go through `load_view`, so they show the same numbers.
"""
from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .analyses import REGISTRY
from .analyses.base import AnalyzeConfig
from .analyses.spatial import _spatial_layout
from .analyze import applicable
from .errors import VitseeError
from .stats import ALPHA, ROUGH_BATCHES, significance_label
from .store import Store

VIEW_KINDS = tuple(REGISTRY)
VIEW_HELP = ", ".join(spec.usage for spec in list(REGISTRY.values())[:-1]) + f" or {list(REGISTRY.values())[-1].usage}"


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
    # cells that were computed but are NaN/Inf (non-finite inputs, or a readout skipped for them), beside the
    # values so that "non-finite" and "not computed" (NaN without a mark) stay two things
    nonfinite: np.ndarray | None = None  # (rows, cols) bool
    nonfinite_images: np.ndarray | None = None  # (rows, cols) images with non-finite inputs per cell, -1 unknown
    n_images: int = 0
    # statistics, each shaped like matrix when present (None: the result has none): see engine/stats.py
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None
    p_value: np.ndarray | None = None

    def value(self, row: int, col: int) -> float:
        return float(self.matrix[row, col])

    def is_nonfinite(self, row: int, col: int) -> bool:
        """Returns whether a cell was computed and came out non-finite (NaN/Inf)."""
        return self.nonfinite is not None and bool(self.nonfinite[row, col])

    def nonfinite_text(self, row: int, col: int) -> str:
        """Returns 'non-finite (3 of 48 images)' for a non-finite cell ('non-finite' when the images are unknown)."""
        count = int(self.nonfinite_images[row, col]) if self.nonfinite_images is not None else -1
        return f"non-finite ({count} of {self.n_images} images)" if count > 0 else "non-finite"

    def cell_text(self, row: int, col: int, digits: int = 4, missing: str = "not computed") -> str:
        """Returns a cell as text: its value, 'non-finite (k of N images)', or `missing` (not computed)."""
        value = self.matrix[row, col]
        if np.isfinite(value):
            return f"{value:.{digits}f}"
        return self.nonfinite_text(row, col) if self.is_nonfinite(row, col) else missing

    def nonfinite_note(self) -> str:
        """Returns one line on the non-finite cells ('' when there are none): how many and which rows."""
        if self.nonfinite is None or not self.nonfinite.any():
            return ""
        whole = np.flatnonzero(self.nonfinite.all(axis=1))  # a layer with non-finite activations fills its row
        rows = whole if whole.size else np.flatnonzero(self.nonfinite.any(axis=1))
        names = ", ".join(self.rows[r] for r in rows[:4]) + (f" and {len(rows) - 4} more" if len(rows) > 4 else "")
        where = "activations" if self.kind in ("cka", "spatial", "probes") else "per-image statistics"
        return (f"{int(self.nonfinite.sum())} non-finite cell(s), from NaN/Inf in the stored {where}, in {names}"
                + (": see `vitsee info`" if where == "activations" else ""))

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
        elif self.kind == "heads":  # analyses/heads.py
            out["model"], out["other"] = self.models[0], self.models[-1]
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
        out["nonfinite"] = [  # the cells whose value is null because it is NaN/Inf (other nulls: not computed)
            {"row": int(r), "col": int(c), "row_label": self.rows[r], "col_label": self.cols[c],
             "images": (int(self.nonfinite_images[r, c]) if self.nonfinite_images is not None
                        and self.nonfinite_images[r, c] >= 0 else None)}
            for r, c in zip(*np.nonzero(self.nonfinite))] if self.nonfinite is not None else []
        out["n_images"] = self.n_images
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
IDENTITY = {name: spec.identity for name, spec in REGISTRY.items()}


@dataclass(frozen=True)
class _Request:
    """What a view string asks of the store: the analysis, resolved model keys and its arguments."""

    kind: str
    keys: list[str]
    layer: str | None

    def params(self, store: Store, cfg: AnalyzeConfig) -> dict:
        return REGISTRY[self.kind].params(store, self.keys, self.layer, cfg)

    def run(self, store: Store, cfg: AnalyzeConfig, progress) -> dict:
        return REGISTRY[self.kind].run(store, self.keys, self.layer, cfg, progress)


def _request(store: Store, text: str) -> _Request:
    kind, args = parse_view(text)
    spec = REGISTRY[kind]
    if len(args) > 1 and spec.models[1] == 1 and not spec.layer:
        raise VitseeError(f"view '{text}' takes one model: use {VIEW_HELP}")
    if len(args) < spec.models[0]:
        raise VitseeError(f"view '{text}' names one model; heads:VIT:OTHER compares a ViT's heads with another model's layers")
    keys = [store.resolve_model(a) for a in (args if spec.models[1] > 1 else args[:1])]
    return _Request(kind, keys, args[1] if spec.layer and len(args) > 1 else None)


def resolve_view(path: str | Path, text: str) -> tuple[str, list[str], str | None]:
    """Returns (kind, store keys, layer) of a view string for the store at path (model prefixes resolved)."""
    with Store.open(path) as store:
        request = _request(store, text)
    return request.kind, request.keys, request.layer


def cached_params(store: Store, text: str, cfg: AnalyzeConfig | None = None) -> dict | None:
    """Returns the parameters of the cached result that serves a view, or None when it must be computed.

    With cfg given only an exact match serves; with cfg None the newest cached result about the same
    models/layers/images does, whatever settings (batch size, shuffles, seed) made it; for probes the one with
    per-token maps for the widest layers first.
    """
    request = _request(store, text)
    params = request.params(store, cfg or AnalyzeConfig())
    if cfg is not None:
        return params if store.get_result(request.kind, params) is not None else None
    same = [r for r in store.results(request.kind) if all(r["params"].get(k) == params.get(k) for k in IDENTITY[request.kind])]

    def preference(r: dict) -> tuple:
        wider = r["params"].get("max_token_dim", 0) if request.kind == "probes" else 0  # more token maps, same rest
        return wider, r["provenance"].get("created", ""), r["provenance"].get("created_unix", 0.0)

    best = max(same, key=preference, default=None)
    return best["params"] if best else None


def compute_view(store: Store, text: str, cfg: AnalyzeConfig, progress=None) -> None:
    """Computes and caches the result behind a view in a store open for writing (cached: returns at once)."""
    _request(store, text).run(store, cfg, progress)


def load_view(path: str | Path, text: str, cfg: AnalyzeConfig | None = None, progress=None,
              device: str | None = None) -> View:
    """Returns the view named by `text` for the store at path, computing and caching what is missing.

    cfg None means "no particular estimator settings": any cached result about the same thing serves
    (see cached_params), and a missing one is computed with the defaults, on `device` (where to compute is not
    what to show: it never picks the estimate).
    """
    path = Path(path)
    with Store.open(path) as store:
        request = _request(store, text)
        subtitle = _subtitle(store, list(dict.fromkeys(request.keys)))
        info = store.model_info(request.keys[0])
        n_images = store.n_images
        params = None if cfg is not None and cfg.recompute else cached_params(store, text, cfg)
        result = store.get_result(request.kind, params) if params is not None else None
    if result is None:
        with Store.writer(path) as store:
            result = request.run(store, cfg or AnalyzeConfig(device=device or AnalyzeConfig.device), progress)
    spec = REGISTRY[request.kind]
    view = View(**spec.view(result, request.keys, info, request.layer))
    view.subtitle = subtitle
    view.n_images = n_images
    if not np.isfinite(view.matrix).all() and request.kind != "probes":  # probes mark their own (see _probe_view)
        with Store.open(path) as store:
            mark_nonfinite(view, store)
    args = request.keys if spec.models[1] > 1 else request.keys + ([request.layer] if request.layer else [])
    view.spec = f"{request.kind}:{':'.join(args)}"
    return view


# --- non-finite cells ---------------------------------------------------------------------------------


def nonfinite_rows(store: Store, key: str, layer: str, cells=None) -> np.ndarray | None:
    """Returns the (N,) mask of images whose stored activations in a layer hold NaN/Inf (with `cells`, a
    function activations -> per-cell (b, D) features: the (N, cells) mask), or None when the store cannot
    tell (no activations stored). Reads only the batches the extraction counted non-finite values in."""
    if store.streaming:
        return None
    per_batch = store.nonfinite_batches(key)[:, store.layers(key).index(layer)]
    bs, n = store.batch_size(key), store.n_images
    mask = None
    for b in np.flatnonzero(per_batch):
        rows = slice(int(b) * bs, min((int(b) + 1) * bs, n))
        a = store.activations(key, layer, rows)
        bad = np.stack([~np.isfinite(c).all(axis=1) for c in cells(a)], axis=1) if cells else ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
        if mask is None:
            mask = np.zeros((n, *bad.shape[1:]), dtype=bool)
        mask[rows] = bad
    if mask is None:
        n_cells = len(cells(np.zeros((0, *store.layer_shape(key, layer)), dtype=np.float32))) if cells else None
        mask = np.zeros((n, n_cells) if cells else (n,), dtype=bool)
    return mask


def mark_nonfinite(view: View, store: Store) -> None:
    """Marks the view's non-finite cells as computed-but-non-finite, with the images behind each one.

    CKA and spatial cells count the images whose activations (of either layer; of the token) hold NaN/Inf,
    attention cells the images whose distance of that head is, skip cells those whose ratio is.
    """
    bad = ~np.isfinite(view.matrix)
    if view.kind == "attention" and "heads_per_block" in view.extra:  # a Swin stage's missing heads are no values
        heads = np.asarray(view.extra["heads_per_block"])
        bad &= np.arange(view.matrix.shape[1])[None, :] < heads[:, None]
    view.nonfinite = bad
    counts = np.full(view.matrix.shape, -1, dtype=np.int64)
    if view.kind == "cka":
        a, b = view.models[0], view.models[-1]
        rows = {layer: nonfinite_rows(store, a, layer) for layer in set(view.rows[i] for i in np.flatnonzero(bad.any(axis=1)))}
        cols = {layer: nonfinite_rows(store, b, layer) for layer in set(view.cols[j] for j in np.flatnonzero(bad.any(axis=0)))}
        for i, j in zip(*np.nonzero(bad)):
            r, c = rows[view.rows[i]], cols[view.cols[j]]
            if r is not None and c is not None and (r.any() or c.any()):
                counts[i, j] = int((r | c).sum())
    elif view.kind == "spatial":
        _, _, cells = _spatial_layout(store, view.models[0], view.params["layer"])
        tokens = nonfinite_rows(store, view.models[0], view.params["layer"], cells)  # (N, cells)
        if tokens is not None:
            per_token = tokens.sum(axis=0)
            counts = np.where(bad & (per_token[:, None] > 0), per_token[:, None], -1)
    elif view.kind == "attention":
        per_head = (~np.isfinite(store.attention_distance(view.models[0]))).sum(axis=0)  # (blocks, heads)
        sorted_counts = np.take_along_axis(per_head, np.asarray(view.extra["head_order"]), axis=1)
        counts = np.where(bad, sorted_counts, -1)
    elif view.kind == "skip":
        names = [n for n in ("skip_ratio_attn", "skip_ratio_mlp") if n in store.stats(view.models[0])] or ["skip_ratio_block"]
        per_cell = [0] * len(names)
        for batch in store.stat_batches(view.models[0], names):
            per_cell = [c + (~np.isfinite(batch[n])).sum(axis=0) for c, n in zip(per_cell, names)]
        if len(names) == 2:  # rows interleave attn and mlp sublayers, as in run_skip
            cells = np.empty((2 * per_cell[0].shape[0], per_cell[0].shape[1]), dtype=np.int64)
            cells[0::2], cells[1::2] = per_cell
        else:
            cells = np.asarray(per_cell[0]).reshape(-1, 1)
        counts = np.where(bad, cells[: bad.shape[0], : bad.shape[1]], -1)
    view.nonfinite_images = counts


def uniform_text(view: View) -> str:
    """Returns 'uniform attention: 116.5 px', or for Swin the value inside a window of each stage."""
    per_block = np.asarray(view.extra.get("uniform_px_per_block", [view.extra["uniform_px"]]), dtype=float)
    if np.allclose(per_block, per_block[0]):
        return f"uniform attention: {float(view.extra['uniform_px']):.1f} px"
    stages = list(dict.fromkeys(round(float(v), 1) for v in per_block))
    return "uniform attention inside a window: " + ", ".join(f"{v:.1f}" for v in stages) + " px by stage"


def skipped_note(view: View) -> str:
    """Returns, for a probes view, '; not fitted (non-finite features): ...' naming the skipped readouts, else ''."""
    skipped = view.extra.get("skipped") or []
    if not skipped:
        return ""
    named = ", ".join(f"{s['layer']} {s['readout']} ({s['images']} of {view.n_images} images)" for s in skipped[:4])
    more = f" and {len(skipped) - 4} more" if len(skipped) > 4 else ""
    return f"; not fitted, their features hold NaN/Inf: {named}{more} (see `vitsee info`)"


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


def available_views(path: str | Path) -> list[str]:
    """Returns every view that applies to the store (for pickers): CKA pairs first, then per model."""
    with Store.open(path) as store:
        models = store.models
        out = [f"cka:{m}" for m in models]
        out += [f"cka:{a}:{b}" for i, a in enumerate(models) for b in models[i + 1 :]]
        for m in models:
            out += [f"{kind}:{m}" for kind in applicable(store, m)]
        heads, erf = REGISTRY["heads"], REGISTRY["erf"]  # heads: every ViT with head outputs against each other model
        out += [f"heads:{v}:{o}" for v in models if heads.applies(store, v) for o in models if o != v]
        out += [f"erf:{m}" for m in models if erf.applies(store, m)]
    return out

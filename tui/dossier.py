"""What vitsee knows about one pair of layers (the dossier of a CKA cell): each analysis's numbers for those two
layers, read from the store's cache, as lines of text; what is not cached says how to compute it.

Runs in thread workers (it opens the store); no Textual here. The screen that draws it is screens/dossier.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vitsee.tui.results import LoadedView, StoreSummary, read_view

if TYPE_CHECKING:
    from vitsee.engine.analyze import AnalyzeConfig
    from vitsee.engine.views import View

CHEAP = ("attention", "skip")  # summaries of per-image statistics recorded at extraction: computed if missing
RAMP = " .:-=+*#%@"  # the spatial map as glyphs, dark to bright (readable without colour)


@dataclass
class Section:
    """One analysis of one of the two layers: a title, its numbers as lines, and the full view it opens."""

    kind: str  # the view Enter opens: attention, probes, skip, spatial, erf
    model: str
    layer: str  # where that view's cursor goes (attention: the block)
    title: str
    lines: list[str]
    available: bool  # False: not computed, or not applicable (the lines say which)


@dataclass
class Dossier:
    """The CKA cell and the sections of the row layer (model A) and the column layer (model B)."""

    cka: LoadedView
    row: int
    col: int
    sections: list[Section] = field(default_factory=list)

    @property
    def sides(self) -> list[tuple[str, str]]:
        """Returns (model, layer) of the row and the column, once when they are the same layer."""
        view = self.cka.view
        row = (view.models[0], view.rows[self.row])
        col = (view.models[-1], view.cols[self.col])
        return [row] if row == col else [row, col]


# --- the numbers of each analysis for one layer -----------------------------------------------------------------


def block_of(blocks: list[str], layer: str) -> str | None:
    """Returns the block a layer belongs to (blocks.3 for blocks.3 and blocks.3.attn), None outside every block."""
    return next((b for b in blocks if layer == b or layer.startswith(b + ".")), None)


def attention_lines(view: View, block: str) -> list[str]:
    """Returns the block's heads, nearest first, with their mean distance in px and its interval."""
    r = view.rows.index(block)
    order = np.asarray(view.extra["head_order"])[r]
    uniform = np.asarray(view.extra.get("uniform_px_per_block", [view.extra["uniform_px"]] * len(view.rows)))[r]
    heads = []
    for h, distance in enumerate(view.matrix[r]):
        shown = f"{distance:.1f} px" if np.isfinite(distance) else view.cell_text(r, h)
        if view.ci_low is not None and np.isfinite(view.ci_low[r, h]):
            shown += f" [{view.ci_low[r, h]:.1f}, {view.ci_high[r, h]:.1f}]"
        heads.append(f"head {int(order[h]) + 1} {shown}")
    finite = view.matrix[r][np.isfinite(view.matrix[r])]
    mean = f"{finite.mean():.1f} px" if finite.size else "none finite"
    return [f"{len(heads)} heads, mean {mean}; uniform attention {float(uniform):.1f} px", "  ".join(heads)]


def probe_lines(view: View, layer: str) -> list[str]:
    """Returns the layer's test accuracy per readout with its interval, and the best layer of each readout."""
    r = view.rows.index(layer)
    cells, best = [], []
    for c, readout in enumerate(view.cols):
        if np.isfinite(view.matrix[r, c]):
            cells.append(f"{readout} {view.matrix[r, c]:.3f}{view.interval_text(r, c)}")
        else:
            cells.append(f"{readout} {view.cell_text(r, c, missing='n/a')}")
        column = np.where(np.isfinite(view.matrix[:, c]), view.matrix[:, c], -np.inf)
        if np.isfinite(column).any():
            b = int(np.argmax(column))
            best.append(f"{readout} {view.rows[b]} {view.matrix[b, c]:.3f}")
    chance = view.extra.get("chance")
    tail = f"; chance {float(chance):.3f}" if chance is not None else ""
    return ["  ".join(cells), f"best: {'  '.join(best)}{tail}"]


def skip_lines(view: View, layer: str, note: str = "") -> list[str]:
    """Returns ||z|| / ||f(z)|| of the layer's sublayers (or block): CLS token and spatial mean, with intervals."""
    extra = view.extra
    rows = [i for i, name in enumerate(view.rows) if name == layer or name.startswith(layer + ".")]
    lines = []
    for i in rows:
        parts = []
        for name, key in (("CLS", "cls"), ("spatial", "spatial_mean")):
            value = float(np.asarray(extra[key], dtype=float)[i])
            if not np.isfinite(value):
                continue
            text = f"{name} {value:.3g}"
            low, high = extra.get(f"{key.partition('_')[0]}_ci_low"), extra.get(f"{key.partition('_')[0]}_ci_high")
            if low is not None and np.isfinite(low[i]):
                text += f" [{low[i]:.3g}, {high[i]:.3g}]"
            parts.append(text)
        lines.append(f"{view.rows[i]}: " + ("  ".join(parts) or "no finite ratio"))
    return lines + ([note] if note else [])


def spatial_lines(view: View) -> list[str]:
    """Returns how local the layer's tokens are (CKA with their own input patch) and the centre token's map."""
    gh, gw = (int(g) for g in view.extra["grid"])
    matrix = np.asarray(view.matrix, dtype=float)  # (tokens, patches)
    own = np.diag(matrix)
    finite = np.isfinite(matrix).any(axis=1)
    peaks = np.array([np.nanargmax(row) if ok else -1 for row, ok in zip(matrix, finite)])
    at_own = int((peaks == np.arange(len(peaks))).sum())
    centre = (gh // 2) * gw + gw // 2
    lines = [f"CKA of a token with its own patch: mean {np.nanmean(own):.3f}; the peak is its own patch for "
             f"{at_own} of {len(own)} tokens", f"map of token r{gh // 2}c{gw // 2} (dark {RAMP[1]} to bright {RAMP[-1]}):"]
    lines += ["  " + row for row in ramp_rows(matrix[centre].reshape(gh, gw))]
    return lines


def ramp_rows(grid: np.ndarray) -> list[str]:
    """Returns a map as rows of RAMP glyphs scaled from its minimum to its maximum (NaN as a blank)."""
    finite = grid[np.isfinite(grid)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = high - low or 1.0
    levels = np.clip(((grid - low) / span * (len(RAMP) - 2)).round(), 0, len(RAMP) - 2)
    return ["".join(" " if not np.isfinite(v) else RAMP[int(lv) + 1] for v, lv in zip(vals, lvls))
            for vals, lvls in zip(grid, levels)]


def half_mass_radius(erf: np.ndarray) -> float:
    """Returns the radius in px around the centre pixel (H // 2, W // 2) holding half of the map's total."""
    h, w = erf.shape
    yy, xx = np.mgrid[0:h, 0:w]
    radius = np.hypot(yy - h // 2, xx - w // 2).ravel()
    order = np.argsort(radius, kind="stable")
    share = np.nan_to_num(erf.ravel()[order]) / np.nansum(erf)
    return float(radius[order][np.searchsorted(np.cumsum(share), 0.5 - 1e-12)])


def erf_lines(view: View) -> list[str]:
    """Returns how spread the layer's effective receptive field is: its half-mass radius and its peak's share."""
    erf = np.asarray(view.matrix, dtype=float)
    h, w = erf.shape
    return [f"half of |d centre / d input| lies within {half_mass_radius(erf):.1f} px of the centre pixel "
            f"(input {h}x{w}); the peak pixel holds {np.nanmax(erf) / np.nansum(erf):.2%}"]


# --- the whole dossier ----------------------------------------------------------------------------------------------


def _command(kind: str, store: Path, layer: str) -> str:
    extra = f" --spatial-layer {layer}" if kind == "spatial" else ""
    return f"not computed: vitsee analyze {store} --{kind}{extra}"


def read_dossier(path: str | Path, summary: StoreSummary, cka: LoadedView, row: int, col: int,
                 config: Callable[[], AnalyzeConfig], known: dict[str, LoadedView] | None = None) -> Dossier:
    """Returns the dossier of CKA cell (row, col): per layer its head distances, probes, skip ratios, spatial map
    and ERF. Views in `known` or the cache are read; attention and skip summaries are computed when missing
    (they summarise statistics recorded at extraction); the rest say how to compute them."""
    from vitsee.engine.store import Store
    from vitsee.engine.views import cached_params

    from vitsee.tui.results import ACCESS

    path, known = Path(path), dict(known or {})
    dossier = Dossier(cka, row, col)

    def view_of(spec: str, kind: str) -> LoadedView | None:
        if spec in known:
            return known[spec]
        with ACCESS.read(), Store.open(path) as store:
            cached = cached_params(store, spec) is not None
        if not cached and kind not in CHEAP:
            return None
        known[spec] = read_view(path, spec, config())
        return known[spec]

    for model, layer in dossier.sides:
        info = summary.model(model)
        name = model.partition("@")[0]
        for kind in ("attention", "probes", "skip", "spatial", "erf"):
            dossier.sections.append(_section(kind, model, name, layer, info, summary, view_of))
    return dossier


def _section(kind, model, name, layer, info, summary, view_of) -> Section:
    """Returns one analysis's section for one layer: its numbers, why it does not apply, or how to compute it."""
    title = {"attention": "Attention distances", "probes": "Linear probes", "skip": "Skip ratios \u2016z\u2016/\u2016f(z)\u2016",
             "spatial": "Spatial map", "erf": "Effective receptive field"}[kind] + f" \u00b7 {name} {layer}"
    missing = Section(kind, model, layer, title, [], False)
    if kind == "erf":
        if summary.streaming or layer not in info.erf_layers:
            missing.lines = [f"{layer} has no centre position for a receptive field" if not summary.streaming
                             else "a streaming store keeps no model input for ERFs"]
            return missing
        spec = f"erf:{model}:{layer}"
    elif kind not in info.views:
        if summary.streaming and kind in ("probes", "spatial"):
            missing.lines = [f"a streaming store keeps no activations, which {kind} read"]
        else:
            missing.lines = [f"does not apply to {name} ({info.family})" if kind != "probes" else "the images have no labels"]
        return missing
    elif kind == "spatial":
        if layer not in info.spatial_layers:
            missing.lines = [f"{layer} has no token grid or feature map"]
            return missing
        spec = f"spatial:{model}:{layer}"
    else:
        spec = f"{kind}:{model}"
    loaded = view_of(spec, kind)
    if loaded is None:
        missing.lines = [_command(kind, summary.path, layer)]
        return missing
    view = loaded.view
    if kind == "attention":
        block = block_of(list(view.rows), layer)
        if block is None:
            missing.lines = [f"{layer} is not an attention block ({view.rows[0]} \u2026 {view.rows[-1]} are)"]
            return missing
        return Section(kind, model, block, title.replace(layer, block) if block != layer else title,
                       attention_lines(view, block), True)
    if kind == "probes":
        if layer not in view.rows:
            missing.lines = [f"{layer} was not probed"]
            return missing
        return Section(kind, model, layer, title, probe_lines(view, layer), True)
    if kind == "skip":
        lines = skip_lines(view, layer, loaded.init_notes.get(model, ""))
        if not lines or lines == [loaded.init_notes.get(model, "")]:
            missing.lines = [f"{layer} has no residual sublayer"]
            return missing
        return Section(kind, model, layer, title, lines, True)
    if kind == "spatial":
        return Section(kind, model, layer, title, spatial_lines(view), True)
    return Section(kind, model, layer, title, erf_lines(view), True)

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
    if view.extra.get("no_field"):  # rounding noise, not a map (engine/analyses/erf.py)
        return [view.extra["no_field"]]
    erf = np.asarray(view.matrix, dtype=float)
    h, w = erf.shape
    return [f"half of |d centre / d input| lies within {half_mass_radius(erf):.1f} px of the centre pixel "
            f"(input {h}x{w}); the peak pixel holds {np.nanmax(erf) / np.nansum(erf):.2%}"]


# --- the whole dossier ----------------------------------------------------------------------------------------------


def _command(kind: str, store: Path, layer: str) -> str:
    extra = f" --spatial-layer {layer}" if kind == "spatial" else ""
    return f"not computed: vitsee analyze {store} --{kind}{extra}"


TITLES = {"attention": "Attention distances", "probes": "Linear probes", "skip": "Skip ratios \u2016z\u2016/\u2016f(z)\u2016",
          "spatial": "Spatial map", "erf": "Effective receptive field"}


def read_dossier(path: str | Path, summary: StoreSummary, cka: LoadedView, row: int, col: int,
                 config: Callable[[], AnalyzeConfig], known: dict[str, LoadedView] | None = None) -> Dossier:
    """Returns the dossier of CKA cell (row, col): per layer its head distances, probes, skip ratios, spatial map
    and ERF. Views in `known` or the cache are read; attention and skip summaries are computed when missing
    (they summarise statistics recorded at extraction); the rest say how to compute them."""
    from vitsee.engine.init_notes import random_init_note
    from vitsee.engine.store import Store
    from vitsee.engine.views import cached_params, load_view

    from vitsee.tui.results import ACCESS

    path, known = Path(path), dict(known or {})
    dossier = Dossier(cka, row, col)
    wanted = [(kind, model, layer, _spec(kind, model, layer, summary)) for model, layer in dossier.sides
              for kind in TITLES]
    specs = {spec for *_, (spec, _) in wanted if spec is not None and spec not in known}
    with ACCESS.read(), Store.open(path) as store:  # one open for every check (each open verifies the file)
        cached = {spec for spec in specs if cached_params(store, spec) is not None}
        notes = {m: random_init_note(store.model_info(m)) or "" for m, _ in dossier.sides}
    views: dict[str, View] = {spec: loaded.view for spec, loaded in known.items()}
    for spec in sorted(specs):
        if spec in cached:
            with ACCESS.read():
                views[spec] = load_view(path, spec)
        elif spec.partition(":")[0] in CHEAP:
            views[spec] = read_view(path, spec, config()).view
    for kind, model, layer, (spec, why) in wanted:
        title = f"{TITLES[kind]} \u00b7 {model.partition('@')[0]} {layer}"
        if spec is None:
            dossier.sections.append(Section(kind, model, layer, title, [why], False))
        elif spec not in views:
            dossier.sections.append(Section(kind, model, layer, title, [_command(kind, summary.path, layer)], False))
        else:
            dossier.sections.append(_section(kind, model, layer, title, views[spec], notes[model]))
    return dossier


def _spec(kind: str, model: str, layer: str, summary: StoreSummary) -> tuple[str | None, str]:
    """Returns (the view that holds `kind` for this layer, '') or (None, why there is none)."""
    info, name = summary.model(model), model.partition("@")[0]
    if kind == "erf":
        if summary.streaming:
            return None, "a streaming store keeps no model input for ERFs"
        if layer not in info.erf_layers:
            return None, f"{layer} has no centre position for a receptive field"
        return f"erf:{model}:{layer}", ""
    if kind not in info.views:
        if summary.streaming and kind in ("probes", "spatial"):
            return None, f"a streaming store keeps no activations, which {kind} read"
        return None, f"does not apply to {name} ({info.family})" if kind != "probes" else "the images have no labels"
    if kind == "spatial":
        if layer not in info.spatial_layers:
            return None, f"{layer} has no token grid or feature map"
        return f"spatial:{model}:{layer}", ""
    return f"{kind}:{model}", ""


def _section(kind: str, model: str, layer: str, title: str, view: View, note: str) -> Section:
    """Returns one analysis's section for one layer from its view, or why the view has nothing for the layer."""
    if kind == "attention":
        block = block_of(list(view.rows), layer)
        if block is None:
            return Section(kind, model, layer, title,
                           [f"{layer} is not an attention block ({view.rows[0]} \u2026 {view.rows[-1]} are)"], False)
        return Section(kind, model, block, title.replace(layer, block), attention_lines(view, block), True)
    if kind == "probes":
        if layer not in view.rows:
            return Section(kind, model, layer, title, [f"{layer} was not probed"], False)
        return Section(kind, model, layer, title, probe_lines(view, layer), True)
    if kind == "skip":
        lines = skip_lines(view, layer)
        if not lines:
            return Section(kind, model, layer, title, [f"{layer} has no residual sublayer"], False)
        return Section(kind, model, layer, title, lines + ([note] if note else []), True)
    if kind == "spatial":
        return Section(kind, model, layer, title, spatial_lines(view), True)
    return Section(kind, model, layer, title, erf_lines(view), True)

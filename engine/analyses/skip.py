"""Skip-connection norm ratios (Raghu et al. 2021, Fig. 7): ||z|| / ||f(z)|| per sublayer and token, from the
per-image statistics the extraction recorded; their parameters (cache key) and the run over the store."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.analyses.base import (
    NO_CLS,
    AnalyzeConfig,
    RunningMoments,
    StepFn,
    emit,
    has_cls_token,
    no_cls,
    save_result,
    with_interval,
)
from vitsee.analyses.contract import Analysis, DossierEntry, Request, Result, Shape, View, features_reason
from vitsee.store.layout import is_features_model


def skip_params(store: Store, key: str, cfg: AnalyzeConfig) -> dict:
    return with_interval({"model": key, "n_images": store.n_images}, cfg)


def run_skip(store: Store, model: str, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
    """Returns skip-connection norm ratios ||z||/||f(z)||: ViT per sublayer x token (mean over images),
    with CLS vs mean of spatial tokens; ResNet per block."""
    key = store.resolve_model(model)
    store.require_complete(key)
    info = store.model_info(key)
    params = skip_params(store, key, cfg)
    cached = None if cfg.recompute else Result.load(store, "skip", params)
    if cached is not None:
        return cached
    stats = store.stats(key)
    pairs = [(names, parts) for names, parts in SKIP_SUBLAYERS if names[0] in stats]
    if pairs:
        ((names, parts),) = pairs
        first, second = _finite_means(store, key, list(names))  # (blocks, T) each
        blocks = first.shape[0]
        per_token = np.empty((2 * blocks, first.shape[1]))
        per_token[0::2] = first
        per_token[1::2] = second
        prefix = int(info.get("num_prefix_tokens") or 0)
        has_cls = has_cls_token(info)
        prefix_names = info.get("prefix_names") or (["CLS"] if has_cls else []) + [
            f"prefix {t}" for t in range(1, prefix)
        ]
        rows = [f"blocks.{b}.{part}" for b in range(blocks) for part in parts]
        cols = [prefix_names[t] if t < prefix else f"token {t - prefix}" for t in range(first.shape[1])]
        arrays = {
            "ratio": per_token,
            "rows": np.array(rows),
            "cols": np.array(cols),
            # a register-only ViT has prefix tokens but no class token: it gets no CLS series
            "cls": per_token[:, 0] if has_cls else np.full(2 * blocks, np.nan),
            "spatial_mean": per_token[:, prefix:].mean(axis=1),
        }
        if "stats" in params:
            arrays |= _skip_intervals(store, key, list(names), arrays, prefix, params["stats"]["ci"], has_cls)
    elif "skip_ratio_block" in stats:
        (ratio,) = _finite_means(store, key, ["skip_ratio_block"])  # (blocks,)
        blocks = [layer for layer in store.layers(key) if layer[:5] in ("layer", "stage")]
        arrays = {
            "ratio": ratio[:, None],
            "rows": np.array(
                blocks[: len(ratio)] if len(blocks) >= len(ratio) else [f"block {i}" for i in range(len(ratio))]
            ),
            "cols": np.array(["whole map"]),
            "cls": np.full(len(ratio), np.nan),
            "spatial_mean": ratio,
        }
        if "stats" in params:
            arrays |= _skip_intervals(store, key, ["skip_ratio_block"], arrays, 0, params["stats"]["ci"], False)
    else:
        raise VitseeError(no_skip_reason(key))
    emit(progress, f"skip {key}", 1, 1)
    return save_result(store, "skip", params, arrays)


def no_skip_reason(key: str) -> str:
    """Returns the one line that says why a model has no skip-connection ratios."""
    return f"{key} has no skip-connection statistics: they are recorded for ViT-, Mixer- and ResNet-like models"


# per-token statistics of a block's two residual sublayers and the row labels they get
SKIP_SUBLAYERS = (
    (("skip_ratio_attn", "skip_ratio_mlp"), ("attn", "mlp")),
    (("skip_ratio_token_mixing", "skip_ratio_channel_mixing"), ("token_mixing", "channel_mixing")),
)


def _skip_intervals(
    store: Store, key: str, names: list[str], arrays: dict, prefix: int, level: float, has_cls: bool
) -> dict:
    """Returns Student-t intervals over images for the skip ratios: per cell (ci_low, ci_high, like `ratio`), the CLS
    curve (cls_ci_*) and the spatial curve (spatial_ci_*), the last from each image's mean over its spatial tokens.

    Like the means, they skip inf (a zero branch). Each interval is centred on the cached estimate, so where an image
    has inf tokens the spatial interval's centre (a mean of token means) and its spread (of image means) differ a
    little; with all finite they agree.
    """
    mean = arrays["ratio"]  # (rows, T): for ViTs attn and mlp interleaved, as `ratio` is built
    m2, count = np.zeros_like(mean), np.zeros_like(mean)
    spatial = RunningMoments()
    for batch in store.stat_batches(key, names):
        x = (
            np.stack([batch[n] for n in names], axis=2).reshape(len(batch[names[0]]), *mean.shape)
            if len(names) > 1
            else np.asarray(batch[names[0]], dtype=np.float64).reshape(-1, *mean.shape)
        )  # (b, rows, T)
        finite = np.isfinite(x)
        m2 += np.where(finite, np.square(np.where(finite, x, 0.0) - mean), 0.0).sum(axis=0)
        count += finite.sum(axis=0)
        tokens = np.where(finite, x, np.nan)[:, :, prefix:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an image with no finite spatial token: nan, left out
            spatial.update(np.nanmean(tokens, axis=2))  # (b, rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        std = np.sqrt(m2 / np.maximum(count, 1))
    low, high = stats_mod.mean_interval(mean, std, count, level)
    s_low, s_high = stats_mod.mean_interval(arrays["spatial_mean"], spatial.std, spatial.n, level)
    return {
        "ci_low": low,
        "ci_high": high,
        "cls_ci_low": low[:, 0] if has_cls else np.full(len(mean), np.nan),
        "cls_ci_high": high[:, 0] if has_cls else np.full(len(mean), np.nan),
        "spatial_ci_low": s_low,
        "spatial_ci_high": s_high,
    }


def _finite_means(store: Store, key: str, names: Sequence[str]) -> list[np.ndarray]:
    """Returns per statistic the mean over images ignoring inf (a zero branch, e.g. a ResNet's
    zero-initialised last BN), nan where no image is finite; streamed batch by batch."""
    sums: list = [0.0] * len(names)
    counts: list = [0] * len(names)
    for batch in store.stat_batches(key, names):
        for i, name in enumerate(names):
            finite = np.isfinite(batch[name])
            sums[i] = sums[i] + np.where(finite, batch[name], 0.0).sum(axis=0, dtype=np.float64)
            counts[i] = counts[i] + finite.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return [np.where(c > 0, s / np.maximum(c, 1), np.nan) for s, c in zip(sums, counts)]


# --- the view and its dossier section --------------------------------------------------------------------


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


class SkipRatios(Analysis):
    """Skip-connection norm ratios ||z||/||f(z)|| per sublayer and token (paper Fig. 7), summarised from the
    per-image statistics the extraction recorded."""

    name = "skip"
    label = "Skip"
    title = "skip-connection norm ratio ||z||/||f(z)|| per sublayer and token"
    figures = ("7",)
    order = 40
    shape = Shape.TOKEN_RATIOS
    tooltip = "Show the skip-connection norm ratios"
    option_help = "skip-connection norm ratios"
    cost = 0
    needs = frozenset({"statistics"})
    identity = ("model", "n_images")
    dossier_title = "Skip ratios \u2016z\u2016/\u2016f(z)\u2016"
    layer_list_title = "Blocks (Enter: go)"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if is_features_model(store.model_info(key)):  # no model at all: its family says nothing here
            return features_reason(key, "skip-connection ratios")
        if not any(s.startswith("skip_ratio") for s in store.stats(key)):
            return no_skip_reason(key)
        return None

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return skip_params(store, request.keys[0], cfg)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_skip(store, request.keys[0], cfg, progress)

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the ratios per sublayer (or block) and token, with the CLS and spatial-mean curves."""
        r, key = result, request.keys[0]
        ratio = np.asarray(r["ratio"], dtype=float)
        finite = ratio[np.isfinite(ratio)]
        extra = {"cls": r["cls"], "spatial_mean": r["spatial_mean"], "cls_token": has_cls_token(info)}
        for name in ("cls_ci_low", "cls_ci_high", "spatial_ci_low", "spatial_ci_high"):
            if name in r:
                extra[name] = r[name]
        title = f"Skip-connection norm ratio ||z||/||f(z)|| {key}" + (
            f" ({NO_CLS}: spatial tokens only)" if no_cls(info) else ""
        )
        return View.of(
            request,
            title=title,
            matrix=ratio,
            rows=[str(x) for x in r["rows"]],
            cols=[str(x) for x in r["cols"]],
            value_name="ratio",
            vmin=float(finite.min()) if finite.size else 0.0,
            vmax=float(finite.max()) if finite.size else 1.0,
            params=dict(r.params),
            extra=extra,
            models=[key],
            ci_low=r.get("ci_low"),
            ci_high=r.get("ci_high"),
        )

    def nonfinite_images(self, view: View, store: Store) -> np.ndarray:
        """Returns per cell the images whose ratio there is NaN/Inf."""
        names = [n for n in ("skip_ratio_attn", "skip_ratio_mlp") if n in store.stats(view.models[0])] or [
            "skip_ratio_block"
        ]
        per_cell = [0] * len(names)
        for batch in store.stat_batches(view.models[0], names):
            per_cell = [c + (~np.isfinite(batch[n])).sum(axis=0) for c, n in zip(per_cell, names)]
        if len(names) == 2:  # rows interleave attn and mlp sublayers, as in run_skip
            cells = np.empty((2 * per_cell[0].shape[0], per_cell[0].shape[1]), dtype=np.int64)
            cells[0::2], cells[1::2] = per_cell
        else:
            cells = np.asarray(per_cell[0]).reshape(-1, 1)
        bad = view.nonfinite
        return np.where(bad, cells[: bad.shape[0], : bad.shape[1]], -1)

    def dossier_section(self, view: View, layer: str, note: str = "") -> DossierEntry:
        lines = skip_lines(view, layer)
        if not lines:
            return DossierEntry(layer, [f"{layer} has no residual sublayer"], False)
        return DossierEntry(layer, lines + ([note] if note else []))

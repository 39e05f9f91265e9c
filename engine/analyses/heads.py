"""Head-level CKA against another model (Raghu et al. 2021, Fig. 5): each attention head of a ViT against every
layer of another model (usually a ResNet), beside the head's mean attention distance.

A head's representation is its attention output before the output projection, softmax(q k^T * scale) v on the
spatial tokens, flattened per image (recorded at extraction, see recorders.HeadOutputRecorder). The CKA is the
project's minibatch unbiased CKA (cka.MinibatchCKA) with the batches of the CKA view (--batch-size, --shuffles),
accumulated only between the heads and the other model's layers.

The pure core is `HeadCKA` (per-batch head outputs and layer activations in, a heads x layers matrix out);
`run_heads` is the store-facing runner, `heads_params` its cache key, and `HeadCKAAnalysis` its contract (view,
to which models it applies, how it is found in the registry: engine/analyses/contract.py).

A streaming extraction with `--heads` keeps no head outputs: `StreamedHeads` adds each batch's heads to one HeadCKA
per ViT (against every layer of the run's other models) as the forward pass makes them, the store keeps its state
after every batch, and `save_streamed_heads` caches heads:VIT:OTHER for every other model under the key
`analyze --heads --batch-size B --shuffles 0` gives, so views, export and the app find it like an analyzed one.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from vitsee.analyses.cka import MinibatchCKA
from vitsee.errors import VitseeError
from vitsee.store import Store, read_rows

from vitsee.lazy import lazy_module

# the shared plumbing of the store-facing runners (batches by global index, device, caching with provenance)
from vitsee.analyses.base import AnalyzeConfig, StepFn, batch_plan, check_ready, emit, resolve_device, save_result
from vitsee.analyses.contract import Analysis, Request, Result, Shape, View, features_reason
from vitsee.store.layout import is_features_model

torch = lazy_module("torch")  # reading a cached result needs numpy only; torch is imported by the first computation

ANALYSIS = "heads"
IDENTITY = ("vit", "other", "blocks", "layers", "n_images")  # what a result is about (views take any estimate of it)


# --- the pure core ------------------------------------------------------------------------------------------


def split_heads(outputs) -> list:
    """Returns one (b, tokens * head_dim) array per head of a block's outputs (b, heads, tokens, head_dim)."""
    b, n_heads = outputs.shape[:2]
    return [outputs[:, h].reshape(b, -1) for h in range(n_heads)]


class HeadCKA:
    """Accumulates minibatch CKA between R head representations and L layers; `result()` is (R, L).

    One MinibatchCKA over [heads..., layers...] split at R, so only the head x layer block (and each one's own
    HSIC) is accumulated: the same estimator, numbers and numerics as the CKA view.
    """

    def __init__(self, n_heads: int, n_layers: int, device: str | torch.device | None = None):
        self.n_heads = n_heads
        self.acc = MinibatchCKA(n_heads + n_layers, device, cross_at=n_heads)

    def update(self, heads: Sequence, layers: Sequence) -> None:
        """Adds one batch: R head arrays (m, ...) and L layer arrays (m, ...) of the same m images."""
        self.acc.update([*heads, *layers])

    def result(self) -> np.ndarray:
        return self.acc.result()[: self.n_heads, self.n_heads :]


class _BlockHeads:
    """The heads of one block's batch, read from the store when the first is asked for and dropped after the
    last, so the accumulator holds one block's outputs at a time."""

    def __init__(self, ds, rows: np.ndarray, n_heads: int):
        self.ds, self.rows, self.n_heads = ds, rows, n_heads
        self._data: np.ndarray | None = None
        self._given = 0

    def head(self, h: int) -> _LazyHead:
        return _LazyHead(self, h)

    def take(self, h: int) -> np.ndarray:
        if self._data is None:
            self._data = read_rows(self.ds, self.rows)
        out = self._data[:, h].reshape(len(self.rows), -1)
        self._given += 1
        if self._given == self.n_heads:
            self._data = None
        return out


class _LazyHead:
    def __init__(self, block: _BlockHeads, h: int):
        self.block, self.h = block, h
        tokens, dim = block.ds.shape[2:]
        self.shape = (len(block.rows), tokens * dim)

    def __array__(self, dtype=None, copy=None):
        array = self.block.take(self.h)
        return array if dtype is None else array.astype(dtype)


# --- the store-facing runner ----------------------------------------------------------------------------------


def pairs(store: Store) -> list[tuple[str, str]]:
    """Returns every (ViT with stored or streamed head outputs, other model) pair of the store (none: a
    VitseeError that says why)."""
    out = _pairs(store)
    if not out:
        raise VitseeError(no_pairs_reason(store))
    return out


def _pairs(store: Store) -> list[tuple[str, str]]:
    vits = [m for m in store.models if store.head_blocks(m)]
    return [(v, o) for v in vits for o in store.models if o != v]


def no_pairs_reason(store: Store) -> str:
    """Returns why a store has no pair for head-level CKA (a ViT with head outputs and another model)."""
    streaming = _streaming_reason(store)
    if streaming:
        return streaming
    why = (
        "no model has stored head outputs (they are recorded for ViT-like models by this vitsee's extract)"
        if not any(store.head_blocks(m) for m in store.models)
        else "head-level CKA compares a ViT with another model and the store holds one"
    )
    return f"{store.path}: {why}: extract a ViT and e.g. a ResNet into the store (`vitsee extract STORE --model NAME`)"


def _streaming_reason(store: Store) -> str | None:
    """Returns why a streaming store that did not accumulate head-level CKA (extracted without --heads) has none."""
    if store.streaming and not store.streamed_heads():
        return (
            f"{store.path} was extracted with --streaming without --heads, which keeps no head outputs, so "
            "head-level CKA cannot be computed: re-extract with --streaming --heads (or without --streaming) into "
            "another store"
        )
    return None


def no_head_outputs_reason(key: str) -> str:
    """Returns why a model has no head-level CKA: no head outputs were stored for it."""
    return (
        f"{key} has no stored head outputs: they are recorded for ViT-like models at extraction; "
        "re-extract it with this vitsee (`vitsee extract STORE --model NAME --overwrite`)"
    )


def heads_params(store: Store, vit: str, other: str, cfg) -> dict:
    """Returns the cache key of heads:VIT:OTHER: what it is about, and the CKA estimator's settings."""
    vit, other = store.resolve_model(vit), store.resolve_model(other)
    streaming = _streaming_reason(store)
    if streaming:
        raise VitseeError(streaming)
    blocks = store.head_blocks(vit)
    if not blocks:
        raise VitseeError(no_head_outputs_reason(vit))
    batch_size = min(cfg.batch_size, store.n_images)
    return {
        "vit": vit,
        "other": other,
        "blocks": blocks,
        "layers": store.layers(other),
        "batch_size": batch_size,
        "shuffles": cfg.shuffles,
        "seed": cfg.seed if cfg.shuffles else None,
        "n_images": store.n_images,
    }


def mean_distances(store: Store, vit: str, blocks: Sequence[str]) -> np.ndarray:
    """Returns (blocks * heads,) each head's mean attention distance in px over the images (nan when the
    statistic was not recorded), rows in the order blocks.B.head.H."""
    n_heads = int(store.model_info(vit)["num_heads"])
    if "attention_distance" not in store.stats(vit):
        return np.full(len(blocks) * n_heads, np.nan)
    total, count = 0.0, 0
    for batch in store.stat_batches(vit, ["attention_distance"]):
        total = total + batch["attention_distance"].sum(axis=0, dtype=np.float64)  # (all blocks, heads)
        count += len(batch["attention_distance"])
    mean = np.asarray(total) / max(count, 1)
    return np.concatenate([mean[int(b.rsplit(".", 1)[1])] for b in blocks])


def run_heads(store: Store, vit: str, other: str, cfg, progress=None) -> Result:
    """Returns the head-level CKA result (cached or computed): `cka` (heads, layers) with rows blocks.B.head.H,
    the other model's layers as columns, and each head's mean attention distance `distance_px`."""
    params = heads_params(store, vit, other, cfg)
    vit, other = params["vit"], params["other"]
    check_ready(store, [vit, other])
    cached = None if cfg.recompute else Result.load(store, ANALYSIS, params)
    if cached is not None:
        return cached
    if store.streaming:
        return _streamed_heads(store, vit, other, cfg)
    device = resolve_device(cfg.device)
    blocks, layers = params["blocks"], params["layers"]
    head_ds = [store.model_group(vit)["heads"][b] for b in blocks]
    n_heads = int(head_ds[0].shape[1])
    layer_ds = [store.layer_dataset(other, layer) for layer in layers]
    plan = batch_plan(params["n_images"], params["batch_size"], params["shuffles"], params["seed"] or 0)
    accumulators = [HeadCKA(len(blocks) * n_heads, len(layers), device) for _ in range(max(1, params["shuffles"]))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short last batch is skipped, as the CKA view does
        for b, (k, rows) in enumerate(plan):
            blocks_read = [_BlockHeads(ds, rows, n_heads) for ds in head_ds]
            heads = [block.head(h) for block in blocks_read for h in range(n_heads)]
            accumulators[k].update(heads, [read_rows(ds, rows) for ds in layer_ds])
            emit(progress, f"heads {vit} x {other}", b + 1, len(plan))
        matrices = [acc.result() for acc in accumulators]
    return save_result(store, ANALYSIS, params, _result_arrays(store, params, n_heads, matrices))


def _result_arrays(store: Store, params: dict, n_heads: int, matrices: Sequence[np.ndarray]) -> dict:
    """Returns the cached arrays of heads:VIT:OTHER from one (heads, layers) CKA matrix per shuffle."""
    blocks = params["blocks"]
    rows = [f"{block}.head.{h}" for block in blocks for h in range(n_heads)]
    return {
        "cka": np.mean(matrices, axis=0),
        "shuffle_std": np.std(matrices, axis=0) if len(matrices) > 1 else np.zeros_like(matrices[0]),
        "rows": np.array(rows),
        "cols": np.array(params["layers"]),
        "block": np.repeat([int(b.rsplit(".", 1)[1]) for b in blocks], n_heads),
        "head": np.tile(np.arange(n_heads), len(blocks)),
        "distance_px": mean_distances(store, params["vit"], blocks),
    }


# --- streamed (extract --streaming --heads) ---------------------------------------------------------------------


class StreamedHeads:
    """The head-level CKA a streaming extraction accumulates for one ViT: every head of its recorded blocks
    against every layer of the run's other models (`columns`, (model, layer) in store and forward order), one
    HeadCKA whose `state` the store keeps after every batch. Nothing of a batch is kept after `update`."""

    def __init__(self, vit: str, blocks: Sequence[str], n_heads: int, columns: Sequence[tuple[str, str]], device):
        self.vit, self.blocks, self.n_heads = vit, list(blocks), int(n_heads)
        self.columns = [tuple(c) for c in columns]
        self.acc = HeadCKA(len(self.blocks) * self.n_heads, len(self.columns), device)

    @classmethod
    def resumed(cls, store: Store, device, first: int) -> list[StreamedHeads]:
        """Returns the accumulators of a streaming store's ViTs (none without --heads), each resumed from the
        store's copy of its state when `first` (the first batch still to run) is past the start."""
        out = []
        for vit, layout in store.streamed_heads().items():
            streamed = cls(vit, layout["blocks"], layout["heads"], layout["columns"], device)
            saved = store.streamed_heads_state(vit) if first > 0 else None
            if saved is not None:
                streamed.acc.acc.state.copy_(torch.as_tensor(saved))
            out.append(streamed)
        return out

    def update(self, outputs: dict, feats: dict) -> torch.Tensor:
        """Adds one batch: `outputs` the ViT's head outputs by block (b, heads, tokens, head_dim), `feats` every
        layer's activations by (model, layer); returns a snapshot of the state to write."""
        heads = [head for block in self.blocks for head in split_heads(outputs[block])]  # R x (b, tokens * head_dim)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a last batch under 4 images is skipped, as analyze does
            self.acc.update(heads, [feats[c] for c in self.columns])
        return self.acc.acc.state.clone()


def streamed_heads_params(store: Store, vit: str, other: str) -> dict:
    """Returns the cache key of a streaming store's heads:VIT:OTHER: that of `analyze --heads --shuffles 0` with
    the extraction's batch size (the streamed CKA's batches)."""
    batch_size = int(store.file["streaming/cka_state"].attrs["batch_size"])
    return heads_params(store, vit, other, AnalyzeConfig(batch_size=batch_size, shuffles=0))


def save_streamed_heads(store: Store, vits: Sequence[str] | None = None) -> list[Result]:
    """Caches heads:VIT:OTHER for every streamed ViT (or those named) and every other model of a finished
    streaming run, from the accumulators the store kept; returns the results."""
    out = []
    for vit, layout in store.streamed_heads().items():
        if vits is not None and vit not in vits:
            continue
        state = store.streamed_heads_state(vit)
        if state is None:
            raise VitseeError(
                f"{store.path} has no finished batch to compute head-level CKA from: rerun the same "
                "`vitsee extract --streaming --heads` command"
            )
        streamed = StreamedHeads(vit, layout["blocks"], layout["heads"], layout["columns"], "cpu")
        streamed.acc.acc.state = torch.as_tensor(state, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a batch under 4 images was skipped
            matrix = streamed.acc.result()  # (heads, every layer of the other models)
        for other in store.models:
            if other == vit:
                continue
            params = streamed_heads_params(store, vit, other)
            cols = [i for i, (model, _) in enumerate(streamed.columns) if model == other]
            if [streamed.columns[i][1] for i in cols] != params["layers"]:
                raise VitseeError(
                    f"{store.path}: the streamed head-level CKA's layers of {other} do not match the "
                    "store's: re-extract it with --overwrite"
                )
            out.append(
                save_result(store, ANALYSIS, params, _result_arrays(store, params, streamed.n_heads, [matrix[:, cols]]))
            )
    return out


def _streamed_heads(store: Store, vit: str, other: str, cfg) -> Result:
    """Returns the head-level CKA a streaming extraction cached, when the asked-for settings allow it; without
    the head outputs no other estimate can be made."""
    streamed = streamed_heads_params(store, vit, other)
    if cfg.any_cka_estimate and not cfg.recompute:
        cached = Result.load(store, ANALYSIS, streamed)
        return (
            cached
            if cached is not None
            else next(r for r in save_streamed_heads(store, [vit]) if r.params["other"] == other)
        )
    raise VitseeError(
        f"{store.path} was extracted with --streaming: its head-level CKA was computed during extraction with batch "
        f"size {streamed['batch_size']} in store order (--batch-size {streamed['batch_size']} --shuffles 0), and other "
        "settings need the head outputs, which were not stored: re-extract without --streaming into another store"
    )


# --- the view ---------------------------------------------------------------------------------------------------


def most_similar_layer(matrix: np.ndarray) -> int:
    """Returns the column (layer of the other model) with the highest mean CKA over the heads."""
    finite = np.where(np.isfinite(matrix), matrix, 0.0)
    counts = np.isfinite(matrix).sum(axis=0)
    means = np.where(counts > 0, finite.sum(axis=0) / np.maximum(counts, 1), -np.inf)
    return int(np.argmax(means))


class HeadCKAAnalysis(Analysis):
    """Head-level CKA (paper Fig. 5): every head of a ViT against every layer of another model, beside the head's
    mean attention distance."""

    name = ANALYSIS
    label = "Heads"
    title = "CKA of every ViT head with every layer of another model, against the head's attention distance"
    figures = ("5",)
    order = 60
    shape = Shape.HEADS_BY_LAYER
    tooltip = "Show each ViT head's CKA with another model against its attention distance"
    option_help = "head-level CKA: each ViT head against the other models' layers (paper Fig. 5)"
    by_default = False  # asked for: `vitsee analyze --heads`
    cost = 1
    models = (2, 2)
    model_words = ("VIT", "OTHER")
    model_fields = ("model", "other")
    needs = frozenset({"head outputs", "activations"})
    identity = IDENTITY
    layer_list_title = "Other model's layer (Enter)"

    def not_applicable(self, store: Store, key: str) -> str | None:
        """Returns why model `key`'s heads cannot be compared (it is the ViT side of a pair), or None."""
        streaming = _streaming_reason(store)
        if streaming:
            return streaming
        if is_features_model(store.model_info(key)):  # no model at all: its family says nothing here
            return features_reason(key, "per-head attention outputs")
        if not store.head_blocks(key):
            return no_head_outputs_reason(key)
        if len(store.models) < 2:
            return "head-level CKA compares a ViT with another model: extract one into this store"
        return None

    def refusal(self, store: Store) -> str:
        return no_pairs_reason(store)

    def requests(self, store: Store) -> list[Request]:
        return [Request(self.name, (vit, other)) for vit, other in _pairs(store)]

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return heads_params(store, request.keys[0], request.keys[1], cfg)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_heads(store, request.keys[0], request.keys[1], cfg, progress)

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns heads x layers CKA, with distance_px, block and head per row, and the layer the paper's scatter
        plots by default (`scatter_col`, the most similar on average)."""
        vit, other = request.keys[0], request.keys[1]
        matrix = np.asarray(result["cka"], dtype=float)
        extra = {
            "distance_px": np.asarray(result["distance_px"], dtype=float),
            "block": result["block"],
            "head": result["head"],
            "scatter_col": most_similar_layer(matrix),
        }
        params = {k: v for k, v in result.params.items() if k != "layers"}
        return View.of(
            request,
            title=f"Head-level CKA {vit} heads (rows) x {other} (cols)",
            matrix=matrix,
            rows=[str(r) for r in result["rows"]],
            cols=[str(c) for c in result["cols"]],
            value_name="CKA",
            vmin=0.0,
            vmax=1.0,
            params=params,
            extra=extra,
            models=[vit, other],
        )

"""Reading a store: its images, models, layers, activations, statistics and the state of a streaming run.

`StoreReading` is the part of `Store` (store/__init__.py) that reads; it uses what Store opens: `file` (the store's h5py
File), `path`, `_model_files` / `_open_files` (the model files beside it, by key). Every read returns finished rows
only (a batch counts once its `done` flag is set), as float32.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from vitsee.errors import VitseeError


class StoreReading:
    """The read methods of Store (see store/__init__.py): images, models and their layers, rows, statistics."""

    # --- images ----------------------------------------------------------------------------------------------

    @property
    def n_images(self) -> int:
        """Returns how many images the store's run has (finished or not)."""
        return int(self.file["images/index"].shape[0])

    @property
    def dataset_spec(self) -> str:
        return str(self.file["images"].attrs["dataset"])

    @property
    def shuffle_seed(self) -> int | None:
        seed = int(self.file["images"].attrs.get("shuffle_seed", -1))
        return None if seed < 0 else seed

    @property
    def indices(self) -> np.ndarray:
        return self.file["images/index"][:]

    @property
    def labels(self) -> np.ndarray | None:
        """Returns the (N,) labels, or None when the dataset has none."""
        labels = self.file["images/label"][:]
        return labels if (labels >= 0).any() else None

    @property
    def class_names(self) -> list[str] | None:
        names = json.loads(self.file["images"].attrs.get("class_names", "null"))
        return names

    # --- models and their layers -----------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        """Returns the model keys, in the order they were added."""
        main = []
        if "models" in self.file:
            group = self.file["models"]
            main = sorted(group, key=lambda k: int(group[k].attrs.get("order", 0)))
        return main + list(self._model_files)

    def resolve_model(self, name: str) -> str:
        """Returns the key of the model a user named: the exact key, its display name, or a unique prefix of a key."""
        if name in self._model_files or "/" not in name and "models" in self.file and name in self.file["models"]:
            return name  # an exact key, without ordering every model's group (analyses look keys up per layer)
        models = self.models
        if name in models:
            return name
        named = [key for key, shown in self.display_names().items() if shown == name]
        if named:
            return named[0]
        matches = [m for m in models if m.startswith(name)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise VitseeError(f"no model '{name}' in {self.path}: it holds {', '.join(models) or 'no models'}")
        raise VitseeError(f"'{name}' matches several models in {self.path} ({', '.join(matches)}): give the full key")

    def model_group(self, model: str) -> h5py.Group:
        """Returns the h5py group holding a model (named by its key or a unique prefix): /models/KEY of the store
        file, or the root of its model file beside the store. For readers that need the raw datasets (acts/,
        stats/, heads/, input, done); what it holds is drawn in store/__init__.py's docstring."""
        key = self.resolve_model(model)
        if key in self._open_files:
            return self._open_files[key]
        return self.file["models"][key]

    def model_info(self, model: str) -> dict:
        """Returns the model's metadata: spec, family, weights (kind, seed, path, sha256), grid, ..."""
        group = self.model_group(model)
        info = json.loads(group.attrs["record"])
        info.update(batch_size=int(group.attrs["batch_size"]), dtype=str(group.attrs["dtype"]))
        return info

    def run_config(self, model: str | None = None) -> dict | None:
        """Returns the recorded configuration of the run that made the store (or that added `model` to it),
        None for a store made before runs were recorded (see extraction/run_config.py)."""
        attrs = self.file.attrs
        if model is not None and self.resolve_model(model) in self._open_files:
            attrs = self._open_files[self.resolve_model(model)].attrs
        text = attrs.get("run_config")
        return None if text is None else json.loads(text)

    def layers(self, model: str) -> list[str]:
        """Returns the stored layer names in forward order."""
        return json.loads(self.model_group(model).attrs["layers"])

    @property
    def shard_files(self) -> list[Path]:
        """Returns the shard files a store stitched by torchrun reads its rows from (empty otherwise)."""
        return [self.path.parent / rel for rel in json.loads(self.file.attrs.get("shards", "[]"))]

    @property
    def streaming(self) -> bool:
        """True for a store made with `--streaming`: statistics and results only, no activations."""
        return bool(self.file.attrs.get("streaming", False))

    def require_activations(self, what: str) -> None:
        """Raises a VitseeError (`{what}` says what cannot be done) when the store keeps no activations
        (--streaming)."""
        if self.streaming:
            raise VitseeError(
                f"{self.path} was extracted with --streaming: activations were not stored, so {what}: "
                "re-extract without --streaming into another store (or --overwrite)"
            )

    def layer_dataset(self, model: str, layer: str) -> h5py.Dataset:
        """Returns the h5py dataset of a layer's activations (N, ...) in the store's dtype, for streamed reads
        (read_rows, the analyses' read-ahead); an unknown layer is a VitseeError naming the close matches, a
        streaming store one naming the way out. Rows past rows_done() are not finished."""
        self.require_activations(f"layer '{layer}' cannot be read")
        acts = self.model_group(model)["acts"]
        if layer not in acts:
            import difflib

            close = difflib.get_close_matches(layer, list(acts), n=4, cutoff=0.5)
            hint = (
                f"close matches: {', '.join(close)}"
                if close
                else f"stored layers: {', '.join(self.layers(model)[:8])} ..."
            )
            raise VitseeError(f"no layer '{layer}' stored for {self.resolve_model(model)}: {hint}")
        return acts[layer]

    def layer_attrs(self, model: str, layer: str) -> dict:
        """Returns {shape, prefix_tokens} of a layer (from the model's attrs in a streaming store)."""
        group = self.model_group(model)
        if "layer_shapes" not in group.attrs:
            ds = self.layer_dataset(model, layer)
            return {"shape": tuple(ds.shape[1:]), "prefix_tokens": int(ds.attrs.get("prefix_tokens", 0))}
        shapes = json.loads(group.attrs["layer_shapes"])
        if layer not in shapes:
            raise VitseeError(
                f"no layer '{layer}' recorded for {self.resolve_model(model)}: it has {', '.join(list(shapes)[:8])} ..."
            )
        return {
            "shape": tuple(shapes[layer]),
            "prefix_tokens": int(json.loads(group.attrs["layer_prefix_tokens"])[layer]),
        }

    def layer_shape(self, model: str, layer: str) -> tuple[int, ...]:
        """Returns the per-image shape of a stored layer."""
        return self.layer_attrs(model, layer)["shape"]

    def layer_prefix_tokens(self, model: str, layer: str) -> int:
        """Returns how many prefix tokens (CLS, registers, distillation) lead a layer's token axis."""
        return self.layer_attrs(model, layer)["prefix_tokens"]

    def layer_layout(self, model: str, layer: str) -> str:
        """Returns how a layer's per-image axes are laid out: 'tokens' (T, C), 'nchw' (C, H, W), 'nhwc' (H, W, C)
        or 'flat'. Stores written before layouts were recorded read as tokens (2 axes) or nchw (3 axes)."""
        group = self.model_group(model)
        if "layer_shapes" in group.attrs:
            layout = json.loads(group.attrs.get("layer_layouts", "{}")).get(layer)
        else:
            layout = self.layer_dataset(model, layer).attrs.get("layout")
        if layout:
            return str(layout)
        shape = self.layer_shape(model, layer)
        return {2: "tokens", 3: "nchw"}.get(len(shape), "flat")

    # --- rows: which are finished, and reading them ----------------------------------------------------------

    def batch_size(self, model: str) -> int:
        """Returns the batch size a model was extracted with (the unit of its `done` flags)."""
        return int(self.model_group(model).attrs["batch_size"])

    def rows_done(self, model: str) -> int:
        """Returns how many leading rows of the model are finished (written and flushed)."""
        group = self.model_group(model)
        done = group["done"][:]
        pending = np.flatnonzero(done == 0)
        batches = len(done) if len(pending) == 0 else int(pending[0])
        return min(self.n_images, batches * int(group.attrs["batch_size"]))

    def done_batches(self, model: str) -> np.ndarray:
        """Returns the (batches,) bool flags of a model's finished batches."""
        return self.model_group(model)["done"][:].astype(bool)

    def is_complete(self, model: str | None = None) -> bool:
        """Returns whether every row of the model (or of every model) is finished."""
        models = [model] if model is not None else self.models
        return bool(models) and all(self.rows_done(m) == self.n_images for m in models)

    @property
    def complete(self) -> bool:
        return self.is_complete()

    def require_complete(self, model: str | None = None) -> None:
        """Raises a VitseeError naming the way out if a model's extraction has not finished."""
        for m in [self.resolve_model(model)] if model else self.models:
            done = self.rows_done(m)
            if done < self.n_images:
                raise VitseeError(
                    f"{self.path}: {m} has {done} of {self.n_images} images extracted (the run was interrupted): "
                    + (
                        f"resume it with `vitsee extract {self.path}`"
                        if self.run_config(m) is not None
                        else "rerun the same `vitsee extract` command to resume"
                    )
                )

    def activations(self, model: str, layer: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns a layer's activations as float32: all finished rows, or the rows asked for."""
        return self._finished(model, self.layer_dataset(model, layer), rows)

    def iter_batches(
        self, model: str, layers: Sequence[str] | None = None, batch_size: int = 256, order: np.ndarray | None = None
    ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Yields (row indices, {layer: float32 array}) batch by batch over finished rows, streaming.

        order: the rows in the order to visit them (e.g. a shuffle); default the store order.
        """
        layers = list(layers) if layers is not None else self.layers(model)
        datasets = {name: self.layer_dataset(model, name) for name in layers}
        done = self.rows_done(model)
        order = np.arange(done) if order is None else np.asarray(order)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            yield rows, {name: read_rows(ds, rows, limit=done).astype(np.float32) for name, ds in datasets.items()}

    def model_input(self, model: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns the preprocessed model input (N, 3, H, W) as float32."""
        self.require_activations("the model input cannot be read")
        return self._finished(model, self.model_group(model)["input"], rows)

    # --- head outputs (head-level CKA, engine/analyses/heads.py) ---------------------------------------------

    def head_blocks(self, model: str) -> list[str]:
        """Returns the blocks (blocks.B, forward order) whose per-head attention outputs are stored, or, in a
        streaming store, whose head-level CKA was accumulated (`extract --streaming --heads`)."""
        if self.streaming:
            layout = self.streamed_heads().get(self.resolve_model(model))
            return list(layout["blocks"]) if layout else []
        group = self.model_group(model)
        if "heads" not in group:
            return []
        return sorted(group["heads"], key=lambda name: int(name.rsplit(".", 1)[1]))

    def head_outputs(self, model: str, block: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns a block's per-head attention outputs (N, heads, spatial tokens, head_dim) as float32."""
        self.require_activations("head outputs cannot be read")
        group = self.model_group(model)
        if block not in self.head_blocks(model):
            raise VitseeError(
                f"no head outputs of '{block}' stored for {self.resolve_model(model)} (stored: "
                f"{', '.join(self.head_blocks(model)) or 'none'}): "
                "re-extract the ViT with this vitsee, without --streaming"
            )
        return self._finished(model, group["heads"][block], rows)

    def _finished(self, model: str, ds: h5py.Dataset, rows: slice | np.ndarray | None) -> np.ndarray:
        """Returns a per-image dataset's finished rows as float32: all of them, a slice of them, or those asked for
        (a row not extracted yet is an error naming the way out)."""
        done = self.rows_done(model)
        if rows is None:
            return ds[:done].astype(np.float32)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(done)
            return ds[start:stop:step].astype(np.float32)
        return read_rows(ds, np.asarray(rows), limit=done).astype(np.float32)

    # --- per-image statistics --------------------------------------------------------------------------------

    def stats(self, model: str) -> list[str]:
        """Returns the names of the per-image statistics stored for a model."""
        group = self.model_group(model)
        return list(group["stats"]) if "stats" in group else []

    def _stat(self, model: str, name: str) -> h5py.Dataset:
        group = self.model_group(model)
        if "stats" not in group or name not in group["stats"]:
            raise VitseeError(
                f"{self.resolve_model(model)} has no '{name}' statistic in {self.path} "
                f"(stored: {', '.join(self.stats(model)) or 'none'}): it is recorded for ViT-like models at extraction"
            )
        return group["stats"][name]

    def stat(self, model: str, name: str, rows: slice | None = None) -> np.ndarray:
        """Returns a per-image statistic (finished rows, or a slice of them), float32."""
        start, stop, step = (rows or slice(None)).indices(self.rows_done(model))
        return self._stat(model, name)[start:stop:step].astype(np.float32)

    def stat_batches(self, model: str, names: Sequence[str], batch_size: int = 1024) -> Iterator[dict[str, np.ndarray]]:
        """Yields {name: (b, ...) float32} of per-image statistics over the finished rows, in store order,
        batch by batch, so an aggregate over any number of images holds one batch in memory."""
        datasets = {name: self._stat(model, name) for name in names}
        done = self.rows_done(model)
        for start in range(0, done, batch_size):
            stop = min(start + batch_size, done)
            yield {name: ds[start:stop].astype(np.float32) for name, ds in datasets.items()}

    def attention_distance(self, model: str, renormalised: bool = False) -> np.ndarray:
        """Returns (N, blocks, heads) mean attention distances in pixels."""
        return self.stat(model, "attention_distance_renorm" if renormalised else "attention_distance")

    def nonfinite_counts(self, model: str) -> dict[str, int]:
        """Returns the number of non-finite values written per layer (fp16 overflow shows up here)."""
        counts = self.model_group(model)["nonfinite"][:].sum(axis=0)
        return {layer: int(c) for layer, c in zip(self.layers(model), counts)}

    def nonfinite_batches(self, model: str) -> np.ndarray:
        """Returns the (batches, layers) counts of non-finite values written per batch and layer."""
        return self.model_group(model)["nonfinite"][:]

    def model_bytes(self, model: str) -> int:
        group = self.model_group(model)
        total = 0

        def visit(_name, obj):
            nonlocal total
            if isinstance(obj, h5py.Dataset):  # a stitched store's rows live in its shards
                total += obj.nbytes if obj.is_virtual else obj.id.get_storage_size()

        group.visititems(visit)
        return total

    # --- the CKA of a streaming extraction -------------------------------------------------------------------

    def streamed_cka_state(self) -> tuple[np.ndarray, list[tuple[str, str]]] | None:
        """Returns (accumulator state after the last finished batch, its [(model, layer)] columns), or None
        when nothing has been accumulated yet (or the store is not a streaming one)."""
        if "streaming/cka_state" not in self.file:
            return None
        ds = self.file["streaming/cka_state"]
        columns = [tuple(c) for c in json.loads(ds.attrs["columns"])]
        batches = int(ds.attrs["batch_size"])
        done = min((self.rows_done(m) for m in self.models), default=0)
        finished = -(-done // batches)  # batches, the last possibly short
        if finished == 0:
            return None
        return ds[(finished - 1) % 2].astype(np.float64), columns

    def streamed_heads(self) -> dict[str, dict]:
        """Returns {vit: {blocks, heads, columns}} of the head-level CKA a streaming run accumulates (empty
        without `--heads`); columns are the [(model, layer)] of the other models its heads are compared with."""
        if "streaming/heads" not in self.file:
            return {}
        out = {}
        for vit, ds in self.file["streaming/heads"].items():
            out[vit] = {
                "blocks": json.loads(ds.attrs["blocks"]),
                "heads": int(ds.attrs["heads"]),
                "columns": [tuple(c) for c in json.loads(ds.attrs["columns"])],
            }
        return {vit: out[vit] for vit in self.models if vit in out}  # store order

    def streamed_heads_state(self, vit: str) -> np.ndarray | None:
        """Returns a ViT's head-level CKA accumulator after the last finished batch of a streaming run, or None
        when nothing has been accumulated yet."""
        saved = self.streamed_cka_state()  # the same batches, written in the same slot
        if saved is None or f"streaming/heads/{vit}" not in self.file:
            return None
        done = min(self.rows_done(m) for m in self.models)
        finished = -(-done // int(self.file["streaming/cka_state"].attrs["batch_size"]))
        return self.file[f"streaming/heads/{vit}"][(finished - 1) % 2].astype(np.float64)


def read_rows(ds: h5py.Dataset, rows: np.ndarray, limit: int | None = None) -> np.ndarray:
    """Returns ds[rows] for any order of row indices (HDF5 wants them increasing, so sort and undo)."""
    rows = np.asarray(rows, dtype=np.int64)
    if limit is not None and len(rows) and rows.max() >= limit:
        raise VitseeError(
            f"row {int(rows.max())} is not extracted yet ({limit} rows finished): finish the extraction first"
        )
    if len(rows) == 0:
        return np.empty((0, *ds.shape[1:]), dtype=ds.dtype)
    if len(rows) > 1 and np.all(np.diff(rows) == 1):
        return ds[int(rows[0]) : int(rows[-1]) + 1]
    if np.all(np.diff(rows) > 0):  # increasing: HDF5 reads them as they are
        return _read_increasing(ds, rows)
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    unique, inverse = np.unique(sorted_rows, return_inverse=True)
    data = _read_increasing(ds, unique)
    out = np.empty((len(rows), *ds.shape[1:]), dtype=ds.dtype)
    out[order] = data[inverse]
    return out


def _read_increasing(ds: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """Returns ds[rows] for increasing rows, one slice per chunk the rows touch.

    HDF5 reads whole chunks either way, but h5py's point selection of scattered rows costs about 10x the
    slices (21 of 32 rows of 196 x 768 fp16: 0.30 s against 0.025 s), which made probe splits slow to read.
    """
    if ds.chunks is None:
        return ds[rows]
    groups = np.split(rows, np.flatnonzero(np.diff(rows // ds.chunks[0])) + 1)  # runs of rows within one chunk
    return np.concatenate([ds[int(g[0]) : int(g[-1]) + 1][g - g[0]] for g in groups])

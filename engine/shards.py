"""Stitching the shards of a torchrun extraction into one store with HDF5 virtual datasets.

Each rank's shard is a store of the same layout over a contiguous range of whole batches. The stitched store
holds the images and, per model, one virtual dataset per shard dataset (activations, input, statistics,
non-finite counts, `done`) that maps its rows onto the shards' rows by relative path, so the store and its
`.shards` folder can move together. Nothing is copied. HDF5 fills the rows of a source file it cannot open
with the fill value, so completeness is checked here before stitching, `done` fills with 0 (a lost shard
reads as unfinished, never as data) and `Store` refuses to open a stitched store whose shard files are gone.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from . import store as store_mod
from .errors import VitseeError
from .store import Store


def models_to_extract(cfg) -> list[str]:
    """Returns the model specs of cfg a torchrun extraction still has to do (those not finished in the store)."""
    from .data import open_dataset, select_indices
    from .extract import _check_same_images, _check_same_mode
    from .models import parse_model_spec

    path = Path(cfg.store)
    if not path.exists() or cfg.overwrite:
        return list(cfg.models)
    keys = [parse_model_spec(m).key for m in cfg.models]
    images = open_dataset(cfg.dataset)
    with Store.open(path) as store:
        _check_same_images(store, images, select_indices(len(images), cfg.n_images, cfg.shuffle_seed))
        _check_same_mode(store, cfg, keys)
        todo = []
        for spec, key in zip(cfg.models, keys):
            if key not in store.models:
                todo.append(spec)
            elif not store.is_complete(key):
                raise VitseeError(
                    f"{path} holds an unfinished one-process extraction of {key}: resume it with the same command "
                    "without torchrun, or pass --overwrite"
                )
    return todo


def stitch(path: str | Path, shard_paths: Sequence[Path], cfg, models: Sequence[str]) -> None:
    """Checks every shard is there and complete for the run's models (specs), then makes (or extends) the
    store at path with virtual datasets over them. A streamed CKA is the sum of the shards' sums."""
    from .models import parse_model_spec

    path = Path(path)
    keys = [parse_model_spec(m).key for m in models]
    rows = _check_shards(shard_paths, keys)
    rels = [os.path.relpath(p, path.parent) for p in shard_paths]
    if path.exists() and not cfg.overwrite:
        with Store.writer(path) as store:
            if int(rows[-1][1]) != store.n_images:
                raise VitseeError(f"the shards cover {rows[-1][1]} images but {path} holds {store.n_images}: rerun with --overwrite")
            _record_shards(store.file, rels)
            for key in keys:
                _add_virtual_model(store.file, key, shard_paths, rels)
        return
    with Store.open(shard_paths[0]) as first:
        dataset, seed, names = first.dataset_spec, first.shuffle_seed, first.class_names
    indices, labels = [], []
    for p in shard_paths:
        with Store.open(p) as s:
            indices.append(s.indices)
            labels.append(s.file["images/label"][:])
    with store_mod.creating(path, overwrite=cfg.overwrite) as h5:
        store_mod.write_images(h5, dataset, np.concatenate(indices), np.concatenate(labels), names, seed)
        _record_shards(h5, rels)
        for key in keys:
            _add_virtual_model(h5, key, shard_paths, rels)
        if cfg.streaming:
            _sum_streamed_states(h5, shard_paths)
    if cfg.streaming:
        from .extract import save_streamed_cka

        with Store.writer(path) as store:
            save_streamed_cka(store)


def _check_shards(shard_paths: Sequence[Path], keys: Sequence[str]) -> list[tuple[int, int]]:
    """Returns each shard's (start, stop) rows after checking they are there, complete and contiguous."""
    rows = []
    for p in shard_paths:
        if not p.exists():
            raise VitseeError(f"shard {p} is missing: rerun the same torchrun command to extract it")
        with Store.open(p) as s:
            meta = json.loads(s.file.attrs.get("shard", "null") or "null")
            if meta is None:
                raise VitseeError(f"{p} is not a shard of a torchrun extraction: remove it and rerun the same torchrun command")
            for key in keys:
                if key not in s.models:
                    raise VitseeError(f"shard {p} has no {key}: rerun the same torchrun command to extract it")
                if not s.is_complete(key):
                    raise VitseeError(
                        f"shard {p} is incomplete ({key}: {s.rows_done(key)} of {s.n_images} rows): "
                        "rerun the same torchrun command to finish it"
                    )
            rows.append((int(meta["start"]), int(meta["stop"])))
    if rows[0][0] != 0 or any(a[1] != b[0] for a, b in zip(rows, rows[1:])):
        raise VitseeError(f"the shards in {shard_paths[0].parent} do not tile the images ({rows}): rerun with --overwrite")
    return rows


def _record_shards(h5: h5py.File, rels: Sequence[str]) -> None:
    known = json.loads(h5.attrs.get("shards", "[]"))
    h5.attrs["shards"] = json.dumps(sorted(set(known) | set(rels)))


def _add_virtual_model(h5: h5py.File, key: str, shard_paths: Sequence[Path], rels: Sequence[str]) -> None:
    """Adds model `key` to the open store as virtual datasets over the shards' datasets of the model."""
    sources = [h5py.File(p, "r", locking=False) for p in shard_paths]
    try:
        template = sources[0][f"models/{key}"]
        models = h5.require_group("models")
        if key in models:
            raise VitseeError(f"model {key} is already in {h5.filename}: use another spec or --overwrite")
        group = models.create_group(key)
        for name, value in template.attrs.items():
            group.attrs[name] = value
        group.attrs["order"] = len(models) - 1
        names: list[str] = []
        template.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            parts = [src[f"models/{key}/{name}"] for src in sources]
            first = parts[0]
            layout = h5py.VirtualLayout(shape=(sum(p.shape[0] for p in parts), *first.shape[1:]), dtype=first.dtype)
            offset = 0
            for rel, part in zip(rels, parts):
                layout[offset : offset + part.shape[0]] = h5py.VirtualSource(rel, part.name, shape=part.shape)
                offset += part.shape[0]
            parent, _, leaf = name.rpartition("/")
            target = group.require_group(parent) if parent else group
            ds = target.create_virtual_dataset(leaf, layout, fillvalue=0)  # 0: a lost shard's batches read as not done
            for attr, value in first.attrs.items():
                ds.attrs[attr] = value
    finally:
        for src in sources:
            src.close()


def _sum_streamed_states(h5: h5py.File, shard_paths: Sequence[Path]) -> None:
    """Makes the store a streaming one whose CKA accumulator is the sum of the shards' (in rank order)."""
    total, columns, batch_size = None, None, None
    for p in shard_paths:
        with Store.open(p) as s:
            saved = s.streamed_cka_state()
            if saved is None:
                raise VitseeError(f"shard {p} has no streamed CKA: rerun the same torchrun command")
            state, cols = saved
            if columns is not None and cols != columns:
                raise VitseeError(f"shard {p} streamed other layers than the first shard: rerun with --overwrite")
            total = state if total is None else total + state
            columns = cols
            batch_size = int(s.file["streaming/cka_state"].attrs["batch_size"])
    store_mod.add_streaming_state(h5, columns, batch_size)
    h5["streaming/cka_state"][:] = np.stack([total, total])

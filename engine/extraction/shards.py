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

from vitsee import store as store_mod
from vitsee.errors import VitseeError
from vitsee.store import Store


def run_id(cfg, world: int) -> str:
    """Returns the identity of a torchrun extraction every shard records: a digest of its images (dataset,
    the selected indices in order), batch size and process count, so a shard of another run is told apart."""
    import hashlib

    from vitsee.data import open_dataset, select_indices

    indices = select_indices(len(open_dataset(cfg.dataset)), cfg.n_images, cfg.shuffle_seed)
    digest = hashlib.sha1(f"{cfg.dataset}|{cfg.batch_size}|{world}|".encode())
    digest.update(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def models_to_extract(cfg) -> list[str]:
    """Returns the model specs of cfg a torchrun extraction still has to do (those not finished in the store)."""
    from vitsee.data import open_dataset, select_indices
    from vitsee.extraction.plan import check_same_images, check_same_mode
    from vitsee.models.load import parse_model_spec

    path = Path(cfg.store)
    if not path.exists() or cfg.overwrite:
        return list(cfg.models)
    keys = [parse_model_spec(m).key for m in cfg.models]
    images = open_dataset(cfg.dataset)
    with Store.open(path) as store:
        check_same_images(store, images, select_indices(len(images), cfg.n_images, cfg.shuffle_seed))
        check_same_mode(store, cfg, keys)
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
    from vitsee.models.load import parse_model_spec

    path = Path(path)
    keys = [parse_model_spec(m).key for m in models]
    expected = run_id(cfg, len(shard_paths))
    rows = _check_shards(shard_paths, keys, expected)
    rels = [os.path.relpath(p, path.parent) for p in shard_paths]
    if path.exists() and not cfg.overwrite:
        with Store.writer(path) as store:
            if int(rows[-1][1]) != store.n_images:
                raise VitseeError(
                    f"the shards cover {rows[-1][1]} images but {path} holds {store.n_images}: rerun with --overwrite"
                )
            if sorted(os.path.normpath(r) for r in json.loads(store.file.attrs.get("shards", "[]"))) != sorted(
                map(os.path.normpath, rels)
            ):
                raise VitseeError(
                    f"{path} was stitched from other shards than {shard_paths[0].parent.name}/ holds now: "
                    "rerun with --overwrite"
                )
            for key in keys:
                store.add_virtual_model(key, lambda group, key=key: _fill_virtual_model(group, key, shard_paths))
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
        h5.attrs["run_id"] = expected
        models_group = h5.require_group("models")
        for order, key in enumerate(keys):
            group = models_group.create_group(key)
            _fill_virtual_model(group, key, shard_paths)
            group.attrs["order"] = order
        if getattr(cfg, "grams", False):  # each shard kept its batches' Grams: the virtual datasets join them
            from vitsee.zoo.streamed import add_gram_state

            add_gram_state(h5, cfg.batch_size)
        elif cfg.streaming:
            _sum_streamed_states(h5, shard_paths)
    if cfg.streaming:
        from vitsee.analyses.cka import save_streamed_cka
        from vitsee.analyses.heads import save_streamed_heads

        with Store.writer(path) as store:
            save_streamed_cka(store)
            save_streamed_heads(store)


def _check_shards(shard_paths: Sequence[Path], keys: Sequence[str], expected_run: str) -> list[tuple[int, int]]:
    """Returns each shard's (start, stop) rows after checking they are there, of this run, complete and
    contiguous."""
    rows = []
    for p in shard_paths:
        if not p.exists():
            raise VitseeError(f"shard {p} is missing: rerun the same torchrun command to extract it")
        with Store.open(p) as s:
            meta = json.loads(s.file.attrs.get("shard", "null") or "null")
            if meta is None:
                raise VitseeError(
                    f"{p} is not a shard of a torchrun extraction: remove it and rerun the same torchrun command"
                )
            if meta.get("run_id") != expected_run:
                raise VitseeError(
                    f"shard {p} is from another run (other images or process count): remove it and rerun the same "
                    "torchrun command, or rerun with --overwrite"
                )
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
        raise VitseeError(
            f"the shards in {shard_paths[0].parent} do not tile the images ({rows}): rerun with --overwrite"
        )
    return rows


def _record_shards(h5: h5py.File, rels: Sequence[str]) -> None:
    known = json.loads(h5.attrs.get("shards", "[]"))
    h5.attrs["shards"] = json.dumps(sorted(set(known) | set(rels)))


def _fill_virtual_model(group: h5py.Group, key: str, shard_paths: Sequence[Path]) -> None:
    """Fills group with model `key` as virtual datasets over the shards' datasets of the model, each source
    named by its path relative to the file that holds group (HDF5 resolves it from there)."""
    here = Path(group.file.filename).resolve().parent
    stores = [Store.open(p) for p in shard_paths]
    try:
        template = stores[0].model_group(key)
        for name, value in template.attrs.items():
            group.attrs[name] = value
        names: list[str] = []
        template.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            parts = [s.model_group(key)[name] for s in stores]
            first = parts[0]
            layout = h5py.VirtualLayout(shape=(sum(p.shape[0] for p in parts), *first.shape[1:]), dtype=first.dtype)
            offset = 0
            for part in parts:
                rel = os.path.relpath(Path(part.file.filename).resolve(), here)
                layout[offset : offset + part.shape[0]] = h5py.VirtualSource(rel, part.name, shape=part.shape)
                offset += part.shape[0]
            parent, _, leaf = name.rpartition("/")
            target = group.require_group(parent) if parent else group
            ds = target.create_virtual_dataset(leaf, layout, fillvalue=0)  # 0: a lost shard's batches read as not done
            for attr, value in first.attrs.items():
                ds.attrs[attr] = value
    finally:
        for s in stores:
            s.close()


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
    _sum_streamed_heads(h5, shard_paths)


def _sum_streamed_heads(h5: h5py.File, shard_paths: Sequence[Path]) -> None:
    """Gives the store each ViT's head-level CKA accumulator (extract --streaming --heads) as the sum of the
    shards' (in rank order)."""
    with Store.open(shard_paths[0]) as first:
        layouts = first.streamed_heads()
    for vit, layout in layouts.items():
        total = None
        for p in shard_paths:
            with Store.open(p) as s:
                state = s.streamed_heads_state(vit)
                if state is None or s.streamed_heads().get(vit) != layout:
                    raise VitseeError(
                        f"shard {p} streamed other head-level CKA than the first shard: rerun with --overwrite"
                    )
            total = state if total is None else total + state
        store_mod.add_streamed_heads_state(h5, vit, layout["blocks"], layout["heads"], layout["columns"])
        h5[f"streaming/heads/{vit}"][:] = np.stack([total, total])

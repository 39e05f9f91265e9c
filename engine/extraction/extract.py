"""Extraction: one pass over the images feeds every model of a run, hooks record, a writer thread stores.

The main thread loads batches (DataLoader workers), runs each model's forward with its recorders and
starts the device-to-host copies on a side stream (so they overlap the next batch's forward); a background
thread waits for those copies and writes the batch into the store, so the device never waits on HDF5. A
bounded queue keeps host memory flat. Progress and plan messages reach the caller through one callback
(the CLI draws a Rich bar, the terminal app a widget).

With `streaming`, activations never leave the device: each batch's layers of every model go straight
into one all-pairs CKA accumulator, and the store keeps the per-image statistics, the accumulator and,
at the end, the CKA result (what `vitsee analyze --cka --shuffles 0` with the same batch size gives; the
accumulation itself is in engine/analyses/cka.py). With `heads`, each ViT's per-head attention outputs go into
its head-level CKA accumulator the same way (engine/analyses/heads.py) and are dropped after the batch.

This module holds `run_extraction` and the passes; planning and the checks before a run are in
engine/extraction/plan.py, the writer thread and the host copies in engine/extraction/writer.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitsee import store as store_mod
from vitsee.analyses.base import resolve_device
from vitsee.analyses.cka import save_streamed_cka, stream_batch, streaming_accumulator
from vitsee.analyses.heads import StreamedHeads, save_streamed_heads
from vitsee.data import ImageSet, Selection, loader_batches
from vitsee.errors import VitseeError
from vitsee.extraction.plan import (
    DTYPES,
    ExtractConfig,
    ExtractResult,
    ModelPlan,
    Progress,
    ProgressFn,
    _check_disk,
    _estimate,
    _free_memory,
    _release,
    memory_budget,
    plan,
    waves,
)
from vitsee.extraction.recorders import ActivationRecorder, HeadOutputRecorder, fp16_note
from vitsee.extraction.run_config import Resume, run_record
from vitsee.store import LayerSpec, Store
from vitsee.extraction.writer import BatchWriter, NonfiniteLog, _Batch, _HostCopies, _StreamedBatch
from vitsee.zoo.streamed import GRAMS, GramBatch, add_gram_state, gram_rows


# --- the pass ---------------------------------------------------------------------------------------


class _TransformedImages(torch.utils.data.Dataset):
    """Row j of the run -> one tensor per distinct transform (models sharing preprocessing share it)."""

    def __init__(self, images: ImageSet, indices: np.ndarray, transforms: list):
        self.images, self.indices, self.transforms = images, indices, transforms

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j: int):
        try:
            img = self.images.image(int(self.indices[j]))
        except VitseeError as exc:
            return _Unreadable(str(exc))
        return tuple(t(img) for t in self.transforms)


@dataclass(frozen=True)
class _Unreadable:
    """An image that could not be read, carried to the main process as a value: raised in a DataLoader
    worker, its one-line error would arrive wrapped in the worker's traceback."""

    message: str


def _collate(items: list):
    """Returns the batch of a loader's items, or the first unreadable image among them."""
    for item in items:
        if isinstance(item, _Unreadable):
            return item
    return torch.utils.data.default_collate(items)


@contextmanager
def _batches(loader) -> Iterator[Iterator]:
    """Yields an iterator over a loader's batches, an unreadable image ending the run with its one-line
    error; the loader's workers are shut down when the block ends (see data.loader_batches)."""
    with loader_batches(loader) as it:
        yield (_checked(inputs) for inputs in it)


def _checked(inputs):
    if isinstance(inputs, _Unreadable):
        raise VitseeError(f"{inputs.message}, then rerun the same command to resume (finished batches are kept)")
    return inputs


def _nonfinite_rows(acts: dict[str, torch.Tensor], layers: Sequence[LayerSpec]) -> torch.Tensor:
    """Returns (layers, b) counts of inf/nan values per layer and image (fp16 overflow shows up here)."""
    values = [acts[layer.name].flatten(1) for layer in layers]
    if not values:
        return torch.zeros((0, 0), dtype=torch.int64)
    if values[0].device.type == "cpu":
        # a sum in fp32 is finite exactly when every value is (fp16 values cannot overflow it), and reads
        # the data once at memory speed; only a layer that fails it is counted value by value
        b = values[0].shape[0]
        return torch.stack(
            [
                torch.zeros(b, dtype=torch.int64)
                if torch.isfinite(v.sum(dtype=torch.float32))
                else (~torch.isfinite(v)).sum(dim=1)
                for v in values
            ]
        )
    return torch.stack([(~torch.isfinite(v)).sum(dim=1) for v in values])  # no host sync on the device


def _forward(mp: ModelPlan, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Returns (activations, statistics) of one batch, on the model's device."""
    with torch.inference_mode():
        mp.loaded.model(x)
    acts: dict[str, torch.Tensor] = {}
    stats: dict[str, torch.Tensor] = {}
    for rec in mp.recorders:
        (acts if isinstance(rec, ActivationRecorder) else stats).update(rec.collect())
    # head outputs stay in the store's dtype, like activations; statistics are fp32
    return acts, {k: v if k.startswith(HeadOutputRecorder.PREFIX) else v.float() for k, v in stats.items()}


def _forward_batch(mp: ModelPlan, x: torch.Tensor, batch: int, torch_dtype: torch.dtype, copies: _HostCopies) -> _Batch:
    acts, stats = _forward(mp, x)
    nonfinite = _nonfinite_rows(acts, mp.layers)
    if mp.gram_maker is not None:  # a zoo's streaming: each layer's Gram of the batch instead of its activations
        stats.update(
            {
                f"{GRAMS}{layer.name}": gram_rows(mp.gram_maker.layer_gram(acts.pop(layer.name)), mp.batch_size)
                for layer in mp.layers
            }
        )
        copies.begin()
        host = GramBatch(mp.key, batch, copies.to_host(stats), {mp.key: copies.to_host({"c": nonfinite})["c"]})
        host.ready = copies.ready()
        return host
    model_input = x.to(torch_dtype)
    copies.begin()
    host_acts = copies.to_host(acts)
    host_stats = copies.to_host(stats)
    host_rest = copies.to_host({"input": model_input, "nonfinite": nonfinite})
    return _Batch(mp.key, batch, host_acts, host_stats, host_rest["input"], host_rest["nonfinite"], copies.ready())


def _cka_columns(plans: Sequence[ModelPlan]) -> list[tuple[str, str]]:
    """The streamed CKA's columns: every layer of every model, models in store order, layers in forward order."""
    return [(mp.key, layer.name) for mp in plans for layer in mp.layers]


def _add_streamed_heads(h5, plans: Sequence[ModelPlan]) -> None:
    """Allocates the head-level CKA accumulator of every ViT of a streaming run that records its heads: its
    heads against every layer of the other models."""
    for mp in plans:
        rec = mp.head_recorder
        if rec is not None:
            columns = [c for c in _cka_columns(plans) if c[0] != mp.key]
            blocks = [name.removeprefix(rec.PREFIX) for name in map(rec.name, rec._chosen())]
            store_mod.add_streamed_heads_state(h5, mp.key, blocks, mp.loaded.num_heads, columns)


def _head_outputs(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Takes a streamed batch's head outputs out of its statistics: {blocks.B: (b, heads, tokens, head_dim)}."""
    prefix = HeadOutputRecorder.PREFIX
    return {name.removeprefix(prefix): stats.pop(name) for name in [n for n in stats if n.startswith(prefix)]}


def run_extraction(
    cfg: ExtractConfig, progress: ProgressFn | None = None, cancel: threading.Event | None = None
) -> ExtractResult:
    """Extracts (or resumes, or appends) every model of cfg into the store; returns what was done.

    Under torchrun (WORLD_SIZE > 1) the CLI calls `distributed.extract_sharded` instead, which runs this for
    each process's shard and has rank 0 stitch them into the store.
    """
    emit: ProgressFn = progress or (lambda _p: None)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    store_path = Path(cfg.store)
    store_mod.check_not_a_folder(store_path)  # before any work, and before the lock makes STORE.d beside it
    # the lock covers resuming, appending, creating and replacing alike; a new store's is taken once the
    # run's inputs have been checked, so a refused run leaves nothing beside the path
    lock = store_mod.WriteLock(store_path) if store_path.exists() else None
    budget = memory_budget(cfg, device)  # before any model is loaded: what is free for them
    try:
        selection, plans, existing = plan(cfg, device, emit, lock=lock, budget=budget)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if lock is None and existing is not None:  # another run created the store while this one was planned
        _release(plans, existing)
        raise VitseeError(
            f"{store_path} was created by another vitsee process while this run started: "
            "rerun the same command to add to it (or resume it)"
        )
    n = len(selection)
    messages = []
    try:
        size = _estimate(plans, n, cfg, existing is not None)
        msg = f"{store_path}: {size.describe()}"
        messages.append(msg)
        emit(Progress("plan", message=msg))
        for mp in plans:
            note = fp16_note(mp.key, mp.record.get("fp16_loss", {}))
            if note:
                messages.append(note)
                emit(Progress("warning", message=note, model=mp.key))  # about the data: said even with -q
            if not mp.new and mp.batch_size != cfg.batch_size:
                note = f"{mp.key}: resuming with the stored batch size {mp.batch_size}"
                messages.append(note)
                emit(Progress("plan", message=note, model=mp.key))
        groups = waves(plans, budget)
        if len(groups) > 1:
            note = _waves_note(plans, groups, budget, cfg)
            messages.append(note)
            emit(Progress("plan", message=note))
        _check_disk(store_path, size.todo_bytes, cfg.force)
        stale = store_mod.remove_stale_starts(store_path)
        if stale:
            note = f"removed {len(stale)} file(s) a killed start left: {', '.join(t.name for t in stale)}"
            messages.append(note)
            emit(Progress("plan", message=note))

        record = run_record(cfg, selection.images.spec, [(mp.record["spec"], mp.key) for mp in plans])
        if existing is None:
            if lock is None:
                lock = store_mod.WriteLock(store_path)
            with store_mod.creating(store_path, overwrite=cfg.overwrite, lock=lock) as h5:
                images = selection.images
                store_mod.write_images(
                    h5, images.spec, selection.indices, selection.labels, images.class_names, selection.shuffle_seed
                )
                h5.attrs["run_config"] = store_mod.json_attr(record)  # `vitsee extract STORE` resumes from it
                if cfg.shard is not None:
                    h5.attrs["shard"] = store_mod.json_attr(cfg.shard.__dict__)
                for mp in plans:
                    store_mod.add_model_layout(
                        h5,
                        mp.record,
                        mp.layers,
                        mp.stats,
                        mp.input_shape,
                        mp.batch_size,
                        cfg.dtype,
                        n,
                        streaming=cfg.streaming,
                    )
                if cfg.grams:
                    add_gram_state(h5, cfg.batch_size)
                elif cfg.streaming:
                    store_mod.add_streaming_state(h5, _cka_columns(plans), cfg.batch_size)
                    _add_streamed_heads(h5, plans)
            existing = Store.writer(store_path, rows=True, lock=lock)
        else:
            for mp in plans:
                if mp.new:
                    existing.add_model(
                        mp.record, mp.layers, mp.stats, mp.input_shape, mp.batch_size, cfg.dtype, run_config=record
                    )
        run_pass = _streaming_pass if cfg.streaming and not cfg.grams else _extract_pass
        nonfinite = NonfiniteLog(store_path, plans, cfg.shard.start if cfg.shard is not None else 0)
        processed, bytes_written, cancelled = _run_waves(
            run_pass, groups, existing, selection, plans, device, cfg, emit, cancel, nonfinite
        )
        if cfg.streaming and not cancelled and existing.complete and cfg.shard is None:
            save_streamed_cka(existing)  # a shard's share is summed with the others' when they are stitched
            save_streamed_heads(existing)
    finally:
        _release(plans, existing)
        if lock is not None:
            lock.release()
    seconds = time.perf_counter() - t0
    warning = nonfinite.message()
    if warning is not None:  # after the bar, so it is the line a user reads last
        messages.append(warning)
        emit(Progress("warning", message=warning))
    emit(Progress("done", done=processed, total=n, message=f"{processed} images in {seconds:.1f} s"))
    return ExtractResult(store_path, [mp.key for mp in plans], processed, seconds, bytes_written, cancelled, messages)


def resume_extraction(
    resume: Resume, progress: ProgressFn | None = None, cancel: threading.Event | None = None, driver=None
) -> ExtractResult:
    """Returns the ExtractResult of the resumed run(s) (run_config.plan_resume), each run by driver
    (run_extraction unless given, e.g. the torchrun one); cancelled when one was, the rest then not started."""
    driver = driver or run_extraction
    total = ExtractResult(resume.store, [], 0, 0.0, 0, messages=[resume.describe()])
    for cfg in resume.configs:
        result = driver(cfg, progress=progress, cancel=cancel)
        total.models += result.models
        total.images_processed += result.images_processed
        total.seconds += result.seconds
        total.bytes_written += result.bytes_written
        total.messages += result.messages
        if result.cancelled:
            total.cancelled = True
            break
    return total


def _waves_note(plans: Sequence[ModelPlan], groups: list[list[ModelPlan]], budget: int, cfg: ExtractConfig) -> str:
    """Returns the plan line of a run in waves (refusing a streaming run without --grams, which needs one pass)."""
    total = sum(mp.cost for group in groups for mp in group)
    if cfg.streaming and not cfg.grams:
        raise VitseeError(
            f"these {len(plans)} models take {store_mod.human_bytes(total)} together, over the memory budget of "
            f"{store_mod.human_bytes(budget)}, and --streaming without --grams runs them all in one pass: add --grams "
            "(each model streams its own Grams, a few models at a time), raise --memory-budget, or stream fewer models"
        )
    return (
        f"{sum(map(len, groups))} models take {store_mod.human_bytes(total)} together, over the memory budget of "
        f"{store_mod.human_bytes(budget)}: they run in {len(groups)} waves of at most {max(map(len, groups))}, "
        "each reading the images again"
    )


def _run_waves(
    run_pass, groups: list[list[ModelPlan]], store, selection, plans, device, cfg, emit, cancel, nonfinite
) -> tuple[int, int, bool]:
    """Runs the pass over every model at once when they fit the memory budget together (one wave: one pass, as a run
    always did), else once per wave, its models loaded when it starts and released when it ends, so no more than one
    wave is ever resident. Returns (images, bytes written, cancelled)."""
    if len(groups) <= 1:
        return run_pass(store, selection, plans, device, cfg, emit, cancel, nonfinite)
    n = len(selection)
    processed = written = 0
    for w, group in enumerate(groups):
        if cancel is not None and cancel.is_set():
            return processed, written, True
        for mp in plans:
            if mp.resident and not any(mp is g for g in group):
                mp.release()
        _free_memory(device)
        for mp in group:
            if not mp.resident:
                emit(Progress("load", message=f"loading {mp.record['spec']}", model=mp.key))
            mp.reload()
        emit(Progress("plan", message=f"wave {w + 1} of {len(groups)}: {', '.join(mp.key for mp in group)}"))

        def progress(event: Progress, w: int = w) -> None:  # one bar over all waves: images x waves
            if event.stage == "extract":
                event = Progress("extract", done=w * n + event.done, total=len(groups) * n, model=event.model)
            emit(event)

        done, nbytes, cancelled = run_pass(store, selection, group, device, cfg, progress, cancel, nonfinite)
        processed, written = max(processed, done), written + nbytes
        for mp in group:
            mp.release()
        if cancelled:
            return processed, written, True
    _free_memory(device)
    return processed, written, False


def _loader(
    selection: Selection, group: Sequence[ModelPlan], batches: list[list[int]], device: torch.device, cfg: ExtractConfig
) -> tuple[torch.utils.data.DataLoader, dict[str, int]]:
    """Returns a loader yielding per batch one input tensor per distinct transform, and model -> slot."""
    transforms, slot = [], {}
    for mp in group:
        key = repr(mp.transform)
        if key not in slot:
            slot[key] = len(transforms)
            transforms.append(mp.transform)
    dataset = _TransformedImages(selection.images, selection.indices, transforms)
    workers = cfg.workers if cfg.workers is not None else default_workers(device)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=batches, num_workers=workers, pin_memory=device.type == "cuda", collate_fn=_collate
    )
    return loader, {mp.key: slot[repr(mp.transform)] for mp in group}


def default_workers(device: torch.device) -> int:
    """Returns how many loader processes a run starts without --workers: on a GPU the cores but one (at most 4), to
    keep the device fed while they decode; on the CPU none. There the forward's torch threads take every core they
    were given, and a loader process beside them takes one away: the other threads then wait for the descheduled one
    at every parallel region, and each batch crosses between the processes through shared memory (two 19 MB
    tensors a batch of 32 at 224 px). Loading in the main process, between forward passes, costs its own time only
    (1.6-3 ms of CPU an image and transform: 6% of vit_tiny's forward at 224 px; benchmarks/README.md)."""
    return min(4, max(1, (os.cpu_count() or 2) - 1)) if device.type != "cpu" else 0


def _extract_pass(store, selection, plans, device, cfg, emit, cancel, nonfinite=None) -> tuple[int, int, bool]:
    """Runs the pending batches of every model, grouped by batch size (one pass per group)."""
    n = len(selection)
    torch_dtype = DTYPES[cfg.dtype]
    processed = 0
    cancelled = False
    writer = BatchWriter(store, nonfinite=nonfinite, inline=device.type == "cpu")
    copies = _HostCopies(device)
    try:
        for bs in sorted({mp.batch_size for mp in plans}):
            group = [mp for mp in plans if mp.batch_size == bs and not mp.done.all()]
            if not group:
                continue
            n_batches = -(-n // bs)
            pending = [b for b in range(n_batches) if any(not mp.done[b] for mp in group)]
            batches = [list(range(b * bs, min((b + 1) * bs, n))) for b in pending]
            loader, slot = _loader(selection, group, batches, device, cfg)
            done_images = n - sum(len(rows) for rows in batches)
            emit(Progress("extract", done=done_images, total=n))
            with _batches(loader) as loaded:
                for b, inputs in zip(pending, loaded):
                    if cancel is not None and cancel.is_set():
                        cancelled = True
                        break
                    for mp in group:
                        if mp.done[b]:
                            continue
                        x = inputs[slot[mp.key]].to(device, non_blocking=True)
                        writer.put(_forward_batch(mp, x, b, torch_dtype, copies))
                    rows = min(bs, n - b * bs)
                    processed += rows
                    done_images += rows
                    emit(Progress("extract", done=done_images, total=n))
            if cancelled:
                break
    finally:
        writer.close()
    return processed, writer.bytes_written, cancelled


def _streaming_pass(store, selection, plans, device, cfg, emit, cancel, nonfinite=None) -> tuple[int, int, bool]:
    """Runs the pending batches of all models together: statistics to the store, activations into one
    all-pairs CKA accumulator on the device (resumed from the store's copy of it)."""
    n = len(selection)
    bs = plans[0].batch_size
    n_batches = -(-n // bs)
    done = np.logical_and.reduce([mp.done for mp in plans])
    first = int(np.argmin(done)) if not done.all() else n_batches  # streaming writes batches in order
    columns = _cka_columns(plans)
    acc = streaming_accumulator(store, len(columns), device, first)
    heads = StreamedHeads.resumed(store, device, first)  # one per ViT of a --heads run
    pending = list(range(first, n_batches))
    batches = [list(range(b * bs, min((b + 1) * bs, n))) for b in pending]
    processed, cancelled = 0, False
    writer = BatchWriter(store, nonfinite=nonfinite, inline=device.type == "cpu")
    copies = _HostCopies(device)
    try:
        if not pending:
            return 0, 0, False
        loader, slot = _loader(selection, plans, batches, device, cfg)
        done_images = n - sum(len(rows) for rows in batches)
        emit(Progress("extract", done=done_images, total=n))
        with _batches(loader) as loaded:
            for b, inputs in zip(pending, loaded):
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                feats, stats, bad, outputs = [], {}, {}, {}
                for mp in plans:
                    acts, stats[mp.key] = _forward(mp, inputs[slot[mp.key]].to(device, non_blocking=True))
                    outputs[mp.key] = _head_outputs(stats[mp.key])
                    bad[mp.key] = _nonfinite_rows(acts, mp.layers)
                    feats += [acts[layer.name] for layer in mp.layers]
                state = stream_batch(acc, feats)
                by_column = dict(zip(columns, feats))
                head_states = {h.vit: h.update(outputs[h.vit], by_column) for h in heads}
                del feats, by_column, outputs
                copies.begin()
                host = _StreamedBatch(
                    b,
                    {m: copies.to_host(v) for m, v in stats.items()},
                    {m: copies.to_host({"c": c})["c"] for m, c in bad.items()},
                    copies.to_host({"state": state})["state"],
                    heads_states=copies.to_host(head_states),
                )
                host.ready = copies.ready()
                writer.put(host)
                rows = min(bs, n - b * bs)
                processed += rows
                done_images += rows
                emit(Progress("extract", done=done_images, total=n))
    finally:
        writer.close()
    return processed, writer.bytes_written, cancelled

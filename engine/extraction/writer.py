"""The writer side of an extraction: device-to-host copies on a side stream, the background thread that
writes finished batches into the store (bounded queue, flat host memory), and the log of non-finite rows."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitsee.extraction.plan import ModelPlan
from vitsee.store import Store


@dataclass
class _Batch:
    """One model's batch on its way to the store (host tensors, pinned on CUDA)."""

    model: str
    batch: int
    activations: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    model_input: torch.Tensor
    nonfinite: torch.Tensor  # (layers, b) per image
    ready: object = None  # a CUDA event the writer waits on before reading host memory

    def write(self, store: Store) -> int:
        acts = {k: v.numpy() for k, v in self.activations.items()}
        stats = {k: v.numpy() for k, v in self.stats.items()}
        inp = self.model_input.numpy()
        store.write_batch(self.model, self.batch, acts, stats, inp, self.nonfinite.numpy().sum(axis=1).tolist())
        return sum(a.nbytes for a in acts.values()) + inp.nbytes + sum(v.nbytes for v in stats.values())


@dataclass
class _StreamedBatch:
    """One batch of a streaming run: every model's statistics and the CKA accumulator after it."""

    batch: int
    stats: dict[str, dict[str, torch.Tensor]]  # model -> name -> (b, ...)
    nonfinite: dict[str, torch.Tensor]  # model -> (layers, b) per image
    cka_state: torch.Tensor
    ready: object = None
    heads_states: dict[str, torch.Tensor] = field(default_factory=dict)  # ViT -> its head-level CKA accumulator

    def write(self, store: Store) -> int:
        stats = {m: {k: v.numpy() for k, v in values.items()} for m, values in self.stats.items()}
        state = self.cka_state.numpy()
        heads = {vit: s.numpy() for vit, s in self.heads_states.items()}
        counts = {m: c.numpy().sum(axis=1).tolist() for m, c in self.nonfinite.items()}
        store.write_streamed_batch(self.batch, stats, counts, state, heads)
        return (
            state.nbytes
            + sum(s.nbytes for s in heads.values())
            + sum(v.nbytes for values in stats.values() for v in values.values())
        )


class BatchWriter:
    """A thread that writes finished batches into the store; a bounded queue applies back-pressure.

    With `inline` (extraction on the CPU) there is no thread: `put` writes the batch at once. There the forward's
    torch threads already take every core they were given, so a writer thread overlaps nothing; it only takes a core
    from one compute thread, and the others then wait for that one at every parallel region of the next forward
    (issue 23: vit_tiny + resnet18 at 224 px, the forward passes took 7.0 s inside extraction against 4.6 s alone).
    """

    def __init__(self, store: Store, max_pending: int = 3, nonfinite: NonfiniteLog | None = None, inline: bool = False):
        self.store = store
        self.nonfinite = nonfinite  # told which images of each written batch hold non-finite values
        self.queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.error: BaseException | None = None
        self.bytes_written = 0
        self.thread = None if inline else threading.Thread(target=self._run, name="vitsee-writer", daemon=True)
        if self.thread is not None:
            self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue  # drain after a failure so the producer never blocks
            try:
                self._write(item)
            except BaseException as exc:  # reported to the producer on its next put/close
                self.error = exc

    def _write(self, item: _Batch | _StreamedBatch) -> None:
        if item.ready is not None:
            item.ready.synchronize()
        self.bytes_written += item.write(self.store)
        self._log_nonfinite(item)

    def _log_nonfinite(self, item: _Batch | _StreamedBatch) -> None:
        if self.nonfinite is None:
            return
        per_model = {item.model: item.nonfinite} if isinstance(item, _Batch) else item.nonfinite
        for model, per_row in per_model.items():
            self.nonfinite.add(model, item.batch, per_row.numpy())

    def put(self, item: _Batch | _StreamedBatch) -> None:
        if self.error is not None:
            raise self.error
        if self.thread is None:
            self._write(item)
            return
        self.queue.put(item)

    def close(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
        if self.error is not None:
            raise self.error


class _HostCopies:
    """Device-to-host copies into pinned memory on a side stream, so they overlap the next forward.

    The side stream first waits for the compute stream (the values must be finished), and every source
    tensor is marked as used by it, so the caching allocator does not hand its memory to the next batch
    before the copy has read it. On CPU the tensors are already on the host: nothing is copied.
    """

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def begin(self) -> None:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))

    def to_host(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.stream is None:
            return {name: t.contiguous() for name, t in tensors.items()}
        out = {}
        with torch.cuda.stream(self.stream):
            for name, t in tensors.items():
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                t.record_stream(self.stream)
                out[name] = host
        return out

    def ready(self):
        """Returns an event the writer waits on before it reads the copies (None on CPU)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event


class NonfiniteLog:
    """Which images (store rows) held non-finite values in which layer, gathered batch by batch as the
    writer stores them; `message()` is the run's one closing line about them."""

    MAX_LAYERS = 4
    MAX_RANGES = 10

    def __init__(self, store: Path, plans: Sequence[ModelPlan], row_offset: int = 0):
        self.store = store
        self.layers = {mp.key: [layer.name for layer in mp.layers] for mp in plans}
        self.batch_size = {mp.key: mp.batch_size for mp in plans}
        self.row_offset = row_offset
        self.rows: dict[str, dict[str, set[int]]] = {mp.key: {} for mp in plans}  # model -> layer -> rows
        self._lock = threading.Lock()

    def add(self, model: str, batch: int, per_row: np.ndarray) -> None:
        """Records the (layers, b) non-finite counts of one of a model's batches."""
        if not per_row.any():
            return
        first = self.row_offset + batch * self.batch_size[model]
        with self._lock:
            for li, j in zip(*np.nonzero(per_row)):
                self.rows[model].setdefault(self.layers[model][li], set()).add(first + int(j))

    def message(self) -> str | None:
        """Returns one line naming the layers and images with non-finite values and how to look, or None."""
        parts = []
        for model, layers in self.rows.items():
            if not layers:
                continue
            names = [name for name in self.layers[model] if name in layers]  # forward order
            shown = ", ".join(names[: self.MAX_LAYERS]) + (
                f" and {len(names) - self.MAX_LAYERS} more" if len(names) > self.MAX_LAYERS else ""
            )
            rows = sorted(set().union(*layers.values()))
            parts.append(
                f"{model} layer(s) {shown} in {len(rows)} image(s) (store rows {row_ranges(rows, self.MAX_RANGES)})"
            )
        if not parts:
            return None
        return (
            f"non-finite values (NaN/Inf) in {'; '.join(parts)}: see `vitsee info {self.store}`; views mark "
            "what they touch as non-finite and probes skip them (fp16 overflow? extract with --dtype float32)"
        )


def row_ranges(rows: Sequence[int], limit: int = 10) -> str:
    """Returns sorted rows as ranges, '5-9, 17', at most `limit` of them and then 'and N more' (rows)."""
    spans: list[list[int]] = []
    for r in rows:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans[:limit])
    if len(spans) > limit:
        text += f" and {sum(b - a + 1 for a, b in spans[limit:])} more"
    return text

"""A zoo's streamed statistics in the store: every layer's Gram of every batch, from which the CKA of any pair of
layers of any two models can be had later, without the activations.

Layout (additions to the store of engine/store/__init__.py, made by `vitsee extract --grams`, which implies
--streaming):
    /                              attrs: streaming = 1 (no activations are stored, as for any streaming store)
    /streaming                     attrs: grams = 1, batch_size B (every Gram is of a batch of B images in store order)
    /models/<key>/grams/<layer>    (N, B) float32: row r holds row r - bB of the Gram K_b = X_b X_b' of batch
                                   b = r // B, X_b the layer's batch flattened (m, D) and shifted to about its batch
                                   mean exactly as analyses/cka.MinibatchCKA shifts it; a last batch of m < B images
                                   fills its first m columns and leaves zeros after them. Written row by row like
                                   the statistics beside it, so `done` marks a batch whole or not at all.
    (a model appended later, STORE.d/models/<key>.h5, has the same grams/ group at its root)

Why Grams. The unbiased HSIC of a batch is a Frobenius inner product of U-centred Grams,
HSIC1_b(X, Y) = <U(K_b), U(L_b)>_F / (m (m - 3)), so the stored Grams are a sufficient statistic for the minibatch CKA
of every pair: each model runs alone (models go through the images in waves, never all resident), a kill loses at
most the batches in flight of the models in flight, and a model appended later needs its own forward pass plus the
products of its new pairs only. The per-batch terms stay available, so bootstrap intervals and permutation nulls
(engine/stats.py) can be computed from the Grams too. The Grams are the fp32 Grams MinibatchCKA.update builds, and
analyses/cka.cka_from_grams runs the rest of its arithmetic on them: the CKA of all the store's layers at once equals
`vitsee analyze --cka --shuffles 0` with batch size B bit for bit (same thread count), and a block computed on its
own (cross_at) agrees to rounding (~1e-15).

Disk: 4 N B bytes per layer and model, 4 N B sum_models L_model in all (plus the per-image statistics, and the
(batches, layers) counters every model has) -- with B = 128, 512 bytes per image and layer, against 300 KB per image
for one ViT-B/16 block's activations in fp16. 50 models x 14 layers x 10,240 images at B = 128: 3.7 GB. It grows
with the batch size; the CKA estimate does not need large batches (the paper's 128 and 1024 gave the same curves).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import h5py
import numpy as np

from vitsee.errors import VitseeError
from vitsee.store import GRAMS, ArraySpec, LayerSpec, Store

__all__ = [
    "GRAMS",
    "GramBatch",
    "add_gram_state",
    "batch_grams",
    "gram_batch_size",
    "gram_bytes",
    "gram_rows",
    "gram_specs",
    "keeps_grams",
    "read_gram",
]


def gram_specs(layers: Sequence[LayerSpec], batch_size: int) -> list[ArraySpec]:
    """Returns the per-image arrays that hold a model's Grams: grams/<layer>, (batch_size,) float32 per image."""
    return [ArraySpec(f"{GRAMS}{layer.name}", (int(batch_size),), "float32") for layer in layers]


def gram_bytes(n_images: int, batch_size: int, n_layers: int) -> int:
    """Returns the bytes on disk of n_layers layers' Grams over n_images in batches of batch_size: 4 N B L."""
    return 4 * int(n_images) * int(batch_size) * int(n_layers)


def add_gram_state(file: h5py.File, batch_size: int) -> None:
    """Marks a new store as a streaming store keeping each layer's per-batch Gram (a zoo's statistics)."""
    file.attrs["streaming"] = True
    group = file.require_group("streaming")
    group.attrs["grams"] = True
    group.attrs["batch_size"] = int(batch_size)


def keeps_grams(store: Store) -> bool:
    """Returns whether a store keeps per-batch Grams (made with `vitsee extract --grams`)."""
    return store.streaming and "streaming" in store.file and bool(store.file["streaming"].attrs.get("grams", False))


def gram_batch_size(store: Store) -> int:
    """Returns the batch size of a Gram-keeping store's Grams."""
    return int(store.file["streaming"].attrs["batch_size"])


def gram_rows(gram, batch_size: int):
    """Returns a batch's (m, m) Gram (a torch tensor) as the (m, batch_size) rows its grams/<layer> dataset holds."""
    m = int(gram.shape[0])
    if m == batch_size:
        return gram
    rows = gram.new_zeros((m, batch_size))
    rows[:, :m] = gram
    return rows


@dataclass
class GramBatch:
    """One model's batch of a Gram-keeping run on its way to the store: its statistics and grams/<layer> rows
    (host tensors), written by the extraction's writer thread like any batch."""

    model: str
    batch: int
    stats: dict  # name -> (b, ...) tensor, grams/<layer> among them
    nonfinite: dict  # {model: (layers, b) counts per image}, as the writer's log reads a streamed batch's
    ready: object = None

    def write(self, store: Store) -> int:
        arrays = {k: v.numpy() for k, v in self.stats.items()}
        counts = self.nonfinite[self.model].numpy().sum(axis=1).tolist()
        store.write_batch(self.model, self.batch, {}, arrays, None, counts)
        return sum(a.nbytes for a in arrays.values())


def read_gram(store: Store, model: str, layer: str, batch: int) -> np.ndarray:
    """Returns the (m, m) float32 Gram of one layer's batch (m = the batch's images)."""
    group = store.model_group(model)
    if GRAMS.rstrip("/") not in group or layer not in group[GRAMS.rstrip("/")]:
        raise VitseeError(f"{store.path} keeps no Grams of {model} {layer}: extract it with `vitsee extract --grams`")
    bs = gram_batch_size(store)
    start, stop = batch * bs, min((batch + 1) * bs, store.n_images)
    return group[GRAMS.rstrip("/")][layer][start:stop, : stop - start]


def batch_grams(store: Store, columns: Sequence[tuple[str, str]]) -> Iterator[tuple[int, list[np.ndarray]]]:
    """Yields (batch, [the (m, m) Gram of each (model, layer) column]) for every batch in store order."""
    if not keeps_grams(store):
        raise VitseeError(f"{store.path} keeps no Grams: extract the zoo with `vitsee extract --grams`")
    for model in dict.fromkeys(m for m, _ in columns):
        store.require_complete(model)
    n_batches = -(-store.n_images // gram_batch_size(store))
    for b in range(n_batches):
        yield b, [read_gram(store, model, layer, b) for model, layer in columns]

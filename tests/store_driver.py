"""The store writes of `vitsee analyze` (caching a result) and of appending a model, without torch, so a
fault-injection test can kill a process at each of its writes in a fraction of a second.

    python store_driver.py STORE result   # caches a CKA-shaped result, as analyze does
    python store_driver.py STORE append   # appends model `extra`, allocates it, writes every batch, as extract does
"""

from __future__ import annotations

import sys

import numpy as np

from vitsee.store import ArraySpec, LayerSpec, Store

LAYERS = [LayerSpec("blocks.0", (5, 8), prefix_tokens=1), LayerSpec("blocks.1", (5, 8), prefix_tokens=1)]
STATS = [ArraySpec("attention_distance", (2, 2))]
BATCH = 4


def expected_result() -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    params = {"models": ["a"], "batch_size": 4, "shuffles": 0}
    arrays = {
        "cka": rng.normal(size=(6, 6)),
        "std": rng.normal(size=(6, 6)),
        "layers": np.array(["x", "y"]),
        "per_model/a": np.arange(6.0),
    }
    return params, arrays


def rows(n: int, layer: str) -> np.ndarray:
    seed = sum(map(ord, layer))
    return np.random.default_rng(seed).normal(size=(n, *LAYERS[0].shape)).astype(np.float16)


def main(path: str, op: str) -> None:
    with Store.writer(path, rows=(op == "append")) as store:
        if op == "result":
            params, arrays = expected_result()
            store.put_result("cka", params, arrays, provenance={"driver": True})
            return
        record = {"key": "extra", "family": "vit", "weights": {"kind": "random", "seed": 0}}
        if "extra" not in store.models:
            store.add_model(record, LAYERS, STATS, (3, 4, 4), BATCH, "float16")
        n = store.n_images
        done = store.done_batches("extra")
        for b in range(-(-n // BATCH)):
            if done[b]:
                continue
            start, stop = b * BATCH, min((b + 1) * BATCH, n)
            acts = {layer.name: rows(n, layer.name)[start:stop] for layer in LAYERS}
            stats = {"attention_distance": np.full((stop - start, 2, 2), b, np.float32)}
            store.write_batch("extra", b, acts, stats, np.zeros((stop - start, 3, 4, 4), np.float16), [0, 0])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

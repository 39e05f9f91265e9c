"""Time and peak memory of every measure beyond linear CKA, all layer pairs of a store, from one Gram per layer.

For each store and image count n (a seeded subset, engine/measures/grams.py choose_images): read every stored layer of
every model, build each layer's LayerGrams once, then the per-layer parts the measures share -- the spectrum (one
eigh per layer: Procrustes, SVCCA, PWCCA), the kNN masks (k = 10: mknn, CKNNA), the RDM ranks (rsa) -- and then
each measure's joint L x L matrix (within and across models) from those parts. Beside them: vitsee's minibatch
linear CKA (the `cka` view, batches of 256) on the same features, and, at the smallest n, the direct functions
called pair by pair (each call builds both layers' Grams again) on 3 layers, scaled to L x L pairs.

The count lines show the sharing: Gram products, eigendecompositions and kNN sorts are counted by wrapping the
torch calls, and equal the number of layers, not layers^2 x measures. Peak memory is the largest rise of this
process's resident set over the step (sampled every 2 ms), so it counts what the step allocates, not the Grams
already held; "parts held" is the bytes of every LayerGrams with its caches after all steps.

    python benchmarks/measures.py                                  # bench.h5 (32 images) and /tmp/measures_2000.h5
    python benchmarks/measures.py --store S.h5 --sizes 250 500 1000 2000 --threads 1
    python benchmarks/measures.py --build                          # first build /tmp/measures_2000.h5 (~1 min)

Procrustes costs one SVD of an r x r matrix per pair (r <= n): above --procrustes-full images it is timed on the
first two row layers against all columns and scaled to L rows, marked "~".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import torch

from vitsee.measures import grams as mg
from vitsee.measures.registry import measure
from vitsee.analyses.cka import minibatch_cka
from vitsee.store import Store
from vitsee.threads import set_compute_threads

BENCH = Path("/work/fpstores/bench.h5")
BIG = Path("/tmp/measures_2000.h5")
BUILD = [
    "vitsee",
    "extract",
    str(BIG),
    "-m",
    "vit_tiny_patch16_224@random:0",
    "-m",
    "resnet18@random:0",
    "--dataset",
    "synthetic",
    "-n",
    "2000",
    "--img-size",
    "32",
    "--device",
    "cpu",
]
MEASURES = [
    ("linear_cka", {}),
    ("rbf_cka", {}),
    ("procrustes", {}),
    ("svcca", {}),
    ("pwcca", {}),
    ("mknn", {"k": 10}),
    ("cknna", {"k": 10}),
    ("rsa", {}),
]


class PeakRSS:
    """Samples this process's resident set every 2 ms; `rise` is the peak over the start, in MiB."""

    def __init__(self):
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def rise(self) -> float:
        return (self.peak - self.start) / 2**20


COUNTS = {"gram": 0, "eigh": 0, "sort": 0}


@contextmanager
def counted():
    """Counts Gram builds (LayerGrams.from_features), eigendecompositions and sorts while the body runs."""
    eigh, sort, build = torch.linalg.eigh, torch.sort, mg.LayerGrams.from_features.__func__

    def c_eigh(*a, **k):
        COUNTS["eigh"] += 1
        return eigh(*a, **k)

    def c_sort(*a, **k):
        COUNTS["sort"] += 1
        return sort(*a, **k)

    def c_build(cls, *a, **k):
        COUNTS["gram"] += 1
        return build(cls, *a, **k)

    torch.linalg.eigh, torch.sort, mg.LayerGrams.from_features = c_eigh, c_sort, classmethod(c_build)
    try:
        yield
    finally:
        torch.linalg.eigh, torch.sort, mg.LayerGrams.from_features = eigh, sort, classmethod(build)


def timed(fn):
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t0
    return out, wall, mem.rise


def held_bytes(grams) -> int:
    total = 0
    for g in grams:
        tensors = [g.gram, g.v, g.w, g.s]
        for part in g._cache.values():
            tensors += [t for t in (part if isinstance(part, tuple) else (part,)) if isinstance(t, torch.Tensor)]
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


class _Rows(list):
    def append(self, row):
        step, wall, rise, note = row
        print(f"| {step} | {wall:.3f} | {rise:.1f} | {note} |", flush=True)
        super().append(row)


def run(store_path: Path, n: int, procrustes_full: int, per_pair: bool) -> list[tuple]:
    """Prints and returns the table rows (step, wall s, peak rise MiB, note) for n images of the store."""
    rows = _Rows()
    with Store.open(store_path) as store:
        idx, record = mg.choose_images(store.n_images, n, seed=0)
        columns = [(m, layer) for m in store.models for layer in store.layers(m)]
        feats, wall, rise = timed(lambda: [store.activations(m, layer, idx) for m, layer in columns])
    L = len(columns)
    rows.append(("read layers", wall, rise, f"{L} layers, {sum(f[0].size for f in feats)} values a row"))
    for k in COUNTS:
        COUNTS[k] = 0
    with counted():
        names = [f"{m.split('@')[0]}:{layer}" for m, layer in columns]
        grams, wall, rise = timed(lambda: mg.layer_grams(feats, names))
        rows.append(("Grams (fp64, once per layer)", wall, rise, f"n={record['n_images']}, {COUNTS['gram']} Grams"))
        _, wall, rise = timed(lambda: [g.spectrum() for g in grams])
        rows.append(("spectra (eigh, once per layer)", wall, rise, f"{COUNTS['eigh']} eigh"))
        _, wall, rise = timed(lambda: [g.knn(10) for g in grams])
        rows.append(("kNN masks k=10 (once per layer)", wall, rise, f"{COUNTS['sort']} sorts"))
        _, wall, rise = timed(lambda: [g.rdm_ranks() for g in grams])
        rows.append(("RDM ranks (once per layer)", wall, rise, ""))
        before = dict(COUNTS)
        for name, params in MEASURES:
            if name == "procrustes" and n > procrustes_full:
                _, wall, rise = timed(lambda: mg.pairwise(grams[:2], grams, name, **params))
                rows.append((f"{name} all pairs", wall * L / 2, rise, f"~ from 2 x {L} pairs"))
                continue
            _, wall, rise = timed(lambda: mg.pairwise(grams, None, name, **params))
            rows.append((f"{name} all pairs", wall, rise, f"{L} x {L}"))
        shared = {k: COUNTS[k] - before[k] for k in COUNTS}
    rows.append(
        (
            "  Grams / eigh / sorts added by all the pairs",
            0.0,
            0.0,
            f"{shared['gram']} / {shared['eigh']} / {shared['sort']}",
        )
    )
    _, wall, rise = timed(lambda: minibatch_cka(feats, batch_size=min(256, len(idx))))
    rows.append(("vitsee minibatch CKA (batch 256)", wall, rise, "the `cka` view's estimator"))
    rows.append(("parts held (all layers)", 0.0, held_bytes(grams) / 2**20, "MiB, not a rise"))
    if per_pair:  # the direct functions on the first 3 layers' 9 pairs, scaled to L x L
        few = feats[:3]
        for name, params in MEASURES:
            fn = measure(name).direct
            _, wall, rise = timed(lambda: [[fn(a, b, **params) for b in few] for a in few])
            rows.append(
                (f"{name} direct, pair by pair", wall * L * L / 9, rise, "~ from 9 pairs; Grams rebuilt per call")
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, action="append", help="store(s) to time (default: bench.h5 and the 2,000)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000], help="image counts (big store)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    ap.add_argument("--procrustes-full", type=int, default=1000, help="above this n, Procrustes on 2 row layers")
    ap.add_argument("--build", action="store_true", help=f"build {BIG} first: {' '.join(BUILD)}")
    args = ap.parse_args()
    if args.build and not BIG.exists():
        subprocess.run(BUILD, check=True)
    threads = set_compute_threads(args.threads)
    stores = args.store or [p for p in (BENCH, BIG) if p.exists()]
    print(f"torch {torch.__version__}, {threads} thread(s), load average {os.getloadavg()}")
    for path in stores:
        with Store.open(path) as s:
            total = s.n_images
        sizes = [total] if total <= 64 else [n for n in args.sizes if n <= total]
        for i, n in enumerate(sizes):
            print(f"\n### {path.name}, n = {n} images (load average {os.getloadavg()[0]:.1f})\n")
            print("| step | wall s | peak rise MiB | note |\n|---|---:|---:|---|", flush=True)
            run(path, n, args.procrustes_full, per_pair=(i == 0 and n <= 500))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

    python benchmarks/measures.py --compare                        # every direct function against its peers

--compare times each measure's direct function (`vitsee.measures.<name>(x, y)`, what a notebook calls) against the
peers' own code on the same fp64 arrays (benchmarks/peers.py says which code and how it is called), in interleaved
rounds -- per round vitsee and each peer once, the order reversed every other round, so a neighbour's job on the
shared machine falls on all of them -- at n = 500 and 2,000 examples, d = 768 and 9,408 features, one thread and
two. Per round it prints each time and the ratio vitsee / peer (below 1: vitsee is faster), then the ratio's minimum
and median over the rounds against each peer and against the fastest peer (the one of least median time), and the
largest difference between vitsee's value and the peer's. Then linear CKA over all layer pairs, minibatch (the
`cka` view), against pytorch-cka's batched call on benchmarks/cka.py's features. The features: a shared latent
signal of 48 directions with decaying scales seen by both layers, full-rank noise with a decaying spectrum, and a
per-feature offset (what the centring must remove).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import torch

from vitsee.measures import grams as mg
from vitsee.measures.registry import measure
from vitsee.analyses.cka import minibatch_cka
from vitsee.store import Store
from vitsee.threads import set_compute_threads, torch_threads

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


# ----------------------------------------------------------------------------------------------------------------
# --all-pairs: every measure's matrix as `vitsee analyze --measures all` computes it, timed, saved, compared


def spread_layers(store_path: Path, n: int, max_layers: int) -> tuple[list[tuple[str, str]], np.ndarray, list]:
    """Returns (columns, images, features): up to max_layers stored layers spread evenly over the models (model,
    layer), the seeded subset of at most n images, and each layer's activations on them."""
    with Store.open(store_path) as store:
        idx, _ = mg.choose_images(store.n_images, n, seed=0)
        columns = [(m, layer) for m in store.models for layer in store.layers(m)]
        if len(columns) > max_layers:
            columns = [columns[i] for i in np.linspace(0, len(columns) - 1, max_layers).round().astype(int)]
        return columns, idx, [store.activations(m, layer, idx) for m, layer in columns]


def all_pairs(store_path: Path, n: int, max_layers: int, save: Path | None, against: Path | None) -> None:
    """Prints each step's wall time for every measure's (L, L) matrix over up to max_layers layers (spread over the
    models) of n images; saves the matrices to `save` (.npz) and prints the largest difference from `against`'s."""
    from vitsee.measures.registry import REGISTRY

    columns, idx, feats = spread_layers(store_path, n, max_layers)
    ref = dict(np.load(against)) if against else {}
    print(
        f"\n### {store_path.name}: {len(columns)} layers, n = {len(idx)}, {torch.get_num_threads()} thread(s), "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| step | wall s | max abs diff from --against |\n|---|---:|---:|", flush=True)
    total = 0.0
    out = {}
    t0 = time.perf_counter()
    grams = mg.layer_grams(feats, [f"{m}:{layer}" for m, layer in columns])
    wall = time.perf_counter() - t0
    total += wall
    print(f"| Grams | {wall:.2f} | |", flush=True)
    for name in REGISTRY:
        t0 = time.perf_counter()
        out[name] = mg.pairwise(grams, None, name)
        wall = time.perf_counter() - t0
        total += wall
        diff = f"{np.nanmax(np.abs(out[name] - ref[name])):.1e}" if name in ref else ""
        if name == "procrustes" and name in ref:  # arccos(1 - rounding) on the diagonal: see --floor
            off = ~np.eye(len(columns), dtype=bool) & (np.abs(ref[name]) > 1e-6)
            diff = f"{np.nanmax(np.abs(out[name] - ref[name])[off]):.1e} (angles > 1e-6)"
        print(f"| {name} | {wall:.2f} | {diff} |", flush=True)
    print(f"| all | {total:.2f} | |", flush=True)
    if save:
        np.savez(save, **out)


# ----------------------------------------------------------------------------------------------------------------
# --floor: each all-pairs step as it runs today against its least-work form (engine/measures/floor.py)


def floor_steps(store_path: Path, n: int, max_layers: int) -> None:
    """Prints, for up to max_layers stored layers (spread over the models) of n images of the store, each step's
    time today and at its floor, the speed-up and the largest difference of the values (both on one thread)."""
    from vitsee.measures import floor
    from vitsee.measures import kernels as ms
    from vitsee.measures.catalog.procrustes import _scaled_basis as scaled_basis
    from vitsee.measures.catalog.procrustes import angle
    from vitsee.measures.catalog.svcca import reduction

    columns, idx, feats = spread_layers(store_path, n, max_layers)
    L, n = len(columns), len(idx)
    print(f"\n### {store_path.name}: {L} layers, n = {n} (load average {os.getloadavg()[0]:.1f})\n")
    print("| step | today s | floor s | speed-up | max abs diff | note |\n|---|---:|---:|---:|---:|---|", flush=True)

    def row(step, t_old, t_new, diff, note=""):
        print(f"| {step} | {t_old:.2f} | {t_new:.2f} | {t_old / t_new:.1f}x | {diff:.1e} | {note} |", flush=True)

    # Grams: torch's fp64 product (LayerGrams.from_features) against numpy's syrk of the same centred features
    t0 = time.perf_counter()
    grams = mg.layer_grams(feats, [f"{m}:{layer}" for m, layer in columns])
    t1 = time.perf_counter()
    syrk = []
    for f in feats:
        x = np.asarray(f, dtype=np.float64).reshape(n, -1)
        x -= x.mean(axis=0)
        syrk.append(floor.symmetric_product(x))
    t2 = time.perf_counter()
    diff = max(float(np.abs(g.gram.numpy() - k).max() / np.abs(k).max()) for g, k in zip(grams, syrk))
    row("Grams (relative diff)", t1 - t0, t2 - t1, diff, "centring and fp64 conversion in both")

    # spectra: torch eigh (today) against numpy's, compared through the eigenvalues
    t0 = time.perf_counter()
    spectra = [torch.linalg.eigh(g.centred()) for g in grams]
    t1 = time.perf_counter()
    np_spectra = [floor.eigh(g.centred()) for g in grams]
    t2 = time.perf_counter()
    diff = max(float((a[0] - b[0]).abs().max() / a[0].abs().max()) for a, b in zip(spectra, np_spectra))
    row("eigendecompositions (relative diff of eigenvalues)", t1 - t0, t2 - t1, diff)
    ranks = [g.spectrum()[0].shape[1] for g in grams]  # today's spectra, for the pairs below

    # Procrustes: today's padded, batched svdvals against the guarded eigvalsh of the smaller side, same bases
    t0 = time.perf_counter()
    old = mg.pairwise(grams, None, "procrustes")
    t1 = time.perf_counter()
    bases = [scaled_basis(g, 1.0) for g in grams]

    def procrustes_pair(ij):
        i, j = ij
        value, route = floor.nuclear_norm_route(bases[i].T @ bases[j], graded=True)
        return value, route

    pairs = [(i, j) for i in range(L) for j in range(i, L)]
    sims, routes = np.ones((L, L)), {"eigvalsh": 0, "svdvals": 0}
    for (i, j), (v, route) in zip(pairs, floor.run_tasks(procrustes_pair, pairs)):
        sims[i, j] = sims[j, i] = v
        routes[route] += 1
    t2 = time.perf_counter()
    new = np.vectorize(angle)(sims)
    # arccos has infinite slope at 1: for a layer and itself, or two identical layers, the angle is arccos(1 - a
    # rounding) ~ 1e-8 either way; the cosines, and the angles of distinct layers, say how close the routes are
    cos_diff = float(np.abs(np.cos(old) - sims).max())
    apart = np.abs(old) > 1e-6
    row(
        "procrustes, all pairs (rad)",
        t1 - t0,
        t2 - t1,
        float(np.abs(old - new)[apart].max()) if apart.any() else 0.0,
        f"pairs at angle > 1e-6; cosines within {cos_diff:.1e}; {routes['svdvals']} of {len(pairs)} pairs took "
        f"svdvals; ranks {min(ranks)}-{max(ranks)}; identical layers: today "
        f"{np.abs(old[~apart]).max():.1e}, floor {np.abs(new[~apart]).max():.1e}",
    )

    # SVCCA: today's svdvals per pair against nuclear_norm(Ux' Uy) / min(rx, ry)
    t0 = time.perf_counter()
    old = mg.pairwise(grams, None, "svcca")
    t1 = time.perf_counter()
    reduced = [reduction(g, 0.99)[0] for g in grams]

    def svcca_pair(ij):
        i, j = ij
        return floor.nuclear_norm(reduced[i].T @ reduced[j]) / min(reduced[i].shape[1], reduced[j].shape[1])

    new = np.zeros((L, L))
    for (i, j), v in zip(pairs, floor.run_tasks(svcca_pair, pairs)):
        new[i, j] = new[j, i] = v
    t2 = time.perf_counter()
    row(
        "svcca, all pairs",
        t1 - t0,
        t2 - t1,
        float(np.abs(old - new).max()),
        "kept ranks " + str(sorted({r.shape[1] for r in reduced})[:1] + sorted({r.shape[1] for r in reduced})[-1:]),
    )

    # kNN masks: a full sort against topk with the sort's tie rule
    t0 = time.perf_counter()
    masks = [ms.knn_mask(g.cosine(), 10) for g in grams]
    t1 = time.perf_counter()
    indices = [floor.knn_indices(g.cosine(), 10) for g in grams]
    t2 = time.perf_counter()
    same = all(torch.equal(m, floor.mask_from_indices(i, n)) for m, i in zip(masks, indices))
    row("kNN masks, k = 10", t1 - t0, t2 - t1, 0.0 if same else math.inf, f"masks identical: {same}")

    # mknn and CKNNA: dense masks against the k neighbours of each row
    for g in grams:  # today's caches hold the masks already: time the pairs alone
        g.knn(10)
    t0 = time.perf_counter()
    old = mg.pairwise(grams, None, "mknn", k=10)
    t1 = time.perf_counter()
    new = np.array([[floor.mutual_neighbours(indices[i], masks[j]) for j in range(L)] for i in range(L)])
    t2 = time.perf_counter()
    row("mknn, all pairs", t1 - t0, t2 - t1, float(np.abs(old - new).max()))
    t0 = time.perf_counter()
    old = mg.pairwise(grams, None, "cknna", k=10)
    t1 = time.perf_counter()
    cos = [g.cosine() for g in grams]
    own = [floor.cknna_terms(cos[i], cos[i], indices[i], masks[i], masks[i]) for i in range(L)]
    new = np.array(
        [
            [
                floor.cknna_terms(cos[i], cos[j], indices[i], masks[i], masks[j]) / math.sqrt(own[i] * own[j])
                for j in range(L)
            ]
            for i in range(L)
        ]
    )
    t2 = time.perf_counter()
    row("cknna, all pairs", t1 - t0, t2 - t1, float(np.nanmax(np.abs(old - new))), "cosine kernels built in both")


# ----------------------------------------------------------------------------------------------------------------
# --compare: the direct functions against the peers' own code


def synthetic_pair(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns two fp64 layers (n, d) of the same n examples: a shared latent signal with decaying scales, full-rank
    noise whose feature scales decay (a spectrum like a network's), and a per-feature offset."""
    rng = np.random.default_rng(seed)
    latent = 48
    z = rng.normal(size=(n, latent))
    scales = 1.0 / np.sqrt(1.0 + np.arange(latent))

    def layer(signal: np.ndarray) -> np.ndarray:
        x = signal @ (rng.normal(size=(latent, d)) * scales[:, None])
        x += rng.normal(size=(n, d)) * (0.5 / np.sqrt(1.0 + np.arange(d)))  # noise, decaying over features
        x += rng.uniform(0.0, 2.0, size=d)
        return x

    return layer(z), layer(0.8 * z + 0.6 * rng.normal(size=(n, latent)))


COMPARE_PARAMS = {"mknn": {"k": 10}, "cknna": {"k": 10}}


def _threads(n: int):
    """Returns a context that runs torch and the BLAS libraries numpy and scipy load (threadpoolctl) on n threads."""
    from threadpoolctl import threadpool_limits

    class Both:
        def __enter__(self):
            self._blas = threadpool_limits(limits=n)
            self._torch = torch_threads(n)
            self._torch.__enter__()
            return self

        def __exit__(self, *exc):
            self._torch.__exit__(*exc)
            self._blas.unregister() if hasattr(self._blas, "unregister") else self._blas.restore_original_limits()

    return Both()


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else math.nan


def compare_measure(
    name: str, fn, contenders: list[tuple[str, object]], x, y, rounds: int, params: dict, max_call_s: float = math.inf
) -> dict:
    """Times vitsee's fn and each peer on (x, y) in `rounds` interleaved rounds; prints each round; returns the
    summary {peer: (min ratio, median ratio, median peer s, max |value diff|)} and vitsee's median seconds."""
    names = ["vitsee"] + [p for p, _ in contenders]
    fns = dict([("vitsee", fn), *contenders])
    times = {p: [] for p in names}
    values: dict[str, float] = {}
    for r in range(rounds):
        if r and sum(times[p][-1] for p in names if times[p]) > max_call_s:
            print(f"    (no more rounds: one took over {max_call_s:.0f} s)", flush=True)
            break
        order = names if r % 2 == 0 else names[::-1]
        for p in order:
            t0 = time.perf_counter()
            try:
                v = fns[p](x, y, **params)
            except Exception as e:  # a peer that fails is said and left out
                print(f"    {p}: failed ({type(e).__name__}: {str(e)[:120]})", flush=True)
                fns = {q: f for q, f in fns.items() if q != p}
                names = [q for q in names if q != p]
                continue
            times[p].append(time.perf_counter() - t0)
            values.setdefault(p, float(v))
        cells = "  ".join(
            f"{p} {times[p][-1]:.3f}s ({times['vitsee'][-1] / times[p][-1]:.2f}x)" for p in names[1:] if times[p]
        )
        print(f"    round {r + 1}: vitsee {times['vitsee'][-1]:.3f}s  {cells}", flush=True)
    summary = {}
    for p in names[1:]:
        ratios = [a / b for a, b in zip(times["vitsee"], times[p])]
        summary[p] = (min(ratios), _median(ratios), _median(times[p]), abs(values["vitsee"] - values[p]), ratios)
    if summary:
        fastest = min(summary, key=lambda p: summary[p][2])
        for p, (lo, med, sec, diff, _) in summary.items():
            mark = "  <- fastest peer" if p == fastest and len(summary) > 1 else ""
            print(
                f"  {name} vs {p}: ratio min {lo:.2f} median {med:.2f} (vitsee {_median(times['vitsee']):.3f}s, "
                f"{p} {sec:.3f}s), |value diff| {diff:.1e} (vitsee {values['vitsee']:.12g}){mark}",
                flush=True,
            )
    return {"vitsee_s": _median(times["vitsee"]), "peers": summary}


def compare_all_pairs_cka(n: int, vit: int, cnn: int, rounds: int) -> dict | None:
    """Times vitsee's minibatch_cka against pytorch-cka's one joint call on benchmarks/cka.py's vit + cnn layers of n
    images (fp32 features, 3.4 MB an image at 12 + 14: mind the memory; batches of 256), interleaved; prints the
    rounds and returns the summary."""
    import importlib.util

    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("vitsee_bench_cka", Path(__file__).with_name("cka.py"))
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)  # it takes its own folder off sys.path, so `import cka` is pytorch-cka
        feats = bench.synthetic_features(n, bench.layer_shapes(vit, cnn), 0.0, vit, seed=0)
        peer = bench.pytorch_cka_joint(feats, 256, torch.device("cpu"))
    except Exception as e:
        print(f"  pytorch-cka: unavailable ({type(e).__name__}: {e}); pip install -e '.[bench]'")
        return None
    finally:
        sys.path[:] = saved
    ours = lambda: bench.vcka.minibatch_cka(feats, batch_size=256, device="cpu")  # noqa: E731
    return _compare_matrices(ours, peer, rounds)


def _compare_matrices(ours, peer, rounds: int) -> dict:
    times = {"vitsee": [], "pytorch-cka": []}
    outs = {}
    for r in range(rounds):
        order = [("vitsee", ours), ("pytorch-cka", peer)]
        for p, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            outs[p] = np.asarray(fn(), dtype=np.float64)
            times[p].append(time.perf_counter() - t0)
        print(
            f"    round {r + 1}: vitsee {times['vitsee'][-1]:.3f}s  pytorch-cka {times['pytorch-cka'][-1]:.3f}s "
            f"({times['vitsee'][-1] / times['pytorch-cka'][-1]:.2f}x)",
            flush=True,
        )
    ratios = [a / b for a, b in zip(times["vitsee"], times["pytorch-cka"])]
    diff = float(np.abs(outs["vitsee"] - outs["pytorch-cka"]).max())
    print(
        f"  linear CKA all pairs vs pytorch-cka (1 joint call): ratio min {min(ratios):.2f} median "
        f"{_median(ratios):.2f}, max |matrix diff| {diff:.1e} (pytorch-cka computes in fp32)",
        flush=True,
    )
    return {"ratios": ratios, "diff": diff}


def compare(args) -> int:
    """--compare: prints every direct function against its peers at each size and thread count (see the module)."""
    import peers as peer_code  # benchmarks/peers.py, beside this file

    from vitsee import measures as vm

    table, missing = peer_code.peers(args.peers)
    for who, why in missing.items():
        print(f"{who}: unavailable ({why})")
    chosen = args.measures or list(vm.__all__)
    print(f"torch {torch.__version__}, numpy {np.__version__}, cores {os.cpu_count()}, load {os.getloadavg()}")
    worst: dict[tuple, float] = {}
    for threads in args.compare_threads:
        with _threads(threads):
            for n in args.compare_sizes:
                for d in args.compare_dims:
                    x, y = synthetic_pair(n, d)
                    print(f"\n### {threads} thread(s), n = {n}, d = {d} (load average {os.getloadavg()[0]:.1f})")
                    for name in chosen:
                        contenders = [
                            (p, f)
                            for p, f in table.get(name, [])
                            if not (p == "netrep" and d > args.netrep_max_d)  # a (d, d) SVD: minutes to hours
                        ]
                        if not contenders:
                            print(f"  {name}: no peer available")
                            continue
                        out = compare_measure(
                            name,
                            getattr(vm, name),
                            contenders,
                            x,
                            y,
                            args.rounds,
                            COMPARE_PARAMS.get(name, {}),
                            args.max_call_s,
                        )
                        peers_s = {p: v[2] for p, v in out["peers"].items()}
                        fastest = min(peers_s, key=peers_s.get)
                        worst[(threads, n, d, name)] = out["peers"][fastest][1]
                        if any(p == "netrep" for p, _ in table.get(name, [])) and d > args.netrep_max_d:
                            print(
                                f"  (netrep on the raw features not timed at d = {d} > --netrep-max-d: a {d} x {d} SVD)"
                            )
            if args.all_pairs_cka:
                vit, cnn = (int(v) for v in args.cka_layers.split(","))
                print(f"\n### {threads} thread(s): linear CKA, all pairs of {vit}+{cnn} layers, n = {args.cka_n}")
                out = compare_all_pairs_cka(args.cka_n, vit, cnn, args.rounds)
                if out:
                    worst[(threads, args.cka_n, f"{vit}+{cnn} layers", "linear CKA all pairs")] = _median(out["ratios"])
    print("\n### median ratio against the fastest peer (vitsee / peer; at or below 1.00: vitsee as fast or faster)\n")
    print("| threads | n | d | measure | median ratio |\n|---:|---:|---:|---|---:|")
    for (threads, n, d, name), ratio in worst.items():
        print(f"| {threads} | {n} | {d} | {name} | {ratio:.2f} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, action="append", help="store(s) to time (default: bench.h5 and the 2,000)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000], help="image counts (big store)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    ap.add_argument("--procrustes-full", type=int, default=1000, help="above this n, Procrustes on 2 row layers")
    ap.add_argument("--build", action="store_true", help=f"build {BIG} first: {' '.join(BUILD)}")
    ap.add_argument("--compare", action="store_true", help="direct functions against the peers' own code")
    ap.add_argument("--compare-sizes", type=int, nargs="+", default=[500, 2000], help="n for --compare")
    ap.add_argument("--compare-dims", type=int, nargs="+", default=[768, 9408], help="d for --compare")
    ap.add_argument("--compare-threads", type=int, nargs="+", default=[1, 2], help="thread counts for --compare")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measure and size (--compare)")
    ap.add_argument("--measures", nargs="+", help="only these measures (--compare)")
    ap.add_argument("--peers", type=Path, default=Path("/work/.mirror"), help="where the fetched peer repositories are")
    ap.add_argument("--netrep-max-d", type=int, default=4096, help="largest d netrep's (d, d) SVD is timed at")
    ap.add_argument("--cka-n", type=int, default=512, help="images of the all-pairs CKA comparison (--compare)")
    ap.add_argument("--cka-layers", default="12,14", help="ViT-like,ResNet-like layers of it (benchmarks/cka.py)")
    ap.add_argument("--max-call-s", type=float, default=120.0, help="one round only where a round took longer")
    ap.add_argument("--no-all-pairs-cka", dest="all_pairs_cka", action="store_false", help="skip pytorch-cka")
    ap.add_argument("--floor", action="store_true", help="each all-pairs step today against its floor (--store)")
    ap.add_argument("--max-layers", type=int, default=12, help="layers of the store --floor takes (spread)")
    ap.add_argument("--all-pairs", action="store_true", help="every measure's matrix on --store, timed")
    ap.add_argument("--save", type=Path, help="--all-pairs: save the matrices here (.npz)")
    ap.add_argument("--against", type=Path, help="--all-pairs: the largest difference from these matrices")
    args = ap.parse_args()
    if args.all_pairs:
        set_compute_threads(args.threads)
        for path in args.store or [BIG]:
            for n in args.sizes:
                all_pairs(path, n, args.max_layers, args.save, args.against)
        return 0
    if args.floor:
        from vitsee.measures.floor import one_thread

        set_compute_threads(1)
        with one_thread():  # torch and numpy's OpenBLAS alike: two OpenBLAS threads beside a busy core ran 25x slower
            for path in args.store or [BIG]:
                for n in args.sizes:
                    floor_steps(path, n, args.max_layers)
        return 0
    if args.compare:
        return compare(args)
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

"""Linear probes against CKA on the same store: the probes/CKA time ratio (target: at most 3x).

The store of issue 10: 32 synthetic images through mixer_b16_224 with random weights at 224 px (196 tokens x
768 channels per layer), its stem, 12 blocks and norm by default. Both analyses run through the store runners, as
`vitsee analyze --probes` and `vitsee analyze --cka` do (recompute on: nothing is read from the cache):
- probes: CLS-free readouts (GAP) and per-token probes of every layer, the L2 chosen on a held-out part;
- cka: the within-model L x L minibatch CKA.
They run in turns (best of --repeats, each with a --budget-s cap) because the development machine is shared and
its wall clock moves with the neighbours. The store is built once and kept (--store) so reruns time only the
analyses.

    python benchmarks/probes.py                       # 32 images, blocks, cpu
    python benchmarks/probes.py --layers sublayers    # the app's 32-image sublayers store
    python benchmarks/probes.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from vitsee.analyses import probes
from vitsee.analyses.cka import run_cka
from vitsee.analyses.probes import estimate_probe_seconds, run_probes
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.store import Store
from vitsee.threads import set_compute_threads, task_workers

TARGET = 3.0
# What `--layers blocks` means for MLP-Mixer (issue 10, section 4), spelled out for timm's module paths.
MIXER_BLOCKS = ",".join(["stem"] + [f"blocks.{i}" for i in range(12)] + ["norm"])


def build_store(path: Path, model: str, n_images: int, img_size: int, layers: str, device: str) -> None:
    """Extract the benchmark store unless a complete one is already at path."""
    if path.exists():
        with Store.open(path) as store:
            if store.complete and store.n_images == n_images:
                return
    t0 = time.perf_counter()
    layer_arg = layers if layers in ("blocks", "sublayers") else layers.split(",")
    run_extraction(
        ExtractConfig(
            store=path,
            models=[model],
            dataset="synthetic",
            n_images=n_images,
            batch_size=16,
            img_size=img_size,
            layers=layer_arg,
            device=device,
            overwrite=True,
            force=True,
        )
    )
    print(f"extracted {path} in {time.perf_counter() - t0:.0f} s", flush=True)


def time_analyses(path: Path, cfg: AnalyzeConfig, repeats: int, budget_s: float) -> dict[str, float]:
    """Return {analysis: best wall seconds}, the two analyses run in turns."""
    runs = {"cka": lambda store: run_cka(store, cfg), "probes": lambda store: run_probes(store, store.models[0], cfg)}
    best = dict.fromkeys(runs, float("inf"))
    used = dict.fromkeys(runs, 0.0)
    for _ in range(max(1, repeats)):
        for name, run in runs.items():
            if used[name] > budget_s:
                continue
            with Store.writer(path) as store:
                t0 = time.perf_counter()
                run(store)
                seconds = time.perf_counter() - t0
            used[name] += seconds
            best[name] = min(best[name], seconds)
            print(f"  {name}: {seconds:.2f} s", flush=True)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mixer_b16_224@random:0")
    p.add_argument("--n-images", type=int, default=32)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument(
        "--layers", default=MIXER_BLOCKS, help="blocks | sublayers | NAME,NAME (default: stem, the 12 blocks, norm)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--store", type=Path, default=None, help="where to keep the store (default: a temp folder)")
    p.add_argument(
        "--space",
        default="auto",
        choices=["auto", "primal", "dual"],
        help="force the probes' solve space; primal is how every probe was solved before the dual form",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: as vitsee analyze picks them)")
    p.add_argument("--repeats", type=int, default=3, help="best of this many interleaved runs (default 3)")
    p.add_argument("--budget-s", type=float, default=120.0, help="no more repeats once an analysis used this long")
    args = p.parse_args()

    set_compute_threads(args.threads)  # what `vitsee analyze` does first
    path = args.store or Path(tempfile.gettempdir()) / f"vitsee-bench-probes-{len(args.layers)}-{args.n_images}.h5"
    build_store(path, args.model, args.n_images, args.img_size, args.layers, args.device)
    with Store.open(path) as store:
        key = store.models[0]
        shapes = {tuple(store.layer_shape(key, layer)) for layer in store.layers(key)}
        n_layers = len(store.layers(key))
    print(
        f"{args.model}, {args.n_images} images at {args.img_size} px, {n_layers} layers {sorted(shapes)}, "
        f"{args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, {task_workers()} task workers, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    if args.space != "auto":
        probes.solve_space = lambda n_examples, n_features: args.space  # what new_accumulator asks
    cfg = AnalyzeConfig(device=args.device, recompute=True)
    with Store.open(path) as store:
        estimate = estimate_probe_seconds(store, key, cfg)
    best = time_analyses(path, cfg, args.repeats, args.budget_s)
    ratio = best["probes"] / best["cka"]
    print(
        f"probes ({args.space}) {best['probes']:.2f} s (estimated beforehand: {estimate:.1f} s), "
        f"cka {best['cka']:.2f} s: "
        f"probes/CKA {ratio:.1f}x (target: at most {TARGET:g}x); load average {os.getloadavg()[0]:.2f}"
    )
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

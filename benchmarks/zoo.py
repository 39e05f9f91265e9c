"""A zoo's extraction against its size: 4, 8 and 16 small models over the same 512 images; and what the zoo's
permutation null (1,000 permutations) and jackknife intervals cost against the zoo itself.

Each zoo is extracted as a zoo is (`vitsee extract --grams`: each layer's per-batch Gram, no activations) in a
subprocess of its own, once under a memory budget (models in waves, a few resident at a time) and once with the default
budget (everything fits: one pass, every model resident), and the table gives the time, the child's peak RSS (wait4's
rusage), the child's CPU seconds (user + system: what the machine's other load moves least) and the store's size on
disk, then the time of the all-pairs CKA from the stored Grams (in this process).

The models are small timm architectures of eight kinds (ViT, DeiT, Swin, Mixer, ResNet, ResNetV2, ConvNeXt, a deep
narrow ViT) at 32 px, random init, 15-45 MB of weights each; the 16-model zoo is the eight with seeds 0 and 1.
They are registered in timm under names of their own in each child (the same code), so extraction builds them by name.

    python benchmarks/zoo.py                       # 4, 8, 16 models; the stores in a temporary folder
    python benchmarks/zoo.py --sizes 4 16 --budget 200M --keep /tmp/zoos

Targets: extraction time linear in the models (seconds per model flat), peak RSS in waves flat (16 within 1.2x of 4).
The exit status is 1 when the peak RSS in waves at the largest zoo is more than 20% above the smallest's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMG = 32
ARCHS = ("vit", "resnet", "swin", "mixer", "deit", "resnetv2", "convnext", "vitdeep")  # the first four: four families


def register() -> None:
    """Registers the eight small architectures in the timm module of their family."""
    import importlib

    import timm
    from timm.models import register_model
    from timm.models.mlp_mixer import _create_mixer

    def make(variant, **fixed):
        return lambda **kw: timm.create_model(variant, **{**fixed, **kw})

    archs = {
        "vit_zoo_bench": (
            "vision_transformer",
            make("vit_small_patch16_224", patch_size=8, embed_dim=256, depth=6, num_heads=4),
        ),
        "deit_zoo_bench": (
            "deit",
            make("deit_tiny_distilled_patch16_224", patch_size=8, embed_dim=256, depth=6, num_heads=4),
        ),
        "vitdeep_zoo_bench": (
            "vision_transformer",
            make("vit_small_patch16_224", patch_size=8, embed_dim=160, depth=12, num_heads=4),
        ),
        "swin_zoo_bench": (
            "swin_transformer",
            make("swin_tiny_patch4_window7_224", embed_dim=96, depths=(2, 6), num_heads=(3, 6), window_size=4),
        ),
        "mixer_zoo_bench": (
            "mlp_mixer",
            lambda **kw: _create_mixer("mixer_s16_224", **{"patch_size": 8, "num_blocks": 6, "embed_dim": 384, **kw}),
        ),
        "resnet_zoo_bench": ("resnet", make("resnet18")),
        "resnetv2_zoo_bench": ("resnetv2", make("resnetv2_18")),
        "convnext_zoo_bench": ("convnext", make("convnext_femto")),
    }
    for name, (module, build) in archs.items():
        if timm.is_model(name):
            continue
        mod = importlib.import_module(f"timm.models.{module}")

        def entry(pretrained=False, build=build, **kwargs):
            return build(**kwargs)

        entry.__name__, entry.__qualname__, entry.__module__ = name, name, mod.__name__
        register_model(entry)


def zoo(n: int) -> list[str]:
    """Returns the specs of an n-model zoo: the eight architectures in ARCHS order with seed 0, then with seed 1."""
    specs = [f"{a}_zoo_bench@random:{seed}" for seed in (0, 1) for a in ARCHS]
    if n > len(specs):
        raise SystemExit(f"at most {len(specs)} models")
    return specs[:n]


def child(store: str, n: int, budget: str | None, images: int, batch: int) -> None:
    """Extracts the n-model zoo into store (in this process) and prints what it did as JSON."""
    register()
    from vitsee.extraction.extract import ExtractConfig, run_extraction
    from vitsee.extraction.plan import parse_bytes
    from vitsee.threads import set_compute_threads

    set_compute_threads(None)
    t0 = time.perf_counter()
    result = run_extraction(
        ExtractConfig(
            store=store,
            models=zoo(n),
            dataset="synthetic",
            n_images=images,
            batch_size=batch,
            img_size=IMG,
            device="cpu",
            workers=0,
            grams=True,
            memory_budget=parse_bytes(budget) if budget else None,
        )
    )
    waves = next((m.split("they run in ")[1].split(" waves")[0] for m in result.messages if "they run in" in m), "1")
    print(json.dumps({"seconds": time.perf_counter() - t0, "waves": int(waves)}))


def run_child(args: list[str]) -> tuple[dict, float, float]:
    """Runs this script as a child; returns (what it printed, its peak RSS in MB, its CPU seconds, user + system)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"zoo {' '.join(args)} failed:\n{proc.stderr.read().decode()}")
    out = json.loads(proc.stdout.read().decode().strip().splitlines()[-1])
    return out, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime  # ru_maxrss: KiB on Linux


def disk_mb(store: Path) -> float:
    files = [store, *(p for p in Path(f"{store}.d").rglob("*.h5"))]
    return sum(p.stat().st_size for p in files if p.exists()) / 1e6


def pairs_seconds(store: Path) -> tuple[float, int]:
    """Returns (seconds, layers) of the all-pairs CKA of every stored layer from the store's Grams."""
    from vitsee.analyses.cka import cka_from_grams
    from vitsee.store import Store

    with Store.open(store) as s:
        columns = [(m, layer) for m in s.models for layer in s.layers(m)]
        t0 = time.perf_counter()
        cka_from_grams(s, columns).result()
        return time.perf_counter() - t0, len(columns)


def zoo_seconds(store: Path, permutations: int, level: float) -> float:
    """Returns the seconds of `vitsee analyze --zoo` on a copy of the store: its CKA from the Grams and the summaries,
    plus the null's pass with `permutations` and the intervals' pass at `level` (0: none)."""
    from vitsee.analyses.config import AnalyzeConfig
    from vitsee.analyses.driver import run_analyses
    from vitsee.store import copy_store

    work = copy_store(store, store.with_name(f"{store.stem}-z{permutations}-{level:g}.h5"))
    try:
        cfg = AnalyzeConfig(
            device="cpu",
            ci=level,
            permutations=0,
            any_cka_estimate=True,  # the streamed CKA, as `vitsee analyze --zoo` takes it
            options={"zoo_permutations": permutations},
        )
        t0 = time.perf_counter()
        run_analyses(work, ["zoo"], cfg)
        return time.perf_counter() - t0
    finally:
        work.unlink(missing_ok=True)
        shutil.rmtree(f"{work}.d", ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--budget", default="160M", help="the memory budget of the waves (default 160M)")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-one-pass", action="store_true", help="skip the runs with every model resident")
    parser.add_argument(
        "--null", type=int, default=1000, help="permutations of the zoo's null timed on the waves' store (0: none)"
    )
    parser.add_argument("--keep", type=Path, help="folder to keep the stores in (default: a temporary one)")
    parser.add_argument("--child", nargs=5, metavar=("STORE", "N", "BUDGET", "IMAGES", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        store, n, budget, images, batch = args.child
        child(store, int(n), None if budget == "-" else budget, int(images), int(batch))
        return 0

    register()
    import torch

    from vitsee.models.load import load_model

    sizes = {
        a: sum(
            p.numel() * p.element_size() for p in load_model(f"{a}_zoo_bench@random:0", img_size=IMG).model.parameters()
        )
        / 1e6
        for a in ARCHS
    }
    folder = args.keep or Path(tempfile.mkdtemp(prefix="vitsee-zoo-"))
    folder.mkdir(parents=True, exist_ok=True)
    floor, floor_cpu = run_child_floor()
    print(
        f"zoos of small models over {args.images} synthetic images at {IMG} px, batches of {args.batch_size}, "
        f"`extract --grams`, CPU, torch {torch.__version__}; weights (MB): "
        + ", ".join(f"{a} {mb:.0f}" for a, mb in sizes.items())
    )
    print(
        f"importing torch and vitsee alone: {floor:.0f} MB peak RSS, {floor_cpu:.1f} CPU s (left out of CPU s/model); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'models':>6} {'run':>24} {'waves':>5} {'extract s':>9} {'s/model':>7} {'CPU s':>6} {'CPU s/model':>11} "
        f"{'peak RSS MB':>11} {'disk MB':>8} {'pairs s':>7} {'layers':>6}"
    )
    peaks = []
    for n in args.sizes:
        runs = [("waves", args.budget)] + ([] if args.no_one_pass else [("one pass", "-")])
        for label, budget in runs:
            store = folder / f"zoo-{n}-{label.replace(' ', '')}.h5"
            out, peak, cpu = run_child([str(store), str(n), budget, str(args.images), str(args.batch_size)])
            pairs, layers = pairs_seconds(store)
            if label == "waves":
                peaks.append(peak)
            name = f"{label} (budget {budget})" if budget != "-" else "one pass (all resident)"
            print(
                f"{n:>6} {name:>24} {out['waves']:>5} {out['seconds']:>9.1f} {out['seconds'] / n:>7.2f} {cpu:>6.1f} "
                f"{(cpu - floor_cpu) / n:>11.2f} {peak:>11.0f} "
                f"{disk_mb(store):>8.1f} {pairs:>7.2f} {layers:>6}  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            if label == "waves" and args.null:
                bare = zoo_seconds(store, 0, 0.0)
                null = zoo_seconds(store, args.null, 0.0)
                both = zoo_seconds(store, args.null, 0.95)
                itself = out["seconds"] + pairs
                print(
                    f"{'':>6} zoo summaries {bare:.2f} s; with a {args.null}-permutation null {null:.2f} s "
                    f"(the null {null - bare:.2f} s = {(null - bare) / itself:.2f}x the zoo itself, extraction + "
                    f"pairs {itself:.1f} s; target <= 2x); null and jackknife intervals {both:.2f} s "
                    f"({(both - bare) / itself:.2f}x)",
                    flush=True,
                )
            if args.keep is None:
                store.unlink()
                shutil.rmtree(f"{store}.d", ignore_errors=True)
    growth = peaks[-1] / peaks[0] - 1
    print(f"peak RSS in waves at {args.sizes[-1]} models vs {args.sizes[0]}: {growth:+.1%} (target: within +20%)")
    return 0 if growth <= 0.20 else 1


def run_child_floor() -> tuple[float, float]:
    """Returns (peak RSS in MB, CPU seconds) of a child that only imports what extraction imports."""
    proc = subprocess.Popen([sys.executable, "-c", "import vitsee.extraction.extract, vitsee.cli, timm, torch"])
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())

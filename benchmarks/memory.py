"""Peak memory of `vitsee analyze` against the number of images: it must not grow (within 20%).

Builds stores of 1k, 4k and 16k images with synthetic features shaped like a small ViT (8 stored layers of
65 tokens x 64 channels, 6 blocks x 12 heads of attention distances, 6 blocks x 65 tokens of skip ratios,
labels, a 3 x 64 x 64 input), written straight through the store API, then runs each analysis of `vitsee
analyze` in its own subprocess and reads that child's peak resident set size from wait4's rusage.

    python benchmarks/memory.py                      # 1k, 4k, 16k images; stores in a temporary folder
    python benchmarks/memory.py --sizes 1000 4000 --keep /tmp/stores

The exit status is 1 when the peak at the largest size is more than 20% above the smallest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vitsee import store as store_mod
from vitsee.store import ArraySpec, LayerSpec, Store

BLOCKS, HEADS, GRID, PATCH, DIM, CLASSES = 6, 12, 8, 8, 64, 10
TOKENS = 1 + GRID * GRID
ANALYSES = ("cka", "attention", "probes", "skip", "spatial")


def fake_vit_record(key: str = "fake_vit@random:0") -> dict:
    """Returns the metadata of a ViT-like model as extraction records it (grid 8x8 of 8 px, 1 CLS token)."""
    return {
        "key": key,
        "spec": key,
        "name": "fake_vit",
        "tag": None,
        "timm_name": "fake_vit",
        "family": "vit",
        "grid_size": [GRID, GRID],
        "patch_size": [PATCH, PATCH],
        "num_prefix_tokens": 1,
        "num_blocks": BLOCKS,
        "num_heads": HEADS,
        "data_config": {"input_size": [3, GRID * PATCH, GRID * PATCH]},
        "extra": {},
        "weights": {"kind": "random", "seed": 0, "path": None, "sha256": None, "source": "benchmarks/memory.py"},
        "transform": "synthetic",
        "layers_arg": "blocks",
        "dtype": "float16",
    }


def build_store(path: Path, n_images: int, batch_size: int = 256, seed: int = 0) -> Path:
    """Writes a complete synthetic store of n images at path (batch by batch, like extraction)."""
    record = fake_vit_record()
    layers = [LayerSpec("patch_embed", (GRID * GRID, DIM), 0, "patch_embed")]
    layers += [LayerSpec(f"blocks.{i}", (TOKENS, DIM), 1, f"blocks.{i}") for i in range(BLOCKS)]
    layers += [LayerSpec("norm", (TOKENS, DIM), 1, "norm")]
    stats = [
        ArraySpec("attention_distance", (BLOCKS, HEADS)),
        ArraySpec("attention_distance_renorm", (BLOCKS, HEADS)),
        ArraySpec("skip_ratio_attn", (BLOCKS, TOKENS)),
        ArraySpec("skip_ratio_mlp", (BLOCKS, TOKENS)),
    ]
    labels = np.arange(n_images) % CLASSES
    with store_mod.creating(path, overwrite=True) as h5:
        store_mod.write_images(
            h5, f"synthetic-features:{seed}", np.arange(n_images), labels, [f"class {c}" for c in range(CLASSES)], None
        )
        store_mod.add_model_layout(
            h5, record, layers, stats, (3, GRID * PATCH, GRID * PATCH), batch_size, "float16", n_images
        )
    rng = np.random.default_rng(seed)
    class_dirs = rng.standard_normal((CLASSES, DIM)).astype(np.float32)
    mixing = rng.standard_normal((len(layers), DIM, DIM)).astype(np.float32) / np.sqrt(DIM)
    with Store.writer(path) as store:
        for b in range(-(-n_images // batch_size)):
            rows = np.arange(b * batch_size, min((b + 1) * batch_size, n_images))
            m = len(rows)
            r = np.random.default_rng([seed, b])
            x = r.standard_normal((m, TOKENS, DIM), dtype=np.float32) + class_dirs[labels[rows]][:, None, :]
            acts = {}
            for i, layer in enumerate(layers):
                x = np.tanh(x @ mixing[i]) + 0.5 * x  # each layer a mix of the one before: CKA has structure
                acts[layer.name] = (x[:, 1:] if layer.name == "patch_embed" else x).astype(np.float16)
            dist = r.uniform(5, 60, (m, BLOCKS, HEADS)).astype(np.float32)
            stat = {
                "attention_distance": dist,
                "attention_distance_renorm": dist * 1.1,
                "skip_ratio_attn": r.uniform(0.5, 5, (m, BLOCKS, TOKENS)).astype(np.float32),
                "skip_ratio_mlp": r.uniform(0.5, 5, (m, BLOCKS, TOKENS)).astype(np.float32),
            }
            pixels = r.standard_normal((m, 3, GRID * PATCH, GRID * PATCH), dtype=np.float32).astype(np.float16)
            store.write_batch(record["key"], b, acts, stat, pixels, [0] * len(layers))
    return path


def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """Runs a command; returns (its peak RSS in MB, seconds). Fails loudly if the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr.read().decode()}")
    return usage.ru_maxrss / 1024, seconds  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--analyses", nargs="+", default=list(ANALYSES), choices=ANALYSES)
    parser.add_argument("--keep", type=Path, help="folder to keep the stores in (default: a temporary one)")
    args = parser.parse_args()

    vitsee = [sys.executable, "-m", "vitsee.cli"]
    folder = args.keep or Path(tempfile.mkdtemp(prefix="vitsee-memory-"))
    folder.mkdir(parents=True, exist_ok=True)
    floor, _ = peak_rss_mb([sys.executable, "-c", "import vitsee.cli, vitsee.analyses.driver, torch"])
    print(
        f"peak RSS of `vitsee analyze STORE --<analysis> --device cpu` (MB; one subprocess each); "
        f"importing torch and vitsee alone: {floor:.0f} MB"
    )
    print(
        f"{'images':>7} {'store':>9} {'build s':>8} "
        + " ".join(f"{a:>10}" for a in args.analyses)
        + f" {'peak':>8} {'analyze s':>10}"
    )
    peaks = []
    for n in args.sizes:
        path = folder / f"memory-{n}.h5"
        t0 = time.perf_counter()
        build_store(path, n)
        build = time.perf_counter() - t0
        row, total_s = [], 0.0
        for analysis in args.analyses:
            mb, s = peak_rss_mb(
                [*vitsee, "analyze", str(path), f"--{analysis}", "--device", "cpu", "--quiet", "--recompute"]
            )
            row.append(mb)
            total_s += s
        peaks.append(max(row))
        size_mb = path.stat().st_size / 1e6
        print(
            f"{n:>7} {size_mb:>7.0f}MB {build:>8.1f} "
            + " ".join(f"{v:>10.0f}" for v in row)
            + f" {peaks[-1]:>8.0f} {total_s:>10.1f}",
            flush=True,
        )
        if args.keep is None:
            path.unlink()
    growth = peaks[-1] / peaks[0] - 1
    print(
        f"peak at {args.sizes[-1]} images vs {args.sizes[0]}: {growth:+.1%} (target: within +20%); "
        f"above the import floor: {peaks[0] - floor:.0f} MB -> {peaks[-1] - floor:.0f} MB"
    )
    return 0 if growth <= 0.20 else 1


if __name__ == "__main__":
    sys.exit(main())

"""One process against torchrun with N: wall time of `vitsee extract` and `vitsee analyze --cka`, as a user
runs them (process start, model loading, the pass, stitching the shards / all-reducing the sums), and the
largest difference between the two CKA matrices.

    python benchmarks/distributed.py                       # 2 processes, CPU (gloo), vit_tiny + resnet18
    python benchmarks/distributed.py --nproc 8 --device cuda --n-images 10240 --batch-size 256 --img-size 224

torchrun gives each process OMP_NUM_THREADS=1 unless it is set; the one-process run keeps torch's default
(every core), so on a CPU box the comparison is N processes x 1 thread against 1 process x all threads.
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

from vitsee.analyses.cka import cka_params
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.store import Store


def timed(cmd: list[str]) -> float:
    """Runs a command; returns its wall time in seconds (and fails loudly if it fails)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["vit_tiny_patch16_224@random:0", "resnet18@random:0"])
    parser.add_argument("--n-images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--img-size", type=int, default=112)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shuffles", type=int, default=1)
    args = parser.parse_args()

    vitsee = str(Path(sys.executable).with_name("vitsee"))
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.nproc),
        "--no-python",
        vitsee,
    ]
    folder = Path(tempfile.mkdtemp(prefix="vitsee-distributed-"))
    run = [arg for m in args.models for arg in ("--model", m)] + [
        "--dataset",
        "synthetic",
        "--n-images",
        str(args.n_images),
        "--batch-size",
        str(args.batch_size),
        "--img-size",
        str(args.img_size),
        "--device",
        args.device,
        "--quiet",
    ]
    cka = [
        "--cka",
        "--shuffles",
        str(args.shuffles),
        "--batch-size",
        str(args.batch_size),
        "--device",
        args.device,
        "--quiet",
    ]

    one, many = folder / "one.h5", folder / "many.h5"
    rows = [
        ("extract", timed([vitsee, "extract", str(one), *run]), timed([*torchrun, "extract", str(many), *run])),
        ("analyze --cka", timed([vitsee, "analyze", str(one), *cka]), timed([*torchrun, "analyze", str(many), *cka])),
    ]
    cfg = AnalyzeConfig(batch_size=args.batch_size, shuffles=args.shuffles)
    with Store.open(one) as a, Store.open(many) as b:
        diff = np.abs(
            a.get_result("cka", cka_params(a, cfg))["matrix"] - b.get_result("cka", cka_params(b, cfg))["matrix"]
        ).max()
    models = " + ".join(m.split("@")[0] for m in args.models)
    print(
        f"{models}, {args.n_images} synthetic images, batch {args.batch_size}, {args.img_size} px, {args.device}, "
        f"{os.cpu_count()} cores"
    )
    print(f"{'command':<16} {'1 process s':>12} {f'{args.nproc} processes s':>14} {'speed-up':>9}")
    for name, t1, tn in rows:
        print(f"{name:<16} {t1:>12.1f} {tn:>14.1f} {t1 / tn:>8.2f}x")
    print(f"max |CKA(1 process) - CKA({args.nproc} processes)| = {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time all-pairs minibatch CKA: vitsee against published PyTorch CKA packages and a naive per-pair loop.

The job (the paper's Fig. 1 + Fig. 2 in one): the joint L x L CKA matrix of a ViT-tiny-like model (12 block
outputs of 197 tokens x 192 channels) stacked with a ResNet-like model (14 maps: a stem and residual blocks of four
stages at a 112-px input, 64x28x28 .. 512x4x4), over n synthetic images in consecutive batches of 256, linear
kernel, unbiased HSIC summed over batches (Nguyen et al. 2021). The within-ViT, within-CNN and ViT-vs-CNN matrices
are its blocks. Features are synthetic but shaped like activations: a low-rank per-image signal that drifts with
depth plus noise, a large position-embedding term shared by every image and two outlier channels in the ViT-like
layers, non-negative post-ReLU maps with positive offsets in the CNN-like layers; --offset adds a constant to every
unit (a stress test for fp32 cancellation).

Methods, all given the same fp32 features already on --device, all computing the same 26 x 26 matrix:
- vitsee: vitsee.analyses.cka.minibatch_cka (per batch: each layer's Gram once, all pairs in one product).
- pytorch-cka (PyPI `pytorch-cka`, imports as `cka`), called as its README shows:
  `compute_cka(model1, model2, loader, layers=..., model2_layers=..., device=..., progress=False)`. It wants
  models and a DataLoader, so the precomputed features sit in modules of identity-like submodules that return a
  zero-copy slice of their layer for the batch of image indices the DataLoader (shuffle=False) yields.
  "3 calls": ViT-ViT, CNN-CNN and ViT-CNN, the README's way to the paper's Fig. 1 and 2 (each Gram twice).
  "1 joint call": one module holding all 26 layers passed as both models, its own fast path for a model
  against itself (one forward, each Gram once): the best case for it, not shown in its README.
- torch-cka (PyPI `torch-cka`, AntixK's PyTorch-Model-Compare): `CKA(model, model, ...).compare(loader)` then
  `export()["CKA"]`, as its README shows, on the joint replay module. Its tqdm output is swallowed.
- naive: per batch, per layer pair (upper triangle), centre both layers, rebuild both Grams, Song's formula.
ckatorch (PyPI `ckatorch`) is not timed: its CKA class computes HSIC across the tokens of each image (a bmm over
the second axis) and keeps only the last batch's value, so it does not compute this quantity.
The reference is a plain numpy float64 loop (per batch: fp64 Grams, Song's explicit formula per pair).

Run:  python benchmarks/cka.py            (n=1024, batch 256, 12+14 layers, cpu)
      python benchmarks/cka.py --quick    (a small job, a few seconds a method)
      python benchmarks/cka.py --accuracy (vitsee's error for each Gram / pair-product precision)
      python benchmarks/cka.py --busy-core --layers 12,8 --skip-slow
                                          (idle, then one core kept busy by a spinning process this script
                                          starts and stops: torch's default threads against what
                                          set_compute_threads() sets up, task workers included)
      python benchmarks/cka.py --stats    (vitsee alone: with 95% jackknife intervals and 99-permutation p-values
                                           against without; the defaults of `vitsee analyze`, target <= 1.5x)
Needs the bench extra: pip install -e '.[bench]'. A package that fails to import is reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# This file is called cka.py and pytorch-cka's package is called `cka`: keep `import cka` from finding this file.
_here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _here]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from vitsee.analyses import cka as vcka  # noqa: E402

# Dense peak TFLOP/s for the products vitsee runs (fp32 without TF32 for the Grams, fp64 tensor cores for the
# pair product: the two are equal on these cards), boost clock, from NVIDIA's datasheets. First match wins.
PEAK_TFLOPS = [
    ("H200 NVL", 60.0),
    ("H200", 67.0),
    ("H100 NVL", 60.0),
    ("H100 PCIe", 51.0),
    ("H100", 67.0),
    ("A100", 19.5),
]


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    vit_layers, cnn_layers = (int(v) for v in args.layers.split(","))
    shapes = layer_shapes(vit_layers, cnn_layers)
    torch.manual_seed(0)
    print(
        f"job: {vit_layers} ViT-like + {cnn_layers} ResNet-like layers = {len(shapes)} x {len(shapes)} CKA, "
        f"n={args.n}, batch={args.batch_size}, offset={args.offset}, device={device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    feats = synthetic_features(args.n, shapes, args.offset, vit_layers, seed=0)
    print(f"features: {sum(f.numel() for f in feats) * 4 / 2**30:.2f} GiB fp32")

    if args.stats:
        feats = [f.to(device) for f in feats]
        bs = args.batch_size
        methods = {
            "vitsee minibatch_cka": lambda: vcka.minibatch_cka(feats, batch_size=bs, device=device),
            STATS_METHOD: lambda: vitsee_with_stats(feats, bs, device, args.permutations),
        }
        timings = round_robin(methods, device, args.repeats, args.budget_s)
        plain, with_stats = timings["vitsee minibatch_cka"], timings[STATS_METHOD]
        same = np.array_equal(plain[2], with_stats[2])
        print(f"\n{'method':<40} {'seconds':>9} {'cpu-s':>8}")
        for name, (seconds, cpu, _) in timings.items():
            print(f"{name:<40} {seconds:>9.3f} {cpu:>8.2f}")
        print(
            f"with statistics / without: {with_stats[0] / plain[0]:.2f}x wall, {with_stats[1] / plain[1]:.2f}x CPU "
            f"(target <= 1.5x); CKA values bit-identical: {same}"
        )
        return
    t0 = time.perf_counter()
    ref = reference_cka(feats, args.batch_size)
    print(f"fp64 numpy reference: {time.perf_counter() - t0:.1f} s")
    feats = [f.to(device) for f in feats]

    if args.accuracy:
        accuracy_table(feats, args.batch_size, device, ref)
        return
    if args.busy_core:
        busy_core_table(feats, vit_layers, args.batch_size, device, args.repeats, args.budget_s)
        return

    bs = args.batch_size
    methods: dict[str, Callable[[], np.ndarray]] = {
        "vitsee minibatch_cka": lambda: vcka.minibatch_cka(feats, batch_size=bs, device=device),
    }
    for name, make in (
        ("pytorch-cka, 1 joint call", lambda: pytorch_cka_joint(feats, bs, device)),
        ("pytorch-cka, 3 calls", lambda: pytorch_cka_readme(feats, vit_layers, bs, device)),
        ("torch-cka", lambda: torch_cka_joint(feats, bs, device)),
    ):
        if args.skip_slow and name == "torch-cka":
            continue
        try:
            methods[name] = make()
        except Exception as e:  # not installed, or its API moved: say so and carry on
            print(f"{name}: unavailable ({type(e).__name__}: {e}); install the bench extra: pip install -e '.[bench]'")
    if not args.skip_slow:
        methods["naive per-pair loop"] = lambda: naive_cka(feats, bs, device)

    timings = round_robin(methods, device, args.repeats, args.budget_s)
    ours = timings["vitsee minibatch_cka"][0]
    print()
    print(f"{'method':<26} {'seconds':>9} {'cpu-s':>8} {'vitsee speed-up':>16} {'max |diff| vs fp64':>19}")
    for name, (seconds, cpu, out) in timings.items():
        diff = float(np.abs(np.asarray(out, dtype=np.float64) - ref).max())
        print(f"{name:<26} {seconds:>9.3f} {cpu:>8.2f} {seconds / ours:>15.2f}x {diff:>19.2e}")

    flops = gemm_flops(shapes, args.n, args.batch_size)
    rate = flops / ours / 1e12
    peak = peak_tflops(device)
    where = f"{rate / peak:.0%} of {peak:g} TFLOP/s peak" if peak else "peak unknown for this device"
    print(
        f"\nvitsee GEMMs: {flops / 1e12:.3f} TFLOP (Grams as performed + pair products) in {ours:.3f} s "
        f"= {rate:.3f} TFLOP/s achieved ({where})"
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024, help="number of images (default 1024)")
    p.add_argument("--batch-size", type=int, default=256, help="CKA minibatch size (default 256)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", default="12,14", help="ViT-like,ResNet-like layer counts (default 12,14)")
    p.add_argument("--offset", type=float, default=0.0, help="constant added to every unit (e.g. 300)")
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs per method (default 3)")
    p.add_argument("--budget-s", type=float, default=30.0, help="no more repeats once a method used this long")
    p.add_argument("--quick", action="store_true", help="small job: n=512, batch 128, 4+5 layers")
    p.add_argument("--skip-slow", action="store_true", help="leave out torch-cka and the naive loop")
    p.add_argument("--accuracy", action="store_true", help="vitsee's error for each Gram / pair precision")
    p.add_argument("--busy-core", action="store_true", help="idle against one core kept busy by a spinning process")
    p.add_argument("--stats", action="store_true", help="vitsee with intervals and p-values against without")
    p.add_argument("--permutations", type=int, default=99, help="permutations per p-value with --stats (default 99)")
    args = p.parse_args()
    if args.quick:
        args.n, args.batch_size, args.layers = 512, 128, "4,5"
    return args


# ----------------------------------------------------------------------------------------------------------------
# The features


def layer_shapes(vit_layers: int, cnn_layers: int) -> list[tuple[int, ...]]:
    """Return per-example shapes: ViT-tiny block outputs, then a ResNet stem and blocks over four stages."""
    vit = [(197, 192)] * vit_layers
    stages = [(64, 28, 28), (128, 14, 14), (256, 7, 7), (512, 4, 4)]
    blocks = cnn_layers - 1
    per_stage = [blocks // 4 + (1 if s < blocks % 4 else 0) for s in range(4)]
    cnn = [stages[0]] + [shape for shape, k in zip(stages, per_stage) for _ in range(k)]
    return vit + cnn[:cnn_layers]


def synthetic_features(
    n: int, shapes: list[tuple[int, ...]], offset: float, vit_layers: int, seed: int
) -> list[torch.Tensor]:
    """Return fp32 features (n, *shape) per layer: a depth-drifting low-rank signal, noise and shared offsets."""
    g = torch.Generator().manual_seed(seed)
    rank = 32
    h0 = torch.randn(n, rank, generator=g)  # what the images are, in a few numbers each
    h = h0
    feats = []
    for i, shape in enumerate(shapes):
        if i == vit_layers:  # the CNN sees the same images: restart from the same signal
            h = h0
        h = 0.9 * h + 0.44 * torch.randn(n, rank, generator=g)  # adjacent layers stay similar, far ones drift
        d = int(np.prod(shape))
        w = torch.randn(rank, d, generator=g) / rank**0.5
        x = h @ w  # (n, d)
        x += 0.5 * torch.randn(n, d, generator=g)
        if i < vit_layers:
            x = x.view(n, *shape)
            x += 3.0 * torch.randn(*shape, generator=g)  # a position embedding: the same for every image
            x[..., :2] *= 20.0  # two outlier channels, as in trained ViTs
        else:
            x += 0.5 + torch.rand(d, generator=g)  # positive pre-activation offsets
            x = x.clamp_(min=0).view(n, *shape)  # post-ReLU
        x += offset
        feats.append(x)
    return feats


def reference_cka(feats: list[torch.Tensor], batch_size: int) -> np.ndarray:
    """Return the (L, L) minibatch CKA by a plain numpy float64 loop: fp64 Grams, Song's formula per pair."""
    L, n = len(feats), feats[0].shape[0]
    hsic = np.zeros((L, L))
    for s in range(0, n, batch_size):
        m = min(batch_size, n - s)
        if m < vcka.MIN_BATCH:
            continue
        kt = []  # diagonal-zeroed fp64 Grams of the centred features (centring leaves HSIC1 unchanged)
        for f in feats:
            x = f[s : s + m].reshape(m, -1).cpu().numpy().astype(np.float64)
            x -= x.mean(axis=0)
            k = x @ x.T
            np.fill_diagonal(k, 0.0)
            kt.append(k)
        for i in range(L):
            for j in range(i, L):
                trace = np.sum(kt[i] * kt[j])
                sums = kt[i].sum() * kt[j].sum() / ((m - 1) * (m - 2))
                cross = 2.0 / (m - 2) * (kt[i].sum(axis=0) @ kt[j].sum(axis=1))
                hsic[i, j] = hsic[j, i] = hsic[i, j] + (trace + sums - cross) / (m * (m - 3))
    d = np.sqrt(np.diag(hsic))
    return hsic / np.outer(d, d)


# ----------------------------------------------------------------------------------------------------------------
# The contenders


STATS_METHOD = "vitsee + 95% CI + p-values"


def vitsee_with_stats(
    feats: list[torch.Tensor], batch_size: int, device: torch.device, permutations: int
) -> np.ndarray:
    """Return the (L, L) CKA, computing on the way what `vitsee analyze` adds by default: the delete-one-image
    jackknife moments of every pair (issue 30), the null sums of `permutations` permuted pairings, the jackknife
    interval and the p-values."""
    from vitsee import stats

    n = feats[0].shape[0]
    acc = vcka.MinibatchCKA(len(feats), device, permutations=permutations, seed=0, jackknife=True)
    for s in range(0, n, batch_size):
        if min(batch_size, n - s) >= vcka.MIN_BATCH:
            acc.update([f[s : s + batch_size] for f in feats])
    out = acc.result()
    acc.statistics(stats.DEFAULT_CI)
    return out


def naive_cka(feats: list[torch.Tensor], batch_size: int, device: torch.device) -> np.ndarray:
    """Return the (L, L) CKA rebuilding both Grams for every pair of every batch (what per-pair code does)."""
    L, n = len(feats), feats[0].shape[0]
    xy, xx, yy = np.zeros((L, L)), np.zeros((L, L)), np.zeros((L, L))
    with vcka.full_fp32_matmul():
        for s in range(0, n, batch_size):
            m = min(batch_size, n - s)
            if m < vcka.MIN_BATCH:
                continue
            for i in range(L):
                for j in range(i, L):  # the matrix is symmetric: even naive code skips the lower half
                    x = feats[i][s : s + m].reshape(m, -1).to(device, torch.float32)
                    y = feats[j][s : s + m].reshape(m, -1).to(device, torch.float32)
                    x, y = x - x.mean(0), y - y.mean(0)
                    k, l = x @ x.T, y @ y.T
                    xy[i, j] += vcka.unbiased_hsic(k, l)
                    xx[i, j] += vcka.unbiased_hsic(k, k)
                    yy[i, j] += vcka.unbiased_hsic(l, l)
    xy, xx, yy = (np.triu(a) + np.triu(a, 1).T for a in (xy, xx, yy))
    return xy / np.sqrt(xx * yy)


class LayerReplay(nn.Module):
    """Returns its layer's precomputed features for a batch of consecutive image indices (a view, no copy)."""

    def __init__(self, feats: torch.Tensor):
        super().__init__()
        self.feats = feats  # a plain attribute, so the packages' model.to(device) does not copy it

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        start = int(idx[0])
        return self.feats[start : start + idx.shape[0]]


class FeatureReplay(nn.Module):
    """A stand-in 'model' whose named submodules layer0..layerL-1 output the precomputed features."""

    def __init__(self, feats: list[torch.Tensor]):
        super().__init__()
        self.names = [f"layer{i}" for i in range(len(feats))]
        for name, f in zip(self.names, feats):
            self.add_module(name, LayerReplay(f))

    def forward(self, idx: torch.Tensor) -> None:
        for name in self.names:
            getattr(self, name)(idx)


def index_loader(n: int, batch_size: int) -> DataLoader:
    # Both packages refuse (or mis-handle) a batch under 4: drop it, as vitsee does.
    return DataLoader(
        TensorDataset(torch.arange(n)), batch_size=batch_size, shuffle=False, drop_last=n % batch_size < vcka.MIN_BATCH
    )


def pytorch_cka_joint(feats: list[torch.Tensor], batch_size: int, device: torch.device) -> Callable[[], np.ndarray]:
    """pytorch-cka at its fastest: one call on one module holding all layers (each Gram once per batch)."""
    from cka import compute_cka  # PyPI pytorch-cka

    model = FeatureReplay(feats)

    def run() -> np.ndarray:
        (matrix,) = compute_cka(
            model, model, index_loader(len(feats[0]), batch_size), layers=model.names, device=device, progress=False
        )
        return matrix.cpu().numpy()

    return run


def pytorch_cka_readme(
    feats: list[torch.Tensor], vit_layers: int, batch_size: int, device: torch.device
) -> Callable[[], np.ndarray]:
    """pytorch-cka as its README shows: compute_cka(model1, model2, ...) for ViT-ViT, CNN-CNN and ViT-CNN."""
    from cka import compute_cka  # PyPI pytorch-cka

    vit, cnn = FeatureReplay(feats[:vit_layers]), FeatureReplay(feats[vit_layers:])

    def run() -> np.ndarray:
        def call(a: FeatureReplay, b: FeatureReplay) -> np.ndarray:
            (matrix,) = compute_cka(
                a,
                b,
                index_loader(len(feats[0]), batch_size),
                layers=a.names,
                model2_layers=b.names,
                device=device,
                progress=False,
            )
            return matrix.cpu().numpy()

        vv, cc, vc = call(vit, vit), call(cnn, cnn), call(vit, cnn)
        return np.block([[vv, vc], [vc.T, cc]])

    return run


def torch_cka_joint(feats: list[torch.Tensor], batch_size: int, device: torch.device) -> Callable[[], np.ndarray]:
    """torch-cka: CKA(model, model, ...).compare(loader) on one module holding all layers."""
    from torch_cka import CKA  # PyPI torch-cka

    def run() -> np.ndarray:
        model = FeatureReplay(feats)  # fresh: CKA() registers hooks that are never removed
        cka = CKA(
            model,
            model,
            model1_name="joint",
            model2_name="joint (again)",
            model1_layers=model.names,
            model2_layers=model.names,
            device=str(device),
        )
        with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
            cka.compare(index_loader(len(feats[0]), batch_size))
        return cka.export()["CKA"].cpu().numpy()

    return run


# ----------------------------------------------------------------------------------------------------------------
# Measuring


def round_robin(
    methods: dict[str, Callable[[], np.ndarray]], device: torch.device, repeats: int, budget_s: float
) -> dict[str, tuple[float, float, np.ndarray]]:
    """Return {name: (best wall seconds, CPU seconds of that run, output)}, running the methods in turns.

    Turns (not one method's repeats back to back) spread the swings of a shared machine over all methods; a
    method gets no more turns once it has used budget_s. CPU seconds (all threads of this process) are shown
    because other people's jobs move the wall clock; on CUDA they only count the host side.
    """
    best: dict[str, tuple[float, float, np.ndarray]] = {}
    used = dict.fromkeys(methods, 0.0)
    for _ in range(max(1, repeats)):
        for name, run in methods.items():
            if used[name] > budget_s or used[name] < 0:
                continue
            try:
                sync(device)
                t0, c0 = time.perf_counter(), time.process_time()
                out = run()
                sync(device)
            except Exception as e:
                print(f"{name}: failed ({type(e).__name__}: {e})")
                used[name] = -1.0
                continue
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            used[name] += wall
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu, out)
            print(f"  {name}: {wall:.2f} s", flush=True)
    return best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_flops(shapes: list[tuple[int, ...]], n: int, batch_size: int) -> float:
    """Return the FLOPs of vitsee's GEMMs: each layer's Gram (as its upper block-triangle) and the pair product."""
    total = 0.0
    for s in range(0, n, batch_size):
        m = min(batch_size, n - s)
        if m < vcka.MIN_BATCH:
            continue
        h = m // 2
        gram_cells = m * m if m < vcka.BLOCK_GRAM_MIN else h * m + (m - h) ** 2
        total += sum(2.0 * gram_cells * np.prod(shape) for shape in shapes)
        total += 2.0 * len(shapes) ** 2 * m * m
    return total


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


def accuracy_table(feats: list[torch.Tensor], batch_size: int, device: torch.device, ref: np.ndarray) -> None:
    """Print vitsee's max |CKA - fp64 reference| and time for each (Gram, pair product) precision."""
    saved = vcka.GRAM_DTYPE, vcka.PAIR_DTYPE
    print(f"{'Gram':<8} {'pairs':<8} {'seconds':>8} {'max |diff| vs fp64':>19}")
    try:
        for gram_dtype, pair_dtype in (
            (torch.float32, torch.float64),
            (torch.float32, torch.float32),
            (torch.float64, torch.float64),
        ):
            vcka.GRAM_DTYPE, vcka.PAIR_DTYPE = gram_dtype, pair_dtype
            run = {"vitsee": lambda: vcka.minibatch_cka(feats, batch_size=batch_size, device=device)}
            seconds, _, out = round_robin(run, device, 1, 0.0)["vitsee"]
            print(f"{str(gram_dtype)[6:]:<8} {str(pair_dtype)[6:]:<8} {seconds:>8.2f} {np.abs(out - ref).max():>19.2e}")
    finally:
        vcka.GRAM_DTYPE, vcka.PAIR_DTYPE = saved


# ----------------------------------------------------------------------------------------------------------------
# Threads on a shared machine


def _spin() -> None:
    while True:  # keeps one core busy, as another user's job would
        pass


@contextlib.contextmanager
def busy_core():
    """Keeps one core busy with a spinning process for the duration (started and stopped here)."""
    import multiprocessing

    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    time.sleep(0.5)  # let it reach its loop before anything samples the load
    try:
        yield
    finally:
        spinner.terminate()
        spinner.join()


def busy_core_table(
    feats: list[torch.Tensor], vit_layers: int, batch_size: int, device: torch.device, repeats: int, budget_s: float
) -> None:
    """Print vitsee (and pytorch-cka, if installed) idle and with one core busy: at torch's default thread count
    with the layer Grams one after another (vitsee before task workers), and as `vitsee analyze` sets it up
    (vitsee.threads.set_compute_threads(): torch threads on the free cores, task workers on every usable
    core, each layer's Gram on the next worker free)."""
    from vitsee import threads as threads_mod

    default = torch.get_num_threads()
    methods = {"vitsee minibatch_cka": lambda: vcka.minibatch_cka(feats, batch_size=batch_size, device=device)}
    try:
        methods["pytorch-cka, 3 calls"] = pytorch_cka_readme(feats, vit_layers, batch_size, device)
    except Exception as e:
        print(f"pytorch-cka: unavailable ({type(e).__name__}: {e}); timing vitsee alone (install the bench extra)")
    rows = []
    for condition in ("idle", "one core busy"):
        with busy_core() if condition == "one core busy" else contextlib.nullcontext():
            for setup in ("torch default", "as vitsee analyze"):
                if setup == "torch default":
                    torch.set_num_threads(default)
                    threads_mod._TASK_WORKERS[:] = [1]  # the Grams one after another, on torch's threads
                else:
                    threads_mod.set_compute_threads()
                threads, workers = torch.get_num_threads(), threads_mod.task_workers()
                print(f"{condition}, {setup}: {threads} torch thread(s), {workers} task worker(s):")
                for name, (seconds, cpu, _) in round_robin(methods, device, repeats, budget_s).items():
                    rows.append((condition, setup, threads, workers, name, seconds, cpu))
    torch.set_num_threads(default)
    threads_mod._TASK_WORKERS[:] = []
    print(f"\n{'condition':<14} {'setup':<18} {'threads':>7} {'workers':>7} {'method':<22} {'seconds':>8} {'cpu-s':>7}")
    for condition, setup, threads, workers, name, seconds, cpu in rows:
        print(f"{condition:<14} {setup:<18} {threads:>7} {workers:>7} {name:<22} {seconds:>8.3f} {cpu:>7.2f}")
    ours = {c: s for c, setup, _, _, n, s, _ in rows if setup == "as vitsee analyze" and n.startswith("vitsee")}
    theirs = {c: s for c, setup, _, _, n, s, _ in rows if setup == "torch default" and n.startswith("pytorch-cka")}
    print(
        f"\nvitsee as analyze sets it up: one core busy / idle = {ours['one core busy'] / ours['idle']:.2f}x "
        "(target: at most 1.5x)"
    )
    if theirs:
        print(
            f"one core busy: vitsee {ours['one core busy']:.2f} s, pytorch-cka at torch's default threads "
            f"{theirs['one core busy']:.2f} s (target: vitsee at or below it)"
        )


if __name__ == "__main__":
    main()

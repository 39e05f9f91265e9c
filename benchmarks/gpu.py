"""Everything a GPU has to show, in one run of under 8 minutes: one table, also written as JSON and markdown.

    python benchmarks/gpu.py --out gpu-table.md             # on a CUDA machine: the whole list below
    python benchmarks/gpu.py --quick --out gpu-table.md     # half the sizes, when minutes are short
    python benchmarks/gpu.py --dry-run --out /tmp/gpu.md    # the same code on the CPU, tiny sizes (the suite runs it)

Steps, in this order (a step that fails or overruns its time says why in one line of the table, and the rest run):
  env        the device, its memory, torch / CUDA / driver versions
  gemm       the device's own fp32 and tf32 GEMM rate (a square product, best of a few), the yardstick for CKA below
  tests      the suite's CUDA tests: `pytest -k cuda` over the test files that mention CUDA (passed / failed / skipped;
             a dry run only collects them)
  agreement  every registered analysis (engine/analyses REGISTRY, so a new one is covered) run on one small store on
             the CPU and on the GPU: the largest absolute difference of their result arrays, per analysis (three
             models, two of one family, so that separability applies)
  extract    vit_base_patch16_224 and resnet50, random weights, over 2,048 synthetic images at 224 px (batch 256):
             images/s of `extract` against timm's plain forward on the device (inputs already there), the share of the
             pass the forward kept the GPU busy (CUDA events around each model's forward) and the GPU utilisation
             nvidia-smi saw during the pass (when it is installed). The store (~41 GB) goes to /dev/shm when that can
             hold it, so a slow disk cannot eat the minutes; else to the temp folder, with fewer images if it is short
  cka        all-pairs CKA over every layer of that store on the GPU: the analysis as `vitsee analyze --cka` runs it,
             and the Gram products alone on the first 512 images held on the device (TFLOP/s against the gemm step);
             pytorch-cka on those same features when it is installed ("not installed" otherwise)
  <name>     each other registered analysis on that store on the GPU (probes, attention, skip, spatial, heads, ERF,
             and any added since): its time; soft matching at 256 units a layer (its assignments run on the CPU),
             separability on the agreement's small store (it needs a family of two models beside another)
Every step reports the peak device memory it allocated (torch.cuda.max_memory_allocated).

Time: each step runs in a worker process with its own time cap, inside a budget of --budget-s (450 s) for the whole
run; a step that overruns is killed with its worker, reported, and a new worker takes the steps left. The sizes leave
headroom on an H100/H200 (expected: ~4 minutes); --quick halves them. Without a CUDA device (and no --dry-run) the
script prints one line and exits 2. It installs nothing and needs no network: models are built with random weights.
The stores are deleted at the end (unless --work names the folder); the workers' log (tracebacks) stays beside them.
From the device tool of a session with a GPU: `python benchmarks/gpu.py --out $OUT/gpu-table`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "@@gpu-step "  # a worker's result line: MARK + JSON
BUDGET_S = 450.0


@dataclass(frozen=True)
class Sizes:
    """How big each step is: the full run, --quick (half) and --dry-run (tiny, CPU)."""

    models: tuple[str, ...] = ("vit_base_patch16_224@random:0", "resnet50@random:0")
    img_size: int | None = None  # the models' own 224 px
    n_images: int = 2048
    batch_size: int = 256
    # a family of two beside another, so that separability (which compares pairs within and across families) applies
    small_models: tuple[str, ...] = (
        "vit_tiny_patch16_224@random:0",
        "resnet18@random:0",
        "vit_tiny_patch16_224@random:1",
    )
    small_img_size: int = 64
    small_images: int = 64
    small_batch: int = 32
    cka_subset: int = 512  # images whose features are held on the device for the GEMM rate and pytorch-cka
    gemm_n: int = 8192
    erf_images: int = 32
    # soft matching solves one assignment per layer pair on the CPU (scipy), O(units^3): the default 1024 units take
    # ~0.15 s a pair, ~40 s for each model pair's 276 layer pairs, over this run's budget for a CPU-bound step
    soft_matching_units: int = 256
    separability_measures: str = ""  # the measures whose zoos separability scores ("": every one)

    def options(self) -> dict:
        """Returns the analyses' own options these sizes set (AnalyzeConfig.options)."""
        given = {"soft_matching_units": self.soft_matching_units}
        return given | ({"separability_measures": self.separability_measures} if self.separability_measures else {})


FULL = Sizes()
QUICK = Sizes(n_images=1024, small_images=32, small_batch=16, cka_subset=256, gemm_n=4096, erf_images=16)
DRY = Sizes(
    models=("vit_tiny_patch16_224@random:0", "resnet18@random:0"),
    img_size=32,
    n_images=16,
    batch_size=8,
    small_img_size=32,
    small_images=16,
    small_batch=8,
    cka_subset=8,
    gemm_n=128,
    erf_images=2,
    soft_matching_units=32,
    separability_measures="cka,mknn,rsa,soft_matching",  # linear predictivity's zoo: ~10 s a run at this size
)

# step -> its time cap in seconds (full sizes); the analyses not named here get ANALYSIS_CAP_S
CAPS_S = {"env": 30, "gemm": 30, "tests": 120, "agreement": 100, "extract": 170, "cka": 80}
ANALYSIS_CAP_S = 45


@dataclass
class StepResult:
    step: str
    rows: list[tuple[str, str]] = field(default_factory=list)  # (figure, value)
    seconds: float = 0.0
    peak_mib: float | None = None
    error: str | None = None


# --- the steps (run in a worker process) -------------------------------------------------------------------------


class Step:
    """What a step function gets: the device, the sizes, the work folder, and where its figures go."""

    def __init__(self, name: str, device: str, sizes: Sizes, work: Path):
        self.name, self.device, self.sizes, self.work = name, device, sizes, work
        self.rows: list[tuple[str, str]] = []

    def add(self, figure: str, value) -> None:
        self.rows.append((figure, value if isinstance(value, str) else f"{value}"))

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def step_env(s: Step) -> None:
    import timm
    import torch

    s.add("torch / timm", f"{torch.__version__} / {timm.__version__}")
    if not s.cuda:
        s.add("device", f"cpu ({os.cpu_count()} cores): dry run")
        return
    props = torch.cuda.get_device_properties(0)
    s.add(
        "device",
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, "
        f"compute capability {props.major}.{props.minor}",
    )
    s.add("CUDA / cuDNN", f"{torch.version.cuda} / {torch.backends.cudnn.version()}")
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        s.add("driver, max SM clock, power limit", out.stdout.strip() or out.stderr.strip()[:120])
    else:
        s.add("nvidia-smi", "not found")
    s.add("CPU cores", os.cpu_count())


def gemm_tflops(n: int, device: str, tf32: bool) -> float:
    """Returns the best TFLOP/s of an n x n fp32 product on the device (tf32 tensor cores when tf32)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    # torch raises when its legacy and newer TF32 switches are mixed in one process: speak the one in use, as
    # engine/analyses/cka.full_fp32_matmul does
    matmul = torch.backends.cuda.matmul
    try:
        old, legacy = matmul.allow_tf32, True
        matmul.allow_tf32 = tf32
    except RuntimeError:
        old, legacy = matmul.fp32_precision, False
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        a @ b  # warm-up
        best = float("inf")
        for _ in range(5):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(3):
                a @ b
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / 3)
    finally:
        if legacy:
            matmul.allow_tf32 = old
        else:
            matmul.fp32_precision = old
    return 2 * n**3 / best / 1e12


def step_gemm(s: Step) -> None:
    fp32 = gemm_tflops(s.sizes.gemm_n, s.device, tf32=False)
    tf32 = gemm_tflops(s.sizes.gemm_n, s.device, tf32=True)
    (s.work / "gemm.json").write_text(json.dumps({"fp32": fp32, "tf32": tf32}))
    s.add(f"fp32 GEMM {s.sizes.gemm_n}^2 (TF32 off)", f"{fp32:.1f} TFLOP/s")
    s.add(f"tf32 GEMM {s.sizes.gemm_n}^2", f"{tf32:.1f} TFLOP/s")


def step_tests(s: Step) -> None:
    files = (
        sorted(
            str(p.relative_to(ROOT))
            for p in (ROOT / "tests").glob("test_*.py")
            if "cuda" in p.read_text(errors="replace").lower()
        )
        if (ROOT / "tests").is_dir()
        else []
    )
    if not files:
        raise RuntimeError(f"no test files mention CUDA under {ROOT / 'tests'} (the suite is not beside this script)")
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise RuntimeError("pytest not installed (pip install 'vitsee[test]' where the suite should run)") from None
    # a dry run has no GPU to run them on: it checks that they are found
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        "-k",
        "cuda",
        *files,
        *([] if s.cuda else ["--collect-only"]),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=CAPS_S["tests"] - 10)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]
    s.add("pytest -k cuda " + " ".join(Path(f).stem for f in files), summary.strip("= "))
    failed = [
        line.split(" ", 1)[1].split(" - ")[0]
        for line in done.stdout.splitlines()
        if line.startswith(("FAILED ", "ERROR "))
    ]
    if failed:
        s.add("failed", ", ".join(failed[:6]) + (f" and {len(failed) - 6} more" if len(failed) > 6 else ""))
    if done.returncode not in (0, 5):  # 5: nothing selected
        raise RuntimeError(f"{len(failed)} CUDA test(s) failed: {', '.join(failed[:3])}")


def extract_store(path: Path, models, n_images: int, batch_size: int, img_size, device: str, progress=None):
    """Extracts the models over the first synthetic images into a new store at path (replacing one there)."""
    from vitsee.extraction.extract import run_extraction
    from vitsee.extraction.plan import ExtractConfig

    cfg = ExtractConfig(
        store=path,
        models=list(models),
        dataset="synthetic",
        n_images=n_images,
        batch_size=batch_size,
        img_size=img_size,
        device=device,
        overwrite=path.exists(),
    )
    return run_extraction(cfg, progress)


def result_difference(a, b) -> float:
    """Returns the largest absolute difference between two results' arrays (NaN where both are NaN counts as equal)."""
    import numpy as np

    worst = 0.0
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        if x.dtype.kind not in "fiub" or x.shape != y.shape:
            if x.shape != y.shape:
                raise RuntimeError(f"array {key} has shape {x.shape} on the CPU and {y.shape} on the GPU")
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        both = np.isnan(x) & np.isnan(y)
        if (np.isnan(x) != np.isnan(y)).any():
            return float("inf")
        if x.size and not both.all():
            worst = max(worst, float(np.max(np.abs(x - y)[~both])))
    return worst


def step_agreement(s: Step) -> None:
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store, copy_store

    z = s.sizes
    cpu_store = s.work / "small-cpu.h5"
    extract_store(cpu_store, z.small_models, z.small_images, z.small_batch, z.small_img_size, "cpu")
    gpu_store = copy_store(cpu_store, s.work / "small-gpu.h5")
    cfg = dict(
        batch_size=z.small_batch,
        shuffles=1,
        recompute=True,
        erf_images=min(4, z.erf_images),
        options=z.options(),
    )
    for name, analysis in REGISTRY.items():
        try:
            worst, jobs, start = 0.0, 0, time.perf_counter()
            with Store.writer(cpu_store) as a, Store.writer(gpu_store) as b:
                for job in analysis.jobs(a):
                    on_cpu = analysis.run(a, job, AnalyzeConfig(device="cpu", **cfg))
                    on_gpu = analysis.run(b, job, AnalyzeConfig(device=s.device, **cfg))
                    worst = max(worst, result_difference(on_cpu, on_gpu))
                    jobs += 1
            s.add(
                f"{name}: max |CPU - GPU|",
                f"{worst:.2e} over {jobs} result(s) ({time.perf_counter() - start:.1f} s)"
                if jobs
                else "applies to no model of the small store",
            )
        except Exception as exc:  # one analysis failing says so and the others still run
            s.add(f"{name}: max |CPU - GPU|", f"error: {one_line(exc)}")


def step_extract(s: Step) -> None:
    import torch
    from PIL import Image

    from vitsee.extraction import extract as extract_mod
    from vitsee.extraction.plan import ExtractConfig, estimate
    from vitsee.models.load import load_model, make_transform, parse_model_spec

    z = s.sizes
    device = torch.device(s.device)
    n = z.n_images
    store = s.work / "big.h5"
    # the disk: the store's expected size from a dry run of the same models, fewer images if it would not fit
    probe = estimate(
        ExtractConfig(
            store=store,
            models=list(z.models),
            dataset="synthetic",
            n_images=z.batch_size,
            batch_size=z.batch_size,
            img_size=z.img_size,
            device=s.device,
        )
    )
    per_image = probe.total_bytes / z.batch_size
    free = shutil.disk_usage(s.work).free
    if per_image * n > 0.8 * free:
        n = max(z.batch_size, int(0.8 * free / per_image) // z.batch_size * z.batch_size)
        s.add(
            "images (disk)", f"{n} instead of {z.n_images}: {free / 1e9:.0f} GB free, {per_image / 1e6:.1f} MB an image"
        )
    where = "in RAM (/dev/shm)" if str(s.work).startswith("/dev/shm") else f"on disk ({s.work})"
    s.add("store size", f"{per_image * n / 1e9:.1f} GB for {n} images, {where}")

    # timm's plain forward on the device, inputs already there, fused attention: the yardstick
    plain_s = 0.0
    for spec in z.models:
        loaded = load_model(parse_model_spec(spec), img_size=z.img_size, device=device)
        for module in loaded.model.modules():  # as timm ships it: fused attention
            if hasattr(module, "fused_attn"):
                module.fused_attn = True
        shape = make_transform(loaded)(Image.new("RGB", (64, 64))).shape  # (3, H, W) as extract feeds it
        x = torch.randn(z.batch_size, *shape, device=device)
        with torch.inference_mode():
            loaded.model(x)
            s.sync()
            start = time.perf_counter()
            for first in range(0, n, z.batch_size):
                loaded.model(x[: min(z.batch_size, n - first)])
            s.sync()
        plain_s += time.perf_counter() - start
        del loaded, x
    if s.cuda:
        torch.cuda.empty_cache()
    s.add("plain timm forward, both models", f"{n / plain_s:.0f} images/s ({plain_s:.2f} s)")

    busy: list = []
    forward = extract_mod._forward

    def timed_forward(mp, x):  # CUDA events around each model's forward: how much of the pass the GPU computes
        if not s.cuda:
            start = time.perf_counter()
            out = forward(mp, x)
            busy.append(time.perf_counter() - start)
            return out
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = forward(mp, x)
        end.record()
        busy.append((begin, end))
        return out

    marks: dict[str, float] = {}

    def on_event(event) -> None:
        if event.stage == "extract" and "start" not in marks:
            marks["start"] = time.perf_counter()
        elif event.stage == "done":
            marks["end"] = time.perf_counter()

    extract_mod._forward = timed_forward
    util = Utilisation() if s.cuda else None
    try:
        result = extract_store(store, z.models, n, z.batch_size, z.img_size, s.device, on_event)
    finally:
        extract_mod._forward = forward
        seen = util.stop() if util else None
    pass_s = marks["end"] - marks["start"]
    s.sync()
    gpu_s = sum(b.elapsed_time(e) / 1000 for b, e in busy) if s.cuda else sum(busy)
    s.add(
        "extract (hooks, fp16 copies, loader, writer, HDF5)",
        f"{n / pass_s:.0f} images/s ({pass_s:.1f} s; {pass_s / plain_s:.2f}x the plain forward's time)",
    )
    s.add("forward busy share of the pass", f"{gpu_s / pass_s:.0%} ({gpu_s:.1f} s of forward in {pass_s:.1f} s)")
    if util is not None:
        s.add("GPU utilisation during the pass (nvidia-smi)", seen)
    s.add("written", f"{result.bytes_written / 1e9:.1f} GB at {result.bytes_written / pass_s / 1e9:.2f} GB/s")
    (s.work / "big.json").write_text(json.dumps({"store": str(store), "n_images": n}))


class Utilisation:
    """Samples nvidia-smi's GPU utilisation every 200 ms in a background process, if nvidia-smi is there."""

    def __init__(self):
        smi = shutil.which("nvidia-smi")
        self.proc = (
            None
            if smi is None
            else subprocess.Popen(
                [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200", "-i", "0"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )

    def stop(self) -> str:
        if self.proc is None:
            return "nvidia-smi not found"
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        values = [float(v) for v in out.split() if re.fullmatch(r"\d+(\.\d+)?", v)]
        if not values:
            return "no samples"
        median = sorted(values)[len(values) // 2]
        return f"mean {sum(values) / len(values):.0f}%, median {median:.0f}% ({len(values)} samples)"


def big_store(s: Step) -> tuple[Path, int]:
    """Returns the extract step's store and its image count, or raises why there is none."""
    info = s.work / "big.json"
    if not info.exists():
        raise RuntimeError("no store: the extract step did not finish")
    data = json.loads(info.read_text())
    return Path(data["store"]), int(data["n_images"])


def step_cka(s: Step) -> None:
    import numpy as np
    import torch

    from vitsee.analyses import REGISTRY, cka
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store

    z = s.sizes
    path, n = big_store(s)
    analysis = REGISTRY["cka"]
    with Store.writer(path) as store:
        columns = [(key, layer) for key in store.models for layer in store.layers(key)]
        start = time.perf_counter()
        for job in analysis.jobs(store):
            analysis.run(store, job, AnalyzeConfig(device=s.device, recompute=True))
        s.sync()
        took = time.perf_counter() - start
        s.add(f"vitsee analyze --cka ({len(columns)} layers, {n} images, its defaults)", f"{took:.1f} s")
        m = min(z.cka_subset, n)
        feats = [torch.from_numpy(np.ascontiguousarray(store.layer_dataset(k, l)[:m])).to(s.device) for k, l in columns]
    dims = [int(np.prod(f.shape[1:])) for f in feats]
    batch = min(z.batch_size, m)
    flops = sum(2 * batch * batch * d for d in dims) * (m // batch)  # each layer's Gram x x^T, once per batch
    best, matrix = float("inf"), None
    for _ in range(2):
        s.sync()
        start = time.perf_counter()
        matrix = cka.minibatch_cka(feats, batch_size=batch, device=s.device)
        s.sync()
        best = min(best, time.perf_counter() - start)
    gemm = json.loads((s.work / "gemm.json").read_text()) if (s.work / "gemm.json").exists() else {}
    rate = flops / best / 1e12
    against = ", ".join(f"{rate / gemm[k]:.0%} of {k}" for k in ("fp32", "tf32") if gemm.get(k)) or "no gemm figure"
    s.add(f"all-pairs CKA, {m} images on the device, batch {batch}", f"{best:.2f} s, {rate:.1f} TFLOP/s ({against})")
    try:
        peer = load_pytorch_cka()
    except ImportError:
        s.add("pytorch-cka, same features", "not installed")
        return
    fp32 = [f.float() for f in feats]
    run = peer.pytorch_cka_joint(fp32, batch, torch.device(s.device))
    run()
    s.sync()
    start = time.perf_counter()
    theirs = run()
    s.sync()
    peer_s = time.perf_counter() - start
    s.add(
        "pytorch-cka, same features (1 joint call)",
        f"{peer_s:.2f} s ({peer_s / best:.2f}x vitsee's time), "
        f"largest difference {np.max(np.abs(theirs - matrix)):.1e}",
    )


def load_pytorch_cka():
    """Returns benchmarks/cka.py as a module when pytorch-cka (`import cka`) is installed, else raises ImportError."""
    import importlib.util

    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("vitsee_bench_cka", HERE / "cka.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # it takes its own folder off sys.path, so `import cka` is pytorch-cka
        from cka import compute_cka  # noqa: F401
    finally:
        sys.path[:] = saved
    return module


def analysis_step(name: str):
    def run(s: Step) -> None:
        from vitsee.analyses import REGISTRY
        from vitsee.analyses.driver import AnalyzeConfig
        from vitsee.store import Store

        path, _ = big_store(s)
        analysis = REGISTRY[name]
        units = s.sizes.soft_matching_units
        cfg = AnalyzeConfig(
            device=s.device,
            recompute=True,
            erf_images=s.sizes.erf_images,
            options=s.sizes.options(),
        )
        given = f", {units} units a layer, its assignments on the CPU" if name == "soft_matching" else ""
        with Store.open(path) as store:
            big_has_jobs = bool(analysis.jobs(store))
        small = s.work / "small-gpu.h5"
        if not big_has_jobs and small.exists():  # separability on two models: timed on the agreement step's store
            path = small
        with Store.writer(path) as store:
            jobs = analysis.jobs(store)
            if not jobs:
                s.add(f"{name} on the GPU", analysis.refusal(store))
                return
            where = "" if path != small else f", the small store's {len(store.models)} models"
            for job in jobs:
                start = time.perf_counter()
                analysis.run(store, job, cfg)
                s.sync()
                s.add(f"{job.label} ({store.n_images} images{where}{given})", f"{time.perf_counter() - start:.1f} s")

    return run


def steps_in_order() -> dict:
    """Returns step name -> function, in the order they run."""
    from vitsee.analyses import REGISTRY

    steps = {
        "env": step_env,
        "gemm": step_gemm,
        "tests": step_tests,
        "agreement": step_agreement,
        "extract": step_extract,
        "cka": step_cka,
    }
    for name in REGISTRY:
        if name != "cka":
            steps[name] = analysis_step(name)
    return steps


def step_names() -> list[str]:
    """Returns the step names without importing torch: the fixed ones, then the registered analyses' modules."""
    names = ["env", "gemm", "tests", "agreement", "extract", "cka"]
    from vitsee.analyses import REGISTRY  # the registry imports no torch at import time

    return names + [n for n in REGISTRY if n != "cka"]


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def worker(args) -> int:
    """Runs the named steps one after another, printing each one's result as one MARK line on stdout."""
    import torch

    sizes = Sizes(**json.loads(args.sizes))
    if args.device == "cpu":  # a dry run's tiny products: two threads only wait on each other on a busy machine
        torch.set_num_threads(1)
    steps = steps_in_order()
    for name in args.steps.split(","):
        print(f"{MARK}{json.dumps({'start': name})}", flush=True)
        step = Step(name, args.device, sizes, Path(args.work))
        result = StepResult(name)
        if step.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            steps[name](step)
        except Exception as exc:
            result.error = one_line(exc)
            traceback.print_exc(file=sys.stderr)
        result.seconds = time.perf_counter() - start
        result.rows = step.rows
        if step.cuda:
            result.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        print(f"{MARK}{json.dumps(asdict(result))}", flush=True)
    return 0


# --- the parent: workers, time caps, the table -------------------------------------------------------------------


def run_steps(
    names: list[str], device: str, sizes: Sizes, work: Path, budget_s: float, scale: float, log
) -> list[StepResult]:
    """Runs the steps in worker processes within the budget; returns one result per step, in order."""
    deadline = time.monotonic() + budget_s
    results: dict[str, StepResult] = {}
    todo = list(names)
    while todo:
        if time.monotonic() > deadline - 5:
            for name in todo:
                results[name] = StepResult(name, error=f"not run: the {budget_s:.0f} s budget was spent")
            break
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--steps",
            ",".join(todo),
            "--device",
            device,
            "--work",
            str(work),
            "--sizes",
            json.dumps(asdict(sizes)),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, start_new_session=True)
        current, started = None, time.monotonic()
        while True:
            cap = (CAPS_S.get(current, ANALYSIS_CAP_S) * scale) if current else 120 * scale
            limit = min(started + cap, deadline)
            wait = limit - time.monotonic()
            ready = select.select([proc.stdout], [], [], max(0.0, min(wait, 1.0)))[0] if wait > 0 else []
            if ready:
                line = proc.stdout.readline()
                if not line:  # the worker ended
                    break
                if not line.startswith(MARK):
                    continue
                message = json.loads(line[len(MARK) :])
                if "start" in message:
                    current, started = message["start"], time.monotonic()
                    continue
                result = StepResult(**{**message, "rows": [tuple(r) for r in message["rows"]]})
                results[result.step] = result
                todo.remove(result.step)
                print(
                    f"  {result.step}: {result.seconds:.1f} s" + (f" ({result.error})" if result.error else ""),
                    file=sys.stderr,
                    flush=True,
                )
                current = None
                continue
            if time.monotonic() >= limit:  # overran its cap or the budget: stop the worker and its children
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                name = current or todo[0]
                why = "the run's budget" if limit >= deadline else f"its {cap:.0f} s cap"
                results[name] = StepResult(
                    name,
                    seconds=time.monotonic() - started,
                    error=f"stopped after {time.monotonic() - started:.0f} s: {why}",
                )
                todo.remove(name)
                break
        if proc.poll() is None:
            proc.wait()
        if current is None and todo and proc.returncode not in (0, -signal.SIGKILL):  # it failed before a step began
            for name in todo:
                results[name] = StepResult(
                    name, error=f"the worker process failed to start (exit {proc.returncode}): see the log"
                )
            break
        if todo and current in todo:  # the worker died inside a step (a crash, not an exception)
            results[current] = StepResult(
                current, seconds=time.monotonic() - started, error=f"worker died (exit {proc.returncode}): see the log"
            )
            todo.remove(current)
    return [results[name] for name in names]


def table(results: list[StepResult], title: str) -> str:
    """Returns the markdown table of the results: one row per figure, one for each failed step."""
    lines = [f"### {title}", "", "| step | figure | value | step s | peak device MiB |", "|---|---|---|---:|---:|"]
    for r in results:
        peak = "" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        rows = list(r.rows) + ([("error", r.error)] if r.error else [])
        for i, (figure, value) in enumerate(rows or [("", "")]):
            cells = [
                r.step if i == 0 else "",
                figure.replace("|", "\\|"),
                value.replace("|", "\\|"),
                f"{r.seconds:.1f}" if i == 0 else "",
                peak if i == 0 else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ViT-B/16 + ResNet-50 blocks, heads and input at 224 px in fp16 (`vitsee extract` says 40.8 GB for 2,048 images)
STORE_MB_PER_IMAGE = 20.5


def scratch_folder(sizes: Sizes) -> str | None:
    """Returns /dev/shm when it can hold the extraction's store with room to spare (the store then lives in RAM, so a
    slow disk cannot eat the run's minutes; 128 GiB hosts have room for 41 GB), else None: the system's temp folder."""
    shm = Path("/dev/shm")
    try:
        free = shutil.disk_usage(shm).free
    except OSError:
        return None
    return str(shm) if free > 1.3 * STORE_MB_PER_IMAGE * 1e6 * sizes.n_images else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the table to OUT.md and OUT.json")
    parser.add_argument("--quick", action="store_true", help="half the sizes")
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU with tiny sizes")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="time for the whole run (default 450)")
    parser.add_argument("--steps", default=None, help="comma-separated steps to run (default: all)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the stores (default: a temporary one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(
                "gpu.py: no CUDA device is visible (torch.cuda.is_available() is False): run it on a GPU machine, "
                "or --dry-run to check it on the CPU",
                file=sys.stderr,
            )
            return 2
    device = "cpu" if args.dry_run else "cuda"
    sizes = DRY if args.dry_run else QUICK if args.quick else FULL
    names = step_names()
    if args.steps:
        unknown = [n for n in args.steps.split(",") if n not in names]
        if unknown:
            print(f"gpu.py: unknown step {unknown[0]}: choose from {', '.join(names)}", file=sys.stderr)
            return 2
        names = [n for n in names if n in args.steps.split(",")]
    scratch = None if args.dry_run else scratch_folder(sizes)
    work = args.work or Path(tempfile.mkdtemp(prefix="vitsee-gpu-", dir=scratch))
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "gpu-steps.log"
    started = time.time()
    kind = "dry run" if args.dry_run else "quick" if args.quick else "full"
    print(
        f"gpu.py: {len(names)} steps on {device}, sizes {kind}, "
        f"budget {args.budget_s:.0f} s; work folder {work} (worker output: {log_path})",
        file=sys.stderr,
        flush=True,
    )
    try:
        with open(log_path, "w") as log:
            results = run_steps(names, device, sizes, work, args.budget_s, 1.0, log)
    finally:
        if args.work is None:  # the stores (tens of GB, maybe in RAM) go; the workers' log stays for a traceback
            for path in work.iterdir():
                if path != log_path:
                    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    title = (
        f"benchmarks/gpu.py{' --quick' if args.quick else ''}{' --dry-run' if args.dry_run else ''}: "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}, {time.time() - started:.0f} s in all"
    )
    text = table(results, title)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(
            json.dumps(
                {"title": title, "device": device, "sizes": asdict(sizes), "steps": [asdict(r) for r in results]},
                indent=1,
            )
        )
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

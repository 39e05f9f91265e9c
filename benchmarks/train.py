"""The training figures of benchmarks/README.md: the offline demo's first launch, and the paper's interventions.

    python benchmarks/train.py demo                 # vitsee-tui --demo offline, cache empty: time to the first heatmap
    python benchmarks/train.py paper --work DIR     # Fig. 8, 12, 10/11 with the README's commands, then their figures

`demo` runs the real app headless (Textual's run_test) with HF_HUB_OFFLINE=1 and an empty XDG_CACHE_HOME,
and reports wall and CPU seconds per stage (training, extraction, the CKA heatmap), then a second launch
that reuses the cache. `paper` runs `vitsee train / extract / analyze / export` as a user would (each step
is skipped when its output exists, so an interrupted run continues) and prints the numbers the README gives.
Wall time on a shared machine says little: the load average is printed beside it, and the CPU time of a
one-thread run is about what an idle machine's wall time would be.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VIT = ["-m", "vit_tiny_patch16_224", "--model-arg", "patch_size=4", "--model-arg", "embed_dim=64", "--model-arg",
       "depth=6", "--model-arg", "num_heads=4", "--model-arg", "mlp_ratio=2", "--img-size", "32", "--dataset", "digits"]
NAME = "vit_tiny_patch16_224"


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def cpu_s() -> float:
    """Returns the CPU seconds of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# --- the demo ----------------------------------------------------------------------------------------------


async def launch(cache: Path) -> dict:
    """Returns the seconds (wall, CPU) from the app's start to its first CKA heatmap, per stage."""
    from vitsee.engine.colormap import ColorMode
    from vitsee.tui.app import VitseeApp
    from vitsee.tui.options import AppOptions
    from vitsee.tui.screens.explorer import ExplorerScreen

    marks: dict[str, tuple[float, float]] = {}
    t0, c0 = time.perf_counter(), cpu_s()

    def hook(message) -> None:
        stage = getattr(message, "stage", None)
        if type(message).__name__ == "RunEvent" and stage and f"{stage} first" not in marks:
            marks[f"{stage} first"] = (time.perf_counter() - t0, cpu_s() - c0)
        if type(message).__name__ == "RunEvent" and stage:
            marks[f"{stage} last"] = (time.perf_counter() - t0, cpu_s() - c0)

    def heatmap_shown(app) -> bool:
        screen = app.screen
        panes = screen.query("#pane-cka") if isinstance(screen, ExplorerScreen) else []
        return bool(panes) and screen.kind == "cka" and panes.first().loaded is not None

    app = VitseeApp(None, options=AppOptions(color_mode=ColorMode.TRUECOLOR, export_dir=cache / "exports",
                                             folder=cache), demo=True)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        while not heatmap_shown(app):
            await pilot.pause(0.2)
            if time.perf_counter() - t0 > 1800:
                raise SystemExit("no heatmap after 30 minutes")
        marks["heatmap"] = (time.perf_counter() - t0, cpu_s() - c0)
        title = str(app.screen.query_one("#title-bar").render())
    return {"marks": marks, "title": title}


def demo(args) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    cache = Path(args.cache or tempfile.mkdtemp(prefix="vitsee-demo-"))
    os.environ["XDG_CACHE_HOME"] = str(cache)
    for attempt in ("first launch", "second launch"):
        before = load()
        got = asyncio.run(launch(cache))
        print(f"{attempt} (load average {before} -> {load()}): {got['title']}")
        for stage, (wall, cpu) in got["marks"].items():
            print(f"  {stage:14s} wall {wall:7.1f} s  cpu {cpu:7.1f} s")


# --- the paper's experiments ----------------------------------------------------------------------------------


def vitsee(*argv, cwd: Path) -> float:
    """Runs one vitsee command in cwd and returns its wall seconds (it must succeed)."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "vitsee.engine.cli", *map(str, argv)]
    print("$ vitsee", " ".join(map(str, argv)), f"(load {load()})", flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)
    return time.perf_counter() - t


def trained(work: Path, name: str, *extra: str) -> str:
    """Trains work/NAME.safetensors unless it exists; returns the -m spec that extracts it."""
    if not (work / f"{name}.safetensors").exists():
        vitsee("train", f"{name}.safetensors", *VIT, "--held-out", "test.npz", "-q", *extra, cwd=work)
    return f"{NAME}@{name}.safetensors"


def exported(work: Path, store: str, view: str) -> dict:
    """Returns the numbers of one view of a store (`vitsee export ... -o FILE.json`)."""
    out = work / f"{store}-{view.replace(':', '-').replace('@', '-')}.json"
    if not out.exists():
        vitsee("export", f"{store}.h5", view, "-o", out.name, cwd=work)
    return json.loads(out.read_text())


def extracted(work: Path, store: str, models: list[str], *analyses: str) -> None:
    if not (work / f"{store}.h5").exists():
        vitsee("extract", f"{store}.h5", *[a for m in models for a in ("-m", m)], "--dataset", "npz:test.npz", "-q",
               cwd=work)
        vitsee("analyze", f"{store}.h5", *analyses, "-q", cwd=work)


def test_accuracy(work: Path, name: str) -> float:
    from vitsee.engine.train import read_record

    return read_record(work / f"{name}.safetensors")["test_accuracy"]


def off_diagonal(matrix: np.ndarray) -> float:
    return float(matrix[~np.eye(len(matrix), dtype=bool)].mean())


def paper(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    base, cut = trained(work, "vit"), trained(work, "noskip", "--no-skip", "blocks.1")
    f01, f03 = trained(work, "f01", "--data-fraction", "0.1"), trained(work, "f03", "--data-fraction", "0.3")
    gap = trained(work, "gap", "--pool", "avg")
    for name in ("vit", "noskip", "f01", "f03", "gap"):
        print(f"{name}: test accuracy {test_accuracy(work, name):.3f}")

    extracted(work, "fig8", [base, cut], "--cka")
    print("Fig. 8: CKA between blocks, within each model")
    for model in (base, cut):
        got = exported(work, "fig8", f"cka:{model}")
        print(json.dumps(got)[:300])
    extracted(work, "fig12", [f01, f03, base], "--probes")
    for model in (f01, f03, base):
        print(json.dumps(exported(work, "fig12", f"probes:{model}"))[:300])
    extracted(work, "fig10", [base, gap], "--spatial", "--probes")
    for model in (base, gap):
        print(json.dumps(exported(work, "fig10", f"spatial:{model}"))[:300])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("demo")
    d.add_argument("--cache", help="cache folder (default: a new temporary one)")
    p = sub.add_parser("paper")
    p.add_argument("--work", default="paper-runs", help="folder for the weights, stores and exports")
    args = parser.parse_args()
    {"demo": demo, "paper": paper}[args.what](args)


if __name__ == "__main__":
    main()

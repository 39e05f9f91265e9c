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

VIT = [
    "-m",
    "vit_tiny_patch16_224",
    "--model-arg",
    "patch_size=4",
    "--model-arg",
    "embed_dim=64",
    "--model-arg",
    "depth=6",
    "--model-arg",
    "num_heads=4",
    "--model-arg",
    "mlp_ratio=2",
    "--img-size",
    "32",
    "--dataset",
    "digits",
]
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
    from vitsee.output.colormap import ColorMode
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

    app = VitseeApp(
        None, options=AppOptions(color_mode=ColorMode.TRUECOLOR, export_dir=cache / "exports", folder=cache), demo=True
    )
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
    cmd = [sys.executable, "-m", "vitsee.cli", *map(str, argv)]
    print("$ vitsee", " ".join(map(str, argv)), f"(load {load()})", flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)
    return time.perf_counter() - t


# name -> `vitsee train` options; every run shares the split (seed 0) and so the held-out test.npz
RUNS = {
    "vit": [],  # the recipe's default; vit_tiny has a class token (CLS head)
    "vit-lr1e-3": ["--lr", "1e-3"],  # Fig. 8 compares at 1e-3: without a skip 3e-3 does not train
    "noskip-lr1e-3": ["--no-skip", "blocks.1", "--lr", "1e-3"],
    "noskip": ["--no-skip", "blocks.1"],
    "noskip-mlp": ["--no-skip", "blocks.1.mlp"],  # only the MLP's skip, at the recipe's 3e-3
    "f01": ["--data-fraction", "0.1"],  # Fig. 12, the same 15 epochs: fewer steps
    "f03": ["--data-fraction", "0.3"],
    "f01-steps": ["--data-fraction", "0.1", "--epochs", "150"],  # the same 660 steps as the whole split
    "f03-steps": ["--data-fraction", "0.3", "--epochs", "50"],
    "gap": ["--pool", "avg"],  # Fig. 10, 11
}
STORES = {  # store -> (runs, analyses)
    "fig8": (["vit-lr1e-3", "noskip-lr1e-3", "vit", "noskip-mlp"], ["--cka"]),
    "fig12": (["f01", "f03", "f01-steps", "f03-steps", "vit"], ["--probes"]),
    "fig10": (["vit", "gap"], ["--spatial", "--probes"]),
}


def model(name: str) -> str:
    return f"{NAME}@file:{name}"


def trained(work: Path, name: str) -> dict:
    """Trains work/NAME.safetensors unless it exists; returns its training record."""
    from vitsee.training.train import read_record

    if not (work / f"{name}.safetensors").exists():
        vitsee("train", f"{name}.safetensors", *VIT, "--held-out", "test.npz", "-q", *RUNS[name], cwd=work)
    return read_record(work / f"{name}.safetensors")


def exported(work: Path, store: str, view: str) -> dict:
    """Returns the numbers of one view of a store (`vitsee export ... -o FILE.json`)."""
    out = work / f"{store}-{view.replace(':', '-').replace('@', '-')}.json"
    if not out.exists():
        vitsee("export", f"{store}.h5", view, "-o", out.name, cwd=work)
    return json.loads(out.read_text())


def extracted(work: Path, store: str) -> None:
    runs, analyses = STORES[store]
    if not (work / f"{store}.h5").exists():
        specs = [a for r in runs for a in ("-m", f"{NAME}@{r}.safetensors")]
        vitsee("extract", f"{store}.h5", *specs, "--dataset", "npz:test.npz", "-q", cwd=work)
    vitsee("analyze", f"{store}.h5", *analyses, "-q", cwd=work)  # cached results are read, not recomputed


def values(view: dict) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in view["values"]], dtype=np.float64)


def fig8(work: Path) -> None:
    print("\nFig. 8: CKA between layers within each model (mean off-diagonal; blocks.1 is the one without skips)")
    for name in STORES["fig8"][0]:
        view = exported(work, "fig8", f"cka:{model(name)}")
        cka, rows = values(view), view["rows"]
        off = cka[~np.eye(len(cka), dtype=bool)]
        b = {r: i for i, r in enumerate(rows)}
        early = [b[r] for r in ("patch_embed", "blocks.0")]
        late = [b[f"blocks.{i}"] for i in range(2, 6)] + [b["norm"]]
        print(
            f"| {name} | {np.nanmean(off):.3f} | {np.nanmean(cka[np.ix_(early, late)]):.3f} | "
            f"{np.nanmean(cka[np.ix_(late, late)][~np.eye(len(late), dtype=bool)]):.3f} |"
        )
        print("  rows:", " ".join(rows))
        for r, row in zip(rows, cka):
            print(f"  {r:12s}", " ".join(f"{v:.2f}" for v in row))


def fig12(work: Path) -> None:
    print("\nFig. 12: linear probe test accuracy per layer (CLS / GAP / mean of per-token probes)")
    for name in STORES["fig12"][0]:
        view = exported(work, "fig12", f"probes:{model(name)}")
        acc = values(view)
        cells = " | ".join("/".join("-" if np.isnan(v) else f"{v:.2f}" for v in row) for row in acc)
        print(f"| {name} | {cells} |")
    print("  layers:", " ".join(view["rows"]), "; readouts:", ", ".join(view["cols"]))


def fig10(work: Path) -> None:
    print("\nFig. 10, 11: spatial maps of the last block (token x input patch CKA) and per-token probes")
    for name in STORES["fig10"][0]:
        cka = values(exported(work, "fig10", f"spatial:{model(name)}"))  # (tokens, patches), one row per token
        own = np.diag(cka)
        other = cka[~np.eye(len(cka), dtype=bool)]
        # where a token's map peaks: at its own patch, or within one patch of it on the 8 x 8 grid
        side = int(round(len(cka) ** 0.5))
        peak = np.nanargmax(np.nan_to_num(cka, nan=-np.inf), axis=1)
        tok = np.arange(len(cka))
        near = np.maximum(abs(peak // side - tok // side), abs(peak % side - tok % side)) <= 1
        view = exported(work, "fig10", f"probes:{model(name)}")
        acc = dict(zip(view["cols"], values(view)[view["rows"].index("blocks.5")]))  # a GAP model has no CLS column
        readouts = " / ".join(f"{acc[c]:.2f}" if c in acc else "-" for c in ("CLS", "GAP", "tokens (mean)"))
        print(
            f"| {name} | {np.nanmean(own):.3f} | {np.nanmean(other):.3f} | {np.mean(peak == tok):.2f} | "
            f"{np.mean(near):.2f} | {readouts} |"
        )


def paper(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print("| run | train images | test accuracy after each epoch | seconds in epochs |")
    for name in RUNS:
        r = trained(work, name)
        accs = [h["test_accuracy"] for h in r["history"]]
        shown = accs if len(accs) <= 15 else accs[:: len(accs) // 15][:14] + accs[-1:]
        print(
            f"| {name} | {r['n_train']} | {' '.join(f'{a:.2f}' for a in shown)} | "
            f"{sum(h['seconds'] for h in r['history']):.0f} |"
        )
    for store in STORES:
        extracted(work, store)
    fig8(work)
    fig12(work)
    fig10(work)


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

"""The training figures of benchmarks/README.md: the offline demo's first launch, and the paper's interventions.

    python benchmarks/train.py demo                 # vitsee-tui --demo offline, cache empty: time to the first heatmap
    python benchmarks/train.py paper --work DIR     # Fig. 8, 12, 10/11 with the README's commands, then their figures
    python benchmarks/train.py seeds --work DIR     # the same with three init seeds on one split: mean and spread

`seeds` trains every run with `vitsee train ... --seeds 0,1,2 --split-seed 0` (seed 0 is `paper`'s run), extracts
each seed's models into stores of their own over the same held-out images, and prints each figure's numbers as the
mean and the sample standard deviation over the seeds (and each seed's), drawing the figures with their spread into
--figures (vitsee.across_seeds gives the CKA matrices' mean and spread); trained models against their random-init
twins (each seed's own init, `write_initial`) come from the zoo with its permutation null.

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
    from vitsee.models.load import read_record

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


# --- the paper's experiments over training seeds --------------------------------------------------------------

SEEDS = (0, 1, 2)
RESNET = ["-m", "resnet18", "--model-arg", "channels=[32,64,128,256]", "--img-size", "32", "--dataset", "digits"]
SEED_RUNS = {  # name -> (architecture options, `vitsee train` options), every run on the split of seed 0
    "vit": (VIT, []),
    "vit-lr1e-3": (VIT, ["--lr", "1e-3"]),
    "noskip-lr1e-3": (VIT, ["--no-skip", "blocks.1", "--lr", "1e-3"]),
    "gap": (VIT, ["--pool", "avg"]),
    "f01-steps": (VIT, ["--data-fraction", "0.1", "--epochs", "150"]),
    "f03-steps": (VIT, ["--data-fraction", "0.3", "--epochs", "50"]),
    "resnet": (RESNET, []),
}
SEED_STORES = {  # store -> (runs, analyses); twins: each trained model and its seed's random init
    "fig8": (["vit-lr1e-3", "noskip-lr1e-3"], ["--cka"]),
    "fig12": (["f01-steps", "f03-steps", "vit"], ["--probes"]),
    "fig10": (["vit", "gap"], ["--spatial", "--probes"]),
    "twins": (["vit", "vit-init", "resnet", "resnet-init"], ["--cka", "--zoo"]),
}


def seed_model(name: str, seed: int) -> str:
    arch = "resnet18" if name.startswith("resnet") else NAME
    return f"{arch}@{name.removesuffix('-init')}{'-init' if name.endswith('-init') else ''}-s{seed}.safetensors"


def seed_trained(work: Path) -> None:
    """Trains every run for every seed (each `--seeds` run skips the seeds already trained), then writes each trained
    ViT's and ResNet's random-init twin (the seed's own init: what its training started from)."""
    from vitsee.training.train import TrainConfig, parse_model_args, write_initial

    seeds = ",".join(map(str, SEEDS))
    for name, (arch, extra) in SEED_RUNS.items():
        if not all((work / f"{name}-s{s}.safetensors").exists() for s in SEEDS):
            t = vitsee("train", f"{name}.safetensors", *arch, "--seeds", seeds, "--split-seed", "0", "--held-out",
                       "test.npz", "-q", *extra, cwd=work)  # fmt: skip
            print(f"  {name}: {t:.0f} s for {len(SEEDS)} seeds", flush=True)
    for name in ("vit", "resnet"):
        arch = SEED_RUNS[name][0]
        model = arch[arch.index("-m") + 1]
        args = parse_model_args([arch[i + 1] for i, a in enumerate(arch) if a == "--model-arg"])
        for seed in SEEDS:
            out = work / f"{name}-init-s{seed}.safetensors"
            if not out.exists():
                write_initial(
                    TrainConfig(out=out, model=model, model_args=args, img_size=32, dataset="digits", seed=seed,
                                split_seed=0, device="cpu")
                )  # fmt: skip


def seed_extracted(work: Path) -> None:
    for store, (runs, analyses) in SEED_STORES.items():
        for seed in SEEDS:
            path = work / f"{store}-s{seed}.h5"
            if not path.exists():
                specs = [a for r in runs for a in ("-m", seed_model(r, seed))]
                vitsee("extract", path.name, *specs, "--dataset", "npz:test.npz", "-q", cwd=work)
            vitsee("analyze", path.name, *analyses, "-q", cwd=work)


def mean_sd(values) -> str:
    v = np.asarray(values, dtype=np.float64)
    return f"{v.mean():.3f} +- {v.std(ddof=1):.3f}"


def seed_fig8(work: Path, figures: Path) -> None:
    import vitsee

    print("\nFig. 8 over seeds: CKA within each model, mean +- sd over 3 seeds (each seed's in brackets)")
    print("| model | test accuracy | mean off-diagonal CKA | before the cut x after it | within blocks.2 ... norm |")
    print("|---|---|---|---|---|")
    spreads = {}
    for name in SEED_STORES["fig8"][0]:
        stores = [work / f"fig8-s{s}.h5" for s in SEEDS]
        runs = vitsee.across_seeds(stores, [f"cka:{NAME}@file:{name}-s{s}" for s in SEEDS], progress=False)
        spreads[name] = runs
        b = {r: i for i, r in enumerate(runs.rows)}
        early = [b[r] for r in ("patch_embed", "blocks.0")]
        late = [b[f"blocks.{i}"] for i in range(2, 6)] + [b["norm"]]
        rows = []
        for cka in runs.values:
            off = cka[~np.eye(len(cka), dtype=bool)]
            within = cka[np.ix_(late, late)][~np.eye(len(late), dtype=bool)]
            rows.append((np.nanmean(off), np.nanmean(cka[np.ix_(early, late)]), np.nanmean(within)))
        rows = np.array(rows)
        acc = [read(work, f"{name}-s{s}")["test_accuracy"] for s in SEEDS]
        cells = [f"{mean_sd(rows[:, k])} ({' '.join(f'{v:.3f}' for v in rows[:, k])})" for k in range(3)]
        print(f"| {name} | {mean_sd(acc)} ({' '.join(f'{a:.2f}' for a in acc)}) | {' | '.join(cells)} |")
    draw_fig8(spreads, figures / "seeds-fig8.png")


def read(work: Path, name: str) -> dict:
    from vitsee.models.load import read_record

    return read_record(work / f"{name}.safetensors")


def seed_fig12(work: Path, figures: Path) -> None:
    print("\nFig. 12 over seeds: probe test accuracy per layer (CLS / GAP / per-token mean), mean +- sd over 3 seeds")
    curves = {}
    for name in SEED_STORES["fig12"][0]:
        views = [exported(work, f"fig12-s{s}", f"probes:{NAME}@file:{name}-s{s}") for s in SEEDS]
        acc = np.stack([values(v) for v in views])  # (seeds, layers, readouts)
        curves[name] = (acc, views[0]["rows"], views[0]["cols"])
        mean, sd = np.nanmean(acc, axis=0), np.nanstd(acc, axis=0, ddof=1)
        cells = " | ".join(
            "/".join("-" if np.isnan(m) else f"{m:.2f}+-{d:.2f}" for m, d in zip(mr, dr)) for mr, dr in zip(mean, sd)
        )
        test = [read(work, f"{name}-s{s}")["test_accuracy"] for s in SEEDS]
        print(f"| {name} ({mean_sd(test)}) | {cells} |")
    print("  layers:", " ".join(views[0]["rows"]), "; readouts:", ", ".join(views[0]["cols"]))
    draw_fig12(curves, figures / "seeds-fig12.png")


def seed_fig10(work: Path, figures: Path) -> None:
    print("\nFig. 10, 11 over seeds: the last block's spatial maps, mean +- sd over 3 seeds")
    print("| model | map at own patch | elsewhere | peak at own patch | peak within one patch |")
    print("|---|---|---|---|---|")
    measured = {}
    for name in SEED_STORES["fig10"][0]:
        rows = []
        for s in SEEDS:
            cka = values(exported(work, f"fig10-s{s}", f"spatial:{NAME}@file:{name}-s{s}"))
            side = int(round(len(cka) ** 0.5))
            peak = np.nanargmax(np.nan_to_num(cka, nan=-np.inf), axis=1)
            tok = np.arange(len(cka))
            near = np.maximum(abs(peak // side - tok // side), abs(peak % side - tok % side)) <= 1
            other = cka[~np.eye(len(cka), dtype=bool)]
            rows.append((np.nanmean(np.diag(cka)), np.nanmean(other), np.mean(peak == tok), np.mean(near)))
        rows = np.array(rows)
        measured[name] = rows
        print(f"| {name} | " + " | ".join(f"{mean_sd(rows[:, k])}" for k in range(4)) + " |")
    draw_bars(
        ["map at own patch", "elsewhere", "peak at own patch", "peak within one patch"],
        measured,
        f"Fig. 10, 11 over {len(SEEDS)} seeds: the last block's tokens, CLS (vit) against GAP",
        figures / "seeds-fig10.png",
    )


def seed_twins(work: Path, figures: Path) -> None:
    print("\nTrained against random-init twins over seeds: the zoo's best-match CKA, raw / calibrated, mean +- sd")
    names = SEED_STORES["twins"][0]
    raw, cal, pvals = [], [], []
    for s in SEEDS:
        view = exported(work, f"twins-s{s}", "zoo")
        order = [view["rows"].index(seed_model(n, s).replace(".safetensors", "").replace("@", "@file:")) for n in names]
        pick = np.ix_(order, order)
        raw.append(values(view)[pick])
        cal.append(np.array(view["calibrated"], dtype=float)[pick])
        pvals.append(np.array([[np.nan if v is None else v for v in r] for r in view["p_value"]], dtype=float)[pick])
    raw, cal, pvals = np.stack(raw), np.stack(cal), np.stack(pvals)
    print("| pair | raw | calibrated | p (each seed) |")
    print("|---|---|---|---|")
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            print(
                f"| {names[i]} x {names[j]} | {mean_sd(raw[:, i, j])} | {mean_sd(cal[:, i, j])} | "
                + " ".join(f"{p:.3f}" for p in pvals[:, i, j])
                + " |"
            )
    draw_twins(names, raw, cal, figures / "seeds-twins.png")


def draw_fig8(spreads: dict, out: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6.6), dpi=110)
    axes = fig.subplots(2, len(spreads))
    for col, (name, runs) in enumerate(spreads.items()):
        for row, (what, data, vmax) in enumerate((("mean", runs.mean, 1.0), ("sd over seeds", runs.std, 0.3))):
            ax = axes[row, col]
            im = ax.imshow(data, origin="lower", vmin=0, vmax=vmax, cmap="viridis" if row == 0 else "magma")
            ax.set_title(f"{name}: CKA {what}", fontsize=9)
            ax.set_xticks(range(len(runs.cols)), runs.cols, rotation=90, fontsize=7)
            ax.set_yticks(range(len(runs.rows)), runs.rows, fontsize=7)
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"Fig. 8 over {len(SEEDS)} training seeds (one split): a ViT without blocks.1's skips", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    print(f"  figure: {out}")


def draw_fig12(curves: dict, out: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.4), dpi=110)
    axes = fig.subplots(1, 3, sharey=True)
    for k, readout in enumerate(("CLS", "GAP", "tokens (mean)")):
        ax = axes[k]
        for name, (acc, rows, cols) in curves.items():
            if readout not in cols:
                continue
            v = acc[:, :, cols.index(readout)]
            mean, sd = np.nanmean(v, axis=0), np.nanstd(v, axis=0, ddof=1)
            x = np.arange(len(rows))
            ax.plot(x, mean, marker="o", ms=3, label=name)
            ax.fill_between(x, mean - sd, mean + sd, alpha=0.25)
        ax.set_title(f"{readout} probe", fontsize=9)
        ax.set_xticks(np.arange(len(rows)), rows, rotation=90, fontsize=7)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("test accuracy (mean +- sd over seeds)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"Fig. 12 over {len(SEEDS)} training seeds: less data, the same 660 steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    print(f"  figure: {out}")


def draw_bars(labels: list[str], measured: dict[str, np.ndarray], title: str, out: Path) -> None:
    """Draws each run's numbers (seeds, len(labels)) as bars of their mean with the sd, each seed a dot."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2), dpi=110)
    ax = fig.subplots()
    x, width = np.arange(len(labels)), 0.8 / len(measured)
    for k, (name, rows) in enumerate(measured.items()):
        at = x + (k - (len(measured) - 1) / 2) * width
        ax.bar(at, rows.mean(axis=0), width, yerr=rows.std(axis=0, ddof=1), capsize=3, label=name)
        for seed_row in rows:
            ax.plot(at, seed_row, "k.", ms=3)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title(title + " (bars: mean, sd; dots: seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    print(f"  figure: {out}")


def draw_twins(names: list[str], raw: np.ndarray, cal: np.ndarray, out: Path) -> None:
    from matplotlib.figure import Figure

    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    fig = Figure(figsize=(8, 3.4), dpi=110)
    ax = fig.subplots()
    x = np.arange(len(pairs))
    for k, (label, data) in enumerate((("raw best-match CKA", raw), ("calibrated", cal))):
        v = np.stack([data[:, i, j] for i, j in pairs], axis=1)  # (seeds, pairs)
        ax.bar(x + (k - 0.5) * 0.38, v.mean(axis=0), 0.38, yerr=v.std(axis=0, ddof=1), capsize=3, label=label)
        for s in range(len(v)):
            ax.plot(x + (k - 0.5) * 0.38, v[s], "k.", ms=3)
    ax.set_xticks(x, [f"{names[i]}\nx {names[j]}" for i, j in pairs], fontsize=7)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title(f"trained models and their random-init twins over {len(SEEDS)} seeds (bars: mean, sd; dots: seeds)",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out)
    print(f"  figure: {out}")


def seeds(args) -> None:
    import warnings

    warnings.simplefilter("ignore", RuntimeWarning)  # a readout a layer lacks (patch_embed's CLS): NaN, said as '-'
    work = Path(args.work)
    figures = Path(args.figures)
    work.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    seed_trained(work)
    print("| run | test accuracy per seed | mean +- sd | seconds in epochs per seed |")
    print("|---|---|---|---|")
    for name in SEED_RUNS:
        recs = [read(work, f"{name}-s{s}") for s in SEEDS]
        acc = [r["test_accuracy"] for r in recs]
        secs = " ".join(f"{sum(h['seconds'] for h in r['history']):.0f}" for r in recs)
        print(f"| {name} | {' '.join(f'{a:.3f}' for a in acc)} | {mean_sd(acc)} | {secs} |")
    seed_extracted(work)
    seed_fig8(work, figures)
    seed_fig12(work, figures)
    seed_fig10(work, figures)
    seed_twins(work, figures)
    print(f"\n{time.perf_counter() - t0:.0f} s (load {load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("demo")
    d.add_argument("--cache", help="cache folder (default: a new temporary one)")
    p = sub.add_parser("paper")
    p.add_argument("--work", default="paper-runs", help="folder for the weights, stores and exports")
    s = sub.add_parser("seeds")
    s.add_argument("--work", default="seed-runs", help="folder for the weights, stores and exports")
    s.add_argument("--figures", default="seed-figures", help="folder for the figures (PNG)")
    args = parser.parse_args()
    {"demo": demo, "paper": paper, "seeds": seeds}[args.what](args)


if __name__ == "__main__":
    main()

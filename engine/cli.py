"""`vitsee`: the headless command line (extract, train, analyze, export, show, info, name, models, layers).

Thin on purpose: parse, call the engine, render with Rich. A VitseeError becomes one line on stderr and
a non-zero exit; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from vitsee.errors import VitseeError, VitseeNote, brief

app = typer.Typer(
    name="vitsee",
    help="Do vision transformers see like CNNs? Extract timm activations into an HDF5 store and analyse them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True)


class _NoBar:
    def stop(self) -> None:
        pass


def _warn(event) -> None:
    err.print(f"warning: {event.message}", style="yellow", highlight=False, soft_wrap=True)


def _progress_bar(quiet: bool, warn: bool = True):
    """Returns (callback, context manager) drawing extraction progress on stderr; quiet: no bars or progress
    lines, but the warnings about the data (fp16 loss, non-finite values) still, as `vitsee info` shows them."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if quiet:
        return (lambda e: _warn(e) if warn and e.stage == "warning" else None), _NoBar()
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
    state: dict = {}

    def on_event(event) -> None:
        import time

        if event.stage in ("plan", "load"):
            bar.console.print(event.message, style="dim" if event.stage == "load" else None, highlight=False)
        elif event.stage == "warning":
            _warn(event)
        elif event.stage == "extract":
            if "task" not in state:
                bar.start()
                state["task"] = bar.add_task("extract", total=event.total, completed=event.done, rate="")
                state["t0"], state["start"] = time.perf_counter(), event.done
            elapsed = time.perf_counter() - state["t0"]
            rate = (event.done - state["start"]) / elapsed if elapsed > 0 else 0.0
            bar.update(state["task"], completed=event.done, rate=f"{rate:.1f} img/s")
        elif event.stage == "analyze":
            key = ("analyze", event.message)
            if key not in state:
                bar.start()
                state[key] = bar.add_task(event.message, total=event.total, rate="")
            bar.update(state[key], completed=event.done)

    return on_event, bar


@app.command()
def extract(
    ctx: typer.Context,
    store: Annotated[Path, typer.Argument(help="HDF5 store to create, resume or append to")],
    model: Annotated[
        list[str],
        typer.Option(
            "--model",
            "-m",
            help="NAME[.TAG][@pretrained|@random[:SEED]|@PATH]; repeat for several; none: resume the run STORE records",
        ),
    ] = [],  # noqa: B006
    dataset: Annotated[
        str,
        typer.Option(help="digits | samples | synthetic | imagefolder:PATH | cifar10:PATH | cifar100:PATH | npz:PATH"),
    ] = "samples",
    n_images: Annotated[Optional[int], typer.Option("--n-images", "-n", help="how many images (default: all)")] = None,
    batch_size: Annotated[int, typer.Option(help="images per forward pass and per stored chunk")] = 64,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    layers: Annotated[str, typer.Option(help="blocks | sublayers | NAME,NAME,... (timm module paths)")] = "blocks",
    img_size: Annotated[Optional[int], typer.Option(help="build every model for N x N input")] = None,
    dtype: Annotated[str, typer.Option(help="float16 | float32 for stored activations")] = "float16",
    shuffle_seed: Annotated[
        Optional[int], typer.Option(help="take a seeded random subset instead of the first N")
    ] = None,
    workers: Annotated[
        Optional[int],
        typer.Option(
            help="image loading processes (default: on a GPU cores - 1, at most 4; on the CPU 0, "
            "images load between forward passes)"
        ),
    ] = None,
    streaming: Annotated[
        bool,
        typer.Option(
            help="keep no activations: CKA (store order, this batch size) and statistics straight from the forward pass"
        ),
    ] = False,
    heads: Annotated[
        bool,
        typer.Option(
            "--heads",
            help="with --streaming: also head-level CKA, each ViT head against the other models' layers "
            "(paper Fig. 5); without it head outputs are stored anyway",
        ),
    ] = False,
    models_from: Annotated[
        list[Path],
        typer.Option(
            "--models-from",
            help="a file of model specs, one per line as --model takes them (# comments); repeat for several",
        ),
    ] = [],  # noqa: B006
    models_pattern: Annotated[
        list[str],
        typer.Option(
            "--models",
            help="every timm model with pretrained weights matching a pattern, e.g. 'vit_tiny*' "
            "(timm.list_models(PATTERN, pretrained=True))",
        ),
    ] = [],  # noqa: B006
    skip_missing: Annotated[
        bool,
        typer.Option("--skip-missing", help="leave out listed models whose weights cannot be had here, and say so"),
    ] = False,
    grams: Annotated[
        bool,
        typer.Option(
            "--grams",
            help="streaming for a zoo: keep each layer's Gram of each batch (4 x images x batch size bytes a layer), "
            "so models run a few at a time and can be added later",
        ),
    ] = False,
    memory_budget: Annotated[
        Optional[str],
        typer.Option(
            "--memory-budget",
            help="memory the models may take at once, e.g. 4G (default: half of what is free); "
            "more models run in waves",
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="replace an existing store")] = False,
    force: Annotated[bool, typer.Option(help="start even if the disk looks too small")] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="no progress bar (warnings about the data still print)")
    ] = False,
    threads: Annotated[
        Optional[int],
        typer.Option(
            help="CPU compute threads (default: the usable cores other processes leave free; "
            "CKA Grams and probe fits also share the busy ones, a layer at a time)"
        ),
    ] = None,
) -> None:
    """Run models over images and store layer activations and per-image statistics (resumable: with no
    --model, `vitsee extract STORE` finishes the run STORE records)."""
    _precheck_extract(store, model, dataset, models_from)  # a typo costs seconds, not the minute torch takes
    from vitsee.extraction import distributed
    from vitsee.extraction.distributed import is_secondary
    from vitsee.extraction.extract import resume_extraction, run_extraction
    from vitsee.extraction.run_config import Resume, extraction
    from vitsee.threads import set_compute_threads

    secondary = is_secondary()
    quiet = quiet or secondary  # under torchrun rank 0 speaks for the run
    # under torchrun (WORLD_SIZE > 1) each process extracts a shard and rank 0 stitches them
    driver = distributed.extract_sharded if distributed.current() is not None else run_extraction
    if models_from or models_pattern:
        model = _listed_models(model, models_from, models_pattern, skip_missing, quiet)
    planned = extraction(store, model, ctx.params, given=_typed_options(ctx))
    if isinstance(planned, Resume):
        if not quiet:
            err.print(planned.describe(), highlight=False, soft_wrap=True)
        if planned.complete:
            return
        run = lambda progress: resume_extraction(planned, progress=progress, driver=driver)  # noqa: E731
    else:
        run = lambda progress: driver(planned, progress=progress)  # noqa: E731
    set_compute_threads(threads)
    on_event, bar = _progress_bar(quiet, warn=not secondary)
    try:
        result = run(on_event)
    except KeyboardInterrupt:
        err.print(f"interrupted: finished batches are kept; resume with `vitsee extract {store}`", highlight=False)
        raise typer.Exit(130) from None
    finally:
        if isinstance(bar, _NoBar) or bar.live.is_started:
            bar.stop()
    if not quiet:
        rate = result.images_processed / result.seconds if result.seconds else 0
        err.print(
            f"wrote {result.store}: {', '.join(result.models)}; {result.images_processed} images in "
            f"{result.seconds:.1f} s ({rate:.1f} img/s)",
            highlight=False,
        )


def _precheck_extract(store: Path, specs: list[str], dataset: str, files: list[Path]) -> None:
    """Raises the VitseeError of a mistake in what `extract` was given that shows without torch or timm: a model
    spec's weights or (with timm's names kept here) its name, the dataset, a missing file, the store's folder."""
    from vitsee.data import check_dataset_spec
    from vitsee.models.specs import precheck_spec

    for spec in specs:
        precheck_spec(spec)
    for path in files:
        if not path.exists():
            raise VitseeError(f"--models-from {path} does not exist: give a file with one model spec per line")
        if not path.is_file():
            raise VitseeError(f"--models-from {path} is not a file: give a file with one model spec per line")
    if specs or files:  # without models a run resumes the store's recorded dataset
        check_dataset_spec(dataset)
    if not store.expanduser().parent.is_dir():
        parent = store.expanduser().parent
        raise VitseeError(f"folder {parent} does not exist: create it first (mkdir -p {parent}) or choose another path")


def _listed_models(
    specs: list[str], files: list[Path], patterns: list[str], skip_missing: bool, quiet: bool
) -> list[str]:
    """Returns the specs to extract from -m, --models-from and --models, after printing the plan of their weights
    (cached here, would be downloaded, cannot be had) on stderr."""
    from vitsee.models.load import model_list

    listed = model_list(specs, files, patterns)
    if not quiet:
        for line in listed.describe():
            err.print(line, highlight=False, soft_wrap=True, markup=False)
    run = listed.check(skip_missing)
    if listed.missing and not quiet:
        err.print(
            f"left out (--skip-missing): {', '.join(e.spec for e in listed.missing)}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    return run


def _typed(ctx: typer.Context, name: str, value):
    """Returns value if the user typed the option (or set it in the environment), else None."""
    source = ctx.get_parameter_source(name)  # typer's own copy of click's ParameterSource: compare by name
    return None if source is None or source.name == "DEFAULT" else value


def _typed_options(ctx: typer.Context) -> dict:
    """Returns {flag: value} of the options a resume checks against the store's record that the user typed (and
    --device, which replaces the recorded one)."""
    from vitsee.extraction.run_config import RECORDED_OPTIONS

    flags = {**RECORDED_OPTIONS, "--overwrite": "overwrite", "--device": "device"}
    typed = {flag: _typed(ctx, name, ctx.params[name]) for flag, name in flags.items()}
    return {flag: value for flag, value in typed.items() if value is not None}


def _train_bar(quiet: bool):
    """Returns (callback, stop) drawing a Rich bar per epoch on stderr and one line when each epoch ends."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if quiet:
        return (lambda _e: None), (lambda: None)
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}  acc {task.fields[acc]:.3f}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    state: dict = {}

    def on_event(event) -> None:
        if event.stage in ("plan", "done"):
            err.print(event.message, highlight=False)
        elif event.stage == "step":
            if state.get("epoch") != event.epoch:
                if "task" in state:
                    bar.remove_task(state["task"])
                bar.start()
                state["epoch"] = event.epoch
                state["task"] = bar.add_task(
                    f"epoch {event.epoch}/{event.epochs}", total=event.total, loss=0.0, acc=0.0
                )
            bar.update(state["task"], completed=event.done, loss=event.loss, acc=event.accuracy)
        elif event.stage == "epoch":
            bar.stop()
            r = event.row
            err.print(
                f"epoch {r['epoch']}/{event.epochs}  loss {r['train_loss']:.4f}  train acc {r['train_accuracy']:.3f}  "
                f"test acc {r['test_accuracy']:.3f}  lr {r['lr']:.2e}  {r['seconds']:.1f} s",
                highlight=False,
            )

    return on_event, bar.stop


@app.command()
def train(
    out_file: Annotated[
        Path, typer.Argument(metavar="OUT.safetensors", help="weights file to write (with its training record)")
    ],
    model: Annotated[str, typer.Option("--model", "-m", help="timm model name, e.g. vit_tiny_patch16_224 or resnet18")],
    model_arg: Annotated[
        list[str], typer.Option("--model-arg", help="KEY=VALUE for timm.create_model, e.g. patch_size=4; repeat")
    ] = [],  # noqa: B006
    img_size: Annotated[Optional[int], typer.Option(help="train at N x N input")] = None,
    dataset: Annotated[
        str,
        typer.Option(
            help="a labelled set: digits | synthetic | imagefolder:PATH | cifar10:PATH | cifar100:PATH | npz:PATH"
        ),
    ] = "digits",
    n_images: Annotated[
        Optional[int], typer.Option("--n-images", "-n", help="split a seeded N of the set (default: all)")
    ] = None,
    data_fraction: Annotated[
        float, typer.Option(help="train on a seeded fraction in (0, 1] of the training split")
    ] = 1.0,
    test_fraction: Annotated[
        float, typer.Option(help="part of the images held out for testing, never trained on")
    ] = 0.2,
    epochs: Annotated[
        Optional[int], typer.Option(help="epochs [default: the family's recipe, ViT 15, ResNet 6]")
    ] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="images per step [default: ViT 32, ResNet 64]")] = None,
    lr: Annotated[
        Optional[float], typer.Option(help="peak AdamW learning rate [default: 3e-3 ViT, 2e-3 ResNet]")
    ] = None,
    weight_decay: Annotated[
        Optional[float], typer.Option(help="AdamW weight decay [default: 0.05 ViT, 0.01 ResNet]")
    ] = None,
    warmup_epochs: Annotated[
        Optional[float], typer.Option(help="linear warm-up before the cosine decay [default: 0.5]")
    ] = None,
    label_smoothing: Annotated[Optional[float], typer.Option(help="[default: 0.1]")] = None,
    augment: Annotated[
        Optional[bool],
        typer.Option(
            "--augment/--no-augment",
            help="light augmentation (timm's training transform: random resized crops) [default: ResNet yes, ViT no]",
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="seed of the init and the data order (and of the split, unless --split-seed)")
    ] = 0,
    split_seed: Annotated[
        Optional[int],
        typer.Option(help="seed of the train/test split and the data fraction's part [default: --seed]"),
    ] = None,
    seeds: Annotated[
        Optional[str],
        typer.Option(
            help="train one run per init seed, e.g. 0,1,2, into OUT-s0.safetensors, ... on one split "
            "(--split-seed, default --seed)"
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    workers: Annotated[int, typer.Option(help="image loading processes")] = 0,
    threads: Annotated[
        Optional[int],
        typer.Option(
            help="torch compute threads [default: 1 on CPU, faster on a shared machine; torch's own on a GPU]"
        ),
    ] = None,
    no_skip: Annotated[
        Optional[str], typer.Option(help="remove residual adds: BLOCK[.attn|.mlp],... e.g. blocks.3")
    ] = None,
    pool: Annotated[
        Optional[str], typer.Option(help="ViT classifier: cls (class token) | avg (GAP, no class token)")
    ] = None,
    held_out: Annotated[
        Optional[Path],
        typer.Option(help="also write the test split (never trained on) as FILE.npz for extract --dataset npz:FILE"),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="replace an existing OUT (and start over from any checkpoint)")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar or epoch lines")] = False,
) -> None:
    """Train a timm classifier with the paper's interventions; resumable, OUT written at the end."""
    from vitsee.models.interventions import parse_no_skip
    from dataclasses import replace

    from vitsee.training.train import TrainConfig, check_held_out, checkpoint_path, parse_model_args, write_held_out
    from vitsee.training.train import parse_seeds, seed_path
    from vitsee.training.train import train as run_training

    if split_seed is not None and split_seed < 0:
        raise VitseeError(f"--split-seed {split_seed} is negative: use a seed of 0 or more")
    cfg = TrainConfig(
        out=out_file,
        model=model,
        model_args=parse_model_args(model_arg),
        img_size=img_size,
        dataset=dataset,
        n_images=n_images,
        data_fraction=data_fraction,
        test_fraction=test_fraction,
        seed=seed,
        split_seed=split_seed,
        no_skip=parse_no_skip(no_skip),
        pool=pool,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        warmup_epochs=warmup_epochs,
        label_smoothing=label_smoothing,
        augment=augment,
        device=device,
        workers=workers,
        threads=threads,
        overwrite=overwrite,
    )
    if held_out is not None:
        check_held_out(held_out, out_file)
    runs = [cfg]
    if seeds is not None:  # several init seeds on one split: the split seed stays what one run would have used
        fixed = seed if split_seed is None else split_seed
        runs = [replace(cfg, out=seed_path(out_file, s), seed=s, split_seed=fixed) for s in parse_seeds(seeds)]
    for run in runs:
        if seeds is not None and run.out.exists() and not overwrite:
            if not quiet:
                err.print(f"{run.out} exists: kept (--overwrite trains it again)", highlight=False)
            continue
        on_event, stop = _train_bar(quiet)
        try:
            result = run_training(run, progress=on_event)
        except KeyboardInterrupt:
            err.print(
                f"interrupted: finished epochs are kept in {checkpoint_path(run.out)}; "
                "rerun the same command to resume",
                highlight=False,
            )
            raise typer.Exit(130) from None
        finally:
            stop()
        if not quiet:
            err.print(
                f"{result.seconds:.1f} s; extract it with -m {model}@{result.out}"
                + (f" --dataset npz:{held_out}" if held_out else ""),
                highlight=False,
            )
    if held_out is not None:
        write_held_out(runs[0], held_out)  # every seed's split is the same: one file of images none trained on


@app.command()
def info(store: Annotated[Path, typer.Argument(help="a store made by `vitsee extract`")]) -> None:
    """Print what a store holds: images, models, layers with shapes and sizes, statistics, results."""
    from rich.markup import escape

    from vitsee.store import Store

    with Store.open(store) as s:
        _print_store(s, store)
        for key in s.models:
            _print_model(s, key)
        results = s.results()
        if results:
            out.print()
            out.print("[bold]cached results[/]")
            for r in results:
                out.print(f"  {r['analysis']} {r['id']}  {r['params']}", highlight=False)
        out.print()
        out.print(
            f"remove it with `vitsee rm {escape(str(store))}`: the file and everything of it beside it, together "
            f"(deleting {escape(store.name)} alone leaves {escape(s.sidecar.name)}/ behind)",
            highlight=False,
        )


@app.command()
def rm(
    store: Annotated[Path, typer.Argument(help="a store made by `vitsee extract` (or the path of one that is gone)")],
    leftover: Annotated[
        bool, typer.Option("--leftover", help="remove the folder STORE.d of a store that is gone (deleted by hand)")
    ] = False,
) -> None:
    """Remove a store: its file, and its folder beside it (appended models, cached results) and torchrun shards."""
    from vitsee.store.remove import remove_leftover, remove_store, summary

    done = remove_leftover(store) if leftover else remove_store(store)
    if leftover:
        out.print(
            f"removed the folder of {store}: {len(done['removed'])} file(s)"
            + (f"; left {len(done['left'])} that are not vitsee's" if done["left"] else ""),
            highlight=False,
        )
    else:
        out.print(summary(store, done), highlight=False)


def _print_store(s, store: Path) -> None:
    """Prints a store's file, whether it is complete, the command that made it, what lies beside it, and its images."""
    from rich.markup import escape

    from vitsee.extraction.run_config import command_line
    from vitsee.store import human_bytes
    from vitsee.store.files import find_moved_folder

    record = s.run_config()
    resume = (
        f"resume it with `vitsee extract {store}`"
        if record is not None
        else "rerun the `vitsee extract` command that made it to resume"
    )
    status = "complete" if s.complete else f"[yellow]incomplete[/] ({escape(resume)})"
    out.print(f"[bold]{escape(str(store))}[/]  {human_bytes(store.stat().st_size)} on disk, {status}", highlight=False)
    if record is not None:
        out.print(f"made by: {escape(command_line(store, record))}", highlight=False)
    side = s.files_beside()
    if side["files"]:
        out.print(
            f"beside it in {s.sidecar.name}/: {side['models']} appended model file(s), {side['results']} cached "
            f"result file(s), {human_bytes(side['bytes'])} (move or copy the store and this folder together)",
            highlight=False,
        )
    moved = find_moved_folder(store, s.store_id)
    if moved is not None:
        out.print(
            f"[yellow]{escape(str(moved))} holds appended models or cached results of this store[/] (it was "
            f"moved without its folder): {escape(_folder_back(moved, s.sidecar))}",
            highlight=False,
        )
    if s.streaming:
        heads = " and head-level CKA" if s.streamed_heads() else ""  # extract --streaming --heads
        out.print(
            f"streaming: activations not stored (statistics and CKA{heads} from the forward pass only)",
            highlight=False,
        )
    if s.shard_files:
        size = sum(f.stat().st_size for f in s.shard_files)
        out.print(
            f"stitched from {len(s.shard_files)} torchrun shards in {s.shard_files[0].parent.name}/ "
            f"({human_bytes(size)} on disk): keep the folder beside the store",
            highlight=False,
        )
    names = s.class_names
    labels = s.labels
    label_text = f"{len(set(labels.tolist()))} classes" if labels is not None else "no labels"
    seed = f", shuffle seed {s.shuffle_seed}" if s.shuffle_seed is not None else ""
    out.print(
        f"images: {s.n_images} of [cyan]{s.dataset_spec}[/]{seed}, {label_text}"
        + (f" ({', '.join(names[:6])}{' ...' if len(names) > 6 else ''})" if names else ""),
        highlight=False,
    )


def _print_model(s, key: str) -> None:
    """Prints a model of the store: its weights, input and grid, rows done, what float16 lost, its layers and
    statistics."""
    from rich.markup import escape

    from vitsee.models.init_notes import random_init_note
    from vitsee.store import human_bytes

    meta = s.model_info(key)
    w = meta["weights"]
    weights = w["kind"] + (f" seed {w['seed']}" if w.get("seed") is not None else "")
    if w.get("sha256"):
        weights += f" sha256 {w['sha256'][:12]}"
    if w.get("source") and w["kind"] != "random":
        weights += f" ({w['source']})"
    done = s.rows_done(key)
    out.print()
    out.print(f"[bold green]{escape(key)}[/]  {meta['family']}  {weights}", highlight=False)
    out.print(
        f"  called {escape(repr(s.display_name(key)))} in figures and titles (`vitsee name` renames it)",
        highlight=False,
    )
    if w.get("trained"):
        out.print(f"  trained here on {w['trained']}", highlight=False)
    note = random_init_note(meta)
    if note:
        out.print(f"  [yellow]{note}[/]", highlight=False)
    out.print(
        f"  input {meta['data_config']['input_size']}{_grid_text(meta)}; "
        f"{meta['dtype']}, batch {meta['batch_size']}; "
        f"{done}/{s.n_images} rows done; {human_bytes(s.model_bytes(key))}",
        highlight=False,
    )
    lossy = meta.get("fp16_lossy_layers") or []
    if lossy:
        worst = max(meta["fp16_loss"][layer] for layer in lossy)
        out.print(
            f"  [yellow]float16 storage lost up to {worst:.1e} of the signal[/] of {len(lossy)} layer(s) "
            f"({', '.join(lossy[:4])}{' ...' if len(lossy) > 4 else ''}): CKA on them may be off; "
            "re-extract with --dtype float32",
            highlight=False,
        )
    out.print(_layer_table(s, key, meta))
    if s.stats(key):
        out.print(
            "  statistics: "
            + ", ".join(f"{n} {'x'.join(map(str, s.model_group(key)['stats'][n].shape[1:]))}" for n in s.stats(key)),
            highlight=False,
        )


def _layer_table(s, key: str, meta: dict) -> Table:
    """Returns the table of a model's layers: shape per image, layout, size on disk, images with NaN/Inf."""
    from vitsee.store import human_bytes

    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("layer")
    table.add_column("shape / image")
    table.add_column("layout")
    table.add_column("size", justify="right")
    table.add_column("non-finite", justify="right")
    nonfinite = s.nonfinite_counts(key)
    itemsize = 2 if meta["dtype"] == "float16" else 4
    for layer in s.layers(key):
        shape = s.layer_shape(key, layer)
        n_el = 1
        for d in shape:
            n_el *= d
        size = "not stored" if s.streaming else human_bytes(n_el * itemsize * s.n_images)
        table.add_row(
            layer,
            "x".join(map(str, shape)),
            s.layer_layout(key, layer),
            size,
            str(nonfinite[layer]) if nonfinite[layer] else "",
        )
    return table


@app.command()
def name(
    store: Annotated[Path, typer.Argument(help="a store")],
    model: Annotated[str, typer.Argument(help="the model: its store key, a unique prefix of it, or its display name")],
    new_name: Annotated[
        Optional[str],
        typer.Argument(
            metavar="[NAME]",
            help="what figures, titles, legends and file names call it, e.g. 'ViT-B/16 (pretrained)'; "
            "none: print its name",
        ),
    ] = None,
    automatic: Annotated[
        bool, typer.Option("--automatic", help="give the model back its automatic name (timm name and weights)")
    ] = False,
) -> None:
    """Print or set the display name of a model, kept in the store (the JSON exports keep its key)."""
    from vitsee.store import Store

    if new_name is not None and automatic:
        raise VitseeError("give a NAME or --automatic, not both")
    if new_name is None and not automatic:
        with Store.open(store) as s:
            key = s.resolve_model(model)
            out.print(f"{s.display_name(key)}  ({key})", highlight=False, markup=False)
        return
    with Store.writer(store) as s:
        key = s.resolve_model(model)
        shown = s.set_display_name(key, None if automatic else new_name)
    err.print(f"{key} is now called {shown!r}", highlight=False, markup=False)


def _folder_back(moved: Path, sidecar: Path) -> str:
    """Returns how to give a moved-away folder back to its store, in words and a command."""
    if not sidecar.exists() and moved.suffix != ".d":  # moved aside: it holds this store's files only
        return f"rename it (`mv {moved} {sidecar}`)"
    # another store's folder (files of both stores), or a folder of its own here already: merge, replacing nothing;
    # the next writer of each store moves the other's files aside
    return f"copy its files beside the store (`cp -an {moved}/. {sidecar}/`)"


def _grid_text(meta: dict) -> str:
    """Returns ', grid GxG of P px, ...' for a model with a token grid: P is the input px a token covers (input
    size / grid; a hybrid's stem patch on its feature map is smaller), then its prefix and class tokens and heads."""
    if not meta.get("grid_size"):
        return ""
    (gh, gw), (_, h, w) = meta["grid_size"], meta["data_config"]["input_size"]
    px = f"{h // gh}" if h // gh == w // gw else f"{h // gh}x{w // gw}"
    text = f", grid {gh}x{gw} of {px} px"
    if meta.get("family") == "swin":
        stages = meta["extra"]["stages"]
        return (
            text
            + ", windows "
            + ", ".join(f"{st['window'][0]}x{st['window'][1]} of {st['token_px'][0]} px" for st in stages)
            + f", {'/'.join(str(st['heads']) for st in stages)} heads per stage"
        )
    prefix = int(meta.get("num_prefix_tokens") or 0)
    names = meta.get("prefix_names") or []
    text += f", {prefix} prefix token(s)" + (f" ({', '.join(names)})" if names else "")
    if meta.get("family") == "vit" and "cls_token" in meta and not meta["cls_token"]:
        text += ", no class token"
    return text + (f", {meta['num_heads']} heads" if meta.get("num_heads") else "")


@app.command()
def models(
    pattern: Annotated[str, typer.Argument(help="substring or glob of timm names")] = "*",
    pretrained: Annotated[bool, typer.Option(help="only names with pretrained tags")] = False,
) -> None:
    """List timm models: the family vitsee recognises and whether pretrained weights are cached locally."""
    from vitsee.models.load import list_models

    rows = list_models(pattern, pretrained_only=pretrained)
    if not rows:
        raise VitseeError(f"no timm model matches '{pattern}': try a shorter pattern, e.g. `vitsee models vit_`")
    table = Table(box=None, header_style="bold")
    table.add_column("model")
    table.add_column("family")
    table.add_column("weights")
    for r in rows:
        table.add_row(r["name"], r["family"], "[green]cached[/]" if r["cached"] else "")
    out.print(table)
    out.print(f"{len(rows)} models; {sum(r['cached'] for r in rows)} with weights in the local cache", style="dim")


@app.command()
def layers(
    model: Annotated[str, typer.Argument(help="NAME[.TAG][@WEIGHTS]")],
    img_size: Annotated[Optional[int], typer.Option(help="build for N x N input")] = None,
    granularity: Annotated[
        Optional[str],
        typer.Option(
            help="blocks | sublayers | modules (every module path); default: sublayers, or modules for a model "
            "outside the ViT/ResNet/Mixer/Swin families"
        ),
    ] = None,
) -> None:
    """List the layer names a model offers to --layers, in forward order."""
    from vitsee.models.load import layer_points, load_model, parse_model_spec

    if granularity not in (None, "blocks", "sublayers", "modules"):
        raise VitseeError(f"--granularity '{granularity}' is not one of blocks, sublayers, modules")
    spec = parse_model_spec(model)
    if spec.weights == "pretrained":  # names do not depend on weights: never download for a listing
        spec = parse_model_spec(f"{spec.timm_name}@random")
    loaded = load_model(spec, img_size=img_size)
    if granularity is None and loaded.family == "other":  # no blocks or sublayers defined: module paths are the names
        err.print(
            f"{type(loaded.model).__name__} is outside the ViT/ResNet/Mixer/Swin families: listing every module "
            "path (--granularity modules); pass any of them to --layers",
            style="dim",
            highlight=False,
            soft_wrap=True,
        )
        granularity = "modules"
    if granularity == "modules":
        for name, module in loaded.model.named_modules():
            if name:
                out.print(f"{name}  [dim]{type(module).__name__}[/]", highlight=False)
        return
    for point in layer_points(loaded.model, loaded.family, granularity or "sublayers"):
        where = f"input of {point.module}" if point.kind == "input" else ""
        out.print(f"{point.name}  [dim]{where}[/]", highlight=False)


def analysis_options(command):
    """Returns `command` with the `vitsee analyze` options every registered analysis declares (engine/analyses/):
    a `--NAME` flag each, then each one's own options (`--erf-images N`), as harlequin builds its adapters' options.
    The command receives the names flagged, in the registry's order, as `chosen`, and the values given of the
    analyses' own options as `given` (option attribute -> value)."""
    return _with_analysis_options(command, flags=True)


def own_options(command):
    """Returns `command` (show, export) with each registered analysis's own options (`--zoo-measure NAME`, which
    say what a view is of), their values given as `given` (option attribute -> value)."""
    return _with_analysis_options(command, flags=False)


def _with_analysis_options(command, flags: bool):
    import functools
    import inspect

    from vitsee.analyses import REGISTRY

    flags = [(a.name, a.option_help) for a in REGISTRY.values()] if flags else []
    # an option several analyses declare (the measures' --max-images) is one option, given to each of them
    options = list({o.name: o for a in REGISTRY.values() for o in a.options}.values())
    keyword = inspect.Parameter.KEYWORD_ONLY
    added = [
        inspect.Parameter(
            name,
            keyword,
            default=False,
            annotation=Annotated[
                bool, typer.Option(f"--{name}", *([f"--{name.replace('_', '-')}"] if "_" in name else []), help=text)
            ],
        )
        for name, text in flags
    ]  # --rbf_cka as the view rbf_cka:A:B names it, or --rbf-cka
    added += [
        inspect.Parameter(
            o.attr,
            keyword,
            default=None,
            annotation=Annotated[Optional[o.type], typer.Option(f"--{o.name}", help=o.help)],
        )
        for o in options
    ]
    own = [
        p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name not in ("chosen", "given")
    ]
    positional = [p for p in own if p.kind is not keyword]
    rest = [p.replace(kind=keyword) for p in own if p.kind is keyword or p.default is not inspect.Parameter.empty]
    positional = [p for p in positional if p.default is inspect.Parameter.empty]

    @functools.wraps(command)
    def with_options(*args, **kwargs):
        chosen = [name for name, _ in flags if kwargs.pop(name, False)]
        given = {o.attr: value for o in options if (value := kwargs.pop(o.attr, None)) is not None}
        return command(*args, **({"chosen": chosen} if flags else {}), given=given, **kwargs)

    with_options.__signature__ = inspect.Signature(positional + added + rest)
    with_options.__annotations__ = {p.name: p.annotation for p in positional + added + rest}
    del with_options.__wrapped__  # typer reads the signature above, not the command's
    return with_options


@app.command()
@analysis_options
def analyze(
    store: Annotated[Path, typer.Argument(help="a complete store")],
    batch_size: Annotated[Optional[int], typer.Option(help="images per CKA minibatch [default: 256]")] = None,
    shuffles: Annotated[
        Optional[int], typer.Option(help="average CKA over K seeded shuffles (0: store order) [default: 1]")
    ] = None,
    seed: Annotated[
        Optional[int],
        typer.Option(
            help="seed of the shuffles, the probe split and the measures' image subset and resamples [default: 0]"
        ),
    ] = None,
    ci: Annotated[
        Optional[float],
        typer.Option(
            help="confidence level of the intervals (jackknife over images for CKA, exact binomial for probes, "
            "Student-t for means over images); 0: none [default: 0.95]"
        ),
    ] = None,
    permutations: Annotated[
        Optional[int], typer.Option(help="permutations behind each CKA p-value; 0: none [default: 99]")
    ] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    recompute: Annotated[bool, typer.Option(help="ignore cached results")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars")] = False,
    threads: Annotated[
        Optional[int],
        typer.Option(
            help="CPU compute threads (default: the usable cores other processes leave free; "
            "CKA Grams and probe fits also share the busy ones, a layer at a time)"
        ),
    ] = None,
    measures: Annotated[
        Optional[str],
        typer.Option(
            help="layer x layer measures to compute beside the flags, a comma list (cka,rbf_cka,procrustes,svcca,pwcca,"
            "mknn,cknna,rsa) or all; each on one Gram per layer, shared"
        ),
    ] = None,
    *,
    chosen: list[str],
    given: dict,
) -> None:
    """Compute the paper's analyses (none named: all that apply) and cache them in the store."""
    from dataclasses import fields

    from vitsee.extraction import distributed
    from vitsee.analyses.driver import AnalyzeConfig, measure_names, run_analyses
    from vitsee.extraction.distributed import is_secondary
    from vitsee.threads import set_compute_threads

    chosen = list(dict.fromkeys([*chosen, *measure_names(measures)]))
    base = AnalyzeConfig()
    own = {f.name for f in fields(AnalyzeConfig)}  # an analysis's option is a config field, or kept by its name
    cfg = AnalyzeConfig(
        batch_size=base.batch_size if batch_size is None else batch_size,
        shuffles=base.shuffles if shuffles is None else shuffles,
        seed=base.seed if seed is None else seed,
        device=device,
        recompute=recompute,
        any_cka_estimate=batch_size is None
        and shuffles is None
        and seed is None
        and ci is None
        and permutations is None,
        options={k: v for k, v in given.items() if k not in own},
        **{k: v for k, v in given.items() if k in own},
        **_stats_options(ci, permutations),
    )
    quiet = quiet or is_secondary()  # under torchrun rank 0 speaks for the run
    set_compute_threads(threads)
    on_event, bar = _progress_bar(quiet)

    def on_step(step) -> None:
        from vitsee.extraction.plan import Progress

        on_event(Progress("analyze", done=step.done, total=step.total, message=step.analysis))

    try:
        # under torchrun every process takes a share of the CKA batches, then rank 0 runs the rest
        driver = distributed.analyze_sharded if distributed.current() is not None else run_analyses
        done = driver(store, chosen or None, cfg, progress=on_step)
    finally:
        if isinstance(bar, _NoBar) or bar.live.is_started:
            bar.stop()
    if not quiet:
        err.print(f"{store}: {', '.join(done)} ready", highlight=False)


def _stats_options(ci, permutations) -> dict:
    """Returns the AnalyzeConfig statistics fields the user set (checked here, so a bad one fails before any work)."""
    from vitsee.stats import check_level, stats_settings

    out = {}
    if ci is not None:
        out["ci"] = check_level(ci) if ci else 0.0
    if permutations is not None:
        stats_settings(0.0, permutations, 0)  # the one-line error for a negative count
        out["permutations"] = permutations
    return out


def _view_config(batch_size, shuffles, seed, device, ci=None, permutations=None):
    """Returns None (any cached estimate serves) unless the user set an estimator or statistics option; --device
    alone says where to compute what is missing, not which estimate to show (load_view takes it apart)."""
    from vitsee.analyses.driver import AnalyzeConfig

    if batch_size is None and shuffles is None and seed is None and ci is None and permutations is None:
        return None
    base = AnalyzeConfig()
    return AnalyzeConfig(
        batch_size=base.batch_size if batch_size is None else batch_size,
        shuffles=base.shuffles if shuffles is None else shuffles,
        seed=base.seed if seed is None else seed,
        device=device or base.device,
        **_stats_options(ci, permutations),
    )


def _view_arg() -> str:
    from vitsee.analyses import REGISTRY

    return " | ".join(a.usage for a in REGISTRY.values())


VIEW_ARG = _view_arg()
EST_HELP = "if the result must be computed (default: use any cached one)"
# the estimator options export and show share: unset, a view takes whatever estimate is cached
ViewBatchSize = Annotated[Optional[int], typer.Option(help=f"CKA minibatch size {EST_HELP}")]
ViewShuffles = Annotated[Optional[int], typer.Option(help=f"CKA shuffles {EST_HELP}")]
ViewSeed = Annotated[Optional[int], typer.Option(help=f"seed {EST_HELP}")]
ViewDevice = Annotated[
    Optional[str],
    typer.Option(
        help="auto | cpu | cuda: where to compute a view not cached yet "
        "(the cached one is shown whatever device made it)"
    ),
]
ViewCI = Annotated[Optional[float], typer.Option(help=f"confidence level of the intervals (0: none) {EST_HELP}")]
ViewPermutations = Annotated[Optional[int], typer.Option(help=f"permutations per CKA p-value (0: none) {EST_HELP}")]


@app.command()
@own_options
def export(
    store: Annotated[Path, typer.Argument(help="a store")],
    view: Annotated[str, typer.Argument(help=VIEW_ARG)],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="FILE.png | FILE.json | FILE.csv")],
    cmap: Annotated[str, typer.Option(help="viridis | magma | cividis")] = "viridis",
    batch_size: ViewBatchSize = None,
    shuffles: ViewShuffles = None,
    seed: ViewSeed = None,
    device: ViewDevice = None,
    ci: ViewCI = None,
    permutations: ViewPermutations = None,
    *,
    given: dict,
) -> None:
    """Write one view as a figure (.png), its numbers (.json) or a table (.csv); computes it if needed."""
    from vitsee.output.export import check_export, write_view
    from vitsee.analyses.views import load_view

    check_export(out_file, cmap)  # before the view is computed: a refused export changes nothing
    v = load_view(
        store, view, _view_config(batch_size, shuffles, seed, device, ci, permutations), device=device, options=given
    )
    path = write_view(v, out_file, cmap=cmap)
    err.print(f"wrote {path}", highlight=False)


@app.command()
@own_options
def show(
    store: Annotated[Path, typer.Argument(help="a store")],
    view: Annotated[str, typer.Argument(help=VIEW_ARG)],
    color: Annotated[str, typer.Option(help="auto | truecolor | 256 | 16 | none")] = "auto",
    cmap: Annotated[str, typer.Option(help="viridis | magma | cividis")] = "viridis",
    fmt: Annotated[
        str, typer.Option("--format", help="text (a heatmap or table) | csv | json (the numbers only)")
    ] = "text",
    batch_size: ViewBatchSize = None,
    shuffles: ViewShuffles = None,
    seed: ViewSeed = None,
    device: ViewDevice = None,
    ci: ViewCI = None,
    permutations: ViewPermutations = None,
    *,
    given: dict,
) -> None:
    """Print a view in the terminal: a coloured heatmap or a table (ASCII with NO_COLOR, or into a pipe or file,
    followed there by the numbers), and the best cell's interval; --format csv|json prints the numbers only."""
    from vitsee.output.colormap import ColorMode, check_colormap, detect_color_mode
    from vitsee.output.render import prints_numbers, render_view
    from vitsee.analyses.views import load_view

    if fmt not in ("text", "csv", "json"):
        raise VitseeError(f"--format '{fmt}' is not one of text, csv, json")
    check_colormap(cmap)  # before the view is computed, as export checks it
    mode = detect_color_mode(override=None if color == "auto" else color)
    piped = color == "auto" and not out.is_terminal
    if piped:  # uncoloured half blocks carry no value: the ASCII ramp does, and the numbers follow
        mode = ColorMode.NONE
    v = load_view(
        store, view, _view_config(batch_size, shuffles, seed, device, ci, permutations), device=device, options=given
    )
    if fmt != "text":
        text = v.to_csv() if fmt == "csv" else json.dumps(v.to_json(), indent=1)
        out.file.write(text if text.endswith("\n") else text + "\n")
        return
    systems = {ColorMode.TRUECOLOR: "truecolor", ColorMode.COLORS_256: "256", ColorMode.COLORS_16: "standard"}
    # an explicit --color keeps its colours when piped (e.g. into less -R); auto follows the terminal
    console = out
    if color != "auto" and mode is not ColorMode.NONE:
        console = Console(
            file=out.file, force_terminal=True, color_system=systems[mode], width=out.width, soft_wrap=True
        )
    for renderable in render_view(v, color=mode.value, cmap=cmap, width=console.width):
        console.print(renderable)
    if piped and not prints_numbers(v):  # a table prints its numbers already
        out.file.write(f"\n{v.value_name} values (as --format csv prints them):\n{v.to_csv()}")


def main() -> None:
    """Entry point: runs the Typer app, turning user errors into one line and a non-zero exit."""
    with warnings.catch_warnings():  # restores the warning machinery when the command returns
        warnings.simplefilter("always", VitseeNote)
        said: set[str] = set()

        def show(message, category, filename, lineno, file=None, line=None):
            # one line each, once: a warning raised again per resample or per shuffle (and Python's own output, its
            # source path and line of code) said `analyze --measure-bootstrap 5` of a constant layer in 12 lines
            from rich.markup import escape

            text = (str(message).strip().splitlines() or [category.__name__])[0]
            if text not in said:
                said.add(text)
                err.print(
                    f"{'note' if issubclass(category, VitseeNote) else 'warning'}: {escape(text)}",
                    highlight=False,
                    soft_wrap=True,
                )

        warnings.showwarning = show
        _main()


def _main() -> None:
    try:
        app()  # standalone: usage errors print click's message and exit 2
    except VitseeError as exc:
        from rich.markup import escape

        # escaped: messages show specs such as NAME[.TAG][@WEIGHTS], which Rich would take for markup and drop
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except OSError as exc:
        if not _is_hdf5_error(exc):
            raise
        # damage inside a store that opened fine shows up as an HDF5 read error on first use
        err.print(
            f"[bold red]error:[/] a store file could not be read ({brief(exc)}): it is damaged; restore it "
            "from a copy, or re-extract it (`vitsee extract ... --overwrite`)",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)


def _is_hdf5_error(exc: OSError) -> bool:
    text = str(exc)
    return any(
        marker in text for marker in ("Unable to synchronously", "HDF5", "h5py", "Can't read data", "file signature")
    )


if __name__ == "__main__":
    main()

"""`vitsee.extract` and `vitsee.train`: the CLI's two long-running commands as functions, with the same names and
defaults, drawing progress bars (see _progress.py). torch is imported when one of them is called, not before."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from vitsee.errors import VitseeError

from vitsee.library.progress import Bars
from vitsee.library.store import Store


def extract(
    path: str | os.PathLike,
    models: str | Sequence[str] = (),
    dataset: str = "samples",
    n_images: int | None = None,
    *,
    batch_size: int = 64,
    device: str = "auto",
    layers: str | Sequence[str] = "blocks",
    img_size: int | None = None,
    dtype: str = "float16",
    shuffle_seed: int | None = None,
    workers: int | None = None,
    streaming: bool = False,
    heads: bool = False,
    grams: bool = False,
    memory_budget: str | int | None = None,
    overwrite: bool = False,
    force: bool = False,
    threads: int | None = None,
    progress: bool = True,
) -> Store:
    """Returns the store after running timm models over images into it: layer activations and per-image statistics,
    as `vitsee extract` stores them; resumable: rerun the same call (or give no models) to finish an interrupted run.

    Args:
        path: the store to create, resume or add models to (`run.h5`; `run.h5.d/` goes beside it).
        models: `NAME[.TAG][@pretrained|@random[:SEED]|@PATH]` specs (one string or a list); none: resume the run
            the store records.
        dataset: digits, samples, synthetic, imagefolder:PATH, cifar10:PATH, cifar100:PATH, npz:PATH, ...
        n_images: how many images (default: all), the first N or a seeded subset with `shuffle_seed`.
        batch_size: images per forward pass and per stored chunk.
        device: auto, cpu, cuda or cuda:N.
        layers: blocks, sublayers, or timm module paths (a list or `NAME,NAME`).
        img_size: build every model for N x N input.
        dtype: float16 or float32 for the stored activations.
        shuffle_seed: take a seeded random subset instead of the first N.
        workers: image loading processes (default: on a GPU cores - 1, at most 4; on the CPU 0: in this process).
        streaming: keep no activations, only CKA and statistics from the forward pass.
        heads: with streaming, also head-level CKA (paper Fig. 5).
        grams: streaming for a zoo: each layer's Gram of each batch, so models run a few at a time and can be
            added later (`store.zoo()` reads them).
        memory_budget: memory the models may take at once (bytes, or a size such as "4G"; default: half of what
            is free); more models run in waves.
        overwrite: replace an existing store.
        force: start even if the disk looks too small.
        threads: CPU compute threads during the run (default: the free cores); torch's count is restored after.
        progress: draw progress bars (widgets in Jupyter, text in a terminal); False: none.

    Returns:
        The store, opened (`vitsee.open(path)`).

    Raises:
        VitseeError: an unknown model, dataset or layer, too few images, a store that exists without
            `overwrite`, no GPU for `device="cuda"`, ...: the one-line message `vitsee extract` prints. Nothing
            finished is lost; a KeyboardInterrupt keeps the finished batches too.
    """
    options = dict(locals())  # every argument by its name: ExtractConfig's fields are named alike
    from vitsee.extraction.extract import resume_extraction, run_extraction
    from vitsee.extraction.run_config import Resume, changed_options, extraction

    models = [models] if isinstance(models, str) else list(models)
    with Bars(progress) as bars, _compute_threads(threads):
        planned = extraction(path, models, options, given=changed_options(options))
        if isinstance(planned, Resume):
            if not planned.complete:
                resume_extraction(planned, progress=bars.extraction)
        else:
            run_extraction(planned, progress=bars.extraction)
    return Store(path)


@contextmanager
def _compute_threads(requested: int | None):
    """Sets torch's compute threads as `vitsee extract --threads` does for the run, then restores torch's count
    (a notebook's own torch work keeps its setting)."""
    import torch

    from vitsee.threads import set_compute_threads

    before = torch.get_num_threads()
    set_compute_threads(requested)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train(
    out: str | os.PathLike,
    model: str,
    *,
    model_args: dict | Sequence[str] | None = None,
    img_size: int | None = None,
    dataset: str = "digits",
    n_images: int | None = None,
    data_fraction: float = 1.0,
    test_fraction: float = 0.2,
    epochs: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    warmup_epochs: float | None = None,
    label_smoothing: float | None = None,
    augment: bool | None = None,
    seed: int = 0,
    device: str = "auto",
    workers: int = 0,
    threads: int | None = None,
    no_skip: str | Sequence[str] | None = None,
    pool: str | None = None,
    held_out: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Returns the weights file of a timm classifier trained with the paper's interventions, as `vitsee train` trains
    it; resumable: rerun the same call after an interruption and it goes on from the last finished epoch.

    Args:
        out: the weights file to write (`.safetensors`, with the training record in its metadata).
        model: a timm model name, e.g. vit_tiny_patch16_224 or resnet18.
        model_args: keyword arguments for timm.create_model, a dict (`{"patch_size": 4}`) or `KEY=VALUE` strings.
        img_size: train at N x N input.
        dataset: a labelled set: digits, synthetic, imagefolder:PATH, cifar10:PATH, npz:PATH, ...
        n_images: split a seeded N of the set (default: all).
        data_fraction: train on a seeded fraction in (0, 1] of the training split.
        test_fraction: part of the images held out for testing, never trained on.
        epochs: epochs (default: the family's recipe, ViT 15, ResNet 6).
        batch_size: images per step (default: ViT 32, ResNet 64).
        lr: peak AdamW learning rate (default: 3e-3 ViT, 2e-3 ResNet).
        weight_decay: AdamW weight decay (default: 0.05 ViT, 0.01 ResNet).
        warmup_epochs: linear warm-up before the cosine decay (default: 0.5).
        label_smoothing: default 0.1.
        augment: light augmentation (default: ResNet yes, ViT no).
        seed: seed of the split, the init and the data order.
        device: auto, cpu, cuda or cuda:N.
        workers: image loading processes.
        threads: torch compute threads while training (default: one on CPU).
        no_skip: residual adds to remove, `BLOCK[.attn|.mlp]` (a list or a comma list), e.g. blocks.3.
        pool: the ViT classifier: cls (class token) or avg (GAP, no class token).
        held_out: also write the test split (never trained on) as FILE.npz, for `extract(dataset="npz:FILE")`.
        overwrite: replace an existing `out` (and start over from any checkpoint).
        progress: draw a bar per epoch and a line when each ends; False: none.

    Returns:
        The path of the weights file; extract it with `vitsee.extract(..., models=[f"{model}@{path}"])`.

    Raises:
        VitseeError: an unknown model or dataset, a dataset without labels, an out that exists without
            `overwrite`, a `held_out` that is not an .npz, ...: the one-line message `vitsee train` prints.
    """
    from vitsee.models.interventions import parse_no_skip
    from vitsee.training.train import TrainConfig, parse_model_args, write_held_out
    from vitsee.training.train import train as run_training

    if held_out is not None and Path(held_out).suffix != ".npz":
        raise VitseeError(f"--held-out {held_out} must end in .npz: e.g. --held-out test.npz")
    if isinstance(model_args, dict):
        kwargs = dict(model_args)
    else:
        kwargs = parse_model_args([model_args] if isinstance(model_args, str) else list(model_args or []))
    skips = parse_no_skip(no_skip if isinstance(no_skip, str) or no_skip is None else ",".join(no_skip))
    cfg = TrainConfig(
        out=Path(out),
        model=model,
        model_args=kwargs,
        img_size=img_size,
        dataset=dataset,
        n_images=n_images,
        data_fraction=data_fraction,
        test_fraction=test_fraction,
        seed=seed,
        no_skip=skips,
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
    with Bars(progress) as bars:
        result = run_training(cfg, progress=bars.training)
    if held_out is not None:
        write_held_out(cfg, Path(held_out))
    return Path(result.out)

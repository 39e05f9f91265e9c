"""`vitsee train`: small timm classifiers with the paper's interventions, crash-safe and resumable.

A run is a TrainConfig. `train()` checks everything a user can get wrong before it touches the disk, takes a
POSIX lock on OUT.lock, then trains epoch by epoch (AdamW, warm-up then cosine decay per step, label
smoothing, timm's training transform) and after every epoch writes a checkpoint beside OUT (model,
optimiser, scheduler and RNG states, by temp file and rename; tensors and JSON, never a pickle: checkpoint.py).
Running the same command again resumes from it and ends with the same weights as an uninterrupted run (CPU, same
seed). OUT itself, timm's state dict with the run's record in the safetensors metadata under RECORD_KEY, appears
only at the end.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitsee.data import ImageSet, open_dataset, train_test_split
from vitsee.errors import VitseeError, brief
from vitsee.training import checkpoint
from vitsee.models.interventions import pool_kwargs, resolve_no_skip
from vitsee.models.load import RECORD_KEY, build_model

FORMAT = 1
# Recipes that train the small models here out of the box; any key can be overridden from the command line.
# ViT, measured on the digits at 32 px (an 8 x 8 grid of 4-px patches, 64 channels, 6 blocks, 1,438 training
# images): the slow part is learning where the patches are, so it gets many small steps at a high peak lr
# (3e-3 in batches of 32: 0.91 test accuracy after 12 epochs; 1e-3 in batches of 64: 0.47 after 6, 2e-3: 0.73
# after 10, 5e-3: 0.85) and no augmentation (random crops move the digit under the patches it is learning: 0.73
# against 0.84 at 2e-3). ResNets learn in a few epochs and take the light crops.
RECIPES = {
    "vit": {
        "epochs": 15,
        "batch_size": 32,
        "lr": 3e-3,
        "weight_decay": 0.05,
        "warmup_epochs": 0.5,
        "label_smoothing": 0.1,
        "augment": False,
        "crop_scale": 0.8,
        "hflip": 0.0,
    },
    "resnet": {
        "epochs": 6,
        "batch_size": 64,
        "lr": 2e-3,
        "weight_decay": 0.01,
        "warmup_epochs": 0.5,
        "label_smoothing": 0.1,
        "augment": True,
        "crop_scale": 0.8,
        "hflip": 0.0,
    },
}
RECIPES["other"] = RECIPES["vit"]


@dataclass
class TrainConfig:
    """Everything `vitsee train` takes; None in a recipe field means the family's recipe value."""

    out: Path
    model: str
    model_args: dict = field(default_factory=dict)
    img_size: int | None = None
    dataset: str = "digits"
    n_images: int | None = None
    data_fraction: float = 1.0
    test_fraction: float = 0.2
    seed: int = 0  # the init and the data order (and the split, unless split_seed says otherwise)
    # the train/test split and the data fraction's part: None takes `seed`, as every run before split seeds did; a
    # fixed split_seed keeps the held-out images the same while `seed` changes the init (several training seeds)
    split_seed: int | None = None
    no_skip: list[str] = field(default_factory=list)
    pool: str | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    augment: bool | None = None
    device: str = "auto"
    workers: int = 0
    # torch threads while training; None: one on CPU. On the shared 2-core machine two threads ran a step of the
    # small ViT 6x slower than one (their OpenMP barriers wait on descheduled threads), and the models are small
    threads: int | None = None
    overwrite: bool = False


@dataclass
class TrainEvent:
    """One event of a run: stage 'plan' (message), 'step' (batch done of total in epoch), 'epoch' (an epoch
    ended: its row of the history) or 'done' (message)."""

    stage: str
    epoch: int = 0
    epochs: int = 0
    done: int = 0
    total: int = 0
    loss: float = float("nan")
    accuracy: float = float("nan")
    row: dict | None = None
    message: str = ""


@dataclass
class TrainResult:
    out: Path
    record: dict
    resumed_from: int  # epochs found in the checkpoint (0: a fresh run)
    seconds: float


TrainFn = Callable[[TrainEvent], None]


def split_seed(cfg: TrainConfig) -> int:
    """Returns the seed of the run's train/test split: split_seed, or the run's seed when none was given."""
    return cfg.seed if cfg.split_seed is None else int(cfg.split_seed)


def parse_seeds(text: str) -> list[int]:
    """Returns the seeds of `--seeds 0,1,2` (distinct, 0 or more, in the order given); a bad list is a VitseeError."""
    seeds = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        try:
            seed = int(part)
        except ValueError:
            raise VitseeError(f"--seeds {text}: '{part}' is not a seed: write e.g. --seeds 0,1,2") from None
        if seed < 0:
            raise VitseeError(f"--seeds {text}: seed {seed} is negative: use seeds of 0 or more")
        if seed in seeds:
            raise VitseeError(f"--seeds {text}: seed {seed} is given twice: name each seed once")
        seeds.append(seed)
    if not seeds:
        raise VitseeError(f"--seeds '{text}' names no seed: write e.g. --seeds 0,1,2")
    return seeds


def seed_path(out: Path, seed: int) -> Path:
    """Returns the weights file of one seed of a `--seeds` run: OUT with -sSEED before its suffix (vit-s1...)."""
    out = Path(out)
    return out.with_name(f"{out.stem}-s{seed}{out.suffix}")


def checkpoint_path(out: Path) -> Path:
    return Path(f"{out}.ckpt")


def lock_path(out: Path) -> Path:
    return Path(f"{out}.lock")


# --- building ---------------------------------------------------------------------------------------------------


def parse_model_args(items: list[str]) -> dict:
    """Returns the kwargs of `KEY=VALUE` strings; values are read as JSON (4, 0.1, true, [1, 2]) or kept as text."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise VitseeError(f"--model-arg '{item}' is not KEY=VALUE: write e.g. --model-arg patch_size=4")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value.strip()
    return out


# --- planning ---------------------------------------------------------------------------------------------------


def recipe_of(cfg: TrainConfig) -> dict:
    """Returns the recipe a run trains with: its model family's, with the config's non-None fields over it."""
    from vitsee.models.load import family_of_name

    recipe = dict(RECIPES[family_of_name(cfg.model)])
    for key in ("epochs", "batch_size", "lr", "weight_decay", "warmup_epochs", "label_smoothing", "augment"):
        if getattr(cfg, key) is not None:
            recipe[key] = getattr(cfg, key)
    return recipe


@dataclass
class _Plan:
    cfg: TrainConfig
    images: ImageSet
    train_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    family: str
    kwargs: dict
    no_skip: list[str]
    recipe: dict
    device: torch.device
    data_config: dict
    run: dict  # what identifies the run: a checkpoint resumes only the same one


def _plan(cfg: TrainConfig) -> _Plan:
    """Returns the checked run; every user error is raised here, before anything is written."""
    import timm

    from vitsee.analyses.base import resolve_device
    from vitsee.models.load import family_of_name, input_size

    out = Path(cfg.out)
    if out.suffix != ".safetensors":
        raise VitseeError(
            f"{out} must end in .safetensors (timm's state dict with the training record in its metadata)"
        )
    if out.is_dir():
        raise VitseeError(f"{out} is a folder: name the weights file to write, such as {out / 'model.safetensors'}")
    for side, what in ((checkpoint_path(out), "checkpoint"), (lock_path(out), "lock")):
        if side.is_dir():  # never removed: a folder is the user's
            raise VitseeError(
                f"{side} is a folder where vitsee train keeps OUT's {what}: move it away or choose another OUT"
            )
    if out.exists() and not cfg.overwrite:
        raise VitseeError(f"{out} exists: pass --overwrite to replace it, or choose another OUT")
    if not out.parent.is_dir():
        raise VitseeError(f"folder {out.parent} does not exist: create it first or choose another OUT")
    if not timm.is_model(cfg.model):
        raise VitseeError(
            f"unknown model '{cfg.model}': see `vitsee models PATTERN` (a timm name without tag or @weights)"
        )
    for name in ("num_classes", "pretrained"):
        if name in cfg.model_args:
            raise VitseeError(
                f"--model-arg {name} is set by vitsee train (the class count of the dataset; random init): drop it"
            )
    device = resolve_device(cfg.device)
    family = family_of_name(cfg.model)
    recipe = recipe_of(cfg)
    for key in ("epochs", "batch_size"):
        if recipe[key] < 1:
            raise VitseeError(f"--{key.replace('_', '-')} must be at least 1, got {recipe[key]}")
    if recipe["lr"] <= 0:
        raise VitseeError(f"--lr must be positive, got {recipe['lr']}")
    if cfg.workers < 0:
        raise VitseeError(f"--workers must be 0 or more, got {cfg.workers}")
    if cfg.threads is not None and cfg.threads < 1:
        raise VitseeError(f"--threads must be at least 1, got {cfg.threads}: use --threads 1 on a shared CPU")

    images = open_dataset(cfg.dataset)
    labels = images.labels()
    if not images.has_labels or (labels < 0).any():
        missing = int((labels < 0).sum())
        raise VitseeError(
            f"dataset '{images.spec}' has {missing} of {len(images)} images without a label; "
            "training needs a label for "
            "every image: use an image folder with one sub-folder per class, or an .npz with 'labels'"
        )
    train_idx, test_idx = train_test_split(
        len(images), cfg.test_fraction, split_seed(cfg), cfg.n_images, cfg.data_fraction
    )
    num_classes = int(max(labels.max() + 1, len(images.class_names or [])))

    kwargs = {**cfg.model_args, **pool_kwargs(cfg.pool, family, cfg.model), "num_classes": num_classes}
    if cfg.img_size is not None:
        kwargs["img_size"] = cfg.img_size
    model = build_model(cfg.model, kwargs, [])
    no_skip = resolve_no_skip(model, cfg.no_skip, cfg.model)
    _check_forward(model, cfg)
    data_config = timm.data.resolve_model_data_config(model)
    data_config["input_size"] = input_size(model)
    run = {
        "model": cfg.model,
        "kwargs": kwargs,
        "no_skip": no_skip,
        "pool": cfg.pool,
        "dataset": images.spec,
        "seed": cfg.seed,
        **({"split_seed": cfg.split_seed} if split_seed(cfg) != cfg.seed else {}),  # a run before split seeds: its key
        "n_images": cfg.n_images,
        "test_fraction": cfg.test_fraction,
        "data_fraction": cfg.data_fraction,
        "recipe": recipe,
        "workers": cfg.workers,
    }
    return _Plan(
        cfg, images, train_idx, test_idx, num_classes, family, kwargs, no_skip, recipe, device, data_config, run
    )


def _check_forward(model: nn.Module, cfg: TrainConfig) -> None:
    """A model built at a size its patches do not tile fails in its first forward: say so now."""
    from vitsee.models.load import input_size

    c, h, w = input_size(model)
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, c, h, w))
    except Exception as exc:  # timm asserts on sizes, convolutions raise RuntimeError on too-small inputs
        size = f"--img-size {cfg.img_size}" if cfg.img_size else f"its default size {h}"
        raise VitseeError(
            f"{cfg.model} does not run at {size} ({brief(exc)}): choose an --img-size (and patch_size) that fit"
        ) from exc


# --- data ------------------------------------------------------------------------------------------------------


# a deterministic transform's tensors are kept up to this size: on the digits decoding and resizing each image
# again every epoch was 30% of a small ViT's training time
CACHE_BYTES = 256 * 2**20


class _Images(torch.utils.data.Dataset):
    """Images of a set by index, through a transform, with their labels (picklable for loader workers).

    With `fixed` (a transform without randomness) each image's tensor is computed once and kept, if the
    set fits in CACHE_BYTES; in loader workers the cache lives only as long as the worker.
    """

    def __init__(self, images: ImageSet, indices: np.ndarray, transform, fixed: bool = False):
        self.images, self.indices, self.transform = images, indices, transform
        self.labels = images.labels()[indices]
        self.fixed = fixed
        self._kept: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j: int):
        x = self._kept.get(j)
        if x is None:
            x = self.transform(self.images.image(int(self.indices[j])))
            if self.fixed and x.numel() * x.element_size() * len(self) <= CACHE_BYTES:
                self._kept[j] = x
        return x, int(self.labels[j])


def _transforms(plan: _Plan):
    """Returns (train, eval) transforms: timm's training pipeline with light augmentation, and its eval one."""
    import timm

    cfg = plan.data_config
    common = {
        "input_size": cfg["input_size"],
        "interpolation": cfg["interpolation"],
        "mean": cfg["mean"],
        "std": cfg["std"],
    }
    evaluate = timm.data.create_transform(
        **common, crop_pct=cfg["crop_pct"], crop_mode=cfg.get("crop_mode"), is_training=False
    )
    if not plan.recipe["augment"]:
        return evaluate, evaluate
    train = timm.data.create_transform(
        **common,
        is_training=True,
        scale=(plan.recipe["crop_scale"], 1.0),
        ratio=(0.9, 1.1),
        hflip=plan.recipe["hflip"],
        color_jitter=0.0,
    )
    return train, evaluate


def _loader(dataset, batch_size: int, workers: int, shuffle: bool, generator: torch.Generator | None):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=workers,
        generator=generator,
        # a last batch of one breaks BatchNorm in training; only for shuffled (training) loaders
        # workers start afresh each epoch, seeded from `generator`, so a resumed epoch draws what it drew before;
        # forked workers inherit the lock's file but not the lock: lockf locks belong to one process
        drop_last=shuffle and len(dataset) > batch_size,
        persistent_workers=False,
    )


# --- checkpoints -------------------------------------------------------------------------------------------------


def _rng_state(generator: torch.Generator) -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "loader": generator.get_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    generator.set_state(state["loader"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Writes a file under a temporary name in the same folder, flushes it, then renames it into place."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)  # an earlier process's with this pid (a link: never written through)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_dead_temporaries(path: Path) -> list[Path]:
    """Removes the `.NAME.tmpPID` files that runs killed while writing path left (a checkpoint of vit_tiny is
    66 MB), only those whose process is gone; returns what was removed."""
    import glob

    from vitsee.store.lock import pid_alive

    removed = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp*"):
        pid = tmp.name.rpartition(".tmp")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)) and not tmp.is_dir():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _load_checkpoint(path: Path, run: dict) -> dict | None:
    """Returns the checkpoint of this same run, None if there is none; one of another run, or a file that is not a
    checkpoint of ours (checkpoint.py: read as data, never unpickled), is a VitseeError."""
    if not path.exists():
        return None
    ckpt = checkpoint.read(path)
    if not isinstance(ckpt, dict):
        raise VitseeError(f"checkpoint {path} is damaged or not vitsee's (no run record): delete it to start over")
    if json.dumps(ckpt.get("run"), sort_keys=True, default=str) != json.dumps(run, sort_keys=True, default=str):
        raise VitseeError(
            f"{path} is the checkpoint of a different run (other model, data or recipe): rerun that command to "
            "finish it, pass --overwrite to start this one over, or choose another OUT"
        )
    return ckpt


def _restore(ckpt: dict, path: Path, epochs: int, model, optimiser, scheduler, generator) -> tuple[list, int]:
    """Returns (history, epochs done) after loading a checkpoint's states into the run; a checkpoint whose states do
    not fit this run (damaged, or written by hand) is a VitseeError, the checkpoint left as it is."""
    try:
        epoch, history = ckpt["epoch"], ckpt["history"]
        if not (isinstance(epoch, int) and 0 < epoch <= epochs and isinstance(history, list) and len(history) == epoch):
            raise ValueError(
                f"epoch {epoch!r} of {epochs} with {len(history) if isinstance(history, list) else 0} rows"
            )
        model.load_state_dict(ckpt["model"])
        optimiser.load_state_dict(ckpt["optimiser"])
        scheduler.load_state_dict(ckpt["scheduler"])
        _set_rng_state(ckpt["rng"], generator)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
        raise VitseeError(
            f"checkpoint {path} does not fit this run ({brief(exc)}): delete it (`rm {path}`) to start over"
        ) from None
    return history, epoch


@contextmanager
def run_lock(out: Path):
    """Holds an exclusive POSIX lock on OUT.lock while a run trains into OUT (released if the process dies).

    The lock file stays when the run ends: deleting it would let a process that opened it just before the
    delete lock the orphaned file while a third one creates and locks a new one, two holders at once.
    """
    path = lock_path(out)
    fh = open(path, "a+")
    try:
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise VitseeError(f"another `vitsee train` is writing {out} (it holds {path}): wait for it to end") from None
    try:
        yield
    finally:
        fh.close()


@contextmanager
def compute_threads(n: int | None, device: torch.device):
    """Runs the body with n torch threads (None: 1 on CPU, torch's default on a GPU), then restores the count."""
    from vitsee.threads import torch_threads

    if n is None:
        n = 1 if device.type == "cpu" else torch.get_num_threads()
    with torch_threads(n):
        yield


# --- training ---------------------------------------------------------------------------------------------------


def _versions() -> dict:
    import importlib.metadata
    import sys

    import timm

    try:
        vitsee = importlib.metadata.version("vitsee")
    except importlib.metadata.PackageNotFoundError:
        vitsee = "unknown"
    return {"vitsee": vitsee, "timm": timm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}


def _evaluate(model: nn.Module, loader, device: torch.device) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            pred = model(x.to(device)).argmax(1).cpu()
            right += int((pred == y).sum())
            total += len(y)
    return right / max(total, 1)


def train(cfg: TrainConfig, progress: TrainFn | None = None, cancel=None) -> TrainResult:
    """Returns the finished run after training it (or resuming its checkpoint) and writing OUT."""
    emit = progress or (lambda _e: None)
    plan = _plan(cfg)
    out = Path(cfg.out)
    with run_lock(out), compute_threads(cfg.threads, plan.device):
        return _train_locked(plan, out, emit, cancel)


def _train_locked(plan: _Plan, out: Path, emit: TrainFn, cancel) -> TrainResult:
    import timm.optim
    from timm.scheduler import CosineLRScheduler

    cfg, recipe, device = plan.cfg, plan.recipe, plan.device
    started = time.perf_counter()
    ckpt_file = checkpoint_path(out)
    for path in (ckpt_file, out):  # what a killed run was writing; its lock is ours now
        remove_dead_temporaries(path)
    ckpt = None if cfg.overwrite else _load_checkpoint(ckpt_file, plan.run)
    if cfg.overwrite:
        ckpt_file.unlink(missing_ok=True)

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    model = build_model(cfg.model, plan.kwargs, plan.no_skip).to(device)
    train_tf, eval_tf = _transforms(plan)
    train_set = _Images(plan.images, plan.train_idx, train_tf, fixed=not recipe["augment"])
    test_loader = _loader(
        _Images(plan.images, plan.test_idx, eval_tf, fixed=True), recipe["batch_size"], cfg.workers, False, None
    )
    steps_per_epoch = len(_loader(train_set, recipe["batch_size"], 0, True, generator))
    total_steps = recipe["epochs"] * steps_per_epoch
    # timm's factory leaves biases, norms, position embeddings and tokens out of the weight decay: decaying the
    # position embeddings of a small ViT pulls it back towards not knowing where its patches are
    optimiser = timm.optim.create_optimizer_v2(model, "adamw", lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    warmup = int(round(recipe["warmup_epochs"] * steps_per_epoch))
    scheduler = CosineLRScheduler(
        optimiser,
        t_initial=max(total_steps - warmup, 1),
        warmup_t=warmup,
        warmup_lr_init=recipe["lr"] * 0.01,
        warmup_prefix=True,
        lr_min=recipe["lr"] * 0.01,
        t_in_epochs=False,
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe["label_smoothing"])
    history: list[dict] = []
    start_epoch = 0
    if ckpt is not None:
        history, start_epoch = _restore(ckpt, ckpt_file, recipe["epochs"], model, optimiser, scheduler, generator)
    emit(
        TrainEvent(
            "plan",
            message=(
                f"{cfg.model}: {sum(p.numel() for p in model.parameters()):,} parameters, {plan.num_classes} classes; "
                f"{len(plan.train_idx)} train / {len(plan.test_idx)} test images of {plan.images.spec}; "
                f"{recipe['epochs']} epochs of {steps_per_epoch} steps on {device}"
                + (f"; resuming after epoch {start_epoch}" if start_epoch else "")
            ),
        )
    )

    for epoch in range(start_epoch, recipe["epochs"]):
        t0 = time.perf_counter()
        model.train()
        loss_sum, right, seen = 0.0, 0, 0
        loader = _loader(train_set, recipe["batch_size"], cfg.workers, True, generator)
        for step, (x, y) in enumerate(loader):
            if cancel is not None and cancel.is_set():
                raise VitseeError(
                    f"training cancelled in epoch {epoch + 1}: rerun the same command to resume after epoch {epoch}"
                )
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = loss_fn(logits, y)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step_update(epoch * steps_per_epoch + step + 1)
            loss_sum += float(loss.detach()) * len(y)
            right += int((logits.argmax(1) == y).sum())
            seen += len(y)
            emit(
                TrainEvent(
                    "step", epoch + 1, recipe["epochs"], step + 1, steps_per_epoch, loss_sum / seen, right / seen
                )
            )
        if not math.isfinite(loss_sum):
            raise VitseeError(
                f"the training loss became {loss_sum / seen} in epoch {epoch + 1}: lower --lr (now {recipe['lr']:g})"
            )
        row = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / seen,
            "train_accuracy": right / seen,
            "test_accuracy": _evaluate(model, test_loader, device),
            "lr": optimiser.param_groups[0]["lr"],
            "seconds": time.perf_counter() - t0,
        }
        history.append(row)
        state = {
            "run": plan.run,
            "epoch": epoch + 1,
            "history": history,
            "model": model.state_dict(),
            "optimiser": optimiser.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state(generator),
        }
        _write_atomically(ckpt_file, lambda p: checkpoint.write(state, p))
        emit(TrainEvent("epoch", epoch + 1, recipe["epochs"], row=row))

    record = _record(plan, history)
    _write_weights(out, model, record)
    ckpt_file.unlink(missing_ok=True)
    emit(TrainEvent("done", message=f"wrote {out}: test accuracy {record['test_accuracy']:.3f}"))
    return TrainResult(out, record, start_epoch, time.perf_counter() - started)


def write_initial(cfg: TrainConfig) -> dict:
    """Writes cfg.out: the weights the run of cfg starts from (its seeded init, before any step: those of its
    first epoch's start) with the run's record (no epochs; the untrained model's test accuracy), so that
    `-m MODEL@OUT` rebuilds the run's architecture untrained, the trained model's random-init twin; returns the
    record."""
    plan = _plan(cfg)
    out = Path(cfg.out)
    with run_lock(out), compute_threads(cfg.threads, plan.device):
        remove_dead_temporaries(out)
        torch.manual_seed(cfg.seed)  # as _train_locked seeds before it builds the model
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        model = build_model(cfg.model, plan.kwargs, plan.no_skip).to(plan.device)
        _, eval_tf = _transforms(plan)
        test = _loader(
            _Images(plan.images, plan.test_idx, eval_tf, fixed=True),
            plan.recipe["batch_size"],
            cfg.workers,
            False,
            None,
        )
        record = _record(plan, [], untrained_accuracy=_evaluate(model, test, plan.device))
        _write_weights(out, model, record)
    return record


def _record(plan: _Plan, history: list[dict], untrained_accuracy: float | None = None) -> dict:
    cfg = plan.cfg
    return {
        "format": FORMAT,
        "model": cfg.model,
        "model_args": cfg.model_args,
        "kwargs": plan.kwargs,
        "num_classes": plan.num_classes,
        "class_names": plan.images.class_names,
        "interventions": {"no_skip": plan.no_skip, "pool": cfg.pool},
        "dataset": plan.images.spec,
        "init_seed": cfg.seed,  # the init and the data order
        "split": {
            "seed": split_seed(cfg),
            "test_fraction": cfg.test_fraction,
            "n_images": cfg.n_images,
            "data_fraction": cfg.data_fraction,
        },
        "n_train": len(plan.train_idx),
        "n_test": len(plan.test_idx),
        "recipe": {
            **plan.recipe,
            "optimizer": "adamw, no decay of biases, norms, tokens, position embeddings",
            "schedule": "linear warm-up, cosine decay per step",
        },
        "history": history,
        "test_accuracy": history[-1]["test_accuracy"] if history else untrained_accuracy,
        "versions": _versions(),
    }


def _write_weights(out: Path, model: nn.Module, record: dict) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    _write_atomically(out, lambda p: checkpoint.save_tensors(tensors, p, {RECORD_KEY: json.dumps(record)}))


def config_dict(cfg: TrainConfig) -> dict:
    """Returns the config as JSON-able values (for logs and the demo's cache key)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}


def check_held_out(path: Path, out: Path) -> None:
    """Raises a VitseeError naming the way out unless path can take the held-out images: checked before training,
    so a bad --held-out never costs a run."""
    if path.suffix != ".npz":
        raise VitseeError(f"--held-out {path} must end in .npz: e.g. --held-out test.npz")
    if path.is_dir():
        raise VitseeError(f"--held-out {path} is a folder: name the .npz file to write, such as {path / 'test.npz'}")
    if not path.parent.is_dir():
        raise VitseeError(
            f"--held-out {path}: folder {path.parent} does not exist: create it first or choose another path"
        )
    if path.resolve() == Path(out).resolve():
        raise VitseeError(f"--held-out {path} is OUT itself: give the held-out images another name")


def write_held_out(cfg: TrainConfig, path: Path) -> None:
    """Writes the images a run never trains on (its test split) as an .npz that `--dataset npz:PATH` reads."""
    images = open_dataset(cfg.dataset)
    _, test = train_test_split(len(images), cfg.test_fraction, split_seed(cfg), cfg.n_images, cfg.data_fraction)
    arrays = np.stack([np.asarray(images.image(int(i))) for i in test])  # (n_test, H, W, 3) uint8
    names = np.asarray(images.class_names or [str(c) for c in range(int(images.labels().max()) + 1)])

    def save(p: Path) -> None:
        with open(p, "wb") as fh:  # a file object: np.savez would add .npz to the temporary name
            np.savez(fh, images=arrays, labels=images.labels()[test], class_names=names)

    _write_atomically(Path(path), save)

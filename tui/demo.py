"""The demo store `vitsee-tui --demo` opens: a small ViT and a ResNet, and the random-init twin of each (a small zoo).

Built once into the user's cache folder, then reused. With pretrained weights (in the local cache, or the
Hugging Face Hub answers) the two models run over the built-in photographs. Without them the demo trains its
own two small models here (a ViT with a 8 x 8 grid of 4-px patches and a narrow ResNet-18, on the built-in
digits at 32 px), caches the weights beside the store so later launches reuse them, and extracts the digits
held out from training. The store's file name says which, so a store of one kind is never taken for the other.

Beside each model the store holds its random-init twin, the same architecture untrained (`@random:0` for a
pretrained model; for one trained here, the very weights its training started from, written beside its weights),
so the Zoo view shows trained against untrained models. The twins only need extracting; a demo store built before
they existed is reused as it is and gets them appended (its trained models are not extracted again).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vitsee.errors import VitseeError

if TYPE_CHECKING:
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.extraction.plan import ExtractConfig
    from vitsee.training.train import TrainConfig

DEMO_VIT = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
DEMO_RESNET = "resnet18.a1_in1k"
# trained here when no pretrained weights can be had: timm's own architectures, made small with kwargs
# (ViT: an 8 x 8 grid of 4-px patches at 32 px, 64 channels, 6 blocks of 4 heads, MLPs twice as wide: 209k
# parameters, 0.9 test accuracy on the digits in about a minute of one CPU core with its recipe)
TRAINED_VIT = ("vit_tiny_patch16_224", {"patch_size": 4, "embed_dim": 64, "depth": 6, "num_heads": 4, "mlp_ratio": 2})
TRAINED_RESNET = ("resnet18", {"channels": [32, 64, 128, 256]})


@dataclass(frozen=True)
class DemoPlan:
    """What the demo builds: models by timm name, images, and where the store goes."""

    models: tuple[str, ...] = (DEMO_VIT, DEMO_RESNET)
    dataset: str = "samples"
    # 128 of the 240 sample images: ~460 MB at 224 px and about a minute of extraction on 2 CPU cores;
    # CKA needs a few hundred for tight estimates, but the paper's patterns already show here.
    n_images: int = 128
    batch_size: int = 32
    img_size: int | None = None  # the models' own 224 px: a 14 x 14 grid, as in the paper
    # per-token probes fit one probe per token and layer: minutes on a CPU, so the demo keeps CLS and GAP
    probe_tokens: bool = False
    # without pretrained weights: what the demo trains, on what, and how long
    trained: tuple[tuple[str, dict], ...] = (TRAINED_VIT, TRAINED_RESNET)
    train_dataset: str = "digits"
    train_img_size: int = 32
    train_n_images: int | None = None  # all 1,797 digits: 1,438 to train on, 359 held out and extracted
    train_epochs: int | None = None  # None: each family's recipe (engine.train.RECIPES)
    train_seed: int = 0
    twins: bool = True  # each model's random-init twin in the store too (the zoo: trained against untrained)
    twin_seed: int = 0  # a pretrained model's twin: NAME@random:SEED (one trained here: its own seeded init)


@dataclass(frozen=True)
class DemoChoice:
    """The demo's extraction config and, per model, whether its weights are pretrained."""

    config: ExtractConfig
    pretrained: dict[str, bool]
    analysis: AnalyzeConfig
    # without pretrained weights: the runs that make the demo's models (cached ones train no more)
    training: tuple[TrainConfig, ...] = ()
    # their twins: each run's seeded init, written to its `out` (the store extracts them beside the trained models)
    twins: tuple[TrainConfig, ...] = ()

    @property
    def weights_note(self) -> str:
        """Returns e.g. 'vit_tiny_patch16_224: pretrained, resnet18: pretrained', or how the models were trained."""
        twins = len(self.config.models) > len(self.pretrained)
        twins_note = "; beside each, its random-init twin (the Zoo view)" if twins else ""
        return self._models_note() + twins_note

    def _models_note(self) -> str:
        if self.training:
            from vitsee.training.train import recipe_of

            cfg = self.training[0]
            names = " and ".join(t.model for t in self.training)
            epochs = ", ".join(f"{t.model} {recipe_of(t)['epochs']} epochs" for t in self.training)
            return (
                f"{names} trained here on {cfg.dataset} at {cfg.img_size} px ({epochs}; no pretrained "
                "weights in the local cache and the Hugging Face Hub cannot be reached); the store holds the "
                "images held out from training"
            )
        parts = []
        for name, ok in self.pretrained.items():
            parts.append(f"{name.partition('.')[0]}: {'pretrained' if ok else 'random init'}")
        note = ", ".join(parts)
        if not all(self.pretrained.values()):
            note += " (no weights in the local cache and the Hugging Face Hub cannot be reached)"
        return note


def cache_dir() -> Path:
    """Returns the per-user folder for the demo store: $XDG_CACHE_HOME/vitsee or ~/.cache/vitsee."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vitsee"


def hub_reachable() -> bool:
    """Returns whether the Hugging Face Hub answers (False at once when HF_HUB_OFFLINE is set)."""
    from vitsee.models import load as models

    return models.hub_reachable(timeout_s=2.0)


def choose(plan: DemoPlan | None = None, device: str = "auto", folder: Path | None = None) -> DemoChoice:
    """Returns the demo's run: pretrained where possible (may wait a moment on the network check)."""
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.extraction.plan import ExtractConfig
    from vitsee.models.load import cached_pretrained_file

    plan = plan or DemoPlan()
    pretrained: dict[str, bool] = {}
    hub: bool | None = None
    for name in plan.models:
        if cached_pretrained_file(name) is not None:
            pretrained[name] = True
            continue
        if hub is None:
            hub = hub_reachable()
        pretrained[name] = hub
    folder = folder or cache_dir()
    analysis = AnalyzeConfig(device=device, probe_tokens=plan.probe_tokens)
    if not all(pretrained.values()):
        return _trained_choice(plan, device, folder, pretrained, analysis)
    size = f"-{plan.img_size}px" if plan.img_size else ""
    store = folder / f"demo-pretrained-{plan.n_images}{size}.h5"
    twins = [f"{name.partition('.')[0]}@random:{plan.twin_seed}" for name in plan.models] if plan.twins else []
    config = ExtractConfig(
        store=store,
        models=[*plan.models, *twins],
        dataset=plan.dataset,
        n_images=plan.n_images,
        batch_size=plan.batch_size,
        device=device,
        img_size=plan.img_size,
    )
    return DemoChoice(config, pretrained, analysis)


def _trained_choice(plan: DemoPlan, device: str, folder: Path, pretrained: dict[str, bool], analysis) -> DemoChoice:
    """Returns the demo of models trained here: their training runs, and the extraction of the held-out images."""
    from vitsee.extraction.plan import ExtractConfig
    from vitsee.training.train import TrainConfig

    def run(name: str, args: dict, out: Path) -> TrainConfig:
        return TrainConfig(
            out=out,
            model=name,
            model_args=dict(args),
            img_size=plan.train_img_size,
            dataset=plan.train_dataset,
            n_images=plan.train_n_images,
            epochs=plan.train_epochs,
            seed=plan.train_seed,
            device=device,
        )

    drafts = [run(name, args, Path()) for name, args in plan.trained]
    tag = f"{plan.train_dataset}{plan.train_img_size}-{_recipe_tag(plan, drafts)}-s{plan.train_seed}"
    training = tuple(run(d.model, d.model_args, folder / f"demo-{d.model}-{tag}.safetensors") for d in drafts)
    twins = tuple(
        run(d.model, d.model_args, folder / f"demo-{d.model}-{tag}-init.safetensors") for d in drafts if plan.twins
    )
    test_set = folder / f"demo-{plan.train_dataset}-test-s{plan.train_seed}.npz"
    config = ExtractConfig(
        store=folder / f"demo-trained-{tag}.h5",
        models=[f"{t.model}@{t.out}" for t in (*training, *twins)],
        dataset=f"npz:{test_set}",
        batch_size=plan.batch_size,
        device=device,
    )
    return DemoChoice(config, pretrained, analysis, training, twins)


def _recipe_tag(plan: DemoPlan, runs: list[TrainConfig]) -> str:
    """Returns 'eN' for a fixed epoch count, else 'r' and a digest of the models and their recipes, so weights
    cached under an older recipe or architecture are never taken for the current one."""
    import hashlib
    import json

    from vitsee.training.train import recipe_of

    if plan.train_epochs is not None:
        return f"e{plan.train_epochs}"
    text = json.dumps([[r.model, r.model_args, recipe_of(r)] for r in runs], sort_keys=True)
    return "r" + hashlib.sha256(text.encode()).hexdigest()[:8]


def prepare_trained(choice: DemoChoice, progress, cancel=None, clock: BuildClock | None = None) -> None:
    """Trains the demo's models that are not cached yet and writes the held-out images the store extracts;
    progress gets each engine TrainEvent (and `clock` hears which training each belongs to)."""
    from vitsee.training.train import train, write_held_out, write_initial

    for cfg in choice.training:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        if not Path(cfg.out).exists():
            if clock is not None:
                clock.begin(training_part(cfg))
            train(cfg, progress, cancel)
    for cfg in choice.twins:  # no training: the seeded init, a second or so each
        if not Path(cfg.out).exists():
            write_initial(cfg)
    test_set = Path(choice.config.dataset.partition(":")[2])
    if not test_set.exists():
        write_held_out(choice.training[0], test_set)


# --- building it: the models' names, one clock for the whole build, and the whole build as one call -----------

# what the demo's models are called in every title, axis and legend (engine/store/names.py): the timm names say
# vit_tiny_patch16_224, but the ViT trained here has 4-px patches and 6 blocks, so its name would mislead anyone
# who knows timm; a pretrained demo's models are those timm names' own
TRAINED_NAMES = {TRAINED_VIT[0]: "ViT", TRAINED_RESNET[0]: "ResNet-18"}
FAMILY_NAMES = {"vit": "ViT", "resnet": "ResNet", "mixer": "Mixer", "swin": "Swin"}  # another model trained here
PRETRAINED_NAMES = {DEMO_VIT: "ViT-Ti/16", DEMO_RESNET: "ResNet-18"}


def model_names(choice: DemoChoice) -> dict[str, str]:
    """Returns {model spec: display name} of the demo's models: 'ViT (trained here)', 'ViT (random init)' (its
    twin), ...; for a pretrained demo 'ViT-Ti/16 (pretrained)' and its twin 'ViT-Ti/16 (random init)'."""
    specs = list(choice.config.models)
    names: dict[str, str] = {}
    if choice.training:
        for runs, word in ((choice.training, "trained here"), (choice.twins, "random init")):
            for cfg in runs:
                base = trained_name(cfg.model)
                names[f"{cfg.model}@{cfg.out}"] = f"{base} ({word})"
        return {spec: names[spec] for spec in specs if spec in names}
    bases = dict(zip(specs, [PRETRAINED_NAMES.get(s, s.partition(".")[0]) for s in choice.pretrained]))
    for spec, name in zip(specs[len(choice.pretrained) :], choice.pretrained):  # the twins, NAME@random:SEED
        bases[spec] = PRETRAINED_NAMES.get(name, name.partition(".")[0])
    return {spec: f"{base} ({'random init' if '@random' in spec else 'pretrained'})" for spec, base in bases.items()}


def name_models(store: Path, choice: DemoChoice) -> None:
    """Gives the demo store's models their demo names (`model_names`), those without a name of their own only, so
    a name the user set stays; a store another process is writing is left as it is (the names are for looking)."""
    from vitsee.models.load import parse_model_spec
    from vitsee.store import Store

    wanted = model_names(choice)
    try:
        with Store.open(store) as s:
            keys = {spec: parse_model_spec(spec).key for spec in wanted}
            keys = {spec: key for spec, key in keys.items() if key in s.models}
            if not keys or set(keys.values()) <= set(s.set_names()):
                return
        with Store.writer(store) as s:
            named = s.set_names()
            for spec, key in keys.items():
                if key not in named:
                    s.set_display_name(key, wanted[spec])
    except VitseeError:  # being written (the app's analyses), or a name the user already gave another model
        return


# seconds of one CPU core per unit of the build, from `python benchmarks/train.py demo` (benchmarks/README.md, "The
# demo's first launch offline": the ViT 55.4 s for 15 epochs of 45 steps, the ResNet-18 15.7 s for 6 epochs of 23,
# the extraction of two models 7.1 s for 359 images); they weigh the parts of the one bar, its ETA the bar's own
STEP_SECONDS = {"vit": 0.082, "resnet": 0.114}
IMAGE_SECONDS = 0.01  # per image and model
TEST_DIGITS = 359  # the digits the demo holds out of 1,797 (test fraction 0.2, seed 0): what it extracts


def trained_name(model: str) -> str:
    """Returns what the demo calls a model it trains ('ViT', 'ResNet-18'; another by its family)."""
    from vitsee.models.load import family_of_name

    return TRAINED_NAMES.get(model) or FAMILY_NAMES.get(family_of_name(model), model)


def training_part(cfg: TrainConfig) -> str:
    """Returns the words of a training run's part of the build ('training the ViT')."""
    return f"training the {trained_name(cfg.model)}"


class BuildClock:
    """One bar for the whole demo build: every part (each training not cached yet, then the extraction) takes its
    share of the bar by the seconds it is expected to take, so the bar moves at one pace and its ETA is the whole
    build's. Thread-safe enough for one worker: parts begin in order, fractions only grow within a part."""

    def __init__(self, parts: list[tuple[str, float]]):
        self.parts = parts or [("building", 1.0)]
        self.index = 0
        self.fraction = 0.0

    @classmethod
    def for_choice(cls, choice: DemoChoice) -> BuildClock:
        """Returns the clock of the parts the choice still has to run (cached weights train no more)."""
        from vitsee.models.load import family_of_name
        from vitsee.training.train import recipe_of

        parts = []
        for cfg in choice.training:
            if not Path(cfg.out).exists():
                recipe = recipe_of(cfg)
                n_train = (cfg.n_images or 1797) * (1 - cfg.test_fraction)
                steps = recipe["epochs"] * math.ceil(n_train / recipe["batch_size"])
                parts.append((training_part(cfg), steps * STEP_SECONDS.get(family_of_name(cfg.model), 0.1)))
        n_images = choice.config.n_images or (TEST_DIGITS if choice.training else 128)
        parts.append(
            (f"extracting {len(choice.config.models)} models", n_images * len(choice.config.models) * IMAGE_SECONDS)
        )
        return cls(parts)

    @property
    def total(self) -> float:
        """Returns the whole build in expected seconds (the bar's total)."""
        return sum(seconds for _, seconds in self.parts)

    @property
    def done(self) -> float:
        """Returns the expected seconds of the build done so far."""
        return sum(seconds for _, seconds in self.parts[: self.index]) + self.parts[self.index][1] * self.fraction

    def begin(self, part: str) -> None:
        """Moves the clock to the part of that name (parts skipped count as done)."""
        names = [name for name, _ in self.parts]
        if part in names and names.index(part) >= self.index:
            self.index, self.fraction = names.index(part), 0.0

    def extracting(self) -> None:
        """Moves the clock to the extraction, the last part."""
        self.index, self.fraction = len(self.parts) - 1, 0.0

    def advance(self, fraction: float) -> None:
        """Sets how much of the current part is done (0 to 1)."""
        self.fraction = min(max(float(fraction), self.fraction), 1.0)

    def train_step(self, event) -> None:
        """Advances the current training part by an engine TrainEvent of stage 'step'."""
        if event.epochs and event.total:
            self.advance(((event.epoch - 1) * event.total + event.done) / (event.epochs * event.total))

    def describe(self, now: str) -> str:
        """Returns what the build does now and what comes after it: 'training the ViT: epoch 3 of 15; then training
        the ResNet-18, extracting 4 models'."""
        later = [name for name, _ in self.parts[self.index + 1 :]]
        return now + (f"; then {', '.join(later)}" if later else "")


def build(choice: DemoChoice, progress=None, cancel=None) -> Path:
    """Builds the demo store the choice names, as `vitsee-tui --demo` does before its first view: trains the models
    not cached yet (their twins' inits too), extracts them over the held-out images (or, pretrained, the
    photographs) and names them; returns the store. A complete store is reused as it is (named if it is not).
    `progress` gets every engine event (TrainEvent, extraction Progress)."""
    from dataclasses import replace

    from vitsee.extraction.extract import run_extraction

    cfg = choice.config
    Path(cfg.store).parent.mkdir(parents=True, exist_ok=True)
    if not (Path(cfg.store).exists() and _complete(cfg)):
        if choice.training:
            prepare_trained(choice, progress or (lambda event: None), cancel)
        run_extraction(replace(cfg, workers=0 if cfg.workers is None else cfg.workers), progress, cancel)
    name_models(Path(cfg.store), choice)
    return Path(cfg.store)


def _complete(cfg: ExtractConfig) -> bool:
    """Returns whether the store holds every model of the config, every image done."""
    from vitsee.store import Store

    try:
        with Store.open(cfg.store) as s:
            return len(s.models) == len(cfg.models) and s.complete
    except VitseeError:
        return False


# --- the next launch: the store the demo opened last, shown before any of the checks above ----------------------
# choose() imports timm (its pretrained configs), asks the Hub and digests the training recipes: 4-6 s on 2 cores
# before the first frame. A launch after the first opens the store the last one opened, at once; the app runs
# choose() once that store's first view is on screen and builds the store it names if that is another one.

LAST_OPENED = "demo-last.json"


@dataclass(frozen=True)
class Opened:
    """The demo store a launch opened complete, and the note the explorer showed about its weights."""

    store: Path
    note: str | None = None


def remember(store: Path, note: str | None, folder: Path | None = None) -> None:
    """Records the demo store that just opened complete, for the next launch to open first (a torn or missing
    record only means the next launch checks before it opens, as the first does)."""
    import json

    folder = folder or cache_dir()
    record = folder / LAST_OPENED
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"store": str(Path(store).resolve()), "note": note}))
        os.replace(tmp, record)
    except OSError:  # a read-only cache: every launch checks first, as before
        tmp.unlink(missing_ok=True)


def last_opened(folder: Path | None = None) -> Opened | None:
    """Returns the demo store the last launch opened while its file is there, else None (no torch, no network)."""
    import json

    try:
        data = json.loads(((folder or cache_dir()) / LAST_OPENED).read_text())
        opened = Opened(Path(data["store"]), data.get("note"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return opened if opened.store.is_file() else None


def analysis_config(plan: DemoPlan | None = None, device: str = "auto") -> AnalyzeConfig:
    """Returns the parameters the demo computes uncached views with (those choose() gives)."""
    from vitsee.analyses.driver import AnalyzeConfig

    return AnalyzeConfig(device=device, probe_tokens=(plan or DemoPlan()).probe_tokens)

"""The run a store records when `vitsee extract` makes it, and resuming that run from the store alone.

A store's root attr `run_config` (and an appended model file's, for the run that added it) is a JSON record of
everything `vitsee extract` was given that decides what is stored: the models' specs (weights files by their
absolute paths), the dataset (its canonical spec), the number of images and the shuffle seed, the batch size,
the image size, the layers, the dtype and streaming; plus the device it ran on, which changes no stored value
and which a resume may replace (loader workers are not recorded: the resuming machine picks its own).
`vitsee extract STORE` with no model rebuilds the run from that record (`plan_resume`) and finishes its missing
batches (`extract.resume_extraction`), as the app's Resume does. Stores made before runs were recorded open as
before; only resuming them needs the original command.

No torch at import: `vitsee info` reads records through this module.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vitsee.errors import VitseeError

RECORD_VERSION = 1
# the options of `vitsee extract` a record fixes: flag -> record field (the rest, --device, --workers, --threads,
# --force, --quiet, change no stored value and may be given to a resume)
RECORDED_OPTIONS = {
    "--dataset": "dataset",
    "--n-images": "n_images",
    "--batch-size": "batch_size",
    "--layers": "layers",
    "--img-size": "img_size",
    "--dtype": "dtype",
    "--shuffle-seed": "shuffle_seed",
    "--streaming": "streaming",
    "--heads": "heads",
    "--grams": "grams",
}
FLAGS = ("streaming", "heads", "grams")  # on/off options: typed as the bare flag


def run_record(cfg, dataset_spec: str, models: list[tuple[str, str]]) -> dict:
    """Returns the JSON-able record of a run: cfg (an ExtractConfig) with its dataset's canonical spec and its
    models as (spec, key) pairs, each spec as the store records it (a weights file by its absolute path)."""
    layers = cfg.layers if isinstance(cfg.layers, str) else list(cfg.layers)
    return {
        "version": RECORD_VERSION,
        "models": [{"spec": spec, "key": key} for spec, key in models],
        "dataset": dataset_spec,
        "n_images": cfg.n_images,
        "shuffle_seed": cfg.shuffle_seed,
        "batch_size": int(cfg.batch_size),
        "img_size": cfg.img_size,
        "layers": layers,
        "dtype": cfg.dtype,
        "streaming": bool(cfg.streaming),
        "heads": bool(getattr(cfg, "heads", False)),
        "device": str(cfg.device),
    } | ({"grams": True} if getattr(cfg, "grams", False) else {})  # absent: the records of runs before zoos


def command_line(store: Path | str, record: dict) -> str:
    """Returns the `vitsee extract` command that makes the recorded run (the options it needs, no defaults)."""
    words = ["vitsee", "extract", str(store)]
    for m in record["models"]:
        words += ["--model", m["spec"]]
    defaults = {
        "dataset": "samples",
        "n_images": None,
        "batch_size": 64,
        "layers": "blocks",
        "img_size": None,
        "dtype": "float16",
        "shuffle_seed": None,
    }
    for flag, name in RECORDED_OPTIONS.items():
        value = record.get(name)
        if name in FLAGS:
            words += [flag] if value else []
        elif value != defaults[name]:
            words += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    if record.get("device") not in (None, "auto"):
        words += ["--device", record["device"]]
    return " ".join(shlex.quote(w) for w in words)


@dataclass
class Resume:
    """What `vitsee extract STORE` resumes: one ExtractConfig per recorded run with work left (usually one;
    a store a later run appended models to has one per run), and how far each model got."""

    store: Path
    n_images: int
    configs: list = field(default_factory=list)  # ExtractConfig
    progress: dict[str, int | None] = field(default_factory=dict)  # model key -> rows done (None: not started)

    @property
    def complete(self) -> bool:
        return not self.configs

    def describe(self) -> str:
        """Returns the one line saying what is resumed: the models and how far they got, then the run."""
        if self.complete:
            return f"{self.store} is complete: every model has all {self.n_images} images; nothing to resume"
        models = ", ".join(
            f"{key} ({'not started' if done is None else f'{done}/{self.n_images} images'})"
            for key, done in self.progress.items()
        )
        runs = "; ".join(_describe_config(cfg) for cfg in self.configs)
        return f"resuming {self.store}: {models}; {runs}"


def _describe_config(cfg) -> str:
    layers = cfg.layers if isinstance(cfg.layers, str) else ",".join(cfg.layers)
    text = f"{cfg.dataset}, batch size {cfg.batch_size}, layers {layers}, {cfg.dtype}"
    if cfg.img_size is not None:
        text += f", {cfg.img_size} px"
    if cfg.shuffle_seed is not None:
        text += f", shuffle seed {cfg.shuffle_seed}"
    return text + (", streaming Grams" if getattr(cfg, "grams", False) else ", streaming" if cfg.streaming else "")


def extraction(store: Path | str, models: Sequence[str], options: Mapping[str, object], given: Mapping | None = None):
    """Returns what `vitsee extract` and `vitsee.extract` run: with models, the ExtractConfig of `options` (named as
    its fields); with none, the Resume of the run the store records, which `given` ({flag: value}: the recorded
    options the user set, and --device) must not contradict; options' workers, force and memory budget replace the
    recorded ones, and a --device in `given` the recorded device."""
    from vitsee.extraction.plan import ExtractConfig, parse_bytes

    if models:
        return ExtractConfig.from_options(store, models, options)
    given = dict(given or {})
    budget = options.get("memory_budget")
    return plan_resume(
        store,
        given,
        device=given.pop("--device", None),
        workers=options.get("workers"),
        force=bool(options.get("force", False)),
        memory_budget=None if budget is None else parse_bytes(str(budget)),
    )


def changed_options(options: Mapping[str, object]) -> dict:
    """Returns {flag: value} of the options a resume checks against the record (and --overwrite, --device) that
    `options` set away from ExtractConfig's defaults: what `vitsee.extract` was given, as the CLI's typed options."""
    import dataclasses

    from vitsee.extraction.plan import ExtractConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ExtractConfig)}
    flags = {**RECORDED_OPTIONS, "--overwrite": "overwrite", "--device": "device"}
    out = {}
    for flag, name in flags.items():
        value = options.get(name, defaults[name])
        if isinstance(value, (list, tuple)):
            value = ",".join(value)
        if value != defaults[name]:
            out[flag] = value
    return out


def plan_resume(
    store: Path | str,
    given: dict | None = None,
    *,
    device: str | None = None,
    workers: int | None = None,
    force: bool = False,
    memory_budget: int | None = None,
) -> Resume:
    """Returns what resuming the store's recorded run does; raises a VitseeError for a store that cannot be
    resumed (missing, made before runs were recorded) or an option in `given` ({flag: value}, the recorded
    options the user typed) that contradicts the record. device/workers/memory_budget replace the recorded ones."""
    from vitsee.store import Store

    path = Path(store)
    if not path.exists():
        raise VitseeError(
            f"{path} does not exist: give --model NAME to create it (with no --model, "
            "`vitsee extract STORE` resumes an existing store)"
        )
    given = dict(given or {})
    if given.pop("--overwrite", False):
        raise VitseeError(
            "--overwrite needs --model: with no model, `vitsee extract STORE` resumes the run the "
            "store records; to start over, give the models again with --overwrite"
        )
    with Store.open(path) as s:
        records = _records(s)
        if not records and s.complete:  # an older store, or one stitched from torchrun shards: nothing to do
            return Resume(path, s.n_images)
        if not records:
            models = " ".join(f"--model {s.model_info(k)['spec']}" for k in s.models)
            raise VitseeError(
                f"{path} records no run configuration (made by an older vitsee): resume it with the "
                f"command that made it, `vitsee extract {path} {models}` with its other options"
            )
        resume = Resume(path, s.n_images)
        for record in records:
            _check_given(path, given, record, s.n_images)
        claimed: set[str] = set()  # a model resumes with the run that made it, the first record naming it
        for record in records:
            todo = _unfinished(s, record, claimed)
            claimed |= {m["key"] for m in record["models"]}
            if todo:
                for m in todo:
                    resume.progress[m["key"]] = s.rows_done(m["key"]) if m["key"] in s.models else None
                resume.configs.append(_config(path, record, todo, device, workers, force, memory_budget))
    return resume


def _records(s) -> list[dict]:
    """Returns the store's distinct run records: the one that made it, then those of runs that added models."""
    found: dict[str, dict] = {}
    for record in [s.run_config(), *(s.run_config(key) for key in s.models)]:
        if record is not None:
            found.setdefault(_key(record), record)
    return list(found.values())


def _key(record: dict) -> str:
    import json

    return json.dumps(record, sort_keys=True)


def _unfinished(s, record: dict, claimed: set[str]) -> list[dict]:
    """Returns the record's models with rows left to extract (a streaming run's pass needs all its models, unless
    each streams its own Grams)."""
    todo = [
        m
        for m in record["models"]
        if m["key"] not in claimed and (m["key"] not in s.models or not s.is_complete(m["key"]))
    ]
    if todo and record.get("streaming") and not record.get("grams"):
        return list(record["models"])
    return todo


def _config(path: Path, record: dict, models: list[dict], device, workers, force, memory_budget=None):
    """Returns the ExtractConfig that resumes the recorded run's given models (the record's fields are the config's)."""
    from vitsee.extraction.plan import ExtractConfig

    replaced = {"device": device or record.get("device") or "auto", "workers": workers, "force": force}
    options = {**record, **replaced, "memory_budget": memory_budget}
    return ExtractConfig.from_options(path, [m["spec"] for m in models], options)


def _check_given(path: Path, given: dict, record: dict, n_images: int) -> None:
    """Raises a VitseeError naming the first typed option whose value is not the recorded one."""
    for flag, value in given.items():
        name = RECORDED_OPTIONS[flag]
        recorded = record.get(name)
        if _same(name, value, recorded, n_images):
            continue
        if name in FLAGS:
            typed, shown = flag if value else f"--no-{name}", flag if recorded else f"no {flag}"
        else:
            recorded = n_images if name == "n_images" else recorded
            typed = f"{flag} {value}"
            shown = f"{flag} {','.join(recorded) if isinstance(recorded, list) else recorded}"
        raise VitseeError(
            f"{typed} contradicts the run {path} records ({shown}): "
            f"leave it out to resume as recorded, or give --model NAME for another run (new store or --overwrite)"
        )


def _same(name: str, value, recorded, n_images: int) -> bool:
    """Returns whether a typed option value asks for what the record holds."""
    if name == "n_images":
        return value == n_images
    if name == "layers":
        from vitsee.extraction.plan import parse_layers

        return parse_layers(value) == parse_layers(recorded)
    if name == "dataset":
        if value == recorded:
            return True
        from vitsee.data import open_dataset

        return open_dataset(value).spec == recorded
    if name in FLAGS:
        return bool(value) == bool(recorded)
    return value == recorded

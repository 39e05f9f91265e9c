"""timm models by spec `NAME[.TAG][@WEIGHTS]`: weights loading, family recognition, layer points.

WEIGHTS is `pretrained` (default: timm's weights from the Hugging Face Hub or its local cache),
`random` / `random:SEED` (seeded init, seed 0 by default), or a path to a state-dict file
(.safetensors, .pth, .pt, .bin). What was used is recorded in the store, with the file's sha256.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from vitsee.errors import VitseeError, brief
from vitsee.models.interventions import remove_skips
from vitsee.models.specs import (  # noqa: F401  (WEIGHT_SUFFIXES, MAX_TORCH_SEED: the names other modules import)
    MAX_TORCH_SEED,
    WEIGHT_SUFFIXES,
    check_weights,
    remember_names,
    split_spec,
    unknown_name,
)

RECORD_KEY = "vitsee_train"  # the safetensors metadata key of a `vitsee train` record (engine/training/train.py)
# how long to wait for the Hub to answer before giving up on pretrained weights; VITSEE_HUB_TIMEOUT (seconds) sets it
HUB_TIMEOUT_S = 30.0
# Patch-grid transformers whose `blocks` see [prefix tokens, patch grid] and whose attention hands its softmax to
# attn_drop. CaiT has the structure but its `blocks` see patches only (the CLS joins later), so it is not listed.
VIT_MODULES = {"vision_transformer", "deit", "vision_transformer_hybrid", "vision_transformer_relpos", "beit", "eva"}
# Residual CNNs whose blocks vitsee finds by structure (layer1..4 or stages.N.blocks.M, NCHW outputs). Other timm
# modules have the stages.N.blocks.M shape too but are attention hybrids (DaViT, MaxViT, CoAtNet, EfficientViT):
# those are 'other' and take an explicit --layers list.
RESNET_MODULES = {"resnet", "resnetv2", "convnext"}
# MLP-Mixer (token- and channel-mixing MLPs on the patch grid, no attention) and Swin (attention inside shifted
# windows, channels-last stages). Other models of these modules (ResMLP, gMLP, Swin V2) have other blocks.
MIXER_MODULES = {"mlp_mixer"}
SWIN_MODULES = {"swin_transformer"}
FAMILIES = ("vit", "resnet", "mixer", "swin", "other")


# --- specs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A parsed `NAME[.TAG][@WEIGHTS]`."""

    name: str
    tag: str | None
    weights: str  # "pretrained" | "random" | "file"
    seed: int | None = None
    path: str | None = None

    @property
    def timm_name(self) -> str:
        return f"{self.name}.{self.tag}" if self.tag else self.name

    @property
    def key(self) -> str:
        """The model's name inside a store: the timm name plus how it was initialised."""
        if self.weights == "random":
            return f"{self.timm_name}@random:{self.seed}"
        if self.weights == "file":
            stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(self.path).stem)
            return f"{self.timm_name}@file:{stem}"
        return self.timm_name

    def __str__(self) -> str:
        if self.weights == "random":
            return f"{self.timm_name}@random:{self.seed}"
        if self.weights == "file":
            return f"{self.timm_name}@{self.path}"
        return self.timm_name


def parse_model_spec(text: str) -> ModelSpec:
    """Returns the ModelSpec of `NAME[.TAG][@WEIGHTS]`; the name is checked against timm's registry."""
    import timm

    text = text.strip()
    name, tag, weights = split_spec(text)
    remember_names(timm_names())  # for the next check before timm is imported (models/specs.py)
    if not timm.is_model(name):
        raise unknown_name(name, timm.list_models())
    if tag is not None and f"{name}.{tag}" not in timm.list_pretrained(f"{name}.*"):
        known = [t.partition(".")[2] for t in timm.list_pretrained(f"{name}.*")]
        hint = f"known tags: {', '.join(known)}" if known else "it has no pretrained tags; drop the tag"
        raise VitseeError(f"unknown tag '{tag}' for {name}: {hint}")
    kind, seed, path = check_weights(text, weights)
    if kind == "pretrained":
        return ModelSpec(name, tag, "pretrained")
    if kind == "random":
        return ModelSpec(name, tag, "random", seed=seed)
    return ModelSpec(name, tag, "file", path=str(path))


def timm_names() -> set[str]:
    """Returns every name timm.is_model takes: the listed models and the deprecated names it still builds."""
    import timm
    from timm.models import _registry

    return set(timm.list_models()) | set(getattr(_registry, "_model_entrypoints", {}))


# --- families and layer points --------------------------------------------------------------------


def family_of_name(name: str) -> str:
    """Returns 'vit', 'resnet', 'mixer', 'swin' or 'other' for a timm model name, from the module that defines it."""
    from timm.models import _registry

    base = name.partition(".")[0]
    module = _registry._model_to_module.get(base, "")
    if module in VIT_MODULES:
        return "vit"
    if module in RESNET_MODULES:
        return "resnet"
    if module in MIXER_MODULES and not base.startswith(("resmlp", "gmlp")):
        return "mixer"
    if module in SWIN_MODULES:
        return "swin"
    return "other"


def family_of_model(model: nn.Module) -> str:
    """Returns 'vit' for a patch-grid transformer of VIT_MODULES with blocks of attn/mlp, 'resnet' for the residual
    stages of a model of RESNET_MODULES, else 'other': the answer family_of_name gives from the name, checked
    against the structure vitsee's layer points and recorders rely on."""
    blocks = getattr(model, "blocks", None)
    patch_embed = getattr(model, "patch_embed", None)
    module = type(model).__module__.rpartition(".")[2]
    if (
        module in VIT_MODULES
        and isinstance(blocks, nn.Sequential | nn.ModuleList)
        and len(blocks) > 0
        and all(hasattr(b, "attn") and hasattr(b, "mlp") and hasattr(b.attn, "qkv") for b in blocks)
        and getattr(patch_embed, "grid_size", None) is not None
    ):
        return "vit"
    if module in RESNET_MODULES and resnet_blocks(model):
        return "resnet"
    if (
        module in MIXER_MODULES
        and isinstance(blocks, nn.Sequential)
        and len(blocks) > 0
        and all(all(hasattr(b, n) for n in ("norm1", "mlp_tokens", "norm2", "mlp_channels")) for b in blocks)
        and getattr(getattr(model, "stem", None), "grid_size", None) is not None
    ):
        return "mixer"
    if module in SWIN_MODULES and swin_blocks(model) and getattr(patch_embed, "grid_size", None) is not None:
        return "swin"
    return "other"


def swin_blocks(model: nn.Module) -> list[str]:
    """Returns the module paths of a timm Swin's blocks (layers.S.blocks.B), in forward order; [] if not one."""
    stages = getattr(model, "layers", None)
    if not isinstance(stages, nn.Sequential):
        return []
    names = []
    for s, stage in enumerate(stages):
        blocks = getattr(stage, "blocks", None)
        if not isinstance(blocks, nn.Sequential):
            return []
        for i, block in enumerate(blocks):
            if not all(hasattr(block, n) for n in ("norm1", "attn", "norm2", "mlp", "window_size", "shift_size")):
                return []
            names.append(f"layers.{s}.blocks.{i}")
    return names


def resnet_blocks(model: nn.Module) -> list[str]:
    """Returns the module paths of the residual blocks of a timm ResNet / ResNetV2, in forward order."""
    names = []
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        seq = getattr(model, stage, None)
        if isinstance(seq, nn.Sequential):
            names += [f"{stage}.{i}" for i in range(len(seq))]
    stages = getattr(model, "stages", None)
    if not names and isinstance(stages, nn.Sequential):
        for s, stage in enumerate(stages):
            blocks = getattr(stage, "blocks", None)
            if isinstance(blocks, nn.Sequential):
                names += [f"stages.{s}.blocks.{i}" for i in range(len(blocks))]
    return names


@dataclass(frozen=True)
class Point:
    """Where a layer's activation is read: a module's output, or its input (`kind='input'`)."""

    name: str
    module: str
    kind: str = "output"


def _vit_points(model: nn.Module, granularity: str) -> list[Point]:
    def sublayers(b: str) -> list[Point]:
        return [
            Point(f"{b}.norm1", f"{b}.norm1"),
            Point(f"{b}.attn", f"{b}.attn"),
            # the residual stream after the attention sublayer is exactly what norm2 reads
            Point(f"{b}.resid1", f"{b}.norm2", "input"),
            Point(f"{b}.norm2", f"{b}.norm2"),
            Point(f"{b}.mlp.act", f"{b}.mlp.act"),
        ]

    return _token_block_points(model, "patch_embed", sublayers if granularity == "sublayers" else None)


def _token_block_points(model: nn.Module, stem: str, sublayers) -> list[Point]:
    """Returns the stem, each of model.blocks (after its sublayers(b) points, when given) and the final norm."""
    points = [Point(stem, stem)]
    for i in range(len(model.blocks)):
        b = f"blocks.{i}"
        if sublayers is not None:
            points += sublayers(b)
        points.append(Point(b, b))
    if isinstance(getattr(model, "norm", None), nn.Module):
        points.append(Point("norm", "norm"))
    return points


def _resnet_points(model: nn.Module, granularity: str) -> list[Point]:
    stem = "maxpool" if hasattr(model, "maxpool") else "stem"
    points = [Point(stem, stem)]
    for b in resnet_blocks(model):
        block = model.get_submodule(b)
        if granularity == "sublayers":
            acts = [n for n, m in block.named_children() if re.fullmatch(r"act\d", n)]
            norms = [n for n, m in block.named_children() if re.fullmatch(r"norm\d", n)]
            if acts:  # post-activation ResNet: conv-bn-act ... sum -> last act
                points += [Point(f"{b}.{a}", f"{b}.{a}") for a in acts[:-1]]
                # the residual sum is what the block's last activation reads
                points.append(Point(f"{b}.resid", f"{b}.{acts[-1]}", "input"))
            else:  # pre-activation (ResNetV2): norm-act before each conv, the block output is the sum
                points += [Point(f"{b}.{n}", f"{b}.{n}") for n in norms]
        points.append(Point(b, b))
    if hasattr(model, "stages") and isinstance(getattr(model, "norm", None), nn.Module):
        points.append(Point("norm", "norm"))
    return points


def _mixer_points(model: nn.Module, granularity: str) -> list[Point]:
    def sublayers(b: str) -> list[Point]:
        # mlp_tokens works on the transposed (B, C, T) stream: its output is not kept, the stream after it is
        return [
            Point(f"{b}.norm1", f"{b}.norm1"),
            Point(f"{b}.resid1", f"{b}.norm2", "input"),  # the stream after token mixing
            Point(f"{b}.norm2", f"{b}.norm2"),
            Point(f"{b}.mlp_channels.act", f"{b}.mlp_channels.act"),
        ]

    return _token_block_points(model, "stem", sublayers if granularity == "sublayers" else None)


def _swin_points(model: nn.Module, granularity: str) -> list[Point]:
    points = [Point("patch_embed", "patch_embed")]
    for b in swin_blocks(model):
        if granularity == "sublayers":
            # the window attention's own output is in window order, so the stream after it is kept instead
            points += [
                Point(f"{b}.norm1", f"{b}.norm1"),
                Point(f"{b}.resid1", f"{b}.norm2", "input"),
                Point(f"{b}.norm2", f"{b}.norm2"),
                Point(f"{b}.mlp.act", f"{b}.mlp.act"),
            ]
        points.append(Point(b, b))
    if isinstance(getattr(model, "norm", None), nn.Module):
        points.append(Point("norm", "norm"))
    return points


POINTS = {"vit": _vit_points, "resnet": _resnet_points, "mixer": _mixer_points, "swin": _swin_points}


def layer_points(model: nn.Module, family: str, layers: str | list[str]) -> list[Point]:
    """Returns the points to record: `blocks`, `sublayers`, or explicit names (module paths, documented
    points such as `blocks.3.resid1` / `layer2.1.resid`, or `MODULE:in` for a module's input)."""
    if layers in ("blocks", "sublayers"):
        if family in POINTS:
            return POINTS[family](model, layers)
        raise VitseeError(
            f"{type(model).__name__} is not a ViT-, ResNet-, Mixer- or Swin-like model, "
            f"so '{layers}' is not defined for it: "
            "name the layers with --layers NAME,NAME (module paths from `vitsee layers MODEL --granularity modules`)"
        )
    modules = dict(model.named_modules())
    known = {p.name: p for p in (POINTS[family](model, "sublayers") if family in POINTS else [])}
    points = []
    for name in layers:
        if name in known:
            points.append(known[name])
        elif name.endswith(":in") and name[:-3] in modules and name[:-3]:
            points.append(Point(name, name[:-3], "input"))
        elif name in modules and name:
            points.append(Point(name, name))
        else:
            candidates = list(dict.fromkeys(list(known) + [m for m in modules if m]))
            close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.5)
            hint = f"close matches: {', '.join(close)}" if close else "see `vitsee layers MODEL` for the names"
            raise VitseeError(f"unknown layer '{name}' in {type(model).__name__}: {hint}")
    seen = set()
    duplicates = [p.name for p in points if p.name in seen or seen.add(p.name)]
    if duplicates:
        raise VitseeError(f"layer '{duplicates[0]}' is named twice in --layers: list each layer once")
    return _forward_order(model, points)


def _forward_order(model: nn.Module, points: list[Point]) -> list[Point]:
    """Returns points sorted in the order the forward pass reaches them (inputs before outputs)."""
    order: dict[tuple[str, str], int] = {}
    handles = []
    wanted = {p.module for p in points}

    for path in wanted:
        mod = model.get_submodule(path)

        def pre(_m, _a, path=path):
            order.setdefault((path, "input"), len(order))

        def post(_m, _a, _o, path=path):
            order.setdefault((path, "output"), len(order))

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        size = input_size(model)
        with torch.no_grad():
            model(torch.zeros(1, *size, device=next(model.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    missing = [p.name for p in points if (p.module, p.kind) not in order]
    if missing:
        raise VitseeError(f"layer '{missing[0]}' is never reached by the forward pass: pick another layer")
    return sorted(points, key=lambda p: order[(p.module, p.kind)])


# --- loading --------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A model in eval mode with what the store records about it."""

    spec: ModelSpec
    model: nn.Module
    family: str
    data_config: dict
    weights: dict  # kind, seed, path, sha256, source
    grid_size: tuple[int, int] | None = None
    patch_size: tuple[int, int] | None = (
        None  # input px one token covers (input size / grid), not a hybrid stem's patch
    )
    num_prefix_tokens: int = 0
    cls_token: bool = (
        False  # timm's cls_token is a parameter (not None): a register-only ViT has prefix tokens but none
    )
    prefix_names: list[str] = field(default_factory=list)  # "CLS", "dist", "reg 0" ... in token order
    num_blocks: int = 0
    num_heads: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.spec.key

    def record(self) -> dict:
        """Returns the JSON-able metadata stored with the model."""
        # not asdict(self): it deep-copies every field first, the model's weights too (0.1 s and a second copy of
        # the weights per call for a tiny model; a ViT-B's 330 MB)
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in ("model", "spec")}
        out.update(
            spec=str(self.spec), key=self.key, name=self.spec.name, tag=self.spec.tag, timm_name=self.spec.timm_name
        )
        return out


def input_size(model: nn.Module) -> tuple[int, int, int]:
    """Returns the (C, H, W) the model was built for (timm's data config can disagree for ViTs built with
    img_size=N: it still reports the pretrained size)."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    c, h, w = cfg.get("input_size", (3, 224, 224))
    patch_embed = getattr(model, "patch_embed", None) or getattr(model, "stem", None)  # MLP-Mixer calls it stem
    img_size = getattr(patch_embed, "img_size", None)
    if img_size is not None:
        h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    override = getattr(model, "_vitsee_img_size", None)
    if override is not None:
        h = w = override
    return int(c), int(h), int(w)


def sha256_file(path: str | Path) -> str:
    """Returns the hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_pretrained_file(timm_name: str) -> str | None:
    """Returns the local path of a model's pretrained weights if they are already cached, else None."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(timm_name)
    if cfg is None:
        return None
    if cfg.file and Path(cfg.file).exists():
        return cfg.file
    if cfg.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = cfg.hf_hub_id.partition("@")
        filenames = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
        for fname in filenames:
            found = try_to_load_from_cache(repo, fname, revision=revision or None)
            if isinstance(found, str):
                return found
    if cfg.url:
        cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(cfg.url).path)
        if cached.exists():
            return str(cached)
    return None


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Returns whether a TCP connection to the Hub's endpoint (HF_ENDPOINT) opens within timeout_s."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def hub_timeout_s() -> float:
    """Returns how long to wait for the Hub to answer: VITSEE_HUB_TIMEOUT seconds if set, else HUB_TIMEOUT_S."""
    text = os.environ.get("VITSEE_HUB_TIMEOUT", "").strip()
    try:
        value = float(text) if text else HUB_TIMEOUT_S
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise VitseeError(
            f"VITSEE_HUB_TIMEOUT={text!r} is not a positive number of seconds: set it to e.g. 30, or unset it"
        )
    return value


def pretrained_url(timm_name: str) -> str | None:
    """Returns the URL timm fetches a model's pretrained weights from (on the Hub, or the cfg's own url)."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(timm_name)
    if cfg is None:
        return None
    if cfg.hf_hub_id:
        from huggingface_hub import hf_hub_url

        repo, _, revision = cfg.hf_hub_id.partition("@")
        return hf_hub_url(repo, cfg.hf_hub_filename or "model.safetensors", revision=revision or None)
    return cfg.url or None


def _check_hub_answers(timm_name: str) -> None:
    """Raises a VitseeError naming the ways out unless the server holding a model's weights answers one
    request within hub_timeout_s(): timm's download waits minutes on a server that accepts connections and
    stays silent (it retries)."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    ways_out = (
        f"set HF_HUB_OFFLINE=1 to use only cached weights, or give a local weights file, "
        f"{timm_name}@/path/to/weights.safetensors"
    )
    if constants.HF_HUB_OFFLINE:
        raise VitseeError(
            f"pretrained weights for {timm_name} are not in the local cache and HF_HUB_OFFLINE is set: use "
            f"{timm_name}@random[:SEED], {timm_name}@/path/to/weights.safetensors, "
            "or copy the weights into the Hub cache (HF_HOME) on a machine with network"
        )
    url = pretrained_url(timm_name)
    if url is None:
        return
    timeout = hub_timeout_s()
    host = urlparse(url).netloc
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return  # an answer (a 401 or 404 too): the server is there, and timm reports what it says
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError | socket.timeout):
            what = f"did not answer within {timeout:g} s (VITSEE_HUB_TIMEOUT sets the wait)"
        else:
            what = f"cannot be reached ({brief(reason) if isinstance(reason, BaseException) else reason})"
        raise VitseeError(f"pretrained weights for {timm_name} are not cached and {host} {what}: {ways_out}") from exc


def _default_tag(name: str) -> str | None:
    import timm

    tags = timm.list_pretrained(f"{name}.*")
    return tags[0].partition(".")[2] if tags else None


def _create(spec: ModelSpec, img_size: int | None, **kwargs) -> nn.Module:
    import timm

    name = spec.timm_name
    if img_size is not None:
        try:
            model = timm.create_model(name, img_size=img_size, **kwargs)
            return model
        except TypeError as exc:  # CNNs take any input size and have no img_size argument
            if "img_size" not in str(exc):
                raise
    model = timm.create_model(name, **kwargs)
    if img_size is not None:
        model._vitsee_img_size = img_size
    return model


def _unwrap_state_dict(obj, path: str) -> dict:
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict", "module"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise VitseeError(
            f"{path} does not hold a state dict of tensors: save it with torch.save(model.state_dict(), path)"
        )
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module.") :]: v for k, v in obj.items()}
    return obj


def load_state_dict_file(path: str) -> dict:
    """Returns the state dict in a .safetensors / .pth / .pt / .bin file (checkpoint dicts unwrapped)."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path, device="cpu")
        return _unwrap_state_dict(torch.load(path, map_location="cpu", weights_only=True), path)
    except VitseeError:
        raise
    except Exception as exc:  # torch / safetensors raise many types for a bad file
        raise VitseeError(f"cannot read weights file {path} ({brief(exc)}): check it is a state dict") from exc


def _load_file_weights(model: nn.Module, path: str) -> None:
    state = load_state_dict_file(path)
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if filter_fn is not None:
        try:  # adapts e.g. position embeddings to an img_size other than the checkpoint's
            state = filter_fn(state, model)
        except Exception:  # a filter that does not apply to this file: load it as it is
            pass
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    if unexpected:
        problems.append(f"unexpected {', '.join(unexpected[:4])}{' ...' if len(unexpected) > 4 else ''}")
    if mismatched:
        problems.append(f"shape {', '.join(mismatched[:3])}{' ...' if len(mismatched) > 3 else ''}")
    if problems:
        raise VitseeError(
            f"weights in {path} do not fit {type(model).__name__} ({'; '.join(problems)}): "
            "use the model name and --img-size the file was saved from"
        )
    model.load_state_dict(state, strict=True)


def read_record(path: str | Path) -> dict | None:
    """Returns the training record in a .safetensors file's metadata, or None if it has none."""
    if not str(path).endswith(".safetensors"):
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise VitseeError(f"cannot read {path} as safetensors ({brief(exc)}): check the file") from exc
    text = meta.get(RECORD_KEY)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise VitseeError(f"the training record in {path} is not JSON ({exc}): retrain with `vitsee train`") from exc


def build_model(name: str, kwargs: dict, no_skip: list[str]) -> nn.Module:
    """Returns timm's model `name` built with kwargs (num_classes, img_size, pooling ...), skips removed."""
    import timm

    kwargs = dict(kwargs)
    img_size = kwargs.pop("img_size", None)
    if family_of_name(name) == "vit" and img_size is not None:
        kwargs["img_size"] = img_size  # CNNs take any size and have no img_size argument
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as exc:  # timm raises TypeError, ValueError, AssertionError ... for bad kwargs
        shown = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        raise VitseeError(
            f"timm cannot build {name} with {shown} ({brief(exc)}): check the --model-arg names and values"
        ) from exc
    if img_size is not None and "img_size" not in kwargs:
        model._vitsee_img_size = img_size  # what models.input_size reports for a CNN
    return remove_skips(model, no_skip)


def rebuild(record: dict) -> nn.Module:
    """Returns the architecture a training record describes (kwargs, class count, removed skips, pooling),
    with fresh weights."""
    return build_model(record["model"], record["kwargs"], record["interventions"]["no_skip"])


def describe_record(record: dict) -> str:
    """Returns one line saying how a model was trained here, e.g. 'digits (1437 images, 10 epochs, test accuracy
    0.912); no skip in blocks.3.attn, blocks.3.mlp; GAP'."""
    epochs = f"{len(record['history'])} epochs" if record["history"] else "0 epochs: the seeded init"
    text = f"{record['dataset']} ({record['n_train']} images, {epochs}, test accuracy {record['test_accuracy']:.3f})"
    return text + "".join(f"; {part}" for part in interventions_text(record))


def interventions_text(record: dict) -> list[str]:
    """Returns the record's interventions in words (empty for a plain run)."""
    iv = record["interventions"]
    parts = []
    if iv["no_skip"]:
        parts.append(f"no skip in {', '.join(iv['no_skip'])}")
    if iv["pool"]:
        parts.append({"avg": "GAP classifier, no class token", "cls": "class-token classifier"}[iv["pool"]])
    if record["split"]["data_fraction"] < 1:
        parts.append(f"data fraction {record['split']['data_fraction']:g}")
    return parts


def _trained_record(spec: ModelSpec) -> dict | None:
    """Returns the `vitsee train` record of a weights file, None for other files; a record of another model
    than the spec names is a VitseeError."""
    record = read_record(spec.path)
    if record is not None and record["model"] != spec.name:
        raise VitseeError(
            f"{spec.path} was trained as {record['model']}, not {spec.name}: use -m {record['model']}@{spec.path}"
        )
    return record


def load_model(spec: ModelSpec | str, img_size: int | None = None, device: str | torch.device = "cpu") -> LoadedModel:
    """Returns the model of a spec, in eval mode on `device`, with its family, grid and weights record."""
    import timm

    if isinstance(spec, str):
        spec = parse_model_spec(spec)
    weights: dict = {"kind": spec.weights, "seed": spec.seed, "path": spec.path, "sha256": None, "source": None}
    if spec.weights == "pretrained":
        tag = spec.tag or _default_tag(spec.name)
        if tag is None:
            raise VitseeError(
                f"{spec.name} has no pretrained weights in timm: "
                f"use {spec.name}@random or {spec.name}@/path/to/weights.safetensors"
            )
        spec = ModelSpec(spec.name, tag, "pretrained")
        cached = cached_pretrained_file(spec.timm_name)
        if cached is None:
            _check_hub_answers(spec.timm_name)
        try:
            if cached is not None:
                model = _create(spec, img_size, pretrained=True, pretrained_cfg_overlay={"file": cached})
            else:
                model = _create(spec, img_size, pretrained=True)
                cached = cached_pretrained_file(spec.timm_name)
        except VitseeError:
            raise
        except Exception as exc:  # network, hub and format errors come in many types
            raise VitseeError(
                f"pretrained weights for {spec.timm_name} could not be loaded ({brief(exc)}): "
                f"use {spec.timm_name}@random or {spec.timm_name}@/path/to/weights.safetensors"
            ) from exc
        cfg = model.pretrained_cfg
        weights.update(
            source=cfg.get("hf_hub_id") or cfg.get("url"), path=cached, sha256=sha256_file(cached) if cached else None
        )
    elif spec.weights == "random":
        torch.manual_seed(spec.seed)
        model = _create(spec, img_size, pretrained=False)
        weights["source"] = f"timm {timm.__version__} init, torch.manual_seed({spec.seed})"
    else:
        trained = _trained_record(spec)
        if trained is None:
            model = _create(spec, img_size, pretrained=False)
        else:  # a `vitsee train` file: its record rebuilds the architecture (kwargs, classes, skips, pooling)
            model = rebuild(
                trained if img_size is None else {**trained, "kwargs": {**trained["kwargs"], "img_size": img_size}}
            )
            weights.update(trained=describe_record(trained), interventions=trained["interventions"])
        _load_file_weights(model, spec.path)
        weights.update(sha256=sha256_file(spec.path), source=spec.path)

    model.eval().to(device)
    family = family_of_model(model)
    data_config = timm.data.resolve_model_data_config(model)
    data_config["input_size"] = input_size(model)  # the size the model was built for, not the cfg's
    loaded = LoadedModel(spec=spec, model=model, family=family, data_config=data_config, weights=weights)
    describe = {"vit": _describe_vit, "resnet": _describe_resnet, "mixer": _describe_mixer, "swin": _describe_swin}
    if family in describe:
        describe[family](loaded)
    return loaded


def _token_px(loaded: LoadedModel, grid: tuple[int, int]) -> tuple[int, int]:
    """Returns the input pixels one token of a grid covers: input size / grid, refusing a grid that does not tile
    the input. A hybrid's stem makes this larger than patch_embed.patch_size (the patch on the stem's map)."""
    _, h, w = loaded.data_config["input_size"]
    gh, gw = grid
    if h % gh or w % gw:
        step = h // gh
        fits = sorted({max(step, 1) * gh, (step + 1) * gh})
        raise VitseeError(
            f"--img-size {h} is not covered by the {gh}x{gw} token grid of {loaded.spec.timm_name}: "
            f"use --img-size {' or '.join(map(str, fits))}"
        )
    return h // gh, w // gw


def _describe_vit(loaded: LoadedModel) -> None:
    model, pe = loaded.model, loaded.model.patch_embed
    ps = pe.patch_size
    stem_patch = (ps, ps) if isinstance(ps, int) else tuple(int(p) for p in ps)
    _, h, w = loaded.data_config["input_size"]
    ph, pw = stem_patch
    hybrid = getattr(pe, "backbone", None) is not None
    if not hybrid and (h % ph or w % pw):  # timm asserts in the forward, or quietly drops the strip no patch covers
        fits = sorted({max(ph, h // ph * ph), (h // ph + 1) * ph})
        raise VitseeError(
            f"--img-size {h} is not a multiple of the {ph}-px patches of {loaded.spec.timm_name}: "
            f"use --img-size {' or '.join(map(str, fits))}"
        )
    loaded.grid_size = tuple(int(g) for g in pe.grid_size)
    loaded.patch_size = _token_px(loaded, loaded.grid_size)
    if hybrid:
        loaded.extra["stem_patch_size"] = list(stem_patch)
    loaded.num_prefix_tokens = int(getattr(model, "num_prefix_tokens", 1))
    loaded.cls_token = getattr(model, "cls_token", None) is not None
    loaded.prefix_names = _prefix_names(model, loaded.num_prefix_tokens, loaded.cls_token)
    loaded.num_blocks = len(model.blocks)
    loaded.num_heads = int(model.blocks[0].attn.num_heads)


def _prefix_names(model: nn.Module, n: int, cls: bool) -> list[str]:
    """Returns the names of the prefix tokens in timm's order: CLS, then distillation, then registers."""
    names = ["CLS"] if cls else []
    if getattr(model, "dist_token", None) is not None:
        names.append("dist")
    names += [f"reg {i}" for i in range(n - len(names))]
    return names[:n]


def _describe_resnet(loaded: LoadedModel) -> None:
    loaded.num_blocks = len(resnet_blocks(loaded.model))


def _describe_mixer(loaded: LoadedModel) -> None:
    stem = loaded.model.stem
    loaded.grid_size = tuple(int(g) for g in stem.grid_size)
    loaded.patch_size = _token_px(loaded, loaded.grid_size)
    loaded.num_blocks = len(loaded.model.blocks)


def _describe_swin(loaded: LoadedModel) -> None:
    """Grid and token px of the patch embedding, and per stage its blocks, heads, window and token px."""
    model = loaded.model
    loaded.grid_size = tuple(int(g) for g in model.patch_embed.grid_size)
    loaded.patch_size = _token_px(loaded, loaded.grid_size)
    stages = []
    for stage in model.layers:
        first = stage.blocks[0]
        grid = tuple(int(g) for g in first.input_resolution)
        stages.append(
            {
                "blocks": len(stage.blocks),
                "heads": int(first.attn.num_heads),
                "window": [int(v) for v in first.window_size],
                "grid": list(grid),
                "token_px": list(_token_px(loaded, grid)),
            }
        )
    loaded.extra["stages"] = stages
    loaded.num_blocks = sum(st["blocks"] for st in stages)
    loaded.num_heads = max(st["heads"] for st in stages)


def make_transform(loaded: LoadedModel):
    """Returns timm's eval transform for the model's data config at the size the model was built for."""
    import timm

    cfg = dict(loaded.data_config)
    return timm.data.create_transform(**cfg, is_training=False)


def list_models(pattern: str = "*", pretrained_only: bool = False) -> list[dict]:
    """Returns rows (name, family, cached) for timm models matching a pattern; with tags for pretrained."""
    import timm

    if pattern and not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    rows = []
    for name in timm.list_pretrained(pattern):
        rows.append({"name": name, "family": family_of_name(name), "cached": cached_pretrained_file(name) is not None})
    if not pretrained_only:
        with_tags = {r["name"].partition(".")[0] for r in rows}
        for name in timm.list_models(pattern):
            if name not in with_tags:
                rows.append({"name": name, "family": family_of_name(name), "cached": False})
    rows.sort(key=lambda r: r["name"])
    return rows


# --- model lists (`vitsee extract --models-from FILE`, `--models PATTERN`) -------------------------------------


@dataclass(frozen=True)
class WeightsStatus:
    """Whether a listed model's weights can be had here: status is 'cached' (pretrained, in the local cache),
    'download' (pretrained, fetched from the Hub when the run loads it), 'random' (seeded init), 'file' (a local
    file) or 'missing' (cannot be had); detail says where from, or why not; origin where the spec was read."""

    spec: str
    key: str
    status: str
    detail: str
    origin: str = ""

    @property
    def available(self) -> bool:
        return self.status != "missing"


@dataclass
class ModelList:
    """The models a run was given (by -m, --models-from and --models), each with its weights' status."""

    entries: list[WeightsStatus]
    duplicates: int = 0  # the same model given again (by another list or pattern), left out

    @property
    def available(self) -> list[str]:
        return [e.spec for e in self.entries if e.available]

    @property
    def missing(self) -> list[WeightsStatus]:
        return [e for e in self.entries if not e.available]

    def describe(self) -> list[str]:
        """Returns the plan's lines: a count by status, then one line per model (spec, status, where from)."""
        counts = {
            s: sum(e.status == s for e in self.entries) for s in ("cached", "download", "file", "random", "missing")
        }
        words = {
            "cached": "weights cached here",
            "download": "would be downloaded",
            "file": "from local files",
            "random": "random init",
            "missing": "cannot be had",
        }
        parts = [f"{n} {words[s]}" for s, n in counts.items() if n]
        head = f"{len(self.entries)} model(s): {', '.join(parts)}"
        if self.duplicates:
            head += f" ({self.duplicates} given twice, listed once)"
        width = max((len(e.spec) for e in self.entries), default=0)
        return [head] + [f"  {e.spec:<{width}}  {e.status:<8}  {e.detail}" for e in self.entries]

    def check(self, skip_missing: bool) -> list[str]:
        """Returns the specs to run; a model that cannot be had is a VitseeError naming it and the ways out, unless
        skip_missing leaves it out."""
        missing = self.missing
        if missing and not skip_missing:
            first = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            where = f" ({first.origin})" if first.origin else ""
            raise VitseeError(
                f"{first.spec}{where} cannot be had: {first.detail}{more}; {_ways_out(first)}, or pass "
                "--skip-missing to leave out what cannot be had"
            )
        if not self.available:
            raise VitseeError(
                "none of the given models can be had here: see the list above; give weights that are "
                "cached, random init (NAME@random) or local files (NAME@path.safetensors)"
            )
        return self.available


def _ways_out(entry: WeightsStatus) -> str:
    name = entry.spec.partition("@")[0]
    if entry.detail.startswith("weights file"):
        return "fix the path"
    return (
        f"use {name}@random[:SEED] or {name}@/path/to/weights.safetensors, or copy the weights into the Hub cache "
        "(HF_HOME) on a machine with network"
    )


def read_model_list(path: str | Path) -> list[tuple[str, str]]:
    """Returns the (spec, 'FILE line N') of each model a list file names: one spec per line as `-m` takes it, `#`
    starting a comment, blank lines ignored; a weights path relative to the file's folder."""
    path = Path(os.path.expanduser(str(path)))
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise VitseeError(f"--models-from {path} does not exist: give a file with one model spec per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise VitseeError(
            f"--models-from {path} cannot be read ({brief(exc)}): give a text file with one model spec per line"
        ) from None
    out = []
    for number, line in enumerate(lines, start=1):
        text = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not text:
            continue
        base, at, weights = text.partition("@")
        weights = weights.strip()
        if at and weights and weights != "pretrained" and not weights.startswith("random"):
            file = Path(os.path.expanduser(weights))
            text = f"{base.strip()}@{file if file.is_absolute() else path.parent / file}"
        out.append((text, f"{path} line {number}"))
    if not out:
        raise VitseeError(
            f"--models-from {path} lists no model: write one spec per line, NAME[.TAG][@WEIGHTS] "
            "(e.g. vit_tiny_patch16_224@random:0); # starts a comment"
        )
    return out


def pretrained_names(pattern: str) -> list[str]:
    """Returns the timm names with their pretrained tag that a --models pattern matches (timm.list_models(pattern,
    pretrained=True)); none is a VitseeError."""
    import timm

    names = timm.list_models(pattern, pretrained=True)
    if not names:
        raise VitseeError(
            f"--models '{pattern}' matches no timm model with pretrained weights: see "
            f"`vitsee models '{pattern}' --pretrained`, or use a wider pattern such as 'vit_*'"
        )
    return list(names)


def weights_status(text: str, origin: str = "", hub: dict | None = None) -> WeightsStatus:
    """Returns whether the weights of the spec `text` can be had here (nothing is loaded or downloaded). A typo in
    the name or tag is a VitseeError as for -m; a weights file that does not exist is 'missing'. hub caches whether
    the Hub answers, so a list asks it once."""
    base, _, weights = text.strip().partition("@")
    weights = weights.strip()
    if weights and weights != "pretrained" and not weights.startswith("random"):
        path = Path(os.path.expanduser(weights))
        if not path.exists():
            spec = parse_model_spec(f"{base}@random")  # the name and tag are checked all the same
            return WeightsStatus(
                text.strip(),
                ModelSpec(spec.name, spec.tag, "file", path=str(path)).key,
                "missing",
                f"weights file {path} does not exist",
                origin,
            )
    spec = parse_model_spec(text)
    if spec.weights == "random":
        return WeightsStatus(str(spec), spec.key, "random", f"seed {spec.seed}", origin)
    if spec.weights == "file":
        return WeightsStatus(str(spec), spec.key, "file", spec.path, origin)
    tag = spec.tag or _default_tag(spec.name)
    if tag is None:
        return WeightsStatus(str(spec), spec.key, "missing", f"{spec.name} has no pretrained weights in timm", origin)
    cached = cached_pretrained_file(f"{spec.name}.{tag}")
    if cached is not None:
        return WeightsStatus(str(spec), spec.key, "cached", cached, origin)
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return WeightsStatus(
            str(spec), spec.key, "missing", "not in the local cache, and HF_HUB_OFFLINE is set", origin
        )
    url = pretrained_url(f"{spec.name}.{tag}") or ""
    host = urlparse(url).netloc
    if host == urlparse(_hub_endpoint()).netloc:
        hub = {} if hub is None else hub
        if "reachable" not in hub:
            hub["reachable"] = hub_reachable()
        if not hub["reachable"]:
            return WeightsStatus(
                str(spec), spec.key, "missing", f"not in the local cache, and {host} cannot be reached", origin
            )
    return WeightsStatus(str(spec), spec.key, "download", f"from {host or 'its url'}", origin)


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def model_list(specs: Sequence[str] = (), files: Sequence[str | Path] = (), patterns: Sequence[str] = ()) -> ModelList:
    """Returns the ModelList of the models -m (specs), --models-from (files) and --models (patterns) give, in that
    order, each model once (by its store key), with its weights' status."""
    given = [(s, "") for s in specs]
    for f in files:
        given += read_model_list(f)
    for p in patterns:
        given += [(name, f"--models '{p}'") for name in pretrained_names(p)]
    entries, seen, hub = [], set(), {}
    for text, origin in given:
        entry = weights_status(text, origin, hub)
        if entry.key in seen:
            continue
        seen.add(entry.key)
        entries.append(entry)
    return ModelList(entries, duplicates=len(given) - len(entries))

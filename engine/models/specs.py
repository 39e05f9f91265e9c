"""Checking a model spec `NAME[.TAG][@WEIGHTS]` before torch and timm are imported (38 s of a 60 s typo on a loaded
machine): the weights part (pretrained, random[:SEED], a file that is there and a state dict by its suffix), and the
name against the list of timm's model names this machine saw last (kept in the cache folder by timm's version,
written whenever timm is imported to parse a spec; without it the name waits for timm, as before).

No torch, no timm here: `vitsee extract` runs these checks first, then imports them.
"""

from __future__ import annotations

import difflib
import os
from importlib import metadata
from pathlib import Path

from vitsee.errors import VitseeError

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
MAX_TORCH_SEED = 2**64 - 1  # torch.manual_seed takes an unsigned 64-bit seed


def split_spec(text: str) -> tuple[str, str | None, str]:
    """Returns (name, tag or None, weights text: 'pretrained' when none is given) of a spec."""
    text = text.strip()
    base, _, weights = text.partition("@")
    name, _, tag = base.partition(".")
    if not name:
        raise VitseeError(
            f"model spec '{text}' has no name: write NAME[.TAG][@WEIGHTS], e.g. vit_tiny_patch16_224@random"
        )
    return name, tag or None, weights.strip() or "pretrained"


def check_weights(text: str, weights: str) -> tuple[str, int | None, Path | None]:
    """Returns (kind, seed, path) of a spec's weights: ('pretrained', None, None), ('random', SEED, None) or ('file',
    None, PATH); a seed that is no integer or out of torch's range, or a file that is not there or no state dict, is
    the VitseeError naming the way out."""
    if weights == "pretrained":
        return "pretrained", None, None
    if weights == "random" or weights.startswith("random:"):
        seed_text = weights.partition(":")[2] or "0"
        try:
            seed = int(seed_text)
        except ValueError:
            raise VitseeError(
                f"seed '{seed_text}' in '{text}' is not an integer: write @random:SEED, e.g. @random:0"
            ) from None
        if not 0 <= seed <= MAX_TORCH_SEED:
            raise VitseeError(
                f"seed {seed} in '{text}' is out of torch's range: "
                f"use @random:SEED with SEED from 0 to {MAX_TORCH_SEED}"
            )
        return "random", seed, None
    path = Path(os.path.expanduser(weights))
    if not path.exists():
        close = difflib.get_close_matches(weights, ["pretrained", "random"], n=1, cutoff=0.6)
        hint = f" (did you mean @{close[0]}?)" if close else ""
        raise VitseeError(
            f"weights '{weights}' in '{text}' is not pretrained, random[:SEED] or an existing file{hint}: "
            "check the path"
        )
    if path.suffix.lower() not in WEIGHT_SUFFIXES:
        raise VitseeError(f"weights file {path} must end in {', '.join(WEIGHT_SUFFIXES)}")
    return "file", None, path.resolve()


# --- timm's model names, remembered -------------------------------------------------------------------------------


def _timm_version() -> str | None:
    try:
        return metadata.version("timm")
    except metadata.PackageNotFoundError:
        return None


def names_file() -> Path | None:
    """Returns where the names of this timm version are kept ($XDG_CACHE_HOME/vitsee/timm-models-VERSION.txt)."""
    version = _timm_version()
    if version is None:
        return None
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vitsee" / f"timm-models-{version}.txt"


def known_names() -> frozenset[str] | None:
    """Returns timm's model names as this timm version last listed them here, None when they were never kept."""
    path = names_file()
    try:
        return frozenset(path.read_text().split()) if path is not None else None
    except OSError:
        return None


def remember_names(names) -> None:
    """Keeps timm's model names for the next spec check (written whole and renamed; a read-only cache: not kept)."""
    path = names_file()
    if path is None or path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text("\n".join(sorted(names)) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def unknown_name(name: str, names) -> VitseeError:
    """Returns the error for a model name timm does not have, with the names closest to it."""
    close = difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see `vitsee models PATTERN`"
    return VitseeError(f"unknown model '{name}': {hint}")


def precheck_spec(text: str) -> None:
    """Raises the VitseeError a spec would meet once timm is imported, where it can be told without timm: its
    weights, and its name when timm's names were kept here."""
    name, _, weights = split_spec(text)
    check_weights(text, weights)
    names = _live_names() or known_names()
    if names is not None and name not in names:
        raise unknown_name(name, names)


def _live_names() -> frozenset[str] | None:
    """Returns timm's own registry when timm is already imported (a script that registered its models in timm, then
    ran the CLI: the list kept on disk does not have them), else None; never imports timm."""
    import sys

    if "timm" not in sys.modules:
        return None
    from timm.models import _registry  # timm is imported: its registry costs nothing more

    return frozenset(_registry.list_models()) | frozenset(getattr(_registry, "_model_entrypoints", {}))

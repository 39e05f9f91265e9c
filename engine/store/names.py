"""Display names: what figures, titles, legends, file names and messages call a store's models.

A store key (`vit_tiny_patch16_224@file:demo-vit_tiny_patch16_224-digits32-rc36c4504-s0`) says exactly which model
and weights a result is about, so the JSON exports and the cache keep it; it is no label for a paper. Every model
has a display name instead: one set for it (`vitsee name STORE MODEL NAME`, `store.set_name`, the app), else an
automatic one, the timm name and how its weights came about, in a word:

    vit_base_patch16_224 (pretrained)     resnet18 (random init)     vit_tiny_patch16_224 (trained here)

Models that would get the same automatic name are told apart by their seed or their weights file's name
(`vit_tiny_patch16_224 (f01-steps)`), at worst by their keys. A model from another tool's features keeps the name
it was given. The names set are kept in STORE.d/names.h5 (attrs `names`: JSON {key: name}, `store_id`), written
whole under a temporary name and renamed like every file of the store, under the store's write lock; a file another
store left there is not read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import h5py

from vitsee.errors import VitseeError
from vitsee.store.files import is_real_file, open_h5, write_file_atomically
from vitsee.store.layout import FEATURES, json_attr

NAMES_FILE = "names.h5"
MAX_NAME = 60  # a name is a label: an axis title, a legend entry, a part of a file name
_UNTRAINED = re.compile(r"\b0 epochs\b")  # a file written at the start of a training run (the demo's twins)


def weights_word(info: dict) -> str:
    """Returns how a model's weights came about, in a word: pretrained, random init, trained here, or the weights
    file's name."""
    weights = info.get("weights") or {}
    kind = weights.get("kind")
    if kind == "random":
        return "random init"
    if kind == "file":
        trained = weights.get("trained")
        if trained:
            return "random init" if _UNTRAINED.search(str(trained)) else "trained here"
        return Path(str(weights.get("path") or weights.get("source") or "")).stem or "weights file"
    return str(kind or "")


def _specific_word(info: dict) -> str:
    """Returns the weights in more words, to tell apart models whose word is the same (a seed, a file's name)."""
    weights = info.get("weights") or {}
    if weights.get("kind") == "random":
        return f"random init, seed {weights.get('seed')}"
    if weights.get("kind") == "file":
        return Path(str(weights.get("path") or weights.get("source") or "")).stem or "weights file"
    tag = info.get("tag")
    return f"{weights.get('kind')}, {tag}" if tag else str(weights.get("kind"))


def automatic_names(infos: Mapping[str, dict]) -> dict[str, str]:
    """Returns each model's automatic display name from its record (key -> 'resnet18 (random init)'), distinct
    for distinct keys."""

    def label(key: str, word: str) -> str:
        info = infos[key]
        if (info.get("weights") or {}).get("kind") == FEATURES:
            return key  # named by the user when the store was made
        return f"{info.get('name') or key.partition('@')[0]} ({word})" if word else key

    names = {key: label(key, weights_word(info)) for key, info in infos.items()}
    for forms in (lambda k: label(k, _specific_word(infos[k])), lambda k: k):
        alike = _alike(names)
        for key in alike:
            names[key] = forms(key)
    return names


def _alike(names: Mapping[str, str]) -> list[str]:
    """Returns the keys whose names another key shares."""
    seen: dict[str, int] = {}
    for name in names.values():
        seen[name] = seen.get(name, 0) + 1
    return [key for key, name in names.items() if seen[name] > 1]


def check_name(name: str, key: str, others: Mapping[str, str]) -> str:
    """Returns a display name to set for model `key`, stripped; raises the VitseeError naming the way out for one
    that is empty, too long, holds a ':' or a line break, or is another model's name or key (`others`: key -> name
    of the store's other models)."""
    text = " ".join(str(name).split())
    if not text:
        raise VitseeError(f"an empty name for {key}: give a few words, e.g. 'ViT-B/16 (pretrained)'")
    if len(text) > MAX_NAME:
        raise VitseeError(
            f"the name '{text[:MAX_NAME]}...' for {key} is {len(text)} characters: a label takes at most {MAX_NAME}"
        )
    if ":" in text or "\n" in str(name).strip():
        raise VitseeError(
            f"the name '{text}' for {key} holds a ':', which separates the models of a view string: "
            "use another character, e.g. '-' or ','"
        )
    for other, taken in others.items():
        if text in (taken, other):
            raise VitseeError(
                f"'{text}' already names {other} in this store: give {key} another name "
                f"(or rename {other} first: `vitsee name STORE {other} NEW`)"
            )
    return text


class StoreNames:
    """The display-name methods of Store (see store/__init__.py): read the names, set one under the write lock."""

    @property
    def _names_file(self) -> Path:
        return self.sidecar / NAMES_FILE

    def set_names(self) -> dict[str, str]:
        """Returns the display names set for this store's models (key -> name); models without one are absent."""
        path = self._names_file
        if not is_real_file(path):
            return {}
        try:
            with open_h5(path, "r") as f:
                if not self._own(f):  # left by a store this one replaced
                    return {}
                names = json.loads(f.attrs.get("names", "{}"))
        except (OSError, ValueError, TypeError):  # damaged: the automatic names stand, the next rename rewrites it
            return {}
        models = set(self.models)
        return {str(k): str(v) for k, v in names.items() if k in models}

    def display_names(self) -> dict[str, str]:
        """Returns every model's display name (key -> name, in the store's order): the one set for it, else the
        automatic one (`automatic_names`)."""
        names = automatic_names({key: self.model_info(key) for key in self.models})
        chosen = self.set_names()
        taken = set(chosen.values())
        for key, name in names.items():  # a model added after a name was set may have that name automatically
            if key not in chosen and name in taken:
                names[key] = key
        names.update(chosen)
        return names

    def display_name(self, model: str) -> str:
        """Returns the display name of a model (named by its key, a unique prefix or its display name)."""
        return self.display_names()[self.resolve_model(model)]

    def set_display_name(self, model: str, name: str | None) -> str:
        """Sets (None: clears, back to the automatic name) the display name of a model in a store open for writing;
        returns the model's display name now."""
        if not self.writable:
            raise VitseeError(f"{self.path} is open read-only: reopen it for writing to name a model")
        key = self.resolve_model(model)
        chosen = self.set_names()
        current = self.display_names()
        if name is None:
            chosen.pop(key, None)
        else:
            others = {k: v for k, v in current.items() if k != key}
            chosen[key] = check_name(name, key, others)

        def fill(f: h5py.File) -> None:
            f.attrs["names"] = json_attr(chosen)
            f.attrs["store_id"] = self.store_id
            f.attrs["complete"] = True

        write_file_atomically(self._names_file, fill, self.path)
        return self.display_names()[key]

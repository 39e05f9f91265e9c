"""Layer names shortened alike for a narrow place (a heatmap's gutter, an axis), never two layers alike: one
layout for `vitsee show` (engine/output/render.py) and the app (tui/widgets/axis_labels.py builds its axes on it).

    'blocks.11' -> 'b.11'     'layer2.1.conv1' -> 'l2.1.conv1'     'blocks.3.attn' -> '3.attn'
    'patch_embed' -> 'patch…'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ELLIPSIS = "\u2026"


def short_label(label: str) -> str:
    """Returns a module path with its leading parts cut to initials: 'blocks.11' -> 'b.11', 'layer2.1' -> 'l2.1'."""
    parts = label.split(".")
    for i, head in enumerate(parts[:-1]):
        if head.isdigit():  # an index ('blocks.10.attn') is what tells layers apart: keep it whole
            continue
        digits = len(head) - len(head.rstrip("0123456789"))
        parts[i] = head[:1] + (head[-digits:] if 0 < digits < len(head) else "")
    return ".".join(parts)


def abbreviate_label(label: str, width: int) -> str:
    """Returns `label` in at most `width` cells, keeping its distinctive tail ('blocks.11' -> 'b.11')."""
    if len(label) <= width:
        return label
    if len(short := short_label(label)) <= width:
        return short
    parts = short.split(".")
    while len(parts) > 1:  # then drop leading parts: 'b.3.attn' -> '3.attn'
        parts.pop(0)
        if len(text := ".".join(parts)) <= width:
            return text
    if "." not in label and width > 1:  # one word ('patch_embed'): its start says more than its end
        return label[: width - 1] + ELLIPSIS
    return (ELLIPSIS + label[-(width - 1) :]) if width > 1 else label[-width:]


def fit_labels(labels: Sequence[str], width: int) -> list[str]:
    """Returns the labels as they are if all fit in `width`, else all in one short form (so they read alike), at
    `width` when that tells every layer apart, else at the narrowest width that does (the labels as they are at
    worst): 'blocks.10.attn.proj' and 'blocks.11.attn.proj' never both read 'attn.proj'."""
    labels = list(labels)
    if not labels or max(map(len, labels)) <= width:
        return labels
    distinct = len(set(labels))
    for w in range(width, max(map(len, labels)) + 1):
        form = [abbreviate_label(short_label(label), w) for label in labels]
        if len(set(form)) == distinct:
            return form
    return labels


# --- model names ------------------------------------------------------------------------------------------------

_TOKENS = re.compile(r"[-_.]+")


def _model_parts(keys: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """Returns (timm name, tag, how it was initialised in a word, the same shorter) of each store key: '' for
    pretrained weights, 'random:0' / 'r0', and for a weights file the words of its name that the other files'
    names and the model's own name do not share ('init'), cut to 4 letters in the short form."""
    split = [(k.partition("@")[0], k.partition("@")[2]) for k in keys]
    stems = [init.partition(":")[2] for _, init in split if init.startswith("file")]
    common = set.intersection(*(set(_TOKENS.split(s)) for s in stems)) if len(stems) > 1 else set()
    out = []
    for name, init in split:
        base, _, tag = name.partition(".")
        kind, _, rest = init.partition(":")
        if kind == "random":
            word, short = f"random:{rest or 0}", f"r{rest or 0}"
        elif kind == "file":
            own = set(_TOKENS.split(base))
            word = "-".join(t for t in _TOKENS.split(rest) if t and t not in common and t not in own)
            word = word if len(stems) > 1 else ""
            short = word[:4]
        else:
            word = short = init
        out.append((base, tag, word, short))
    if len({word for _, _, word, _ in out}) == 1:  # initialised alike (every one random:0): the words tell nothing
        out = [(base, tag, "", "") for base, tag, _, _ in out]
    return out


def model_labels(keys: Sequence[str], width: int = 24) -> list[str]:
    """Returns store keys as names for a narrow place (a heatmap's gutter, a legend): all in one form, the least
    shortened whose names all fit `width`, never two models alike (at worst the shortest form that tells them apart):

        vit_tiny_patch16_224.augreg_in21k  resnet18@random:0       ->  vit_tiny_patch16_224  resnet18 random:0
        ... at width 12                                             ->  vit_tiny  resnet18 r0
    A weights file is named by the words of its file name the others do not share ('vit_tiny_patch16_224 init')."""
    keys = list(keys)
    if not keys:
        return []
    parts = _model_parts(keys)

    def joined(base: str, word: str) -> str:
        return f"{base} {word}" if word else base

    most = max(len(base.split("_")) for base, *_ in parts)
    forms = [[joined(f"{b}.{t}" if t else b, w) for b, t, w, _ in parts], [joined(b, w) for b, _, w, _ in parts]]
    forms.append([joined(b, s) for b, _, _, s in parts])
    for keep in range(most - 1, 0, -1):  # the name's leading words, the init in a word, then shorter
        forms.append([joined("_".join(b.split("_")[:keep]), w) for b, _, w, _ in parts])
        forms.append([joined("_".join(b.split("_")[:keep]), s) for b, _, _, s in parts])
    distinct = len(set(keys))
    apart = [f for f in forms if len(set(f)) == distinct] or [keys]  # the keys themselves are always apart
    fitting = [f for f in apart if max(map(len, f)) <= width]
    if fitting:
        return fitting[0]
    return min(apart, key=lambda f: max(map(len, f)))


def display_labels(keys: Sequence[str], names: dict[str, str], width: int = 24) -> list[str]:
    """Returns the models' display names (engine/store/names.py) where every one fits `width`, else the keys
    shortened alike (`model_labels`): a gutter or a legend never shows a store key when a name fits."""
    keys = list(keys)
    shown = [names.get(k, "") for k in keys]
    if keys and all(shown) and max(map(len, shown)) <= width and len(set(shown)) == len(set(keys)):
        return shown
    return model_labels(keys, width)

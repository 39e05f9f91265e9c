"""Layer names shortened alike for a narrow place (a heatmap's gutter, an axis), never two layers alike: one
layout for `vitsee show` (engine/render.py) and the app (tui/widgets/axis_labels.py builds its axes on it).

    'blocks.11' -> 'b.11'     'layer2.1.conv1' -> 'l2.1.conv1'     'blocks.3.attn' -> '3.attn'     'patch_embed' -> 'patch…'
"""
from __future__ import annotations

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
    return (ELLIPSIS + label[-(width - 1):]) if width > 1 else label[-width:]


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

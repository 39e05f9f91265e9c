"""Where axis labels go so that none is written over another: thinning, abbreviation or vertical text.

Layer names are long ('blocks.10.attn', 'patch_embed') and the cells they name are narrow (one character
in a fitted heatmap, a braille column in a line plot). `layout_axis_labels` decides once per size how an
axis is labelled:

1. every label, as it is, when all fit side by side;
2. else every label in one consistent short form ('blocks.3' -> 'b.3'), shortened further if need be
   ('3.attn', 'patch…'), as long as the forms still tell every layer apart;
3. else, when lines are free under the axis, every label written downwards, one column each;
4. else every k-th label, k as small as lets them stand apart, in the form that shows the most.

The cursor's label is always shown, in the same form as the others, in a slot of its own: the labels it
would touch are the ones left out, so the highlight never covers a neighbour.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Sequence

from vitsee.output.labels import abbreviate_label, fit_labels, short_label  # noqa: F401  (the one label layout)

MIN_CHARS = 3  # shorter abbreviations ('b.', '…d') no longer name a layer


@dataclass(frozen=True)
class AxisLabels:
    """The labels shown along one axis: (label index, first cell along the axis, text) each.

    Horizontal labels run along the axis from their cell; vertical ones run down one column, from the
    line under the axis, so they take `lines` lines.
    """

    placed: tuple[tuple[int, int, str], ...]
    vertical: bool = False

    @property
    def lines(self) -> int:
        """Returns how many lines the labels take under the axis."""
        return max((len(text) for _, _, text in self.placed), default=1) if self.vertical else 1

    def text_of(self, index: int) -> str | None:
        """Returns the text shown for label `index`, or None when it is left out."""
        return next((text for i, _, text in self.placed if i == index), None)

    def cells(self) -> dict[tuple[int, int], int]:
        """Returns (line, cell along the axis) -> the index of the label written there."""
        out: dict[tuple[int, int], int] = {}
        for index, x, text in self.placed:
            for k in range(len(text)):
                out[(k, x) if self.vertical else (0, x + k)] = index
        return out

    def line_text(self, line: int, width: int) -> str:
        """Returns line `line` of the labels as `width` characters."""
        chars = [" "] * width
        for _index, x, text in self.placed:
            if self.vertical:
                if line < len(text) and 0 <= x < width:
                    chars[x] = text[line]
            elif line == 0:
                for k, char in enumerate(text):
                    if 0 <= x + k < width:
                        chars[x + k] = char
        return "".join(chars)


def _spans(
    texts: Sequence[str], positions: Sequence[int], width: int, centred: bool, vertical: bool
) -> list[tuple[int, int]]:
    """Returns each label's first cell and extent along the axis, kept inside [0, width)."""
    spans = []
    for text, pos in zip(texts, positions):
        extent = 1 if vertical else len(text)
        start = pos - (extent - 1) // 2 if centred else pos
        spans.append((max(0, min(start, width - extent)), extent))
    return spans


def _place(order: Sequence[int], spans: Sequence[tuple[int, int]], gap: int) -> list[int]:
    """Returns the labels of `order` that can be placed in turn without coming closer than `gap` to one before."""
    starts: list[int] = []  # the placed labels' (first, one past last), sorted: only the neighbours can clash
    ends: list[int] = []
    placed = []
    for i in order:
        start, extent = spans[i]
        k = bisect.bisect_right(starts, start)
        if k > 0 and ends[k - 1] + gap > start:
            continue
        if k < len(starts) and start + extent + gap > starts[k]:
            continue
        starts.insert(k, start)
        ends.insert(k, start + extent)
        placed.append(i)
    return placed


def _stride(n: int, spans: Sequence[tuple[int, int]], gap: int) -> list[int]:
    """Returns every k-th index from the first, k as small as lets them all stand apart."""
    for stride in range(1, n + 1):
        grid = list(range(0, n, stride))
        if len(_place(grid, spans, gap)) == len(grid):
            return grid
    return [0]


def _thinned(
    grid: list[int], spans: Sequence[tuple[int, int]], gap: int, cursor: int | None, keep_ends: bool
) -> list[int]:
    """Returns the indices shown: the cursor's first, the first and last when `keep_ends`, then the grid's
    that do not come too close to those."""
    n = len(spans)
    priority = ([cursor] if cursor is not None else []) + ([0, n - 1] if keep_ends else [])
    return sorted(_place(list(dict.fromkeys(priority + grid)), spans, gap))


def _forms(labels: Sequence[str], longest: int) -> list[list[str]]:
    """Returns the label sets to try, each one rule applied to every label, from the labels as they are to
    the shortest: initials ('blocks.3.attn' -> 'b.3.attn'), then leading parts dropped ('3.attn'), then
    single words cut to a width ('patch…'); a rule that would make two layers read alike is left out."""
    short = [short_label(label) for label in labels]
    candidates = [list(labels), short]
    for drop in range(1, max(label.count(".") for label in short) + 1):
        candidates.append([".".join(s.split(".")[min(drop, s.count(".")) :]) for s in short])
    for width in range(max(map(len, short)) - 1, MIN_CHARS - 1, -1):
        # only single words are cut ('patch_embed' -> 'patch…'): a module path's tail is what tells it apart
        # ('l1.0' cut to 'l1…' could be any block of layer1), so it is thinned out rather than cut
        candidates.append([s if len(s) <= width or "." in s else s[: width - 1] + "\u2026" for s in short])
    distinct = len(set(labels))
    forms: list[list[str]] = []
    for form in candidates:
        if len(set(form)) < distinct:  # 'b.0.attn' -> 'attn' would name every block alike
            continue
        if max(map(len, form)) <= longest and form not in forms:
            forms.append(form)
    return forms or [[abbreviate_label(s, longest) for s in short]]


def layout_axis_labels(
    labels: Sequence[str],
    positions: Sequence[int],
    width: int,
    cursor: int | None = None,
    *,
    centred: bool = False,
    gap: int = 1,
    max_lines: int = 1,
    max_chars: int | None = None,
    keep_ends: bool = False,
) -> AxisLabels:
    """Returns where each label goes on an axis of `width` cells so that no two share a cell.

    Args:
        labels: one name per position.
        positions: the cell along the axis of each label (its first cell, or its centre when `centred`).
        width: cells along the axis.
        cursor: the index whose label must be shown (the selected layer).
        gap: blank cells kept between two labels that run along the axis (upright ones may touch).
        max_lines: lines free under the axis; MIN_CHARS or more allow vertical labels.
        max_chars: the longest a label may be (a gutter, a slot); default: the axis width.
        keep_ends: show the first and last label too when thinning (a line plot's x range).
    """
    if not labels or width <= 0:
        return AxisLabels(())
    plan = _plan(tuple(labels), tuple(positions), width, centred, gap, max_lines, min(width, max_chars or width))
    if isinstance(plan, AxisLabels):
        return plan
    texts, spans, grid = plan
    shown = _thinned(list(grid), spans, gap, cursor, keep_ends)
    return AxisLabels(tuple((i, spans[i][0], texts[i]) for i in shown))


@functools.lru_cache(maxsize=64)
def _plan(
    labels: tuple[str, ...],
    positions: tuple[int, ...],
    width: int,
    centred: bool,
    gap: int,
    max_lines: int,
    longest: int,
) -> AxisLabels | tuple[list[str], list[tuple[int, int]], tuple[int, ...]]:
    """Returns what does not depend on the cursor (a cursor move in a 200-column heatmap repeats the rest
    only): every label placed (cases 1-3), or the form, spans and grid to thin with (case 4)."""
    forms = _forms(labels, longest)
    everyone = list(range(len(labels)))
    for texts in forms:  # 1, 2: all shown, in the least abbreviated form that allows it
        spans = _spans(texts, positions, width, centred, vertical=False)
        if len(_place(everyone, spans, gap)) == len(labels):
            return AxisLabels(tuple((i, spans[i][0], texts[i]) for i in everyone))
    if max_lines >= MIN_CHARS:  # 3: downwards, one column each
        # upright text is slow to read: the short form at least, even where the labels as they are would fit
        texts = next((f for f in (forms[1:] or forms) if max(map(len, f)) <= max_lines), None)
        if texts is not None:
            spans = _spans(texts, positions, width, centred, vertical=True)
            if len(_place(everyone, spans, 0)) == len(labels):  # side by side, columns read apart
                return AxisLabels(tuple((i, spans[i][0], texts[i]) for i in everyone), vertical=True)
    # 4: every k-th, in the form whose grid shows the most (the least abbreviated of those), chosen without
    # the cursor so that the form stays put while the cursor moves
    best = None
    for texts in forms:
        spans = _spans(texts, positions, width, centred, vertical=False)
        grid = _stride(len(texts), spans, gap)
        if best is None or len(grid) > len(best[2]):
            best = (texts, spans, tuple(grid))
    return best


def shared_line_labels(upper: Sequence[str], lower: Sequence[str], width: int) -> list[tuple[str, str, str]] | None:
    """Returns, for rows drawn two to a line, one label per line naming both: (common part, upper's rest,
    lower's rest), read as 'b.0.' 'attn' '/mlp'; None when some pair does not fit `width` in any form.

    Every pair is written in the same form, the least abbreviated that lets them all fit.
    """
    if not upper:
        return []
    for form in _forms([*upper, *lower], width):
        ups, lows = form[: len(upper)], form[len(upper) :]
        merged = [_merge(a, b) for a, b in zip(ups, lows)]
        if all(len(p) + len(a) + len(b) <= width for p, a, b in merged):
            return merged
    return None


def _merge(upper: str, lower: str) -> tuple[str, str, str]:
    """Returns (common leading parts with their dot, upper's rest, '/' + lower's rest)."""
    a, b = upper.split("."), lower.split(".")
    common = 0
    while common < min(len(a), len(b)) - 1 and a[common] == b[common]:
        common += 1
    prefix = ".".join(a[:common]) + ("." if common else "")
    return prefix, ".".join(a[common:]), "/" + ".".join(b[common:])

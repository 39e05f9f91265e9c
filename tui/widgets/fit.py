"""Fitting a line of parts into the columns there are: whole parts or none, so no value is ever cut in half."""

from __future__ import annotations

from rich.cells import cell_len

ELLIPSIS = "\u2026"


def fit_parts(parts: list[str], width: int, sep: str = "  ") -> str:
    """Returns the leading parts joined by `sep` that fit in `width` cells; the first part alone, cut with '…',
    when even it does not fit. Later parts are left out whole, never cut ('mean in [82.2,' would read as a value)."""
    parts = [p for p in parts if p]
    if width <= 0 or not parts:
        return ""
    text = parts[0]
    if cell_len(text) > width:
        return crop(text, width)
    for part in parts[1:]:
        longer = f"{text}{sep}{part}"
        if cell_len(longer) > width:
            break
        text = longer
    return text


def fit_line(text: str, width: int, sep: str = "  ") -> str:
    """Returns `text` (parts separated by `sep`) fitted to `width` with fit_parts."""
    return fit_parts(text.split(sep), width, sep)


def crop(text: str, width: int) -> str:
    """Returns text cut to `width` cells, ending in '…' when it was cut."""
    if cell_len(text) <= width:
        return text
    out = ""
    for ch in text:
        if cell_len(out + ch) > width - 1:
            break
        out += ch
    return out + ELLIPSIS


def fit_caption(caption: str, width: int, lead: str = "") -> str:
    """Returns the first that fits `width` cells of: `lead` + the caption; `lead` + its leading whole clauses
    ('; '-separated); those clauses alone; the first clause without the test's name ('95% interval of the mean
    over 64 images': help names the test); that clause cut with '…'."""
    clauses = caption.split("; ")
    first = clauses[0]
    candidates = [f"{lead}{caption}"]
    if cell_len(lead + first) <= width:
        candidates.append(lead + fit_parts(clauses, width - cell_len(lead), "; "))
    if cell_len(first) <= width:
        candidates.append(fit_parts(clauses, width, "; "))
    for test in ("Student-t ", "Clopper-Pearson ", "bootstrap "):
        first = first.replace(test, "")
    candidates += [first, crop(first, width)]
    return next(c for c in candidates if cell_len(c) <= width)

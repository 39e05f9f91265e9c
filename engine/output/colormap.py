"""Quantised sequential colormaps for heatmaps that keep their order on any terminal.

A heatmap is read by brightness: darker is lower. Terminals differ in how many colours they show
(24-bit, the xterm 256 palette, 16 ANSI colours, or none at all over a NO_COLOR link), so every
downgrade here is built to keep the order of the levels: each step up is at least as light as the
one below. With no colour at all the levels become an ASCII density ramp.

Plain numpy; the CLI renders the palettes with Rich and the terminal app with Textual, both of which
understand the colour strings used here ('#rrggbb' and 'color(n)').
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import Mapping

import numpy as np

from vitsee.errors import VitseeError

COLORMAPS = ("viridis", "magma", "cividis")


def check_colormap(cmap: str) -> str:
    """Returns cmap if it is one of COLORMAPS (the terminal, the app and exported figures share them), else
    raises the VitseeError naming the choices."""
    if cmap not in COLORMAPS:
        raise VitseeError(f"unknown colormap {cmap!r}: choose one of {', '.join(COLORMAPS)}")
    return cmap


DEFAULT_LEVELS = 24
MIN_LEVELS, MAX_LEVELS = 2, 32
MISSING = -1  # the level of a NaN cell (a value not computed yet)

ASCII_RAMP = " .:-=+*#%@"
ASCII_MISSING = "?"

# Smallest CIELAB lightness step between neighbouring distinct colours of a downgraded ramp. In the 256
# palette a level that changes colour gets one at least 1 L* lighter; among the 16 ANSI colours several
# sit at almost the same lightness (bright black and bright red differ by 0.1 L*), and a step of 5 keeps
# only those a reader can still put in order: 9 of them.
MIN_LIGHTNESS_STEP = {"256": 1.0, "16": 5.0}

# The xterm cube has 6 steps per channel, so only about a dozen of its entries lie near the viridis curve.
# Giving each of 24-32 levels its own entry forced the ramp through greys and far hues (mid viridis went
# to greys 242/243, magma and cividis crossed 90-100 degrees of hue); a level may instead repeat the
# colour of the level below, at this cost in CIELAB Delta E (about one just-noticeable difference),
# so that a new colour is taken whenever one is nearly as close.
REPEAT_COST_256 = 3.0
# A colour with at least this CIELAB chroma C*ab is never drawn as a grey (232-255, or the cube's equal-RGB
# entries): the middle of cividis (C* under 6) is grey and may be, the middle of viridis (C* 25) is teal.
GREY_CHROMA = 10.0
# A heatmap is read by lightness first, so a lightness error counts 1.5 times in the ramp's Delta E:
# with plain Delta E the darkest cividis level (L* 14) went to an entry at L* 38 and the ramp lost a
# quarter of its range; at 1.5 it keeps it, and no level strays further in hue (at most 45 degrees).
LIGHTNESS_WEIGHT = 1.5


class ColorMode(str, Enum):
    """How many colours the terminal can show."""

    TRUECOLOR = "truecolor"
    COLORS_256 = "256"
    COLORS_16 = "16"
    NONE = "none"

    @classmethod
    def parse(cls, text: str | ColorMode) -> ColorMode:
        """Return the mode named by `text` (also accepts '24bit', '8bit', 'ansi', 'never', ...)."""
        if isinstance(text, ColorMode):
            return text
        key = str(text).strip().lower()
        for mode, names in _MODE_NAMES.items():
            if key in names:
                return mode
        choices = ", ".join(mode.value for mode in cls)
        raise VitseeError(f"unknown colour mode {text!r}: choose one of {choices}")


_MODE_NAMES = {
    ColorMode.TRUECOLOR: {"truecolor", "24bit", "24-bit", "true", "rgb"},
    ColorMode.COLORS_256: {"256", "256color", "8bit", "8-bit"},
    ColorMode.COLORS_16: {"16", "ansi", "standard", "8"},
    ColorMode.NONE: {"none", "no", "never", "off", "0", "ascii", "mono"},
}

# Terminals that speak 24-bit colour but whose TERM says so only by name; over SSH COLORTERM is
# usually not forwarded, so TERM is all that arrives.
_TRUECOLOR_TERMS = ("xterm-kitty", "xterm-ghostty", "wezterm", "alacritty", "foot")


def detect_color_mode(env: Mapping[str, str] | None = None, override: str | ColorMode | None = None) -> ColorMode:
    """Return the colour mode a terminal described by `env` (default os.environ) can show.

    Order: an explicit `override` (a --color flag), then VITSEE_COLOR, then NO_COLOR (set and not
    empty, per no-color.org, which lets explicit flags win), COLORTERM=truecolor|24bit, and TERM:
    'dumb' or unset -> none, '*-direct' and known 24-bit terminals -> truecolor, '*256color*' and
    tmux/screen (which advertise 256 colours) -> 256, anything else -> 16.
    """
    if env is None:
        import os

        env = os.environ
    if override is None and env.get("VITSEE_COLOR"):
        override = env["VITSEE_COLOR"]
    if override is not None:
        return ColorMode.parse(override)
    if env.get("NO_COLOR"):
        return ColorMode.NONE
    if env.get("COLORTERM", "").strip().lower() in ("truecolor", "24bit"):
        return ColorMode.TRUECOLOR
    term = env.get("TERM", "").strip().lower()
    if not term or term == "dumb":
        return ColorMode.NONE
    if term.endswith("-direct") or term.startswith(_TRUECOLOR_TERMS):
        return ColorMode.TRUECOLOR
    if "256color" in term or term.startswith(("tmux", "screen")):
        return ColorMode.COLORS_256
    return ColorMode.COLORS_16


# --- Quantisation ------------------------------------------------------------------------------------


def level_edges(vmin: float, vmax: float, levels: int) -> np.ndarray:
    """Return the levels - 1 inner bin edges between vmin and vmax; a value equal to an edge goes up."""
    return vmin + (vmax - vmin) * np.arange(1, levels) / levels


def quantize(matrix: np.ndarray, levels: int = DEFAULT_LEVELS, vmin: float = 0.0, vmax: float = 1.0) -> np.ndarray:
    """Return int16 levels 0..levels-1 of `matrix` over [vmin, vmax]; NaN -> MISSING, out of range -> clipped."""
    _check_levels(levels)
    values = np.asarray(matrix, dtype=np.float64)
    levels_of = np.searchsorted(level_edges(vmin, vmax, levels), values, side="right")
    return np.where(np.isnan(values), MISSING, levels_of).astype(np.int16)


def _check_levels(levels: int) -> None:
    if not MIN_LEVELS <= levels <= MAX_LEVELS:
        raise VitseeError(f"{levels} colour levels is out of range: use {MIN_LEVELS} to {MAX_LEVELS} (24 by default)")


@dataclass(frozen=True)
class LegendEntry:
    """One level of a legend: values in [low, high) get this level (the top one includes high)."""

    level: int
    low: float
    high: float

    def describe(self, digits: int = 3) -> str:
        """Return the range as text, e.g. '0.958-1.000'."""
        return f"{self.low:.{digits}f}-{self.high:.{digits}f}"


@dataclass(frozen=True)
class ColorScale:
    """A value range cut into `levels` equal bins, coloured by a sequential colormap."""

    vmin: float = 0.0
    vmax: float = 1.0
    levels: int = DEFAULT_LEVELS
    cmap: str = "viridis"

    def __post_init__(self) -> None:
        _check_levels(self.levels)
        check_colormap(self.cmap)
        if not (np.isfinite(self.vmin) and np.isfinite(self.vmax)) or self.vmax < self.vmin:
            raise VitseeError(f"bad value range [{self.vmin}, {self.vmax}]: vmin must be finite and not above vmax")

    @classmethod
    def for_matrix(
        cls,
        matrix: np.ndarray,
        *,
        vmin: float | None = None,
        vmax: float | None = None,
        levels: int = DEFAULT_LEVELS,
        cmap: str = "viridis",
    ) -> ColorScale:
        """Return a scale whose missing bounds are the matrix's finite min / max (0..1 if it has none)."""
        finite = np.asarray(matrix, dtype=np.float64)
        finite = finite[np.isfinite(finite)]
        low = float(finite.min()) if vmin is None and finite.size else vmin
        high = float(finite.max()) if vmax is None and finite.size else vmax
        low = 0.0 if low is None else float(low)
        high = low + 1.0 if high is None else float(high)
        if high == low:  # a constant matrix still needs a range to place its one value in
            high = low + 1.0
        return cls(low, high, levels, cmap)

    def quantize(self, matrix: np.ndarray) -> np.ndarray:
        """Return the level of every cell (MISSING for NaN)."""
        return quantize(matrix, self.levels, self.vmin, self.vmax)

    def legend(self) -> list[LegendEntry]:
        """Return level -> value range, lowest level first."""
        bounds = [self.vmin, *level_edges(self.vmin, self.vmax, self.levels), self.vmax]
        return [LegendEntry(level, float(bounds[level]), float(bounds[level + 1])) for level in range(self.levels)]

    def palette(self, mode: ColorMode) -> Palette:
        """Return the colours (or characters) of the levels for a terminal in `mode`."""
        return palette(self.cmap, self.levels, ColorMode.parse(mode))


# --- Colour science (sRGB, luminance, CIELAB) --------------------------------------------------------


def relative_luminance(rgb: np.ndarray) -> np.ndarray:
    """Return the WCAG relative luminance Y in [0, 1] of uint8 sRGB colours (..., 3)."""
    channel = np.asarray(rgb, dtype=np.float64) / 255.0
    linear = np.where(channel <= 0.04045, channel / 12.92, ((channel + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def _to_lab(rgb: np.ndarray) -> np.ndarray:
    """Return CIELAB (D65) coordinates of uint8 sRGB colours (..., 3)."""
    channel = np.asarray(rgb, dtype=np.float64) / 255.0
    linear = np.where(channel <= 0.04045, channel / 12.92, ((channel + 0.055) / 1.055) ** 2.4)
    xyz = (
        linear
        @ np.array([[0.4124, 0.2126, 0.0193], [0.3576, 0.7152, 0.1192], [0.1805, 0.0722, 0.9505]])
        / np.array([0.95047, 1.0, 1.08883])
    )
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def lightness(rgb: np.ndarray) -> np.ndarray:
    """Return CIELAB L* in [0, 100] of uint8 sRGB colours (..., 3)."""
    return _to_lab(rgb)[..., 0]


# xterm's default 16 colours. Themes recolour these, but almost all keep dark < bright, which is the
# only property the 16-colour ramp leans on.
ANSI_16_RGB = np.array(
    [
        (0, 0, 0),
        (205, 0, 0),
        (0, 205, 0),
        (205, 205, 0),
        (0, 0, 238),
        (205, 0, 205),
        (0, 205, 205),
        (229, 229, 229),
        (127, 127, 127),
        (255, 0, 0),
        (0, 255, 0),
        (255, 255, 0),
        (92, 92, 255),
        (255, 0, 255),
        (0, 255, 255),
        (255, 255, 255),
    ],
    dtype=np.uint8,
)


def _xterm_256_rgb() -> np.ndarray:
    """Return the RGB of palette entries 16..255: the 6x6x6 cube, then the 24-step grey ramp."""
    steps = np.array([0, 95, 135, 175, 215, 255])
    cube = np.array([(steps[r], steps[g], steps[b]) for r in range(6) for g in range(6) for b in range(6)])
    greys = np.array([(8 + 10 * i,) * 3 for i in range(24)])
    return np.concatenate([cube, greys]).astype(np.uint8)


# Entries 0-15 are left out of the 256-colour ramp: they are the ones terminal themes redefine.
XTERM_256_RGB = _xterm_256_rgb()


# --- Palettes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Palette:
    """The look of each level on one kind of terminal.

    `colors` are Rich/Textual colour strings ('#440154', 'color(17)'); empty in NONE mode, where
    `chars` (an ASCII density ramp) carry the levels instead. `rgb` is what the terminal is expected
    to show, used to pick readable text and cursor colours on top of a level.
    """

    mode: ColorMode
    colors: tuple[str, ...]
    rgb: np.ndarray
    chars: tuple[str, ...]
    missing_char: str = ASCII_MISSING

    @property
    def levels(self) -> int:
        return len(self.chars)

    def is_light(self, level: int) -> bool:
        """Return True when dark text reads better than light text on this level."""
        # 0.179 is where black and white text have equal WCAG contrast.
        return bool(relative_luminance(self.rgb[level]) > 0.179)


@functools.lru_cache(maxsize=64)
def palette(cmap: str = "viridis", levels: int = DEFAULT_LEVELS, mode: ColorMode = ColorMode.TRUECOLOR) -> Palette:
    """Return the palette of `levels` levels of `cmap` for a terminal in `mode` (cached)."""
    _check_levels(levels)
    mode = ColorMode.parse(mode)
    target = colormap_rgb(cmap, levels)
    chars = tuple(ascii_ramp(levels))
    if mode is ColorMode.TRUECOLOR:
        colors = tuple("#{:02x}{:02x}{:02x}".format(*map(int, rgb)) for rgb in target)
        return Palette(mode, colors, target, chars)
    if mode is ColorMode.COLORS_256:
        picks = nearest_monotone_ramp(target, XTERM_256_RGB, MIN_LIGHTNESS_STEP["256"], REPEAT_COST_256)
        return Palette(mode, tuple(f"color({16 + i})" for i in picks), XTERM_256_RGB[picks], chars)
    if mode is ColorMode.COLORS_16:
        picks = monotone_match(target, ANSI_16_RGB, MIN_LIGHTNESS_STEP["16"])
        return Palette(mode, tuple(f"color({i})" for i in picks), ANSI_16_RGB[picks], chars)
    greys = np.repeat(np.linspace(0, 255, levels).round().astype(np.uint8)[:, None], 3, axis=1)
    return Palette(mode, ("",) * levels, greys, chars)


@functools.lru_cache(maxsize=32)
def colormap_rgb(cmap: str, levels: int) -> np.ndarray:
    """Return (levels, 3) uint8 colours of matplotlib's `cmap`, evenly spaced from its first to last colour."""
    check_colormap(cmap)
    from matplotlib import colormaps  # imported here: 0.4 s that only a drawn heatmap should pay

    rgba = colormaps[cmap](np.linspace(0.0, 1.0, levels))
    rgb = np.round(rgba[:, :3] * 255).astype(np.uint8)
    rgb.setflags(write=False)
    return rgb


def ascii_ramp(levels: int, ramp: str = ASCII_RAMP) -> list[str]:
    """Return one density character per level, non-decreasing in ink and using every character it can."""
    return [ramp[level * len(ramp) // levels] for level in range(levels)]


def longest_chain(lightnesses: np.ndarray, min_step: float) -> int:
    """Return how many of the given lightnesses can be chosen so each is >= min_step above the last."""
    count, last = 0, -np.inf
    for value in np.sort(lightnesses):  # greedy from the darkest is optimal for a minimum-gap chain
        if value - last >= min_step:
            count, last = count + 1, value
    return count


def monotone_match(target_rgb: np.ndarray, candidates_rgb: np.ndarray, min_step: float) -> np.ndarray:
    """Return, per target colour, the index of a candidate so that lightness never falls along the ramp.

    The ramp uses as many distinct candidates as it can (each one at least `min_step` L* lighter than
    the one before), spreads the targets evenly over them, and among such ramps picks the one closest
    to the targets in CIELAB (dynamic programming over candidates sorted by lightness).
    """
    target_lab, cand_lab = _to_lab(target_rgb), _to_lab(candidates_rgb)
    order = np.argsort(cand_lab[:, 0], kind="stable")
    cand_lab = cand_lab[order]
    light = cand_lab[:, 0]
    n = len(target_lab)
    k = min(n, longest_chain(light, min_step))
    slot = np.arange(n) * k // n  # which step of the ramp each target level falls on

    gap = target_lab[:, None, :] - cand_lab[None, :, :]  # (n, m, 3)
    gap[..., 0] *= LIGHTNESS_WEIGHT
    distance = np.linalg.norm(gap, axis=-1)  # (n, m)
    cost = np.zeros((k, len(cand_lab)))
    np.add.at(cost, slot, distance)  # (k, m): cost of putting candidate c at ramp step j

    # A candidate may follow those at least min_step darker: with sorted lightness they form a prefix.
    prefix_end = np.searchsorted(light, light - min_step, side="right")  # (m,)
    best = cost[0].copy()
    back = np.zeros((k, len(cand_lab)), dtype=np.int64)
    for j in range(1, k):
        prefix_min = np.minimum.accumulate(best)
        prefix_arg = _running_argmin(best)
        reachable = prefix_end > 0
        new = np.full_like(best, np.inf)
        new[reachable] = cost[j, reachable] + prefix_min[prefix_end[reachable] - 1]
        back[j, reachable] = prefix_arg[prefix_end[reachable] - 1]
        best = new
    chain = [int(np.argmin(best))]
    for j in range(k - 1, 0, -1):
        chain.append(int(back[j, chain[-1]]))
    chain.reverse()
    return order[np.array(chain)[slot]]


def is_grey(rgb: np.ndarray) -> np.ndarray:
    """Return True for the colours (..., 3) whose red, green and blue are equal."""
    rgb = np.asarray(rgb)
    return rgb.max(axis=-1) == rgb.min(axis=-1)


def nearest_monotone_ramp(
    target_rgb: np.ndarray, candidates_rgb: np.ndarray, min_step: float, repeat_cost: float
) -> np.ndarray:
    """Return, per target colour, the index of a candidate: the ramp nearest the targets in CIELAB (lightness
    weighted by LIGHTNESS_WEIGHT) whose lightness never falls.

    A level either repeats the candidate of the level below (paying `repeat_cost`) or takes one at least
    `min_step` L* lighter. Targets with clear chroma (GREY_CHROMA) never take a grey candidate, however
    close its lightness. Dynamic programming over the candidates sorted by lightness: the total Delta E
    of the ramp is the least of all ramps that keep these rules.
    """
    target_lab, cand_lab = _to_lab(target_rgb), _to_lab(candidates_rgb)
    order = np.argsort(cand_lab[:, 0], kind="stable")
    cand_lab, light = cand_lab[order], cand_lab[order, 0]
    gap = target_lab[:, None, :] - cand_lab[None, :, :]  # (n, m, 3)
    gap[..., 0] *= LIGHTNESS_WEIGHT
    distance = np.linalg.norm(gap, axis=-1)  # (n, m)
    chromatic = np.hypot(target_lab[:, 1], target_lab[:, 2]) >= GREY_CHROMA
    distance[np.ix_(chromatic, is_grey(np.asarray(candidates_rgb)[order]))] = np.inf

    # the candidates at least min_step darker than candidate c are, by lightness, a prefix: [0, prefix_end[c])
    prefix_end = np.searchsorted(light, light - min_step, side="right")  # (m,)
    n, m = distance.shape
    best = distance[0].copy()  # best[c]: least cost of levels 0..j with level j on candidate c
    back = np.zeros((n, m), dtype=np.int64)
    for j in range(1, n):
        prefix_min, prefix_arg = np.minimum.accumulate(best), _running_argmin(best)
        step_up = np.full(m, np.inf)
        reachable = prefix_end > 0
        step_up[reachable] = prefix_min[prefix_end[reachable] - 1]
        repeat = best + repeat_cost
        stays = repeat <= step_up  # on a tie keep the colour: fewer changes for the same fit
        back[j] = np.where(stays, np.arange(m), prefix_arg[np.maximum(prefix_end - 1, 0)])
        best = distance[j] + np.where(stays, repeat, step_up)
    if not np.isfinite(best).any():  # a bug: the cube always has a non-grey entry at or above any lightness
        raise RuntimeError("no monotone ramp exists for these candidates")
    chain = [int(np.argmin(best))]
    for j in range(n - 1, 0, -1):
        chain.append(int(back[j, chain[-1]]))
    return order[np.array(chain[::-1])]


def _running_argmin(values: np.ndarray) -> np.ndarray:
    """Return, for each i, the index of the smallest of values[:i + 1] (first one on ties)."""
    out = np.zeros(len(values), dtype=np.int64)
    best = 0
    for i in range(len(values)):
        if values[i] < values[best]:
            best = i
        out[i] = best
    return out

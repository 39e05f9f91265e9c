"""Quantised colormaps keep the order of their levels on every kind of terminal."""

import numpy as np
import pytest
from matplotlib import colormaps

from vitsee.engine.colormap import (
    ANSI_16_RGB,
    ASCII_MISSING,
    ASCII_RAMP,
    COLORMAPS,
    MIN_LIGHTNESS_STEP,
    MISSING,
    ColorMode,
    ColorScale,
    ascii_ramp,
    detect_color_mode,
    level_edges,
    lightness,
    palette,
    quantize,
    relative_luminance,
)
from vitsee.engine.errors import VitseeError

LEVEL_COUNTS = (16, 24, 32)


# --- Quantisation ---------------------------------------------------------------------------------------


def test_vmin_is_the_bottom_level_and_vmax_the_top_level():
    assert quantize(np.array([0.0, 1.0]), levels=24).tolist() == [0, 23]


def test_a_value_on_a_bin_edge_goes_to_the_upper_level():
    edges = level_edges(0.0, 1.0, 24)
    assert quantize(edges, levels=24).tolist() == list(range(1, 24))
    just_below = np.nextafter(edges, -np.inf)
    assert quantize(just_below, levels=24).tolist() == list(range(0, 23))


def test_values_outside_the_range_clip_to_the_end_levels():
    levels = quantize(np.array([-5.0, -np.inf, 7.0, np.inf]), levels=16, vmin=0.0, vmax=1.0)
    assert levels.tolist() == [0, 0, 15, 15]


def test_nan_is_the_missing_level_and_no_colour_level():
    levels = quantize(np.array([[np.nan, 0.5]]), levels=24)
    assert levels[0, 0] == MISSING
    assert 0 <= levels[0, 1] < 24


def test_quantisation_respects_a_custom_range():
    assert quantize(np.array([-1.0, 0.0, 1.0]), levels=20, vmin=-1.0, vmax=1.0).tolist() == [0, 10, 19]


@pytest.mark.parametrize("levels", [1, 33])
def test_a_level_count_out_of_range_is_a_user_error(levels):
    with pytest.raises(VitseeError, match="levels"):
        quantize(np.zeros(3), levels=levels)


def test_scale_takes_missing_bounds_from_the_finite_values():
    scale = ColorScale.for_matrix(np.array([[np.nan, 0.2], [0.9, np.inf]]))
    assert (scale.vmin, scale.vmax) == (0.2, 0.9)
    assert ColorScale.for_matrix(np.array([[0.5]]), vmax=1.0).vmax == 1.0


def test_a_constant_or_uncomputed_matrix_still_gets_a_usable_range():
    constant = ColorScale.for_matrix(np.full((3, 3), 0.7))
    assert constant.vmax > constant.vmin
    nothing = ColorScale.for_matrix(np.full((2, 2), np.nan))
    assert (nothing.vmin, nothing.vmax) == (0.0, 1.0)


def test_an_inverted_range_or_unknown_colormap_is_a_user_error():
    with pytest.raises(VitseeError, match="vmin"):
        ColorScale(1.0, 0.0)
    with pytest.raises(VitseeError, match="jet"):
        ColorScale(cmap="jet")


def test_legend_covers_the_range_without_gaps_and_agrees_with_quantize():
    scale = ColorScale(0.0, 2.0, levels=16)
    legend = scale.legend()
    assert [entry.level for entry in legend] == list(range(16))
    assert legend[0].low == 0.0 and legend[-1].high == 2.0
    assert all(a.high == b.low for a, b in zip(legend, legend[1:]))
    assert scale.quantize(np.array([entry.low for entry in legend])).tolist() == list(range(16))
    assert legend[-1].describe() == "1.875-2.000"


# --- Palettes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmap", COLORMAPS)
def test_truecolor_levels_are_matplotlibs_colours_from_end_to_end(cmap):
    colors = palette(cmap, 24, ColorMode.TRUECOLOR).colors
    first, last = colormaps[cmap](0.0), colormaps[cmap](1.0)
    assert colors[0] == "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in first[:3]))
    assert colors[-1] == "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in last[:3]))
    assert len(set(colors)) == 24


@pytest.mark.parametrize("cmap", COLORMAPS)
@pytest.mark.parametrize("levels", LEVEL_COUNTS)
def test_truecolor_ramps_get_lighter_at_every_level(cmap, levels):
    assert np.all(np.diff(lightness(palette(cmap, levels, ColorMode.TRUECOLOR).rgb)) > 0)


@pytest.mark.parametrize("cmap", COLORMAPS)
@pytest.mark.parametrize("levels", LEVEL_COUNTS)
def test_256_colour_ramp_gives_every_level_its_own_strictly_lighter_colour(cmap, levels):
    pal = palette(cmap, levels, ColorMode.COLORS_256)
    indices = [int(color[len("color(") : -1]) for color in pal.colors]
    assert all(16 <= index <= 255 for index in indices)  # never the themeable 0-15
    assert len(set(indices)) == levels
    assert np.all(np.diff(relative_luminance(pal.rgb)) > 0)
    assert np.all(np.diff(lightness(pal.rgb)) >= MIN_LIGHTNESS_STEP["256"] - 1e-9)


def _longest_chain_by_dynamic_programming(values: np.ndarray, min_step: float) -> int:
    """Longest run of values each >= min_step above the last (reference, not the greedy in the module)."""
    values = np.sort(values)
    best = [1] * len(values)
    for i in range(len(values)):
        for j in range(i):
            if values[i] - values[j] >= min_step:
                best[i] = max(best[i], best[j] + 1)
    return max(best)


@pytest.mark.parametrize("cmap", COLORMAPS)
@pytest.mark.parametrize("levels", LEVEL_COUNTS)
def test_16_colour_ramp_never_gets_darker_and_uses_as_many_colours_as_can_be_told_apart(cmap, levels):
    pal = palette(cmap, levels, ColorMode.COLORS_16)
    assert np.all(np.diff(relative_luminance(pal.rgb)) >= 0)
    distinct = list(dict.fromkeys(pal.colors))  # in ramp order
    most = _longest_chain_by_dynamic_programming(lightness(ANSI_16_RGB), MIN_LIGHTNESS_STEP["16"])
    assert len(distinct) == min(levels, most)
    assert len(distinct) >= 8
    steps = np.diff(lightness(ANSI_16_RGB[[int(c[len("color(") : -1]) for c in distinct]]))
    assert np.all(steps >= MIN_LIGHTNESS_STEP["16"])


@pytest.mark.parametrize("levels", LEVEL_COUNTS)
def test_lowest_and_highest_levels_stay_apart_in_every_colour_mode(levels):
    for mode in (ColorMode.TRUECOLOR, ColorMode.COLORS_256, ColorMode.COLORS_16):
        rgb = palette("viridis", levels, mode).rgb
        assert lightness(rgb[-1]) - lightness(rgb[0]) > 60


@pytest.mark.parametrize("levels", LEVEL_COUNTS)
def test_ascii_ramp_adds_ink_level_by_level_and_uses_every_character(levels):
    chars = ascii_ramp(levels)
    positions = [ASCII_RAMP.index(char) for char in chars]
    assert positions == sorted(positions)
    assert set(chars) == set(ASCII_RAMP)
    assert chars[0] == " " and chars[-1] == "@"
    assert ASCII_MISSING not in ASCII_RAMP
    assert palette("viridis", levels, ColorMode.NONE).chars == tuple(chars)


def test_no_colour_palette_carries_no_colours():
    assert set(palette("magma", 24, ColorMode.NONE).colors) == {""}


# --- Detecting what the terminal can show ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TERM": "xterm-256color", "COLORTERM": "truecolor"}, ColorMode.TRUECOLOR),
        ({"TERM": "xterm-256color", "COLORTERM": "24bit"}, ColorMode.TRUECOLOR),
        ({"TERM": "xterm-256color"}, ColorMode.COLORS_256),  # over SSH COLORTERM is usually gone
        ({"TERM": "tmux-256color"}, ColorMode.COLORS_256),
        ({"TERM": "screen"}, ColorMode.COLORS_256),  # tmux / screen report 256 colours
        ({"TERM": "tmux"}, ColorMode.COLORS_256),
        ({"TERM": "screen-256color", "COLORTERM": "truecolor"}, ColorMode.TRUECOLOR),
        ({"TERM": "xterm-direct"}, ColorMode.TRUECOLOR),
        ({"TERM": "xterm-kitty"}, ColorMode.TRUECOLOR),
        ({"TERM": "xterm"}, ColorMode.COLORS_16),
        ({"TERM": "linux"}, ColorMode.COLORS_16),
        ({"TERM": "dumb"}, ColorMode.NONE),
        ({}, ColorMode.NONE),
        ({"TERM": "xterm-256color", "COLORTERM": "truecolor", "NO_COLOR": "1"}, ColorMode.NONE),
        ({"TERM": "xterm-256color", "NO_COLOR": ""}, ColorMode.COLORS_256),  # empty NO_COLOR is unset
        ({"TERM": "xterm", "VITSEE_COLOR": "256"}, ColorMode.COLORS_256),
        ({"TERM": "xterm", "NO_COLOR": "1", "VITSEE_COLOR": "truecolor"}, ColorMode.TRUECOLOR),
    ],
)
def test_detect_color_mode(env, expected):
    assert detect_color_mode(env) is expected


def test_an_explicit_override_beats_the_environment():
    env = {"TERM": "xterm-256color", "COLORTERM": "truecolor", "NO_COLOR": "1", "VITSEE_COLOR": "16"}
    assert detect_color_mode(env, override="none") is ColorMode.NONE
    assert detect_color_mode(env, override="24bit") is ColorMode.TRUECOLOR
    assert detect_color_mode(env, override=ColorMode.COLORS_256) is ColorMode.COLORS_256


def test_an_unknown_override_is_a_user_error_naming_the_choices():
    with pytest.raises(VitseeError, match="truecolor, 256, 16, none"):
        detect_color_mode({}, override="rainbow")

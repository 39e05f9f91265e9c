"""Quantised colormaps keep the order of their levels on every kind of terminal."""

import itertools

import numpy as np
import pytest
from matplotlib import colormaps

from vitsee.output.colormap import (
    ANSI_16_RGB,
    ASCII_MISSING,
    ASCII_RAMP,
    COLORMAPS,
    GREY_CHROMA,
    LIGHTNESS_WEIGHT,
    MIN_LIGHTNESS_STEP,
    MISSING,
    ColorMode,
    ColorScale,
    ascii_ramp,
    detect_color_mode,
    level_edges,
    lightness,
    nearest_monotone_ramp,
    palette,
    quantize,
    relative_luminance,
)
from vitsee.errors import VitseeError

LEVEL_COUNTS = (16, 24, 32)


# --- Quantisation ---------------------------------------------------------------------------------------


def test_vmin_is_the_bottom_level_and_vmax_the_top_level():
    assert quantize(np.array([0.0, 1.0]), levels=24).tolist() == [0, 23]


def test_a_value_on_a_bin_edge_goes_to_the_upper_level():
    edges = level_edges(0.0, 1.0, 24)
    assert quantize(edges, levels=24).tolist() == list(range(1, 24))
    just_below = np.nextafter(edges, -np.inf)
    assert quantize(just_below, levels=24).tolist() == list(range(23))


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


def srgb_to_lab(rgb) -> np.ndarray:
    """CIELAB (D65, 2 degrees) of uint8 sRGB, written from the CIE formulas apart from the module's."""
    out = []
    for r, g, b in np.asarray(rgb, dtype=float).reshape(-1, 3):
        lin = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
        x = 0.4124564 * lin[0] + 0.3575761 * lin[1] + 0.1804375 * lin[2]
        y = 0.2126729 * lin[0] + 0.7151522 * lin[1] + 0.0721750 * lin[2]
        z = 0.0193339 * lin[0] + 0.1191920 * lin[1] + 0.9503041 * lin[2]

        def f(t: float) -> float:
            return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

        fx, fy, fz = f(x / 0.95047), f(y / 1.0), f(z / 1.08883)
        out.append((116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)))
    return np.array(out).reshape(np.shape(rgb))


def xterm_rgb(index: int) -> tuple[int, int, int]:
    """The RGB xterm shows for palette entry 16..255, counted by hand from its cube and grey ramp."""
    if index >= 232:
        return (8 + 10 * (index - 232),) * 3
    r, g, b = np.unravel_index(index - 16, (6, 6, 6))
    return tuple(0 if v == 0 else 55 + 40 * int(v) for v in (r, g, b))


def indices_of(pal) -> list[int]:
    return [int(color[len("color(") : -1]) for color in pal.colors]


def hue_gap_deg(lab_a: np.ndarray, lab_b: np.ndarray) -> np.ndarray:
    hue_a, hue_b = np.arctan2(lab_a[..., 2], lab_a[..., 1]), np.arctan2(lab_b[..., 2], lab_b[..., 1])
    return np.abs((np.degrees(hue_a - hue_b) + 180) % 360 - 180)


@pytest.mark.parametrize("cmap", COLORMAPS)
@pytest.mark.parametrize("levels", LEVEL_COUNTS)
def test_256_colour_ramp_gets_lighter_like_its_source_and_never_greys_a_colour(cmap, levels):
    indices = indices_of(palette(cmap, levels, ColorMode.COLORS_256))
    assert all(16 <= index <= 255 for index in indices)  # never the themeable 0-15
    shown = np.array([xterm_rgb(i) for i in indices])
    np.testing.assert_array_equal(palette(cmap, levels, ColorMode.COLORS_256).rgb, shown)
    source = srgb_to_lab(palette(cmap, levels, ColorMode.TRUECOLOR).rgb)
    lab = srgb_to_lab(shown)
    assert np.all(np.diff(source[:, 0]) > 0)  # the source ramp is strictly lighter level by level ...
    steps = np.diff(lab[:, 0])
    assert np.all(steps >= 0)  # ... and the 256-colour one never darker
    assert np.all(steps[np.diff(indices) != 0] >= 1.0 - 1e-6)  # a change of colour is a visible step up
    chromatic = np.hypot(source[:, 1], source[:, 2]) >= 10
    grey = np.array([i >= 232 or len(set(xterm_rgb(i))) == 1 for i in indices])
    assert not (chromatic & grey).any(), [i for i, c, g in zip(indices, chromatic, grey) if c and g]
    assert hue_gap_deg(lab, source)[chromatic].max() < 50  # teal stays teal, purple purple (RGB picks: 90-100)
    assert np.linalg.norm(lab - source, axis=1).mean() < 15  # distinct-at-any-cost ramps were 20-25 away
    assert len(set(indices)) >= 10 and lab[-1, 0] - lab[0, 0] > 60


def test_mid_range_viridis_is_teal_not_the_greys_242_and_243_in_256_colours():
    indices = indices_of(palette("viridis", 24, ColorMode.COLORS_256))
    assert not {242, 243} & set(indices)
    middle = srgb_to_lab([xterm_rgb(i) for i in indices[8:16]])
    source = srgb_to_lab(palette("viridis", 24, ColorMode.TRUECOLOR).rgb[8:16])  # #2f6c8e .. #2fb47c
    assert np.all(np.hypot(middle[:, 1], middle[:, 2]) > 15)
    assert np.all(hue_gap_deg(middle, source) < 50)


def _ramp_cost(lab_t, lab_c, picks, repeat_cost) -> float:
    weight = np.array([LIGHTNESS_WEIGHT, 1.0, 1.0])
    return float(
        sum(np.linalg.norm((lab_t[j] - lab_c[c]) * weight) for j, c in enumerate(picks))
        + repeat_cost * sum(a == b for a, b in zip(picks, picks[1:]))
    )


def _allowed(lab_t, lab_c, grey, picks, min_step) -> bool:
    chromatic = np.hypot(lab_t[:, 1], lab_t[:, 2]) >= GREY_CHROMA
    if any(chromatic[j] and grey[c] for j, c in enumerate(picks)):
        return False
    return all(a == b or lab_c[b, 0] - lab_c[a, 0] >= min_step for a, b in zip(picks, picks[1:]))


@pytest.mark.parametrize("seed", range(6))
def test_nearest_monotone_ramp_is_the_least_cost_ramp_of_all_that_keep_the_rules(seed):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 256, (4, 3)).astype(np.uint8)
    targets[0] = (90, 90, 90)  # one grey target, which may take a grey
    candidates = np.concatenate([rng.integers(0, 256, (5, 3)), [(60, 60, 60), (170, 170, 170)]]).astype(np.uint8)
    lab_t, lab_c = srgb_to_lab(targets), srgb_to_lab(candidates)
    grey = candidates.max(axis=1) == candidates.min(axis=1)
    min_step, repeat_cost = 4.0, 3.0
    ramps = [
        p
        for p in itertools.product(range(len(candidates)), repeat=len(targets))
        if _allowed(lab_t, lab_c, grey, p, min_step)
    ]
    best = min(_ramp_cost(lab_t, lab_c, p, repeat_cost) for p in ramps)
    picks = nearest_monotone_ramp(targets, candidates, min_step, repeat_cost).tolist()
    assert _allowed(lab_t, lab_c, grey, picks, min_step)
    assert _ramp_cost(lab_t, lab_c, picks, repeat_cost) == pytest.approx(best, rel=1e-9)


def test_the_module_and_the_test_agree_on_cielab():
    rgb = np.array([[0, 0, 0], [255, 255, 255], [68, 1, 84], [33, 145, 140], [253, 231, 37]], dtype=np.uint8)
    np.testing.assert_allclose(lightness(rgb), srgb_to_lab(rgb)[:, 0], atol=0.02)
    np.testing.assert_allclose(srgb_to_lab(rgb)[1], (100, 0, 0), atol=0.02)


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

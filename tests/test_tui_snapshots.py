"""Snapshots of every vitsee-tui view on the tiny analysed store, at a fixed terminal size.

Regenerate after an intended change of the look with `pytest tests/test_tui_snapshots.py --snapshot-update`
and look at the report before committing.
"""

from __future__ import annotations

import pytest

from helpers.app import analysed_copy, make_app, settle, view_shown
from vitsee.output.colormap import ColorMode

SIZE = (120, 36)


@pytest.fixture(scope="session")
def store(tiny_store, tmp_path_factory):
    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


def opened_on(kind: str, *keys: str):
    """Returns a run_before that waits for the store, switches to a view, waits for it, presses keys."""

    async def run_before(pilot) -> None:
        await settle(pilot, view_shown("cka"))
        if kind != "cka":
            await pilot.press({"attention": "2", "probes": "3", "skip": "4", "spatial": "5"}[kind])
            await settle(pilot, view_shown(kind))
        await pilot.press(*keys)
        await settle(pilot)

    return run_before


@pytest.mark.parametrize(
    "kind, keys",
    [
        ("cka", ("down", "down", "right")),
        ("attention", ("down", "right")),
        ("probes", ("down", "down", "right")),
        ("skip", ("down", "right", "right")),
        ("spatial", ("right", "down")),
    ],
)
def test_view_snapshot(kind, keys, store, tmp_path, snap_compare):
    app = make_app(store, tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=opened_on(kind, *keys))


def test_pair_detail_snapshot(store, tmp_path, snap_compare):
    app = make_app(store, tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=opened_on("cka", "down", "right", "right", "enter"))


def test_no_colour_at_80x24_snapshot(store, tmp_path, snap_compare):
    app = make_app(store, tmp_path, color=ColorMode.NONE)
    assert snap_compare(app, terminal_size=(80, 24), run_before=opened_on("cka", "down", "right"))


def test_help_of_the_attention_view_at_80x24_snapshot(store, tmp_path, snap_compare):
    app = make_app(store, tmp_path)
    assert snap_compare(app, terminal_size=(80, 24), run_before=opened_on("attention", "down", "question_mark"))


def test_skip_token_detail_at_80x24_snapshot(store, tmp_path, snap_compare):
    app = make_app(store, tmp_path)
    assert snap_compare(app, terminal_size=(80, 24), run_before=opened_on("skip", "down", "right", "right", "enter"))


def test_head_distance_detail_at_80x24_snapshot(store, tmp_path, snap_compare):
    app = make_app(store, tmp_path)
    assert snap_compare(app, terminal_size=(80, 24), run_before=opened_on("attention", "down", "right", "enter"))


def test_256_colour_snapshot(store, tmp_path, snap_compare):
    # tmux without COLORTERM (`vitsee-tui --color 256`): mid-range viridis stays blue-green, never xterm grey 242/243
    app = make_app(store, tmp_path, color=ColorMode.COLORS_256)
    assert snap_compare(app, terminal_size=SIZE, run_before=opened_on("cka", "down", "down", "right"))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_256_colour_snapshot_at_the_smallest_and_a_large_terminal(size, store, tmp_path, snap_compare):
    app = make_app(store, tmp_path, color=ColorMode.COLORS_256)
    assert snap_compare(app, terminal_size=size, run_before=opened_on("skip", "down", "right"))


@pytest.mark.parametrize(
    "kind, keys, size",
    [
        ("cka", ("b", "down", "right"), (160, 48)),  # model A with itself: every column label of a ViT
        ("probes", ("down", "down"), (160, 48)),
        ("skip", ("down", "right"), (160, 48)),
        ("probes", ("down", "down"), (80, 24)),
        ("skip", ("down", "right"), (80, 24)),
    ],
)
def test_labels_stand_apart_snapshot(kind, keys, size, store, tmp_path, snap_compare):
    """The axis labels at the smallest and a large terminal: none written over another (issue 13, point 9)."""
    app = make_app(store, tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=opened_on(kind, *keys))

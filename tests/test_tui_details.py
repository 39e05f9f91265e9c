"""Enter in every view opens a detail of what is under the cursor, with the view's own numbers; the help screen
speaks the user's words: the shown view, its keys by group, what its marks mean."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from rich.console import Console

import vitsee.tui.screens.view_detail as details
from conftest import RESNET, VIT
from helpers.app import make_app, settle, view_shown
from vitsee.store import Store
from vitsee.tui.screens.explorer import ExplorerScreen
from vitsee.tui.screens.help import HelpScreen
from vitsee.tui.widgets.heatmap import Heatmap
from vitsee.tui.widgets.histogram import Histogram

SIZE = (120, 40)
KEYS = {"attention": "2", "probes": "3", "skip": "4", "spatial": "5", "heads": "6", "erf": "7"}


async def open_view(pilot, kind: str) -> None:
    await settle(pilot, view_shown("cka"))
    if kind != "cka":
        await pilot.press(KEYS[kind])
        await settle(pilot, view_shown(kind))


def footer_keys(app) -> list[str]:
    return [key.description for key in app.screen.query("FooterKey")]


def title_of(screen) -> str:
    return str(screen.query_one(".detail--title").render())


def facts_of(screen) -> str:
    return str(screen.query_one(".detail--facts").render())


async def closes_with(pilot, key: str) -> None:
    await pilot.press(key)
    await pilot.pause()
    assert isinstance(pilot.app.screen, ExplorerScreen)


async def test_enter_on_a_head_opens_its_distance_per_image_with_mean_and_uniform_reference(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "attention")
        assert "Select" in footer_keys(app)
        view = app.screen.pane("attention").view
        await pilot.press("down", "right", "enter")
        await settle(pilot, lambda a: getattr(a.screen, "distances", None) is not None)
        detail = app.screen
        assert isinstance(detail, details.HeadDistanceDetail)
        original = int(view.extra["head_order"][1, 1])
        assert title_of(detail).startswith(f"{view.rows[1]} head {original + 1}: ")
        with Store.open(store) as s:  # the reference: the per-image statistic as stored
            expected = np.asarray(s.attention_distance(VIT)[:, 1, original], dtype=np.float64)
        assert np.array_equal(detail.distances, expected)
        assert detail.distances.mean() == pytest.approx(view.matrix[1, 1], rel=1e-5)  # the view's sorted mean
        histogram = detail.query_one(Histogram)
        assert histogram.counts.sum() == len(expected)  # every image in one bin (all fall within the max distance)
        edges = np.asarray(view.extra["hist_edges"])
        assert histogram.counts.tolist() == [
            int(((expected >= lo) & (expected < hi)).sum()) + int(hi == edges[-1] and (expected == hi).sum())
            for lo, hi in zip(edges[:-1], edges[1:])
        ]
        assert histogram.lines == [pytest.approx(expected.mean())]
        assert histogram.marker == pytest.approx(view.extra["uniform_px"])
        legend = str(detail.query_one("#detail-legend").render())
        assert f"mean {expected.mean():.1f} px over {len(expected)} images" in legend
        await closes_with(pilot, "enter")


async def test_enter_on_a_probe_row_opens_its_per_token_accuracy_map(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "probes")
        assert "Select" in footer_keys(app)
        view = app.screen.pane("probes").view
        row = 2
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        detail = app.screen
        layer = view.rows[row]
        assert isinstance(detail, details.MapDetail)
        assert title_of(detail) == f"{layer}: test accuracy of a probe on each token"
        tokens = np.asarray(view.extra["token_maps"][layer], dtype=float)
        prefix = view.extra["token_prefix"][layer]
        gh, gw = view.extra["grid"]
        assert prefix == 1 and len(tokens) == 1 + gh * gw  # the CLS token, then the 4x4 grid
        heatmap = detail.query_one(Heatmap)
        assert heatmap.zoom == "detail"
        assert np.array_equal(heatmap.matrix, tokens[1:].reshape(gh, gw))
        facts = facts_of(detail)
        assert f"CLS {view.matrix[row, 0]:.4f}" in facts and f"prefix tokens (CLS first): {tokens[0]:.3f}" in facts
        assert f"spatial tokens: mean {tokens[1:].mean():.4f}" in facts
        assert np.isclose(tokens[1:].mean(), view.matrix[row, view.cols.index("tokens (mean)")])  # the table's column
        await closes_with(pilot, "q")


async def test_enter_on_a_resnet_probe_row_says_why_it_has_no_token_map(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("a", "3")  # model A: the ResNet
        await settle(
            pilot,
            lambda a: a.screen.pane("probes").loaded is not None and a.screen.pane("probes").view.models == [RESNET],
        )
        view = app.screen.pane("probes").view
        await pilot.press("down", "enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, details.TextDetail)
        assert title_of(detail) == f"{view.rows[1]}: linear probe accuracy"
        facts = facts_of(detail)
        assert f"GAP {view.matrix[1, view.cols.index('GAP')]:.4f}" in facts
        assert f"no per-token probes for {view.rows[1]}" in facts
        await closes_with(pilot, "enter")


async def test_enter_on_a_skip_cell_opens_the_tokens_ratio_curve_across_sublayers(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "skip")
        assert "Select" in footer_keys(app)
        view = app.screen.pane("skip").view
        await pilot.press("down", "right", "right", "enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, details.CurveDetail)
        assert view.cols[2] == "token 1"  # the first spatial token, after CLS
        assert title_of(detail) == "token 1: ||z||/||f(z)|| across the sublayers"
        assert np.array_equal(detail.values, view.matrix[:, 2], equal_nan=True) and detail.mark == 1
        plot = detail.query_one("#detail-curve")
        assert plot.mark == 1 and np.array_equal(np.asarray(plot.series[0].values), view.matrix[:, 2], equal_nan=True)
        assert np.array_equal(np.asarray(plot.series[1].values), np.asarray(view.extra["spatial_mean"]), equal_nan=True)
        listed = str(detail.query_one("#detail-values Static").render())
        assert (
            f"{view.rows[1]} {view.matrix[1, 2]:.3f}" in listed
            and f"{view.rows[-1]} {view.matrix[-1, 2]:.3f}" in listed
        )
        assert facts_of(detail).startswith(f"{view.rows[1]}: {view.cell_text(1, 2)}")
        await closes_with(pilot, "escape")


async def test_enter_on_a_spatial_token_opens_its_map_at_full_size_with_values(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "spatial")
        pane = app.screen.pane("spatial")
        await pilot.press("right", "down", "enter")
        await pilot.pause()
        detail = app.screen
        gh, gw = pane.grid
        token = 1 * gw + 1
        assert isinstance(detail, details.MapDetail)
        assert title_of(detail) == f"token r1c1 of {pane.view.params['layer']}: CKA with each input patch"
        heatmap = detail.query_one(Heatmap)
        assert heatmap.zoom == "detail" and heatmap.cursor == (1, 1)
        assert np.array_equal(
            heatmap.matrix, np.asarray(pane.view.matrix[token], dtype=float).reshape(gh, gw), equal_nan=True
        )
        values = pane.view.matrix[token]
        peak = int(np.nanargmax(values))
        assert f"peak patch r{peak // gw}c{peak % gw} {values[peak]:.4f}" in facts_of(detail)
        await closes_with(pilot, "enter")


async def test_enter_on_a_head_of_the_heads_view_opens_its_cka_with_every_layer(paper_store, tmp_path):
    app = make_app(paper_store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "heads")
        assert "Select" in footer_keys(app)
        view = app.screen.pane("heads").view
        column = app.screen.query_one("HeadScatter").column
        await pilot.press("down", "enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, details.CurveDetail)
        assert title_of(detail).startswith(f"{view.rows[1]}: CKA with every layer of ")
        assert np.array_equal(detail.values, view.matrix[1]) and detail.mark == column
        assert f"CKA with {view.cols[column]} {view.matrix[1, column]:.4f}" in facts_of(detail)
        await closes_with(pilot, "q")


async def test_enter_on_an_erf_pixel_opens_the_map_with_its_values_in_the_views_scale(paper_store, tmp_path):
    app = make_app(paper_store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "erf")
        pane = app.screen.pane("erf")
        cursor = app.screen.query_one("#erf-heatmap", Heatmap).cursor
        await pilot.press("enter")
        await pilot.pause()
        detail = app.screen
        shares = np.asarray(pane.view.matrix, dtype=float)
        heatmap = detail.query_one(Heatmap)
        assert heatmap.cursor == cursor and heatmap.value_name == "log10 share"
        floor = shares.max() * 1e-6
        assert np.allclose(heatmap.matrix, np.log10(np.maximum(shares, floor)))
        r, c = cursor
        assert f"pixel row {r} col {c}: {shares[r, c]:.3g} of the total" in facts_of(detail)
        await closes_with(pilot, "escape")
        await pilot.press("g", "enter")  # linear colours: the detail shows percent
        await pilot.pause()
        assert np.allclose(app.screen.query_one(Heatmap).matrix, shares * 100)


def tui_class_names() -> set[str]:
    """Returns the names of every class the app defines (none may appear on the help screen)."""
    import vitsee.tui.screens.explorer as explorer
    import vitsee.tui.widgets.distance_plot as distance_plot

    names = set()
    for module in (explorer, distance_plot, details):
        names |= {
            name for name, obj in inspect.getmembers(module, inspect.isclass) if obj.__module__.startswith("vitsee")
        }
    return names | {"ExplorerScreen", "DistancePlot", "Heatmap", "DataTable", "App"}


async def test_help_names_the_view_groups_its_keys_and_explains_the_attention_plots_marks(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_view(pilot, "attention")
        await pilot.press("question_mark")
        await pilot.pause()
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        text = help_screen.text()
        assert text.startswith("Help: Attention view (test_vit (random init))")  # the model's display name
        groups = [line for line in text.splitlines() if line in ("Move", "Views", "Models", "This view", "App")]
        assert groups == ["Move", "Views", "Models", "This view", "App"]
        for name in tui_class_names() - {"App"}:
            assert name not in text, name
        for row in help_screen.keys:
            assert not row.binding_id or row.binding_id not in text
        assert "Open the head under the cursor: its distance per image" in text  # Enter says what it does here
        legend = dict(help_screen.legend)
        for glyph in ("\u25cf", "\u250a  \u25b2", "\u251c\u2500\u2524", "\u00d7", "2-9"):
            assert glyph in legend, glyph
        assert "uniform attention" in legend["\u250a  \u25b2"] and "interval" in legend["\u251c\u2500\u2524"]
        # nothing cut: each table, drawn at the width it has, keeps every word of every line
        for static in help_screen.query("#help-body > Static"):
            console = Console(width=static.content_region.width, record=True, color_system=None)
            console.print(static.render())
            drawn = console.export_text().split()
            table = static.render()
            for cells in getattr(table, "columns", []):
                for cell in cells._cells:
                    for word in str(cell).split():
                        assert word in drawn, word
        body = help_screen.query_one("#help-body")
        assert body.max_scroll_y > 0  # taller than 24 lines: it scrolls
        await pilot.press("end")
        await pilot.pause()
        assert body.scroll_y == body.max_scroll_y
        await pilot.press("escape")
        assert isinstance(app.screen, ExplorerScreen)


async def test_help_on_a_detail_names_the_detail_and_the_key_that_closes_it(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "skip")
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        text = app.screen.text()
        assert text.startswith("Help: Skip ratio of one token: token CLS: ")
        assert "Close this detail" in text and "esc / \u23ce / q  Close this detail" in text


async def test_closing_a_head_detail_before_its_distances_arrive_leaves_the_app_running(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await open_view(pilot, "attention")
        await pilot.press("enter", "escape")  # the worker may still be reading
        await settle(pilot)
        assert isinstance(app.screen, ExplorerScreen) and app.is_running


async def test_help_of_every_view_says_what_enter_does_there_and_explains_its_marks(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        for kind, key in [("cka", "1"), ("probes", "3"), ("skip", "4"), ("spatial", "5")]:
            await pilot.press(key)
            await settle(pilot, view_shown(kind))
            pane = app.screen.pane(kind)
            await pilot.press("question_mark")
            await pilot.pause()
            help_screen = app.screen
            assert help_screen.title_text.startswith(f"{pane.label} view (")
            text = help_screen.text()
            for description in pane.key_help.values():
                assert description in text, (kind, description)
            assert help_screen.legend == pane.legend() and len(help_screen.legend) >= 4
            if kind == "cka":
                assert "Benjamini-Hochberg q > 0.05" in dict(help_screen.legend)["x"]
            await pilot.press("escape")
            await pilot.pause()

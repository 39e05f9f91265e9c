"""The explorer as a place to think in (issue 13): search and jump, the layer-pair dossier, panes from the registry.

Pilot tests on the shared analysed tiny store (a 6-block ViT and a ResNet, 48 images, every analysis but the
ERFs cached); what the screen shows is checked against the store's own views.
"""

from __future__ import annotations

import pytest

from conftest import RESNET, VIT
from test_tui import SIZE, make_app, settle, status, store, view_shown  # noqa: F401  (store: the fixture)
from vitsee.engine.analyses import REGISTRY
from vitsee.tui.screens.explorer import ExplorerScreen
from vitsee.tui.widgets.heatmap import Heatmap


def side_list(app) -> list[str]:
    return [str(o.prompt) for o in app.screen.query_one("#layers").options]


async def search(pilot, text: str) -> None:
    await pilot.press("slash", *text, "enter")
    await pilot.pause()


# --- panes from the registry ----------------------------------------------------------------------------------


def test_every_registered_analysis_has_a_pane_and_the_tabs_follow_the_registry():
    from vitsee.tui.widgets import panes

    assert panes.missing_panes() == []
    assert list(panes.PANES) == list(REGISTRY) and list(panes.KINDS) == list(REGISTRY)
    assert all(cls.kind == name and cls.label and cls.tooltip for name, cls in panes.PANES.items())
    keys = {b.id: b.key for b in ExplorerScreen.BINDINGS if b.id and b.id.startswith("explorer.view_")}
    assert keys == {f"explorer.view_{name}": str(i) for i, name in enumerate(REGISTRY, start=1)}


def test_an_analysis_registered_without_a_pane_is_named_as_missing(monkeypatch):
    from vitsee.tui.widgets import panes
    from vitsee.tui.widgets.view_pane import PANE_CLASSES

    monkeypatch.delitem(PANE_CLASSES, "skip")
    assert panes.missing_panes() == ["skip"]
    assert "skip" not in panes.registered_panes() and list(panes.registered_panes())[:3] == ["cka", "attention", "probes"]


# --- search ---------------------------------------------------------------------------------------------------


async def test_slash_searches_rows_and_columns_and_n_N_cycle_through_the_matches(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        screen = app.screen
        view = screen.pane("cka").view
        assert view.models == [VIT, RESNET]
        heatmap = screen.query_one("#cka-heatmap", Heatmap)
        await pilot.press("slash", *"blocks.4")
        assert side_list(app) == ["blocks.4"]  # the panel lists what matches while one types
        await pilot.press("enter")
        await pilot.pause()
        assert heatmap.cursor == (view.rows.index("blocks.4"), 0)
        assert app.focused is heatmap and status(app).startswith("blocks.4 x maxpool  CKA ")
        # a column layer of model B (ResNet): the cursor moves along the row
        await search(pilot, "layer3")
        assert heatmap.cursor == (view.rows.index("blocks.4"), view.cols.index("layer3.0"))
        assert status(app).startswith("blocks.4 x layer3.0  CKA ")
        # 'blocks' matches every ViT block: n steps down them, N back, round the end
        await search(pilot, "blocks")
        blocks = [i for i, r in enumerate(view.rows) if r.startswith("blocks")]
        assert heatmap.cursor[0] == blocks[0]
        await pilot.press("n", "n")
        assert heatmap.cursor[0] == blocks[2]
        assert "3 of 6: blocks.2" in str(screen.query_one("#search-count").render())
        await pilot.press("N", "N", "N")
        assert heatmap.cursor[0] == blocks[-1]
        # Esc closes the search: the whole list again, and n is the CKA view's own key once more
        await pilot.press("escape")
        assert side_list(app) == view.rows and not screen.query_one("SidePanel").searching
        await pilot.press("n")
        assert heatmap.cursor[0] == blocks[-1]


async def test_a_search_with_no_match_says_so_and_leaves_the_cursor(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        heatmap = app.screen.query_one("#cka-heatmap", Heatmap)
        await pilot.press("down", "right")
        await search(pilot, "qkv")
        assert heatmap.cursor == (1, 1)
        assert side_list(app) == []
        assert "no match in this view" in str(app.screen.query_one("#search-count").render())
        assert any("no layer of the CKA view matches 'qkv'" in n.message for n in app._notifications)


async def test_search_finds_models_in_the_side_panel_and_enter_picks_one_as_model_a(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("slash", *"resnet")
        assert side_list(app) == ["model test_resnet (random)"]
        await pilot.press("enter")  # no layer matches: says where the match is
        assert any("model test_resnet@random:0 does" in n.message for n in app._notifications)
        option_list = app.screen.query_one("#layers")
        option_list.focus()
        option_list.highlighted = 0
        await pilot.press("enter")
        await settle(pilot, lambda a: a.screen.model_a == RESNET and view_shown("cka")(a))
        assert app.screen.pane("cka").view.models[0] == RESNET


async def test_search_in_the_probes_view_moves_the_table_and_the_plot_cursor(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("3")
        await settle(pilot, view_shown("probes"))
        pane = app.screen.pane("probes")
        await search(pilot, "blocks.3")
        assert pane.selection[0] == pane.view.rows.index("blocks.3")
        assert app.screen.query_one("#probes-plot").mark == pane.view.rows.index("blocks.3")
        assert status(app).startswith("blocks.3 CLS  accuracy ")


# --- jump -----------------------------------------------------------------------------------------------------


async def test_colon_lists_every_view_with_the_current_models_and_goes_to_the_one_picked(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("colon")
        await pilot.pause()
        from vitsee.tui.screens.jump import JumpScreen

        jump = app.screen
        assert isinstance(jump, JumpScreen)
        options = [str(o.prompt) for o in jump.query_one("#jump-list").options]
        assert len(options) == len(REGISTRY)
        assert options[0].startswith("1  CKA") and options[0].endswith(f"cka:{VIT}:{RESNET}")
        assert options[3].endswith(f"skip:{VIT}")
        await pilot.press("down", "down", "down", "enter")  # from CKA to the fourth: skip ratios
        await settle(pilot, view_shown("skip"))
        assert isinstance(app.screen, ExplorerScreen) and app.screen.kind == "skip"
        await pilot.press("colon")
        await pilot.pause()
        await pilot.press("escape")
        assert isinstance(app.screen, ExplorerScreen) and app.screen.kind == "skip"

"""The explorer as a place to think in (issue 13): search and jump, the layer-pair dossier, panes from the registry.

Pilot tests on the shared analysed tiny store (a 6-block ViT and a ResNet, 48 images, every analysis but the
ERFs cached); what the screen shows is checked against the store's own views.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import RESNET, VIT
from helpers.app import SIZE, make_app, settle, status, view_shown
from vitsee.analyses import REGISTRY
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
    assert all(
        cls.shape is REGISTRY[name].shape and panes.VIEW_LABELS[name] and panes.tooltip(name)
        for name, cls in panes.PANES.items()
    )
    keys = {b.id: b.key for b in ExplorerScreen.BINDINGS if b.id and b.id.startswith("explorer.view_")}
    tabbed = [name for name, analysis in REGISTRY.items() if analysis.tab]  # the measures show in CKA's tab
    assert keys == {f"explorer.view_{name}": str(i) for i, name in enumerate(tabbed, start=1)}
    assert list(panes.TAB_LABELS) == tabbed
    for name in (
        n for n in REGISTRY if n not in tabbed
    ):  # the measures in CKA's tab, separability and n-curves in the Zoo's
        home = panes.tab_of(name)
        assert home in tabbed and REGISTRY[home].family == REGISTRY[name].family, name


def test_an_analysis_registered_without_a_pane_is_named_as_missing(monkeypatch):
    from vitsee.tui.widgets import panes
    from vitsee.tui.widgets.view_pane import PANE_CLASSES

    monkeypatch.delitem(PANE_CLASSES, REGISTRY["skip"].shape)  # no pane draws the skip ratios' shape
    assert panes.missing_panes() == ["skip"]
    tabbed = [name for name in panes.registered_panes() if REGISTRY[name].tab]
    assert "skip" not in panes.registered_panes() and tabbed[:4] == ["cka", "attention", "probes", "spatial"]


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
        assert "3/6 blocks.2" in str(screen.query_one("#search-count").render())
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
        assert side_list(app) == ["model test_resnet (random init)"]  # its display name
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


async def test_help_lists_the_search_jump_and_dossier_keys_and_new_run_on_ctrl_n(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("question_mark")
        rows = {k.binding_id: k.keys for k in app.screen.keys}
        assert rows["explorer.search"] == "/" and rows["explorer.jump"] == ":" and rows["explorer.dossier"] == "d"
        assert rows["explorer.new_run"] == "^n" and rows["cka.marks"] == "n"
        assert "explorer.next_match" not in rows  # n / N step through matches only while a search is open
        await pilot.press("escape")
        await search(pilot, "blocks")
        await pilot.press("question_mark")
        rows = {k.binding_id: k.keys for k in app.screen.keys}
        assert rows["explorer.next_match"] == "n" and rows["explorer.previous_match"] == "N"
        assert "cka.marks" not in rows and rows["explorer.close_search"] == "esc"


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
        pair = "test_vit (random init) x test_resnet (random init)"  # the models by their display names
        assert options[0].startswith("1  CKA") and options[0].endswith(pair)
        assert options[1].startswith("1m RBF CKA") and options[1].endswith(pair)  # CKA's tab, m
        long = [o for o in options if len(o) > 78]
        assert not long, long  # one line each at 80 columns, no key wrapped mid-word
        skip = list(REGISTRY).index("skip")
        assert options[skip].startswith("4  Skip") and options[skip].endswith("test_vit (random init)")
        await pilot.press(*["down"] * skip, "enter")  # from CKA to skip ratios
        await settle(pilot, view_shown("skip"))
        assert isinstance(app.screen, ExplorerScreen) and app.screen.kind == "skip"
        await pilot.press("colon")
        await pilot.pause()
        await pilot.press("escape")
        assert isinstance(app.screen, ExplorerScreen) and app.screen.kind == "skip"


# --- the layer-pair dossier -------------------------------------------------------------------------------------


async def open_dossier(pilot, row_layer: str, col_layer: str):
    """From the opening ViT x ResNet CKA: put the cursor on (row_layer, col_layer), press d, wait for the sections."""
    from vitsee.tui.screens.dossier import DossierScreen

    app = pilot.app
    await search(pilot, row_layer)
    await search(pilot, col_layer)
    await pilot.press("escape", "d")
    await settle(pilot, lambda a: isinstance(a.screen, DossierScreen) and a.screen.dossier is not None)
    return app.screen


def section_texts(dossier_screen) -> dict[tuple[str, str], str]:
    """Returns (kind, model) -> the section's title and lines as the screen shows them."""
    out = {}
    for widget in dossier_screen.query("DossierSection"):
        text = "\n".join(str(w.render()) for w in widget.query("Label, Static"))
        out[(widget.target.kind, widget.target.model)] = text
    return out


async def test_d_opens_the_dossier_of_the_cka_cell_with_every_analysis_of_both_layers(store, tmp_path):
    from vitsee.analyses.views import load_view

    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        cka = app.screen.pane("cka").view
        dossier = await open_dossier(pilot, "blocks.5", "layer4.0")
        r, c = cka.rows.index("blocks.5"), cka.cols.index("layer4.0")
        assert (dossier.row, dossier.col) == (r, c)
        texts = section_texts(dossier)
        assert texts[("cka", VIT)].startswith(f"CKA {cka.matrix[r, c]:.4f}{cka.interval_text(r, c)}")
        assert [p.mark for p in dossier.query("LinePlot")] == [c, r]  # the pair marked in its row and column
        # the ViT block's heads, nearest first, as the attention view has them (with their intervals)
        attention = load_view(store, f"attention:{VIT}")
        b = attention.rows.index("blocks.5")
        order = attention.extra["head_order"][b]
        heads = "  ".join(
            f"head {int(order[h]) + 1} {attention.matrix[b, h]:.1f} px "
            f"[{attention.ci_low[b, h]:.1f}, {attention.ci_high[b, h]:.1f}]"
            for h in range(2)
        )
        assert heads in texts[("attention", VIT)]
        assert "not an attention block" not in texts[("attention", VIT)]
        assert f"{RESNET} has no attention distances (resnet model)" in texts[("attention", RESNET)]  # its one reason
        # both layers' probe accuracies with their exact binomial intervals
        for model, layer in ((VIT, "blocks.5"), (RESNET, "layer4.0")):
            probes = load_view(store, f"probes:{model}")
            pr = probes.rows.index(layer)
            for pc, readout in enumerate(probes.cols):
                assert (
                    f"{readout} {probes.matrix[pr, pc]:.3f}{probes.interval_text(pr, pc)}" in texts[("probes", model)]
                )
        # skip ratios of the block's two sublayers, and the ResNet's note on its zero-initialised branches
        skip = load_view(store, f"skip:{VIT}")
        i = skip.rows.index("blocks.5.attn")
        assert (
            f"blocks.5.attn: CLS {skip.extra['cls'][i]:.3g} [{skip.extra['cls_ci_low'][i]:.3g}, "
            f"{skip.extra['cls_ci_high'][i]:.3g}]"
        ) in texts[("skip", VIT)]
        assert "blocks.5.mlp: CLS " in texts[("skip", VIT)]
        assert "timm initialises this branch to zero" in texts[("skip", RESNET)]
        # the spatial maps the store caches (the last block of each); the ERFs it does not
        spatial = load_view(store, f"spatial:{VIT}:blocks.5")
        own = np.diag(spatial.matrix)
        assert f"CKA of a token with its own patch: mean {np.nanmean(own):.3f}" in texts[("spatial", VIT)]
        assert "map of token r2c2" in texts[("spatial", VIT)] and ("spatial", RESNET) in texts
        assert f"not computed: vitsee analyze {store} --erf" in texts[("erf", VIT)]
        assert f"not computed: vitsee analyze {store} --erf" in texts[("erf", RESNET)]
        await pilot.press("escape")
        assert isinstance(app.screen, ExplorerScreen)


async def test_a_layer_whose_result_is_not_cached_says_how_to_compute_it(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        texts = section_texts(await open_dossier(pilot, "blocks.2", "layer2.0"))
        # the store caches spatial maps of the last blocks only
        assert texts[("spatial", VIT)].endswith(
            f"not computed: vitsee analyze {store} --spatial --spatial-layer blocks.2"
        )
        assert texts[("spatial", RESNET)].endswith(
            f"not computed: vitsee analyze {store} --spatial --spatial-layer layer2.0"
        )


async def test_enter_on_a_dossier_section_opens_its_full_view_at_that_layer(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        dossier = await open_dossier(pilot, "blocks.3", "layer2.0")
        assert app.focused.target.kind == "cka"
        await pilot.press(
            "down", "down", "down"
        )  # CKA, every measure of the pair, the ViT's head distances, its probes
        assert (app.focused.target.kind, app.focused.target.model) == ("probes", VIT)
        await pilot.press("enter")
        await settle(pilot, view_shown("probes"))
        screen = app.screen
        pane = screen.pane("probes")
        assert isinstance(screen, ExplorerScreen) and pane.view.models == [VIT]
        assert pane.selection[0] == pane.view.rows.index("blocks.3")
        assert status(app).startswith("blocks.3 CLS  accuracy ")
        # the ResNet's skip ratios: the ResNet becomes model A, the ViT model B (the same pair, transposed)
        await pilot.press("1")  # ViT x ResNet still
        await settle(pilot, view_shown("cka"))
        dossier = await open_dossier(pilot, "blocks.3", "layer2.0")
        skip = next(s for s in dossier.query("DossierSection") if (s.target.kind, s.target.model) == ("skip", RESNET))
        skip.focus()
        await pilot.press("enter")
        await settle(pilot, view_shown("skip"))
        screen = app.screen
        assert (screen.model_a, screen.model_b) == (RESNET, VIT)
        heatmap = screen.pane("skip").heatmap
        assert screen.pane("skip").view.rows[heatmap.cursor[0]] == "layer2.0"


async def test_d_outside_the_cka_view_says_where_the_dossier_is(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("2", "d")
        assert isinstance(app.screen, ExplorerScreen)
        assert any("the dossier is of a CKA cell" in n.message for n in app._notifications)


def test_the_erf_half_mass_radius_counts_pixels_outward_from_the_centre():
    from vitsee.analyses.erf import half_mass_radius

    erf = np.zeros((5, 5))
    erf[2, 2] = 0.4  # centre (H // 2, W // 2)
    erf[2, 3] = 0.1  # radius 1: 0.5 reached there
    erf[0, 0] = 0.5  # radius hypot(2, 2)
    assert half_mass_radius(erf) == 1.0
    erf[2, 3] = 0.09
    erf[0, 0] = 0.51
    assert half_mass_radius(erf) == pytest.approx(np.hypot(2, 2))
    # a uniform map: half of 64 pixels lie within the radius of the 32nd nearest pixel to (4, 4)
    flat = np.full((8, 8), 1 / 64)
    radii = np.sort(np.hypot(*np.mgrid[0:8, 0:8] - 4).ravel())
    assert half_mass_radius(flat) == pytest.approx(radii[31])


def test_the_spatial_summary_counts_tokens_whose_peak_is_their_own_patch():
    from vitsee.analyses.views import View
    from vitsee.analyses.spatial import spatial_lines

    matrix = np.full((4, 4), 0.1)
    matrix[0, 0], matrix[1, 1], matrix[2, 0] = 0.9, 0.8, 0.95  # token 2 peaks at patch 0, token 3 ties everywhere
    view = View(
        "spatial",
        "spatial:m:l",
        "",
        "",
        matrix,
        [f"t{i}" for i in range(4)],
        [f"p{i}" for i in range(4)],
        "CKA",
        extra={"grid": [2, 2]},
    )
    lines = spatial_lines(view)
    assert (
        lines[0] == f"CKA of a token with its own patch: mean {np.mean([0.9, 0.8, 0.1, 0.1]):.3f}; "
        "the peak is its own patch for 2 of 4 tokens"
    )
    assert lines[1].startswith("map of token r1c1")
    assert lines[2:] == ["  ..", "  .."]  # token 3's map is flat: every cell at the bottom of the ramp


def test_the_spatial_ramp_runs_from_the_maps_minimum_to_its_maximum_and_leaves_nan_blank():
    from vitsee.analyses.spatial import RAMP, ramp_rows

    assert ramp_rows(np.array([[0.0, 1.0], [0.5, np.nan]])) == [RAMP[1] + RAMP[-1], RAMP[5] + " "]


def test_a_layer_outside_every_block_has_no_head_distances_or_skip_ratios(store):
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.attention import block_of
    from vitsee.analyses.views import load_view
    from vitsee.tui.dossier import section_of

    attention, skip = load_view(store, f"attention:{VIT}"), load_view(store, f"skip:{VIT}")
    assert block_of(attention.rows, "blocks.3.attn") == "blocks.3" and block_of(attention.rows, "blocks.30") is None
    for layer in ("patch_embed", "norm"):
        section = section_of(REGISTRY["attention"], VIT, layer, attention)
        assert not section.available and section.lines == [
            f"{layer} is not an attention block (blocks.0 \u2026 blocks.5 are)"
        ]
        section = section_of(REGISTRY["skip"], VIT, layer, skip)
        assert not section.available and section.lines == [f"{layer} has no residual sublayer"]


async def test_the_search_lists_what_it_counts_model_b_columns_and_models_included(store, tmp_path):
    """Issue 29 (6): `/layer3` said `2 matches (Enter)` over an empty list (the matches were model B's column layers,
    the list showed model A's rows only), and `/resnet` said `no match in this view` beside the model it listed."""
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        screen = app.screen
        view = screen.pane("cka").view
        await pilot.press("slash", *"layer3")
        columns = [c for c in view.cols if "layer3" in c]
        assert columns and side_list(app) == [f"{c} (B)" for c in columns]
        many = "es" if len(columns) > 1 else ""
        assert str(screen.query_one("#search-count").render()) == f"{len(columns)} match{many} (Enter)"
        # picking a listed column moves the cursor along its row to that column
        option_list = screen.query_one("#layers")
        option_list.focus()
        option_list.highlighted = len(columns) - 1
        await pilot.press("enter")
        await pilot.pause()
        assert screen.query_one("#cka-heatmap", Heatmap).cursor[1] == view.cols.index(columns[-1])
        await pilot.press("slash", *"resnet")
        assert side_list(app) == ["model test_resnet (random init)"]
        count = str(screen.query_one("#search-count").render())
        assert count == "1 model, no layer" and "no match" not in count


async def test_every_dossier_line_wraps_inside_its_box_at_80_columns(store, tmp_path):
    """Issue 29 (10): a dossier line ("95% bootstrap interval over 2 minibatches of images (rough: under 10 ...") ran
    past the box's edge, cut, instead of wrapping."""
    from vitsee.tui.screens.dossier import DossierScreen

    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("d")
        await settle(pilot, lambda a: isinstance(a.screen, DossierScreen) and a.screen.dossier is not None)
        labels = [label for section in app.screen.query("DossierSection") for label in section.query("Label")]
        long = [label for label in labels if len(str(label.render())) > labels[0].parent.content_size.width]
        assert long  # the cell's caption at least is longer than the box is wide
        for label in labels:
            assert label.outer_size.width <= label.parent.content_size.width, str(label.render())
        for label in long:
            assert label.outer_size.height > 1  # wrapped onto more lines, nothing cut

"""The app's Zoo view on a zoo of four tiny models (two ViTs, two ResNets): the heatmap in the clustering order with
the families on its columns, the status line's pair, value and interval, Enter opening the pair's CKA view, the
correspondence curves and their reference, labels apart from 80x24 up; and snapshots at 80x24 and 120x36.

Regenerate the snapshots after an intended change of the look with
`pytest tests/test_tui_zoo.py --snapshot-update` and look at the report before committing.
"""

from __future__ import annotations

import numpy as np

from helpers.app import make_app, settle, status, view_shown
from helpers.stores import ZOO_MODELS
from vitsee.output.labels import model_labels
from vitsee.analyses.views import load_view
from vitsee.tui.widgets.panes import TAB_LABELS
from vitsee.tui.widgets.side_panel import SidePanel

ZOO_KEY = str(list(TAB_LABELS).index("zoo") + 1)  # the number key the order of the tabs gives the Zoo tab


async def open_zoo(app, pilot) -> None:
    await settle(pilot, view_shown("cka"))
    await pilot.press(ZOO_KEY)
    await settle(pilot, view_shown("zoo"))


class TestZooView:
    async def test_rows_follow_the_clustering_and_columns_name_the_families(self, zoo_store, tmp_path):
        view = load_view(zoo_store, "zoo")
        order = view.extra["order"]
        app = make_app(zoo_store, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_zoo(app, pilot)
            pane = app.screen.pane("zoo")
            heatmap = pane.heatmap
            names = model_labels(ZOO_MODELS, 16)
            assert heatmap.row_labels == [names[i] for i in order]
            assert heatmap.col_labels == [view.extra["families"][i] for i in order]
            assert heatmap.matrix.tolist() == view.matrix[order][:, order].tolist()
            assert not pane.loaded.computed  # the cached zoo, not a new one
            # the side panel lists the models in the same order; picking one moves the cursor to its row
            panel = app.screen.query_one(SidePanel)
            assert panel.layer_names == [names[i] for i in order]
            assert pane.jump_to_layer(ZOO_MODELS[order[2]]) and heatmap.cursor[0] == 2

    async def test_the_status_line_names_the_pair_with_its_value_and_interval(self, zoo_store, tmp_path):
        view = load_view(zoo_store, "zoo")
        order = view.extra["order"]
        names = model_labels(ZOO_MODELS, 16)
        app = make_app(zoo_store, tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            await open_zoo(app, pilot)
            await pilot.press("down", "right", "right")
            await settle(pilot)
            i, j = order[1], order[2]
            families = view.extra["families"]
            p = view.extra["p_value"][i, j]
            assert status(app) == (
                f"{names[i]} x {names[j]}  best-match CKA {view.matrix[i, j]:.4f} "
                f"[{view.ci_low[i, j]:.3f}, {view.ci_high[i, j]:.3f}]  "
                f"calibrated {view.extra['calibrated'][i, j]:.3f} {'p<0.01' if p < 0.01 else f'p={p:.2f}'}  "
                f"{families[i]} x {families[j]}"
            )
            assert app.screen.pane("zoo").selection == (i, j)  # an export marks the cell in the store's order

    async def test_v_switches_the_heatmap_to_the_calibrated_values_and_back(self, zoo_store, tmp_path):
        view = load_view(zoo_store, "zoo")
        order = view.extra["order"]
        app = make_app(zoo_store, tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            await open_zoo(app, pilot)
            heatmap = app.screen.pane("zoo").heatmap
            await pilot.press("v")
            await settle(pilot)
            calibrated = np.asarray(view.extra["calibrated"])[np.ix_(order, order)]
            np.testing.assert_array_equal(heatmap.matrix, calibrated)
            assert heatmap.value_name == "calibrated best-match CKA"
            await pilot.press("v")
            await settle(pilot)
            assert heatmap.matrix.tolist() == view.matrix[order][:, order].tolist()

    async def test_enter_opens_the_pairs_cka_view_with_models_a_and_b_set(self, zoo_store, tmp_path):
        order = load_view(zoo_store, "zoo").extra["order"]
        app = make_app(zoo_store, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_zoo(app, pilot)
            await pilot.press("right", "enter")
            await settle(pilot, view_shown("cka"))
            screen = app.screen
            a, b = ZOO_MODELS[order[0]], ZOO_MODELS[order[1]]
            assert (screen.model_a, screen.model_b) == (a, b)
            assert screen.pane("cka").loaded.spec == f"cka:{a}:{b}"
            await pilot.press(ZOO_KEY, "left", "enter")  # the diagonal (the cursor stayed): the model with itself
            await settle(pilot, view_shown("cka"))
            assert screen.pane("cka").loaded.spec == f"cka:{a}" and screen.model_b is None

    async def test_the_curves_match_every_other_model_onto_the_reference_and_r_changes_it(self, zoo_store, tmp_path):
        view = load_view(zoo_store, "zoo")
        order = view.extra["order"]
        names = model_labels(ZOO_MODELS, 16)
        app = make_app(zoo_store, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_zoo(app, pilot)
            pane = app.screen.pane("zoo")
            plot = pane.query_one("LinePlot")
            assert pane.reference == 0 and [s.name for s in plot.series] == [names[i] for i in order if i != 0]
            first = next(s for s in plot.series if s.name == names[1])
            c = next(c for c in view.extra["correspondences"] if (c["a"], c["b"]) == (ZOO_MODELS[1], ZOO_MODELS[0]))
            shown = [v for v in first.values if v == v]  # a point per layer, at its relative depth
            assert shown == c["depth_b_path"]
            await pilot.press("r")
            nxt = order[(order.index(0) + 1) % 4]
            assert pane.reference == nxt and names[nxt] not in [s.name for s in plot.series]
            assert f"onto {names[nxt]}'s" in str(pane.query_one(".zoo--curves").render())

    async def test_labels_stand_apart_at_80x24(self, zoo_store, tmp_path):
        app = make_app(zoo_store, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_zoo(app, pilot)
            heatmap = app.screen.pane("zoo").heatmap
            for col in range(4):
                heatmap.cursor = (0, col)
                await settle(pilot)
                layout = heatmap._ensure_layout()
                axis = heatmap._col_axis(layout, col)
                spans = sorted((x, x + len(text)) for _, x, text in axis.placed)
                assert all(end < start for (_, end), (start, _) in zip(spans, spans[1:]))  # a blank between
                assert axis.text_of(col) == heatmap.col_labels[col]  # the cursor's family always shown
            assert len(set(heatmap._row_texts)) == 4  # four rows, four names
            assert "best-match CKA" in app.screen.query_one("#status-line").shown  # the value, not only the pair


async def test_m_summarises_the_next_measure_cached_and_its_own_scale(zoo_store, tmp_path):
    """m in the Zoo reads the zoo of the next layer x layer measure cached for every model (a distance here:
    minima, its own range and name on the legend), then comes back to CKA."""
    from vitsee.analyses.driver import run_analyses
    from vitsee.store import copy_store
    from helpers.stores import ZOO_CFG

    path = copy_store(zoo_store, tmp_path / "zoo.h5")
    run_analyses(path, ["procrustes"], ZOO_CFG)
    procrustes = load_view(path, "zoo", options={"zoo_measure": "procrustes"})
    order = procrustes.extra["order"]
    app = make_app(path, tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await open_zoo(app, pilot)
        pane = app.screen.pane("zoo")
        cka = pane.view.matrix.copy()
        await pilot.press("m")
        await settle(pilot, lambda a: pane.view is not None and pane.view.params["measure"] == "procrustes")
        heatmap = pane.heatmap
        assert heatmap.matrix.tolist() == procrustes.matrix[order][:, order].tolist()
        assert heatmap.value_name == "best-match Procrustes" and (heatmap._vmin, heatmap._vmax) == (None, None)
        assert "best-match Procrustes" in status(app) and "Zoo: best-match Procrustes" in pane.view.title
        assert ("Zoo: Procrustes", "information") in app.notes_seen
        await pilot.press("m")
        await settle(pilot, lambda a: pane.view is not None and pane.view.params["measure"] == "cka")
        assert pane.view.matrix.tolist() == cka.tolist() and pane.heatmap.value_name == "best-match CKA"
        assert (pane.heatmap._vmin, pane.heatmap._vmax) == (0.0, 1.0)


async def test_m_with_only_cka_cached_names_the_command_for_the_others(zoo_store, tmp_path):
    app = make_app(zoo_store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_zoo(app, pilot)
        await pilot.press("m")
        await settle(pilot, lambda a: any("measures" in m for m, _ in a.notes_seen))
        (note,) = [m for m, _ in app.notes_seen if "--measures" in m]
        assert note.startswith("only CKA is cached for every model: `vitsee analyze ")
        assert "--measures rbf_cka,procrustes" in note and note.endswith("then m shows them here")
        assert app.screen.pane("zoo").view.params["measure"] == "cka"


async def test_the_tab_computes_a_missing_zoo_from_the_cka_already_cached(store, tmp_path):
    from vitsee.store import Store, copy_store

    path = copy_store(store, tmp_path / "tiny.h5")  # CKA cached (batch 16, store order), no zoo
    with Store.open(path) as s:
        before = [r["params"] for r in s.results("cka")]
        assert not s.results("zoo") and all(p["batch_size"] == 16 for p in before)
    app = make_app(path, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_zoo(app, pilot)
        assert app.screen.pane("zoo").loaded.computed
    with Store.open(path) as s:
        assert [r["params"] for r in s.results("cka")] == before  # no other estimate computed (the app's is 256)
        (zoo,) = s.results("zoo")
    assert zoo["params"]["of"] in before and zoo["params"]["stats"]["ci"] == 0.95


def opened_zoo(*keys: str):
    async def run_before(pilot) -> None:
        await open_zoo(pilot.app, pilot)
        await pilot.press(*keys)
        await settle(pilot)

    return run_before


def test_zoo_at_80x24_snapshot(zoo_store, tmp_path, snap_compare):
    assert snap_compare(make_app(zoo_store, tmp_path), terminal_size=(80, 24), run_before=opened_zoo("down", "right"))


def test_zoo_at_120x36_snapshot(zoo_store, tmp_path, snap_compare):
    assert snap_compare(
        make_app(zoo_store, tmp_path), terminal_size=(120, 36), run_before=opened_zoo("down", "down", "right", "r")
    )


async def test_m_keeps_the_cursor_on_the_same_pair_of_models_when_the_next_measure_orders_them_otherwise(
    zoo_store, tmp_path
):
    """Issue 29 (10): `m` in the Zoo moved the cursor to another pair: the heatmap kept the cursor's row and column
    while the next measure's clustering put other models there."""
    from vitsee.analyses.driver import run_analyses
    from vitsee.store import copy_store
    from helpers.stores import ZOO_CFG

    path = copy_store(zoo_store, tmp_path / "zoo.h5")
    run_analyses(path, ["procrustes"], ZOO_CFG)
    cka_order = load_view(path, "zoo").extra["order"]
    procrustes_order = load_view(path, "zoo", options={"zoo_measure": "procrustes"}).extra["order"]
    # a cell whose row and column hold another pair of models in the other measure's order
    row, col = next(
        (r, c)
        for r in range(4)
        for c in range(4)
        if (cka_order[r], cka_order[c]) != (procrustes_order[r], procrustes_order[c])
    )
    app = make_app(path, tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await open_zoo(app, pilot)
        pane = app.screen.pane("zoo")
        await pilot.press(*["down"] * row, *["right"] * col)
        await settle(pilot)
        pair = (cka_order[row], cka_order[col])
        assert pane.selection == pair
        before = status(app).split("  ")[0]  # 'vit_a x resnet_b'
        await pilot.press("m")
        await settle(pilot, lambda a: pane.view is not None and pane.view.params["measure"] == "procrustes")
        assert pane.selection == pair and status(app).split("  ")[0] == before
        assert pane.heatmap.cursor == (procrustes_order.index(pair[0]), procrustes_order.index(pair[1]))


async def test_a_view_refused_while_another_writer_holds_the_store_is_read_once_it_lets_go(store, tmp_path):
    """Issue 29 (7): the Zoo tab kept "store is being written by process ... (vitsee analyze)" 5, 15 and 30 s after
    the writer ended, until one left the tab and came back. The explorer watches the lock and reads the view again."""
    from vitsee.store import Store, WriteLock, copy_store

    path = copy_store(store, tmp_path / "tiny.h5")  # CKA cached, no zoo: the tab computes it, under the store's lock
    writer = WriteLock(path, "vitsee analyze")  # as another process's analysis holds it
    app = make_app(path, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press(ZOO_KEY)
        await settle(pilot, lambda a: "is being written by" in status(a) and a.screen.kind == "zoo")
        assert app.screen.pane("zoo").loaded is None
        writer.release()
        await settle(pilot, view_shown("zoo"), timeout=30, idle=False)
        assert app.screen.pane("zoo").loaded.computed and "being written" not in status(app)
    with Store.open(path) as s:
        assert s.results("zoo")

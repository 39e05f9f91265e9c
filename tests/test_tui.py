"""vitsee-tui driven by Textual's Pilot on a tiny analysed store: what a researcher sees and can do.

Most tests open a store whose analyses are already cached (the app must read, never compute); one opens a
store with nothing cached and watches the view being computed in a worker and cached.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import RESNET, VIT, run_cli
from helpers.app import CACHED, SIZE, cka_status, make_app, notifications, same_as_a, settle, status, view_shown
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.output.colormap import ColorMode
from vitsee.store import Store
from vitsee.analyses.views import load_view
from vitsee.tui.app import VitseeApp, build_app, main, parse_args
from vitsee.tui.screens.explorer import ExplorerScreen
from vitsee.tui.widgets.heatmap import UPPER_HALF, Heatmap

# --- opening -----------------------------------------------------------------------------------------------


async def test_opening_a_store_of_two_models_shows_their_cross_model_cka(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        screen = app.screen
        view = screen.pane("cka").view
        assert view.kind == "cka" and view.models == [VIT, RESNET]
        heatmap = screen.query_one("#cka-heatmap", Heatmap)
        assert app.focused is heatmap
        assert status(app) == f"patch_embed x maxpool  CKA {view.matrix[0, 0]:.4f}{view.interval_text(0, 0)}"
        assert not screen.pane("cka").loaded.computed  # read from the cache, not recomputed
        assert "test_vit (random init), seed 0" in str(screen.query_one("#title-bar").render())  # display names
        assert screen.query_one("#model-b").value == RESNET  # the side panel says so too


async def test_arrow_keys_move_the_cursor_and_the_status_line_names_the_pair_with_the_exported_value(
    store, tmp_path, capsys
):
    out = tmp_path / "cka.json"
    code, _, err = run_cli(
        ["export", store, f"cka:{VIT}", "--out", out, "--batch-size", "16", "--shuffles", "0"], capsys
    )
    assert code == 0, err
    exported = json.loads(out.read_text())
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await same_as_a(pilot)
        await pilot.press("right")
        row, col = 0, 1
        assert status(app) == cka_status(exported, row, col)
        await pilot.press("down", "down", "l", "j")
        row, col = 3, 2
        assert app.screen.query_one(Heatmap).cursor == (row, col)
        assert status(app) == cka_status(exported, row, col)
        assert status(app).startswith("blocks.2 x blocks.1  CKA ")


async def test_enter_opens_the_pair_detail_with_both_shapes_and_the_value(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await same_as_a(pilot)
        await pilot.press("down", "right", "right", "enter")
        await pilot.pause()
        from vitsee.tui.screens.pair_detail import PairDetailScreen

        detail = app.screen
        assert isinstance(detail, PairDetailScreen)
        text = " ".join(str(w.render()) for w in detail.query("Label, Static"))
        with Store.open(store) as s:
            shape_row, shape_col = s.layer_shape(VIT, "blocks.0"), s.layer_shape(VIT, "blocks.1")
        value = detail.loaded.view.matrix[1, 2]
        assert f"blocks.0 x blocks.1  CKA {value:.4f}" in text
        assert " x ".join(map(str, shape_row)) in text and " x ".join(map(str, shape_col)) in text
        plots = detail.query("LinePlot")
        assert len(plots) == 2 and plots.first().mark == 2  # the column is marked in the row's plot
        await pilot.press("escape")
        assert isinstance(app.screen, ExplorerScreen)


async def test_b_goes_from_model_b_to_same_as_a_and_back_skipping_model_a_by_name(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        specs = []
        for _ in range(3):
            await pilot.press("b")
            await settle(pilot, view_shown("cka"))
            specs.append(app.screen.pane("cka").loaded.spec)
        # A by name would draw the same matrix as 'same as A': every press changes what is shown
        assert specs == [f"cka:{VIT}", f"cka:{VIT}:{RESNET}", f"cka:{VIT}"]
        assert status(app).startswith("patch_embed x patch_embed  CKA ")
        await pilot.press("b")
        await settle(pilot, lambda a: a.screen.pane("cka").loaded.spec == f"cka:{VIT}:{RESNET}")
        view = app.screen.pane("cka").view
        with Store.open(store) as s:
            assert view.rows == s.layers(VIT) and view.cols == s.layers(RESNET)
        assert status(app).startswith("patch_embed x maxpool  CKA ")


# --- every view ------------------------------------------------------------------------------------------------


async def test_number_keys_switch_views_and_each_shows_its_content(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("2")
        await settle(pilot, view_shown("attention"))
        pane = app.screen.pane("attention")
        assert app.screen.query_one("#panes").current == "pane-attention"
        assert status(app).startswith("blocks.0 head ") and "uniform 32.1 px" in status(app)
        await pilot.press("down")
        assert status(app).startswith("blocks.1 head ")
        histogram = pane.query_one("Histogram")
        assert histogram.counts.sum() == 48 * 2  # images x heads of blocks.1
        assert np.array_equal(histogram.counts, np.asarray(pane.view.extra["hist_counts"])[1])

        await pilot.press("3")
        await settle(pilot, view_shown("probes"))
        table = app.screen.query_one("#probes-table")
        assert table.row_count == len(app.screen.pane("probes").view.rows)
        assert "accuracy" in status(app) and "chance" in status(app)

        await pilot.press("4")
        await settle(pilot, view_shown("skip"))
        assert app.screen.query_one("#skip-heatmap", Heatmap).matrix.shape == (12, 17)
        assert status(app).startswith("blocks.0.attn x CLS  ratio ")

        await pilot.press("5")
        await settle(pilot, view_shown("spatial"))
        heatmap = app.screen.query_one("#spatial-heatmap", Heatmap)
        assert heatmap.matrix.shape == (4, 4)
        view = app.screen.pane("spatial").view
        await pilot.press("right", "down")  # token r1c1 = 5: the map is that token's row of the result
        assert np.allclose(heatmap.matrix.ravel(), view.matrix[5])
        assert status(app).startswith("token r1c1 x patch r1c1  CKA ")

        await pilot.press("1")
        assert app.screen.query_one("#panes").current == "pane-cka"
        assert status(app).startswith("patch_embed x maxpool  CKA ")


async def test_a_view_that_does_not_apply_says_why(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("a")  # model A: the ResNet, which has no attention
        await settle(pilot, lambda a: a.screen.pane("cka").loaded.spec == f"cka:{RESNET}")
        await pilot.press("2")
        await settle(pilot)
        # the analysis's one reason (as `vitsee analyze --attention` and the dossier say it), and the key to a model
        # it fits
        assert status(app) == (
            f"{RESNET} has no attention distances (resnet model): they exist for ViT- and Swin-like "
            f"models only; press a to pick {VIT} as model A"
        )


async def test_the_skip_view_of_a_random_init_resnet_says_timm_zeroes_its_branches(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("4")  # the ViT first: its branches are not zero, no note
        await settle(pilot, view_shown("skip"))
        assert not app.screen.query_one("#skip-note").display
        assert "timm initialises" not in status(app)
        await pilot.press("a")
        await settle(pilot, lambda a: view_shown("skip")(a) and a.screen.pane("skip").view.models == [RESNET])
        pane = app.screen.pane("skip")
        assert not np.isfinite(pane.view.matrix).any()  # what the note explains: every ratio ||z||/0
        note = pane.query_one("#skip-note")
        assert note.display and "\u2016f(z)\u2016 = 0: timm initialises this branch to zero" in str(note.render())
        assert status(app).endswith("\u2016f(z)\u2016 = 0: timm initialises this branch to zero")


async def test_picking_a_layer_in_the_side_panel_moves_the_cursor_there(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await same_as_a(pilot)
        layers = app.screen.query_one("#layers")
        layers.focus()
        layers.highlighted = 4  # blocks.3
        await pilot.press("enter")
        assert app.screen.query_one(Heatmap).cursor[0] == 4
        assert status(app).startswith("blocks.3 x patch_embed")
        assert app.focused is app.screen.query_one(Heatmap)


# --- export ----------------------------------------------------------------------------------------------------


async def test_e_writes_a_png_and_a_json_with_the_stores_numbers_and_the_cursor_cell(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await same_as_a(pilot)
        await pilot.press("down", "right", "right", "e")
        await settle(pilot, lambda a: any("exported" in m for m, _ in notifications(a)))
        said = [m for m, _ in notifications(app) if "exported" in m]
    files = sorted((tmp_path / "exports").iterdir())
    png = next(p for p in files if p.suffix == ".png")
    data = json.loads(next(p for p in files if p.suffix == ".json").read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    from PIL import Image

    with Image.open(png) as image:
        assert image.size[0] > 200 and image.size[1] > 200
    expected = load_view(store, f"cka:{VIT}", CACHED)
    assert np.allclose(np.array(data["values"], dtype=float), expected.matrix, equal_nan=True)
    assert data["rows"] == expected.rows and data["selection"]["row"] == 1 and data["selection"]["col"] == 2
    assert png.name in said[0] and str(tmp_path / "exports") in said[0]  # the notification names the file


async def test_each_view_exports_its_own_numbers(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        for key, kind in (("2", "attention"), ("4", "skip")):
            await pilot.press(key)
            await settle(pilot, view_shown(kind))
            await pilot.press("e")
            await settle(pilot, lambda a, kind=kind: any(kind in m and "exported" in m for m, _ in notifications(a)))
    written = {p.name.split("-")[0] for p in (tmp_path / "exports").glob("*.json")}
    assert written == {"attention", "skip"}
    data = json.loads(next((tmp_path / "exports").glob("attention-*.json")).read_text())
    assert np.allclose(np.array(data["values"]), load_view(store, f"attention:{VIT}", CACHED).matrix)


# --- broken stores -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
async def test_a_missing_or_corrupt_store_is_a_notification_not_a_crash(kind, tmp_path):
    path = tmp_path / "broken.h5"
    if kind == "corrupt":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        errors = [m for m, severity in notifications(app) if severity == "error"]
        assert len(errors) == 1 and str(path) in errors[0]
        assert ("does not exist" if kind == "missing" else "not a readable vitsee store") in errors[0]
        await pilot.press("2", "right", "e")  # keys on a broken store do nothing harmful
        await settle(pilot)
        assert app.is_running


async def test_an_incomplete_store_says_how_far_extraction_got_and_how_to_resume(store, tmp_path):
    path = tmp_path / "interrupted.h5"
    shutil.copy(store, path)
    with h5py.File(path, "r+") as f:  # as if killed during the last batch of the ResNet
        f[f"models/{RESNET}/done"][-1] = 0
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        message = f"extraction incomplete: 32 of 48 images; R resumes it (or `vitsee extract {path}`)"
        assert (message, "error") in notifications(app)
        await pilot.press("a")  # the ResNet's views say it too instead of failing
        await settle(pilot)
        assert message in status(app)


# --- computing what is not cached -------------------------------------------------------------------------------


async def test_a_view_not_cached_is_computed_in_a_worker_and_cached(tiny_store, tmp_path):
    path = tmp_path / "fresh.h5"
    shutil.copy(tiny_store, path)
    with Store.open(path) as s:
        assert not s.results("cka")
    app = make_app(path, tmp_path)
    steps = []
    async with app.run_test(
        size=SIZE, message_hook=lambda m: steps.append(m) if type(m).__name__ == "AnalysisStep" else None
    ) as pilot:
        await settle(pilot, view_shown("cka"), timeout=60)
        assert app.screen.pane("cka").loaded.computed
        assert steps and steps[-1].done == steps[-1].total  # progress reached the bar
        assert not app.screen.query_one("#view-task").running
        assert any("computed and cached" in m for m, _ in notifications(app))
        text = status(app)
    with Store.open(path) as s:
        assert len(s.results("cka")) == 1
    view = load_view(path, f"cka:{VIT}:{RESNET}")  # the CLI's defaults: what the app computed with
    assert text == f"patch_embed x maxpool  CKA {view.matrix[0, 0]:.4f}{view.interval_text(0, 0)}"


def test_a_cancelled_computation_stops_at_its_next_step_and_caches_nothing(tiny_store, tmp_path):
    from vitsee.tui.results import Cancelled, read_view

    path = tmp_path / "fresh.h5"
    shutil.copy(tiny_store, path)
    steps = []
    with pytest.raises(Cancelled):
        read_view(
            path, f"cka:{VIT}", AnalyzeConfig(batch_size=16), progress=steps.append, cancelled=lambda: len(steps) >= 1
        )
    assert len(steps) == 1  # one batch done, then it stopped
    with Store.open(path) as s:
        assert s.results() == []
    loaded = read_view(path, f"cka:{VIT}", AnalyzeConfig(batch_size=16))  # the store is still writable
    assert loaded.computed and loaded.view.matrix.shape == (8, 8)


async def test_a_probe_job_expected_to_take_over_a_minute_is_announced_with_the_ways_to_narrow_it(
    tiny_store, tmp_path, monkeypatch
):
    from vitsee.analyses import probes

    path = tmp_path / "fresh.h5"
    shutil.copy(tiny_store, path)
    monkeypatch.setattr(probes, "matmul_flops_per_s", lambda device="cpu": 1e6)  # estimates: hours
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda app: app.screen.summary is not None, timeout=30, idle=False)
        await pilot.press("3")  # the probes view: not cached, so it starts computing
        await settle(
            pilot, lambda app: any("--probe-max-dim" in m for m, _ in notifications(app)), timeout=30, idle=False
        )
        warning, severity = next((m, s) for m, s in notifications(app) if "--probe-max-dim" in m)
        await pilot.press("x")  # cancel: the warning says so
        await settle(pilot, timeout=60)
    assert severity == "warning" and "probes of" in warning and "x cancels" in warning


# --- terminals --------------------------------------------------------------------------------------------------


def test_no_mouse_turns_mouse_reporting_off(store, monkeypatch):
    calls = {}
    monkeypatch.setattr(VitseeApp, "run", lambda self, **kw: calls.update(kw))
    with pytest.raises(SystemExit) as exit_info:
        main([str(store), "--no-mouse"])
    assert exit_info.value.code == 0 and calls["mouse"] is False
    with pytest.raises(SystemExit):
        main([str(store)])
    assert calls["mouse"] is True


def test_color_flag_and_no_color_pick_the_heatmap_colour_mode(store, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("VITSEE_COLOR", raising=False)
    assert build_app(parse_args([str(store), "--color", "none"])).options.color_mode is ColorMode.NONE
    assert build_app(parse_args([str(store), "--color", "256"])).options.color_mode is ColorMode.COLORS_256
    monkeypatch.setenv("NO_COLOR", "1")
    assert build_app(parse_args([str(store)])).options.color_mode is ColorMode.NONE


async def test_color_none_draws_the_heatmap_with_ascii_and_keeps_the_status_line(store, tmp_path):
    app = make_app(store, tmp_path, color=ColorMode.NONE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await same_as_a(pilot)
        heatmap = app.screen.query_one(Heatmap)
        assert heatmap.color_mode is ColorMode.NONE
        lines = "".join(heatmap.render_line(y).text for y in range(heatmap.size.height))
        assert UPPER_HALF not in lines and "@" in lines  # the densest ASCII level: CKA of a layer with itself
        await pilot.press("right")
        assert status(app).startswith("patch_embed x blocks.0  CKA ")


async def test_the_app_fits_80x24_and_q_quits(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, view_shown("cka"))
        heatmap = app.screen.query_one(Heatmap)
        assert heatmap.size.width >= 40 and heatmap.size.height >= 12
        await pilot.press("end")
        assert status(app).startswith("norm x maxpool  CKA ")
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


# --- keys, help, palette ----------------------------------------------------------------------------------------


async def test_help_lists_the_keys_of_the_focused_view(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("question_mark")
        from vitsee.tui.screens.help import HelpScreen

        assert isinstance(app.screen, HelpScreen)
        rows = {(k.keys, k.binding_id) for k in app.screen.keys}
        assert ("\u2192 / l", "heatmap.right") in rows
        assert ("e", "explorer.export") in rows and ("q / ^q", "app.quit") in rows and ("z", "heatmap.zoom") in rows
        groups = {k.binding_id: k.group for k in app.screen.keys}
        assert (
            groups["heatmap.right"],
            groups["explorer.view_cka"],
            groups["explorer.model_b"],
            groups["heatmap.zoom"],
            groups["app.quit"],
        ) == ("Move", "Views", "Models", "This view", "App")
        assert app.screen.title_text == "CKA view (test_vit (random init) x test_resnet (random init))"
        await pilot.press("escape")
        assert isinstance(app.screen, ExplorerScreen)


async def test_the_command_palette_offers_views_models_export_and_zoom(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        from vitsee.tui.commands import VitseeCommands

        names = [name for name, _, _ in VitseeCommands(app.screen)._commands()]
        for wanted in (
            "View: Attention",
            "Export view to PNG + JSON",
            "Toggle zoom",
            "Model A: test_resnet (random init)",
            "Model B: test_resnet (random init)",
            "Open store list",
        ):
            assert wanted in names
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"zoom")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.query_one(Heatmap).zoom == "1:1"


# --- start screen, new run, demo -------------------------------------------------------------------------------


async def test_without_a_store_the_start_screen_lists_the_stores_here_newest_first(store, tmp_path):
    older, newer = tmp_path / "older.h5", tmp_path / "newer.h5"
    shutil.copy(store, older)
    shutil.copy(store, newer)
    import os

    os.utime(older, (time.time() - 100, time.time() - 100))
    app = make_app(None, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        from vitsee.tui.screens.start import StartScreen

        assert isinstance(app.screen, StartScreen)
        options = app.screen.query_one("#stores").options
        assert [Path(o.id).name for o in options] == ["newer.h5", "older.h5"]
        await pilot.press("enter")
        await settle(pilot, view_shown("cka"))
        assert app.screen.path == newer
        await pilot.press("o")  # the store list again, from the explorer; the other store replaces this one
        await settle(pilot)
        assert isinstance(app.screen, StartScreen)
        await pilot.press("down", "enter")
        await settle(pilot, view_shown("cka"))
        assert app.screen.path == older and len(app.screen_stack) == 2


async def open_form(app, pilot, models):
    """Opens the new-run form from the start screen, picks `models` in its searchable list, returns the form."""
    from vitsee.tui.screens.new_run import NewRunScreen

    await settle(pilot)
    await pilot.press("n")
    await pilot.pause()
    form = app.screen
    assert isinstance(form, NewRunScreen)
    for spec in models:
        form.query_one("#model-search").value = spec
        await pilot.press("enter")
    return form


async def test_a_new_run_from_the_form_extracts_shows_progress_and_opens_the_store(tmp_path, monkeypatch):
    app = make_app(None, tmp_path)
    events = []
    kept = ("RunEvent", "ResultCached")
    async with app.run_test(
        size=SIZE, message_hook=lambda m: events.append(m) if type(m).__name__ in kept else None
    ) as pilot:
        form = await open_form(app, pilot, (VIT, RESNET))
        form.query_one("#dataset").value = "synthetic"
        form.query_one("#n-images").value = "32"
        form.query_one("#img-size").value = "64"
        form.query_one("#device").value = "cpu"
        target = tmp_path / "run.h5"
        form.query_one("#store-path").value = str(target)
        assert form.fields()["models"] == [VIT, RESNET]
        await pilot.press("f2")  # the size on disk, before anything is written
        await settle(
            pilot, lambda a: "expected size on disk" in str(a.screen.query_one("#size-line").render()), timeout=60
        )
        assert "32 images x 2 model(s)" in str(form.query_one("#size-line").render()) and not target.exists()
        await pilot.press("ctrl+s")
        await settle(pilot, view_shown("cka"), timeout=90, idle=False)
        runs = [e for e in events if type(e).__name__ == "RunEvent"]
        plan = [e.text for e in runs if e.stage == "plan" and "expected size on disk" in e.text]
        extract = [(e.done, e.total) for e in runs if e.stage == "extract"]
        assert plan and extract[-1] == (32, 32) and len(extract) >= 3  # the bar moved batch by batch
        assert target.exists()
        with Store.open(target) as s:
            assert s.models == [VIT, RESNET] and s.complete
        await settle(
            pilot,
            lambda a: f"spatial:{VIT}" in [m.spec for m in events if type(m).__name__ == "ResultCached"],
            timeout=90,
            idle=False,
        )
        cached = list(dict.fromkeys(m.spec for m in events if type(m).__name__ == "ResultCached"))
        assert cached[:2] == [f"cka:{VIT}", f"cka:{VIT}:{RESNET}"]  # views fill in one by one, CKA first
        with Store.open(target) as s:  # the background pass caches every view (probes, the slowest, last)
            assert {"cka", "attention", "skip", "spatial"} <= {r["analysis"] for r in s.results()}


async def test_a_streaming_run_from_the_form_keeps_results_only_and_says_why_probes_and_maps_are_missing(tmp_path):
    app = make_app(None, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(app, pilot, (VIT,))
        form.query_one("#dataset").value = "synthetic"
        form.query_one("#n-images").value = "24"
        form.query_one("#img-size").value = "64"
        form.query_one("#device").value = "cpu"
        form.query_one("#keep").value = "streaming"
        target = tmp_path / "streamed.h5"
        form.query_one("#store-path").value = str(target)
        assert form.fields()["streaming"] is True
        await pilot.press("f2")
        await settle(
            pilot, lambda a: "expected size on disk" in str(a.screen.query_one("#size-line").render()), timeout=60
        )
        assert "activations not stored" in str(form.query_one("#size-line").render())
        await pilot.press("ctrl+s")
        await settle(pilot, view_shown("cka"), timeout=90, idle=False)
        await settle(pilot, timeout=90)
        with Store.open(target) as s:
            assert s.streaming and s.complete and s.labels is not None  # labelled images, yet no probes
        streamed = load_view(target, f"cka:{VIT}").matrix  # the CKA accumulated during the pass
        await pilot.press("down", "right", "right")
        await settle(pilot)
        assert status(app) == f"blocks.0 x blocks.1  CKA {streamed[1, 2]:.4f}"
        for key, what in (("3", "linear probes cannot be fitted"), ("5", "spatial maps cannot be computed")):
            await pilot.press(key)
            await settle(pilot)  # the analysis's one reason, as `vitsee analyze --probes` says it
            assert status(app) == (
                f"{target} was extracted with --streaming, which keeps no activations, so {what}: "
                "re-extract without --streaming into another store"
            )
        await pilot.press("2")
        await settle(pilot, view_shown("attention"))  # the statistics streamed during the pass are there


async def test_the_form_streams_head_level_cka_for_a_vit_and_another_model_and_says_what_one_model_lacks(tmp_path):
    from vitsee.tui.screens.new_run import extract_config

    app = make_app(None, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await open_form(app, pilot, (VIT,))
        form.query_one("#keep").value = "streaming-heads"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form  # refused before anything starts
        assert notifications(app)[-1] == (
            "head-level CKA compares a ViT's heads with another model's layers: add a "
            "second model (e.g. resnet18), or stream results only",
            "error",
        )
        form.query_one("#model-search").value = RESNET
        await pilot.press("enter")
        fields = form.fields()
        assert fields["streaming"] is True and fields["heads"] is True
        cfg = extract_config(fields)  # what the run's worker builds: vitsee extract --streaming --heads
        assert cfg.streaming and cfg.heads and cfg.models == [VIT, RESNET]
        form.query_one("#keep").value = "streaming"
        assert form.fields()["heads"] is False
        form.query_one("#keep").value = "activations"
        assert form.fields()["streaming"] is False and form.fields()["heads"] is False


async def test_the_demo_trains_its_models_once_in_the_cache_folder_says_trained_here_and_opens(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    small = {
        "models": ("test_vit", "test_resnet"),
        "batch_size": 8,
        "train_n_images": 60,
        "train_epochs": 1,
        "trained": (("test_vit", {"patch_size": 8, "depth": 2}), ("test_resnet", {})),
    }
    monkeypatch.setattr(VitseeApp, "demo_overrides", small)
    created = []
    for attempt in ("build", "reuse"):
        app = make_app(None, tmp_path, demo=True)
        events = []
        async with app.run_test(
            size=SIZE, message_hook=lambda m: events.append(m) if type(m).__name__ == "RunEvent" else None
        ) as pilot:
            await settle(pilot, view_shown("cka"), timeout=180)
            folder = tmp_path / "cache" / "vitsee"
            stores = list(folder.glob("demo-*.h5"))
            assert [p.name for p in stores] == ["demo-trained-digits32-e1-s0.h5"]
            assert sorted(p.name for p in folder.glob("*.safetensors")) == [  # each model and its untrained twin
                "demo-test_resnet-digits32-e1-s0-init.safetensors",
                "demo-test_resnet-digits32-e1-s0.safetensors",
                "demo-test_vit-digits32-e1-s0-init.safetensors",
                "demo-test_vit-digits32-e1-s0.safetensors",
            ]
            assert [m.key.rpartition("-")[2] for m in app.screen.summary.models] == ["s0", "s0", "init", "init"]
            notes = [m for m, _ in notifications(app) if m.startswith("demo store")]
            assert notes and "test_vit and test_resnet trained here on digits at 32 px" in notes[0]
            assert notes[0].endswith("beside each, its random-init twin (the Zoo view)")
            assert "pretrained" not in notes[0].replace("no pretrained weights", "")
            title = str(app.screen.query_one("#title-bar").render())
            assert "ViT (trained here) on digits (48 images, 1 epochs" in title  # its display name, then the run
            trained = [e for e in events if e.stage == "build"]  # the whole build's one bar while training
            extracted = [e for e in events if e.stage == "extract"]
            # progress shown while training and building, none on reuse
            assert bool(trained) == bool(extracted) == (attempt == "build")
            if trained:  # one bar for the whole build: its total fixed, never going back, saying what comes next
                assert len({e.total for e in trained}) == 1
                assert [e.done for e in trained] == sorted(e.done for e in trained)
                assert "then training the ResNet, extracting 4 models" in trained[0].text
            # a later launch opens the store the first one opened without a run screen (its checks come after the
            # first view: they import timm and may wait on the Hub), and the checks find it is still the one
            assert bool(events) == (attempt == "build")
            assert json.loads((folder / "demo-last.json").read_text())["store"] == str(stores[0].resolve())
            assert isinstance(app.screen, ExplorerScreen) and app.screen.path == stores[0].resolve()
        # without HDF5's lock, as vitsee opens its files: a check the app started may still hold the store open
        with h5py.File(stores[0], "r", locking=False) as f:
            created.append(f.attrs["created"])
    assert created[0] == created[1]


async def test_a_remembered_demo_store_its_checks_no_longer_pick_is_shown_then_the_picked_one_is_built(
    store, tmp_path, monkeypatch
):
    from vitsee.tui import demo
    from vitsee.tui.screens.run import RunScreen

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    small = {
        "models": ("test_vit", "test_resnet"),
        "batch_size": 8,
        "train_n_images": 60,
        "train_epochs": 1,
        "trained": (("test_vit", {"patch_size": 8, "depth": 2}), ("test_resnet", {})),
    }
    monkeypatch.setattr(VitseeApp, "demo_overrides", small)
    old = shutil.copy(store, tmp_path / "demo-older.h5")  # e.g. made by an older recipe: another file name
    demo.remember(old, "demo store of an older recipe")
    app = make_app(None, tmp_path, demo=True)
    shown = []
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda a: view_shown("cka")(a) or isinstance(a.screen, RunScreen), timeout=60, idle=False)
        shown.append(app.screen.path)  # the remembered store's heatmap, before any check ran
        await settle(pilot, lambda a: isinstance(a.screen, RunScreen), timeout=60, idle=False)
        picked = tmp_path / "cache" / "vitsee" / "demo-trained-digits32-e1-s0.h5"
        assert (f"the demo's checks pick {picked}: building it", "information") in notifications(app)
        await settle(pilot, view_shown("cka"), timeout=180)
        assert app.screen.path == picked and picked.exists()
    assert shown == [Path(old)]
    assert demo.last_opened().store == picked.resolve()

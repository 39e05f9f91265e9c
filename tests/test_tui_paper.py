"""The app's Heads (paper Fig. 5) and ERF (Fig. 6) views on a tiny store with both results cached."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import RESNET, VIT
from helpers.app import SIZE, make_app, settle, status, view_shown
from vitsee.tui.widgets.head_scatter import HeadScatter
from vitsee.tui.widgets.heatmap import Heatmap


async def test_heads_view_scatters_heads_and_names_head_distance_and_cka(paper_store, tmp_path):
    app = make_app(paper_store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("6")
        await settle(pilot, view_shown("heads"))
        pane = app.screen.pane("heads")
        view = pane.view
        assert pane.loaded.spec == f"heads:{VIT}:{RESNET}" and not pane.loaded.computed
        col = int(view.extra["scatter_col"])
        line = status(app)
        assert re.fullmatch(
            rf"blocks\.0\.head\.0  distance \d+\.\d px  CKA vs {re.escape(view.cols[col])} -?\d\.\d\d", line
        ), line
        assert f"{view.extra['distance_px'][0]:.1f} px" in line and f"{view.matrix[0, col]:.2f}" in line
        await pilot.press("down")
        assert status(app).startswith("blocks.0.head.1  distance ")
        await pilot.press("]")  # the other model's next layer
        assert f"CKA vs {view.cols[(col + 1) % len(view.cols)]} " in status(app)
        assert pane.selection == (1, (col + 1) % len(view.cols))
        await pilot.press("right")  # the head with the next longer distance
        order = np.argsort(view.extra["distance_px"], kind="stable")
        nxt = int(order[(list(order).index(1) + 1) % len(order)])
        assert status(app).startswith(f"{view.rows[nxt]}  distance ")
        text = str(app.screen.query_one(HeadScatter).render())
        assert "mean attention distance" in text and "0" in text


async def test_erf_view_shows_a_layer_picked_in_the_side_panel_with_a_log_scale_key(paper_store, tmp_path):
    app = make_app(paper_store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("7")
        await settle(pilot, view_shown("erf"))
        pane = app.screen.pane("erf")
        heatmap = app.screen.query_one("#erf-heatmap", Heatmap)
        assert heatmap.matrix.shape == (64, 64)
        peak = float(np.nanmax(pane.view.matrix))
        assert heatmap.matrix.max() == pytest.approx(np.log10(peak))  # log colours by default
        assert status(app).startswith("patch_embed  pixel row ")
        await pilot.press("g")
        assert heatmap.matrix.max() == pytest.approx(peak)
        layers = app.screen.query_one("#layers")
        assert [str(o.prompt) for o in layers.options][:3] == ["patch_embed", "blocks.0", "blocks.1"]
        layers.focus()
        layers.highlighted = 3  # blocks.2
        await pilot.press("enter")
        await settle(pilot, lambda a: a.screen.pane("erf").loaded.spec == f"erf:{VIT}:blocks.2")
        assert status(app).startswith("blocks.2  pixel row ")
        assert np.allclose(app.screen.query_one("#erf-heatmap", Heatmap).matrix, pane.view.matrix)  # still linear


async def test_heads_view_of_a_resnet_says_why(paper_store, tmp_path):
    app = make_app(paper_store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("a")  # model A: the ResNet
        await settle(pilot, lambda a: a.screen.pane("cka").loaded.spec == f"cka:{RESNET}")
        await pilot.press("6")
        await settle(pilot)
        assert "no stored head outputs" in status(app)

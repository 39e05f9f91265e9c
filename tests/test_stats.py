"""Confidence intervals and permutation p-values: against direct, brute-force references on small inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats as sps

from conftest import VIT, run_cli
from vitsee.analyses import driver as an
from vitsee.analyses.attention import run_attention
from vitsee.analyses.cka import cka_params, run_cka
from vitsee.analyses.probes import run_probes
from vitsee.analyses.skip import run_skip
from vitsee import stats
from vitsee.analyses.cka import MinibatchCKA, unbiased_hsic
from vitsee.errors import VitseeError
from vitsee.store import Store


def _related(n: int, seed: int) -> list[np.ndarray]:
    """Three layers of n examples: x, y = a noisy linear map of x, and an unrelated z."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12))
    y = x @ rng.normal(size=(12, 9)) + 2.0 * rng.normal(size=(n, 9))
    return [x, y, rng.normal(size=(n, 7))]


def _accumulate(feats, batch: int, **kw) -> MinibatchCKA:
    n = len(feats[0])
    acc = MinibatchCKA(len(feats), batch_slots=-(-n // batch), **kw)
    for s in range(0, n, batch):
        acc.update([f[s : s + batch] for f in feats])
    return acc


def _fp64_cka(batches: list[list[np.ndarray]]) -> np.ndarray:
    """Song's explicit formula per batch and pair, in fp64: the reference the accumulator must match."""
    L = len(batches[0])
    hsic = np.zeros((L, L))
    for b in batches:
        grams = [torch.as_tensor(f.reshape(len(f), -1) @ f.reshape(len(f), -1).T) for f in b]
        hsic += np.array([[unbiased_hsic(gi, gj) for gj in grams] for gi in grams])
    d = np.sqrt(np.diag(hsic))
    return hsic / np.outer(d, d)


def test_keeping_statistics_leaves_the_cka_bit_identical():
    feats = _related(96, 0)
    plain = MinibatchCKA(3)
    for s in range(0, 96, 32):
        plain.update([f[s : s + 32] for f in feats])
    kept = _accumulate(feats, 32, permutations=9, seed=3)
    assert np.array_equal(plain.result(), kept.result())
    np.testing.assert_allclose(kept.batch_hsic.sum(dim=0).numpy(), kept.hsic_sums.numpy(), rtol=1e-12)


def test_batch_bootstrap_equals_a_direct_bootstrap_over_the_batches():
    feats, batch, reps, seed = _related(80, 1), 16, 60, [7, 0]
    acc = _accumulate(feats, batch)
    got = acc.statistics(0.9, reps, seed)
    batches = [[f[s : s + batch] for f in feats] for s in range(0, 80, batch)]
    direct = np.stack(
        [
            _fp64_cka([batches[i] for i in idx])  # recompute every Gram of every resampled batch
            for idx in stats.bootstrap_indices(len(batches), reps, seed)
        ]
    )
    low, high = np.quantile(direct, [0.05, 0.95], axis=0)
    np.testing.assert_allclose(got["ci_low"], low, atol=1e-7)
    np.testing.assert_allclose(got["ci_high"], high, atol=1e-7)
    assert got["n_batches"] == 5


def test_permutation_p_value_equals_a_brute_force_permutation():
    feats, batch, K, seed = _related(24, 2), 8, 19, [5, 1]
    feats[1] = feats[1] + 6.0 * np.random.default_rng(9).normal(size=feats[1].shape)  # weak: p well inside (0, 1)
    got = _accumulate(feats, batch, permutations=K, seed=seed).statistics(0.0, seed=seed)["p_value"]
    batches = [[f[s : s + batch] for f in feats] for s in range(0, 24, batch)]
    observed = _fp64_cka(batches)
    perms = [stats.batch_permutations(seed, b, batch, K) for b in range(len(batches))]

    def permuted(b: int, r: int, j: int) -> list[np.ndarray]:  # batch b with layer j's images permuted
        return [f[perms[b][r]] if layer == j else f for layer, f in enumerate(batches[b])]

    for i, j in [(0, 1), (0, 2), (1, 2)]:  # the column layer j is the permuted one
        null = np.array([_fp64_cka([permuted(b, r, j) for b in range(len(batches))])[i, j] for r in range(K)])
        brute = (1 + np.sum(null >= observed[i, j] - 1e-12)) / (K + 1)
        assert got[i, j] == pytest.approx(brute), (i, j)
        assert got[j, i] == got[i, j]
    assert 0.05 < got[0, 1] < 1  # the case tests something: some permutations reach the observed value


def test_cross_block_statistics_match_the_full_accumulator():
    feats = _related(64, 3)
    full = _accumulate(feats, 16, permutations=19, seed=1).statistics(0.95, 200, 4)
    n = 64
    cross = MinibatchCKA(3, cross_at=1, batch_slots=4, permutations=19, seed=1)
    for s in range(0, n, 16):
        cross.update([f[s : s + 16] for f in feats])
    part = cross.statistics(0.95, 200, 4)
    for name in ("ci_low", "ci_high", "p_value"):
        np.testing.assert_allclose(part[name][0, 1:], full[name][0, 1:], atol=1e-10)
        assert np.isnan(part[name][1, 2])  # not accumulated


def test_intervals_hold_the_estimate_and_shrink_as_images_grow():
    widths = []
    for n in (256, 1024):
        acc = _accumulate(_related(n, 4), 32)
        cka, st = acc.result(), acc.statistics(0.95, 500, 0)
        assert np.all(st["ci_low"] <= cka + 1e-12) and np.all(cka <= st["ci_high"] + 1e-12)
        widths.append(st["ci_high"][0, 1] - st["ci_low"][0, 1])
    assert widths[1] < 0.7 * widths[0]  # about 1/2 expected (sqrt of 4x the batches)
    assert widths[1] > 0


def test_a_layer_against_itself_is_significant_and_independent_ones_are_not_too_often():
    x = np.random.default_rng(0).normal(size=(64, 6))
    same = _accumulate([x, x.copy()], 16, permutations=99).statistics(0.0)["p_value"]
    assert same[0, 1] == pytest.approx(0.01)  # no permutation reaches CKA 1
    rejections = 0
    repeats = 60
    for seed in range(repeats):
        rng = np.random.default_rng(100 + seed)
        p = _accumulate(
            [rng.normal(size=(48, 5)), rng.normal(size=(48, 4))], 16, permutations=99, seed=seed
        ).statistics(0.0, seed=seed)["p_value"][0, 1]
        rejections += p <= 0.05
    assert rejections / repeats <= 0.15  # ~0.05 expected; P(> 9 of 60 | 0.05) < 0.2%
    assert rejections / repeats < 0.5 and rejections >= 0  # a test that cannot pass all-significant


def test_clopper_pearson_matches_its_closed_forms():
    low, high = stats.clopper_pearson(np.array([0, 10, 7]), 10, 0.95)
    assert low[0] == 0 and high[0] == pytest.approx(1 - 0.025 ** (1 / 10))  # k = 0: 1 - (alpha/2)^(1/n)
    assert high[1] == 1 and low[1] == pytest.approx(0.025 ** (1 / 10))
    # k = 7: the p whose binomial tails are alpha/2
    assert sps.binom.sf(6, 10, low[2]) == pytest.approx(0.025, abs=1e-9)
    assert sps.binom.cdf(7, 10, high[2]) == pytest.approx(0.025, abs=1e-9)


def test_mean_interval_is_the_student_t_interval_of_the_sample():
    x = np.random.default_rng(1).normal(3.0, 2.0, size=20)
    low, high = stats.mean_interval(x.mean(), x.std(), len(x), 0.9)
    ref = sps.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
    assert (float(low), float(high)) == pytest.approx(ref, rel=1e-12)


def test_bad_levels_and_counts_are_one_line_errors():
    with pytest.raises(VitseeError, match=r"--ci 1.5 .* between 0 and 1"):
        stats.stats_settings(1.5, 99, 0)
    with pytest.raises(VitseeError, match="--permutations -1"):
        stats.stats_settings(0.95, -1, 0)
    assert stats.stats_settings(0, 0, 0) is None


def test_significance_label_says_the_permutation_floor():
    assert stats.significance_label(0.01, 99) == "p<0.01"
    assert stats.significance_label(0.05, 19) == "p<=0.05"
    assert stats.significance_label(0.23, 99) == "p=0.23"
    assert stats.significance_label(float("nan"), 99) == ""


# --- store level: cache keys, shapes, the CLI ------------------------------------------------------


def _cfg(**kw) -> an.AnalyzeConfig:
    return an.AnalyzeConfig(batch_size=8, device="cpu", **kw)


def test_cka_result_has_intervals_and_p_values_and_keeps_its_values(tiny_store, tmp_path):
    path = tmp_path / "copy.h5"
    path.write_bytes(tiny_store.read_bytes())
    with Store.writer(path) as store:
        bare = run_cka(store, _cfg(ci=0, permutations=0))
        assert "stats" not in bare.params and "ci_low" not in bare
        with_stats = run_cka(store, _cfg(ci=0.9, permutations=19))
        assert with_stats.params["stats"] == {
            "ci": 0.9,
            "interval": stats.JACKKNIFE,  # new cache parameters: results with the old bootstrap keep their own
            "permutations": 19,
            "seed": 0,
        }
        assert np.array_equal(bare["matrix"], with_stats["matrix"])  # the estimate itself is untouched
        L = len(with_stats["layer"])
        for name in ("ci_low", "ci_high", "p_value"):
            assert with_stats[name].shape == (L, L)
        assert int(with_stats["n_batches"]) == 6  # 48 images in batches of 8
        # the bare result is still served to a bare request, and not to one asking for other statistics
        assert store.get_result("cka", cka_params(store, _cfg(ci=0, permutations=0))) is not None
        assert store.get_result("cka", cka_params(store, _cfg(ci=0.95, permutations=19))) is None


def test_probe_attention_and_skip_results_carry_intervals(tiny_store, tmp_path):
    path = tmp_path / "copy.h5"
    path.write_bytes(tiny_store.read_bytes())
    cfg = _cfg(ci=0.95, probe_tokens=False)
    with Store.writer(path) as store:
        probes = run_probes(store, VIT, cfg)
        n_test = len(probes["split_test"])
        k = np.round(probes["accuracy"] * n_test)
        ok = np.isfinite(k)
        ref_low, ref_high = stats.clopper_pearson(k[ok], n_test, 0.95)
        np.testing.assert_allclose(probes["ci_low"][ok], ref_low)
        assert np.all(probes["ci_low"][ok] <= probes["accuracy"][ok]) and np.all(
            probes["accuracy"][ok] <= probes["ci_high"][ok]
        )
        att = run_attention(store, VIT, cfg)
        dist = store.stat(store.resolve_model(VIT), "attention_distance")[:]  # (images, blocks, heads)
        order = att["head_order"]
        head = dist[:, 0, order[0, 0]].astype(np.float64)  # stored fp32; the moments run in fp64
        ref = sps.t.interval(0.95, len(head) - 1, loc=head.mean(), scale=sps.sem(head))
        assert (att["ci_low_px"][0, 0], att["ci_high_px"][0, 0]) == pytest.approx(ref, rel=1e-9)
        skip = run_skip(store, VIT, cfg)
        assert skip["ci_low"].shape == skip["ratio"].shape
        finite = np.isfinite(skip["spatial_mean"])
        assert np.all(skip["spatial_ci_low"][finite] <= skip["spatial_mean"][finite])
        assert np.all(skip["cls"] <= skip["cls_ci_high"])


def test_export_json_puts_intervals_beside_the_values_and_show_prints_the_best_cell(tiny_store, tmp_path, capsys):
    path = tmp_path / "copy.h5"
    path.write_bytes(tiny_store.read_bytes())
    out = tmp_path / "cka.json"
    code, _, err = run_cli(
        [
            "export",
            path,
            f"cka:{VIT}",
            "-o",
            out,
            "--batch-size",
            "8",
            "--ci",
            "0.9",
            "--permutations",
            "19",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, err
    payload = json.loads(out.read_text())
    shape = np.array(payload["values"], dtype=float).shape
    for name in ("ci_low", "ci_high", "p_value"):
        assert np.array(payload[name], dtype=float).shape == shape
    assert payload["params"]["stats"]["ci"] == 0.9
    code, text, err = run_cli(
        [
            "show",
            path,
            f"cka:{VIT}",
            "--color",
            "none",
            "--batch-size",
            "8",
            "--ci",
            "0.9",
            "--permutations",
            "19",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, err
    assert "90% jackknife interval" in text and "best: " in text and "p<" in text
    code, _, err = run_cli(["analyze", path, "--cka", "--ci", "2", "--device", "cpu"], capsys)
    assert code == 2 and "--ci 2" in err


# --- the app: marks on cells that are not significant ----------------------------------------------


async def test_heatmap_marks_read_as_x_without_colour_and_grey_with_it():
    from textual.app import App, ComposeResult

    from vitsee.tui.widgets import Heatmap
    from vitsee.tui.widgets.heatmap import MARK_CHAR

    matrix = np.linspace(0, 1, 12).reshape(3, 4)
    marks = np.zeros((3, 4), dtype=bool)
    marks[1, 2] = True

    class One(App):
        def __init__(self, mode):
            super().__init__()
            self.heatmap = Heatmap(matrix, color_mode=mode, zoom="1:1")

        def compose(self) -> ComposeResult:
            yield self.heatmap

    async with (app := One("none")).run_test(size=(100, 12)) as pilot:
        app.heatmap.set_marks(marks)
        await pilot.pause()
        lines = ["".join(seg.text for seg in app.heatmap.render_line(y)) for y in range(app.heatmap.size.height)]
        grid = [line for line in lines[:3]]
        assert MARK_CHAR in grid[1] and all(MARK_CHAR not in g for g in (grid[0], grid[2]))
        assert any("x not significant" in line for line in lines)
        app.heatmap.set_marks(None)
        await pilot.pause()
        lines = ["".join(seg.text for seg in app.heatmap.render_line(y)) for y in range(app.heatmap.size.height)]
        assert not any(MARK_CHAR in line for line in lines[:3]) and not any("significant" in line for line in lines)
    async with (app := One("truecolor")).run_test(size=(100, 12)) as pilot:
        before = [app.heatmap.render_line(y) for y in range(2)]
        app.heatmap.set_marks(marks)
        await pilot.pause()
        after = [app.heatmap.render_line(y) for y in range(2)]
        assert before != after  # row 1 shares the first line with row 0: its cell turned grey
        lines = ["".join(seg.text for seg in app.heatmap.render_line(y)) for y in range(app.heatmap.size.height)]
        assert any("not significant (BH q > 0.05)" in line for line in lines)  # the legend


def test_a_view_marks_the_cells_above_alpha_and_words_its_interval():
    from vitsee.analyses.views import View

    p = np.array([[0.01, 0.2], [0.2, 0.01]])
    view = View(
        "cka",
        "cka:a",
        "t",
        "",
        np.array([[1.0, 0.31], [0.31, 1.0]]),
        ["a", "b"],
        ["a", "b"],
        "CKA",
        params={"stats": {"ci": 0.95, "permutations": 99}, "n_images": 40},
        extra={"n_batches": 5},
        models=["a", "a"],
        ci_low=np.array([[1.0, 0.25], [0.25, 1.0]]),
        ci_high=np.array([[1.0, 0.4], [0.4, 1.0]]),
        p_value=p,
    )
    assert view.not_significant().tolist() == [[False, True], [True, False]]
    assert view.interval_text(0, 1) == " [0.250, 0.400] rough  p=0.20"
    assert view.interval_text(0, 0) == " [1.000, 1.000] rough  p<0.01"
    assert "95% bootstrap interval over 5 minibatches" in view.interval_caption() and "rough" in view.interval_caption()
    payload = view.to_json()
    assert payload["p_value"] == p.tolist() and payload["ci_level"] == 0.95


def test_figures_hatch_weak_cka_cells_band_probes_and_whisker_heads(tiny_store, tmp_path):
    from vitsee.output.figures import figure_for
    from vitsee.analyses.views import load_view

    path = tmp_path / "copy.h5"
    path.write_bytes(tiny_store.read_bytes())
    cfg = _cfg(ci=0.9, permutations=19, probe_tokens=False)
    view = load_view(path, f"cka:{VIT}", cfg)
    fig = figure_for(view)
    hatched = [p for p in fig.axes[0].patches if p.get_gid() == "not-significant"]
    assert len(hatched) == int(view.not_significant().sum())
    assert "90% jackknife interval" in fig._supxlabel.get_text()
    probes = figure_for(load_view(path, f"probes:{VIT}", cfg))
    assert any(str(c.get_gid()).startswith("band:") for c in probes.axes[0].collections)
    attention = figure_for(load_view(path, f"attention:{VIT}", cfg))
    assert any(c.get_gid() == "interval" for c in attention.axes[0].collections)
    assert "Student-t interval" in attention._supxlabel.get_text()


async def test_the_app_shows_the_interval_and_n_toggles_the_marks(tiny_store, tmp_path):
    from helpers.app import SIZE, analysed_copy, make_app, settle, status, view_shown

    store = analysed_copy(tiny_store, tmp_path)  # every analysis cached with the defaults' statistics
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        pane = app.screen.pane("cka")
        view = pane.view
        await pilot.press("right")
        await settle(pilot)
        assert status(app).endswith(view.interval_text(0, 1)) and "p<0.01" in status(app) and " [" in status(app)
        await pilot.press("n")
        heatmap = pane.heatmap
        assert pane.marks_on and np.array_equal(heatmap._marks, view.not_significant())
        await pilot.press("n")
        assert not pane.marks_on and heatmap._marks is None

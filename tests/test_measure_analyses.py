"""The measures beyond linear CKA as analyses (issue 20): each a layer x layer view computed from one Gram per layer
that every measure of a run shares, on a seeded subset of the images, with the intervals and p-values of
measures_stats; the `--measures` option; the "measures agree?" comparison; `m` in the CKA view and the dossier's
line on where the measures disagree. The measures' numbers themselves are checked against fp64 references in
tests/test_measures.py; here the analyses must give the same numbers for the stored layers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from conftest import RESNET, VIT, run_cli
from helpers.app import SIZE, make_app, notifications, settle, status, view_shown
from vitsee.analyses import REGISTRY, Result
from vitsee.analyses.similarity import layer_measures
from vitsee.analyses.driver import AnalyzeConfig, run_analyses
from vitsee.store import Store
from vitsee.analyses.views import load_view

CFG = AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", permutations=9)
MEASURES = [a.name for a in layer_measures() if a.name != "cka"]  # the measures of engine/measures/catalog/
# a ViT block against a ResNet stage, and two ResNet stages
PAIRS = [((VIT, "blocks.1"), (RESNET, "layer3.0")), ((RESNET, "layer2.0"), (RESNET, "layer4.0"))]
# the direct functions of RBF CKA, SVCCA and PWCCA take seconds a pair on the ViT's 4,160 features (the analyses
# do all pairs at once from the Grams): they are checked on the ResNet pair
WIDE = {"rbf_cka", "svcca", "pwcca"}


def _copy(tiny_store: Path, folder: Path) -> Path:
    path = folder / "tiny.h5"
    shutil.copy(tiny_store, path)
    return path


def _result(path: Path, name: str) -> Result:
    with Store.open(path) as s:
        (entry,) = s.results(name)
        return Result.load(s, name, entry["params"])


def _cell(result: Result, a: tuple[str, str], b: tuple[str, str]) -> float:
    models, layers = result.params["models"], [str(x) for x in result["layer"]]
    column = [(models[m], layer) for m, layer in zip(result["model"], layers)]
    return float(result["matrix"][column.index(a), column.index(b)])


def _features(path: Path, model: str, layer: str, rows=None) -> np.ndarray:
    with Store.open(path) as s:
        x = s.activations(model, layer, rows)
    return x.reshape(len(x), -1).astype(np.float64)


@pytest.fixture(scope="module")
def measured(tiny_store, tmp_path_factory) -> Path:
    """The tiny store with CKA, the seven measures and their comparison cached by one `run_analyses`."""
    path = _copy(tiny_store, tmp_path_factory.mktemp("measured"))
    run_analyses(path, ["cka", *MEASURES, "agree"], CFG)
    return path


# --- one Gram per layer, shared ------------------------------------------------------------------------------


def test_a_run_builds_each_layers_gram_and_spectrum_once_for_all_its_measures(tiny_store, tmp_path, monkeypatch):
    import torch

    from vitsee.measures import grams as measures_grams

    builds, eighs = [], []
    build, eigh = measures_grams.LayerGrams.from_features.__func__, torch.linalg.eigh
    monkeypatch.setattr(
        measures_grams.LayerGrams,
        "from_features",
        classmethod(lambda cls, x, name="", device=None: builds.append(name) or build(cls, x, name, device)),
    )
    monkeypatch.setattr(torch.linalg, "eigh", lambda *a, **k: eighs.append(1) or eigh(*a, **k))
    path = _copy(tiny_store, tmp_path)
    with Store.open(path) as s:
        n_layers = sum(len(s.layers(m)) for m in s.models)
    run_analyses(path, ["rbf_cka", "procrustes", "svcca", "pwcca", "rsa"], CFG)
    assert len(builds) == n_layers == len(set(builds))  # five measures, one Gram per layer
    assert len(eighs) == n_layers  # Procrustes, SVCCA and PWCCA share each layer's eigendecomposition
    run_analyses(path, ["mknn"], CFG)  # a new run builds its own: the Grams live as long as a run
    assert len(builds) == 2 * n_layers
    with Store.open(path) as s:
        assert {r["analysis"] for r in s.results()} == {"rbf_cka", "procrustes", "svcca", "pwcca", "rsa", "mknn"}


# --- the numbers ------------------------------------------------------------------------------------------------


def _procrustes_reference(x: np.ndarray, y: np.ndarray) -> float:
    """Angular Procrustes distance by Williams et al.'s definition: centred, unit Frobenius norm, arccos of the
    nuclear norm of X'Y (taken as that of Rx Ry' from the thin QR X' = Qx Rx: the Qs are orthonormal)."""
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
    rx, ry = np.linalg.qr(x.T)[1], np.linalg.qr(y.T)[1]
    return float(np.arccos(min(1.0, np.linalg.svd(rx @ ry.T, compute_uv=False).sum())))


def _rsa_reference(x: np.ndarray, y: np.ndarray) -> float:
    """RSA: Spearman correlation of the upper triangles of the correlation-distance RDMs."""
    upper = np.triu_indices(len(x), 1)
    return float(spearmanr((1 - np.corrcoef(x))[upper], (1 - np.corrcoef(y))[upper]).correlation)


def test_every_measure_is_its_function_on_the_stored_layers(measured):
    from vitsee import measures

    for name in MEASURES:
        result = _result(measured, name)
        own = REGISTRY[name].measure_values(result.params)
        assert result.params["max_images"] == 48 and result.params["seed"] is None  # 48 images: all of them
        for a, b in PAIRS[1:] if name in WIDE else PAIRS:
            x, y = _features(measured, *a), _features(measured, *b)
            expected = getattr(measures, name)(x, y, **own)
            # PWCCA weighs by canonical directions, which are not unique where canonical correlations tie: here 48
            # images leave 39-42 kept directions per layer, so dozens of correlations are 1 and the two routes
            # (the Gram's eigenvectors, the features' SVD) pick different bases of that subspace (4e-4 apart)
            rtol = 1e-3 if name == "pwcca" else 1e-9
            np.testing.assert_allclose(_cell(result, a, b), expected, rtol=rtol, atol=1e-12, err_msg=f"{name} {a} {b}")
    for a, b in PAIRS:  # and two from their papers' formulas, written here
        x, y = _features(measured, *a), _features(measured, *b)
        np.testing.assert_allclose(_cell(_result(measured, "procrustes"), a, b), _procrustes_reference(x, y), rtol=1e-9)
        np.testing.assert_allclose(_cell(_result(measured, "rsa"), a, b), _rsa_reference(x, y), rtol=1e-9)


def test_max_images_draws_a_seeded_subset_that_params_and_the_caption_record(tiny_store, tmp_path, capsys):
    from vitsee import measures
    from vitsee.measures.grams import choose_images

    path = _copy(tiny_store, tmp_path)
    code, _, err = run_cli(
        ["analyze", path, "--procrustes", "--max-images", "20", "--seed", "3", "--procrustes-alpha", "0.5", "-q"],
        capsys,
    )
    assert code == 0, err
    result = _result(path, "procrustes")
    rows = choose_images(48, 20, 3)[0]
    assert result.params["max_images"] == 20 and result.params["seed"] == 3 and result.params["alpha"] == 0.5
    np.testing.assert_array_equal(result["images"], rows)
    a, b = PAIRS[0]
    expected = measures.procrustes(_features(path, *a, rows), _features(path, *b, rows), alpha=0.5)
    np.testing.assert_allclose(_cell(result, a, b), expected, rtol=1e-9)
    view = load_view(path, f"procrustes:{VIT}:{RESNET}")
    assert view.title.endswith(", 20 of 48 images")
    assert "on 20 of the 48 images, drawn with seed 3 (--max-images); alpha 0.5" in view.analysis.caption_notes(view)
    out = tmp_path / "p.json"
    assert run_cli(["export", path, f"procrustes:{VIT}:{RESNET}", "--out", out], capsys)[0] == 0
    exported = json.loads(out.read_text())
    assert {k: exported["params"][k] for k in ("max_images", "seed", "alpha")} == {
        "max_images": 20,
        "seed": 3,
        "alpha": 0.5,
    }


def test_intervals_and_p_values_are_measures_stats_over_the_same_grams(tiny_store, tmp_path):
    from vitsee.measures import resampling as measures_stats
    from vitsee.measures.grams import layer_grams

    path = _copy(tiny_store, tmp_path)
    cfg = AnalyzeConfig(device="cpu", seed=2, options={"measure_bootstrap": 20, "measure_permutations": 9})
    run_analyses(path, ["rsa"], cfg)
    result = _result(path, "rsa")
    assert result.params["stats"] == {
        "ci": 0.95,
        "interval": "jackknife",  # --measure-bootstrap N: N groups of images, each left out once (issue 30)
        "groups": 20,
        "permutations": 9,
        "seed": 2,
    }
    from vitsee.measures import jackknife

    with Store.open(path) as s:
        columns = [(m, layer) for m in s.models for layer in s.layers(m)]
        grams = layer_grams([s.activations(m, layer) for m, layer in columns])
    low, high = jackknife.jackknife_interval(grams, None, "rsa", 0.95, 20, 2)
    np.testing.assert_allclose(result["ci_low"], low, rtol=1e-12)
    np.testing.assert_allclose(result["ci_high"], high, rtol=1e-12)
    p = measures_stats.permutation_p_value(grams, None, "rsa", 9, 2)
    np.testing.assert_allclose(result["p_value"], p, rtol=1e-12)
    view = load_view(path, f"rsa:{VIT}:{RESNET}")
    assert "95% jackknife interval: 20 groups of the 48 images each left out once" in view.interval_caption()
    assert "small p: more alike RDMs than images paired at random" in view.analysis.caption_notes(view)
    r, c = view.rows.index("blocks.1"), view.cols.index("layer2.0")
    assert view.interval_text(r, c).startswith(f" [{view.ci_low[r, c]:.3f}, {view.ci_high[r, c]:.3f}]")


# --- the command line ------------------------------------------------------------------------------------------


def test_measures_names_the_measures_to_compute_and_refuses_an_unknown_one_in_a_line(tiny_store, tmp_path, capsys):
    path = _copy(tiny_store, tmp_path)
    code, _, err = run_cli(["analyze", path, "--measures", "rsa,mknn", "-q", "--device", "cpu"], capsys)
    assert code == 0, err
    with Store.open(path) as s:
        assert {r["analysis"] for r in s.results()} == {"rsa", "mknn"}
    bad = [
        (
            ["--measures", "rsa,bogus"],
            "--measures rsa,bogus: 'bogus' is no measure: use a comma list of cka, "
            "rbf_cka, procrustes, svcca, pwcca, mknn, cknna, rsa, soft_matching, linear_predictivity, or all",
        ),
        (["--procrustes", "--procrustes-alpha", "2"], "--procrustes-alpha 2.0: procrustes alpha=2.0 is outside"),
        (["--rsa", "--max-images", "2"], "--max-images 2 is too few"),
        (["--rsa", "--measure-bootstrap", "-5"], "--measure-bootstrap -5 is negative"),
    ]
    for args, words in bad:
        code, _, err = run_cli(["analyze", path, *args, "-q"], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err
    with Store.open(path) as s:
        assert len(s.results()) == 2  # nothing written by the refused ones
    code, text, _ = run_cli(["analyze", "--help"], capsys)
    assert code == 0 and "--measures" in text and "--max-images" in text and "--rbf-cka" in text


# --- do the measures agree? ------------------------------------------------------------------------------------


def test_the_comparison_is_the_spearman_correlation_of_the_measures_over_the_layer_pairs(measured, tmp_path, capsys):
    for spec, within in ((f"agree:{VIT}:{RESNET}", False), (f"agree:{VIT}", True)):
        out = tmp_path / "agree.json"
        assert run_cli(["export", measured, spec, "--out", out], capsys)[0] == 0
        exported = json.loads(out.read_text())
        names = exported["measures"]
        assert names == ["cka", *MEASURES] and exported["rows"] == [REGISTRY[n].label for n in names]
        panels = np.array(exported["panels"], dtype=float)
        for i, name in enumerate(names):  # each panel is that measure's view of the pair
            own = load_view(measured, spec.replace("agree", name, 1))
            np.testing.assert_array_equal(panels[i], own.matrix)
        keep = ~np.eye(*panels.shape[1:], dtype=bool) if within else np.ones(panels.shape[1:], dtype=bool)
        signed = [(1 if REGISTRY[n].higher_is_better else -1) * panels[i][keep] for i, n in enumerate(names)]
        values = np.array(exported["values"], dtype=float)
        for i in range(len(names)):
            for j in range(len(names)):
                expected = 1.0 if i == j else spearmanr(signed[i], signed[j]).correlation
                np.testing.assert_allclose(
                    values[i, j], expected, rtol=1e-12, atol=1e-12, err_msg=f"{names[i]} {names[j]}"
                )
        assert exported["n_pairs"] == int(keep.sum())
    png = tmp_path / "agree.png"
    code, _, err = run_cli(["export", measured, f"agree:{VIT}:{RESNET}", "--out", png], capsys)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", err
    code, text, _ = run_cli(["show", measured, f"agree:{VIT}:{RESNET}", "--color", "none"], capsys)
    assert code == 0 and "rank corr." in text and "Procrustes read reversed" in text


def test_the_figure_draws_each_measure_with_the_same_axes_beside_the_correlations(measured):
    from vitsee.output.figures import figure_for

    view = load_view(measured, f"agree:{VIT}:{RESNET}")
    fig = figure_for(view, selection=(0, 2))
    panels = [ax for ax in fig.axes if ax.get_label().startswith("panel-")]
    assert [ax.get_label() for ax in panels] == [f"panel-{n}" for n in view.extra["measures"]]
    assert all(
        ax.get_shared_x_axes().joined(ax, panels[0]) and ax.get_shared_y_axes().joined(ax, panels[0]) for ax in panels
    )
    corr = next(ax for ax in fig.axes if ax.get_label() == "rank-correlations")
    written = [t.get_text() for t in corr.texts if t.get_gid() == "rank-correlation"]
    assert written == [f"{v:.2f}" for v in view.matrix.ravel()]
    assert [p for p in corr.patches if p.get_gid() == "selection"]


# --- a pair's rank, and whether the measures agree on it --------------------------------------------------------


def test_a_pairs_rank_is_the_share_of_the_other_pairs_more_alike_a_distance_read_the_other_way():
    from vitsee.analyses.agree import agreement_line, pair_rank, rank_words

    m = np.array([[0.9, 0.2, 0.5], [0.4, 0.8, 0.1], [0.3, 0.7, 0.6]])
    assert pair_rank(m, 0, 0) == 0.0 and pair_rank(m, 1, 2) == 1.0
    assert pair_rank(m, 2, 2) == 3 / 8  # 0.9, 0.8, 0.7 above 0.6
    assert pair_rank(m, 2, 2, higher_is_better=False) == 5 / 8  # a distance: 0.2, 0.5, 0.4, 0.1, 0.3 below
    assert pair_rank(m, 2, 1, within=True) == 0 / 5  # the diagonal is no layer pair within a model
    assert [rank_words(s) for s in (0.0, 0.2, 0.3, 0.6, 0.8, 0.95)] == [
        "in the top 10%",
        "in the top quarter",
        "in the top half",
        "in the bottom half",
        "in the bottom quarter",
        "in the bottom 10%",
    ]
    assert agreement_line({"CKA": 0.05, "Procrustes": 0.6, "RSA": 0.3}) == (
        "the measures disagree: in the top 10% of the pairs by CKA; top half by RSA; bottom half by Procrustes"
    )
    assert agreement_line({"CKA": 0.05, "RSA": 0.02}) == (
        "the measures agree: in the top half of the pairs by every one (top 10% by CKA, RSA)"
    )


def test_the_dossier_lists_the_pair_in_every_measure_and_where_they_disagree(measured):
    from vitsee.tui.dossier import MEASURES_TITLE, measures_section
    from vitsee.tui.results import read_summary, read_view

    spec = f"cka:{VIT}:{RESNET}"
    cell = read_view(measured, spec, CFG)
    row, col = cell.view.rows.index("blocks.3"), cell.view.cols.index("layer3.0")
    section = measures_section(measured, read_summary(measured), cell, row, col, {})
    assert section.title == MEASURES_TITLE and section.kind == "agree" and section.available
    words, shares = [], {}
    for name, line in zip(["cka", *MEASURES], section.lines):
        view = load_view(measured, spec.replace("cka", name, 1))
        value = view.matrix[row, col]
        others = np.delete(view.matrix.ravel(), row * view.matrix.shape[1] + col)  # every other pair, counted here
        share = float(np.mean(others > value if REGISTRY[name].higher_is_better else others < value))
        shares[REGISTRY[name].label] = share
        bands = ["top 10%", "top quarter", "top half", "bottom half", "bottom quarter", "bottom 10%"]
        band = bands[int(np.searchsorted([0.1, 0.25, 0.5, 0.75, 0.9], share, side="right"))]
        words.append(band)
        assert line == f"{view.value_name} {value:.3f}{view.interval_or_hint(row, col)}  (in the {band} of the pairs)"
    last = section.lines[len(MEASURES) + 1]
    halves = {share < 0.5 for share in shares.values()}
    assert last.startswith("the measures agree" if len(halves) == 1 else "the measures disagree")
    for label, band in zip(shares, words):
        assert band in last and label in last


# --- the app: m in the CKA view ---------------------------------------------------------------------------------


async def test_m_cycles_the_measures_cached_for_the_models_on_the_same_layer_pair(measured, tmp_path):
    app = make_app(measured, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("j", "j", "l", "l")
        row, col = app.screen.pane("cka").heatmap.cursor
        for name in [*MEASURES, "agree", "cka"]:
            await pilot.press("m")
            await settle(pilot, view_shown(name))
            tab = str(app.screen.query_one("#tab-cka").label)
            assert tab.endswith(REGISTRY[name].label), tab
            pane = app.screen.pane(name)
            if name == "agree":
                assert status(app).startswith("CKA x CKA  rank correlation 1.0000 over 40 layer pairs")
                continue
            view = pane.view
            assert pane.heatmap.cursor == (row, col)  # the same layer pair (CKA's own, back from the comparison)
            value = f"{view.value_name} {view.matrix[row, col]:.4f}"
            assert status(app).startswith(f"{view.rows[row]} x {view.cols[col]}  {value}")
            if name != "cka" and view.ci_low is None:  # a measure without an interval says so, and how to get one
                assert "no interval: --measure-bootstrap 200 gives one" in status(app), status(app)
        await pilot.press("question_mark")
        await settle(pilot)
        assert "the next layer x layer measure cached for these models" in app.screen.text()


async def test_m_with_only_cka_cached_says_the_command_that_computes_the_others(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("m")
        await settle(pilot)
        assert app.screen.kind == "cka"
        command = f"vitsee analyze {store} --measures {','.join(MEASURES)}"
        assert any(f"`{command}`" in message for message, _ in notifications(app)), notifications(app)

"""The separability and n-curve views on the zoo store (four random-init models of two families): each number the
view shows against the pure functions on the measures' own zoos and Grams, the options that change what is shown,
`vitsee show` / `export`, and the one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import RESNET, VIT, run_cli
from vitsee.analyses.base import AnalyzeConfig
from vitsee.analyses.views import load_view
from vitsee.measures import curves
from vitsee.measures import grams as mg
from vitsee.store import Store, copy_store
from vitsee.zoo import separability as sep

VIT1, RESNET1 = "test_vit@random:1", "test_resnet@random:1"
CFG = AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", permutations=0)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


@pytest.fixture(scope="module")
def zoo(zoo_store, tmp_path_factory):
    path = tmp_path_factory.mktemp("which") / "zoo.h5"
    copy_store(zoo_store, path)
    return path


def test_separability_is_each_measures_zoo_scored(zoo):
    options = {"separability_measures": "cka,mknn"}
    view = load_view(zoo, "separability", CFG, options=options)
    assert view.rows == ["CKA", "mknn", "consensus (rank fusion)"] and view.cols == ["d-prime", "silhouette", "ROC-AUC"]
    with Store.open(zoo) as s:
        families = [s.model_info(k)["family"] for k in s.models]
    assert view.extra["groups"] == ["ViT" if f == "vit" else "ResNet" for f in families]
    zoos = []
    for i, measure in enumerate(("cka", "mknn")):
        z = load_view(zoo, "zoo", AnalyzeConfig(**{**CFG.__dict__, "ci": 0.0}), options={"zoo_measure": measure})
        zoos.append(z.matrix)
        want = sep.separability(z.matrix, view.extra["groups"], True, 0.95, 1000, [0, i])
        assert view.matrix[i] == pytest.approx([want["d_prime"], want["silhouette"], want["auc"]], nan_ok=True)
        assert view.ci_low[i, 2] == pytest.approx(want["auc_low"]) and view.ci_high[i, 2] == pytest.approx(
            want["auc_high"]
        )
    fused = sep.rank_fusion(zoos, [True, True])
    assert np.allclose(view.extra["panel"], fused)
    assert view.matrix[-1, 2] == pytest.approx(sep.separability(fused, view.extra["groups"], level=0)["auc"])


def test_the_warning_before_separability_says_how_long_the_missing_zoos_take(zoo, monkeypatch):
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.contract import Request
    from vitsee.measures.registry import measure

    analysis, request = REGISTRY["separability"], Request("separability", ())
    cfg = AnalyzeConfig(device="cpu", options={"separability_measures": "cka,rsa,soft_matching"})
    soft = type(measure("soft_matching"))
    with Store.open(zoo) as s:
        monkeypatch.setattr(soft, "seconds", classmethod(lambda cls, n, layers, **k: 10.0))
        said = analysis.warning(s, request, cfg)
        assert said.startswith("separability computes the zoo of ") and "min on one CPU core" not in said  # seconds
        monkeypatch.setattr(soft, "seconds", classmethod(lambda cls, n, layers, **k: 300.0))
        said = analysis.warning(s, request, cfg)
        assert "soft_matching first (each measure over every layer of every model: about 5 min on one CPU core)" in said


def test_families_set_by_hand_and_trained_against_untrained(zoo, capsys):
    view = load_view(
        zoo, "separability", CFG, options={"separability_measures": "cka", "families": f"{VIT1}=odd,{RESNET1}=odd"}
    )
    assert view.extra["groups"] == ["ViT", "ResNet", "odd", "odd"]
    code, _, err = run_cli(["show", zoo, "separability", "--separate-by", "trained", "--color", "none"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "untrained" in err  # every model is a random init
    code, _, err = run_cli(["show", zoo, "separability", "--separate-by", "seeds"], capsys)
    assert code == 2 and "--separate-by seeds" in err
    code, _, err = run_cli(["show", zoo, "separability", "--separability-measures", "cka,nope"], capsys)
    assert code == 2 and "nope" in err and "Traceback" not in err


def test_show_and_export_the_scores(zoo, tmp_path, capsys):
    args = ["--separability-measures", "cka,mknn"]
    code, text, err = run_cli(["show", zoo, "separability", *args, "--color", "none"], capsys)
    assert code == 0, err
    for word in ("d-prime", "silhouette", "ROC-AUC", "CKA", "mknn", "consensus", "percentile bootstrap over the 4"):
        assert word in text
    out = tmp_path / "sep.json"
    assert run_cli(["export", zoo, "separability", *args, "--out", out], capsys)[0] == 0
    data = json.loads(out.read_text())
    assert data["cols"] == ["d-prime", "silhouette", "ROC-AUC"] and len(data["ci_low"]) == 3
    png = tmp_path / "sep.png"
    assert run_cli(["export", zoo, "separability", *args, "--out", png], capsys)[0] == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def _grams(store_path, model, layers, rows):
    with Store.open(store_path) as s:
        return mg.layer_grams([s.activations(model, layer, rows) for layer in layers])


def test_n_curve_of_a_layer_pair_is_the_measure_on_nested_subsets(zoo):
    spec = f"curve:{VIT}:{RESNET}"
    options = {"curve_layers": "blocks.1,layer2.0", "curve_first": 16}
    with Store.open(zoo) as s:
        assert "blocks.1" in s.layers(VIT) and "layer2.0" in s.layers(RESNET)
        n = s.n_images
    view = load_view(zoo, spec, AnalyzeConfig(**{**CFG.__dict__, "ci": 0.9}), options=options)
    assert view.rows == [str(m) for m in curves.subset_sizes(n, 16)] and view.extra["x_label"] == "images"
    rows = np.arange(n)
    ga, gb = _grams(zoo, VIT, ["blocks.1"], rows), _grams(zoo, RESNET, ["layer2.0"], rows)
    want = curves.measure_curve(ga, gb, "mknn", curves.subset_sizes(n, 16), 0, 0.9, curves.CURVE_REPLICATES, k=10)
    assert np.allclose(view.matrix[:, 0], want["value"][:, 0, 0], atol=1e-12)
    assert np.allclose(view.ci_low[:, 0], want["ci_low"][:, 0, 0], atol=1e-12)
    assert np.allclose(view.ci_high[:, 0], want["ci_high"][:, 0, 0], atol=1e-12)


def test_n_curve_of_the_models_summary_and_a_k_curve(zoo):
    from vitsee.zoo.summaries import best_match_alignment

    with Store.open(zoo) as s:
        n, la, lb = s.n_images, s.layers(VIT), s.layers(RESNET)
    cfg = AnalyzeConfig(**{**CFG.__dict__, "ci": 0.0})
    view = load_view(zoo, f"curve:{VIT}:{RESNET}", cfg, options={"curve_first": 24, "curve_measure": "rsa"})
    assert view.cols == ["best-match RSA"] and view.ci_low is None
    ga, gb = _grams(zoo, VIT, la, np.arange(n)), _grams(zoo, RESNET, lb, np.arange(n))
    for rows, value in zip(curves.nested_subsets(n, [24, n], 0), view.matrix[:, 0]):
        m = mg.pairwise([g.take(rows) for g in ga], [g.take(rows) for g in gb], "rsa")
        assert value == pytest.approx(best_match_alignment(m), abs=1e-12)
    kview = load_view(zoo, f"curve:{VIT}:{RESNET}", cfg, options={"curve_over": "k", "curve_layers": "norm,layer4.0"})
    assert kview.rows == ["5", "10", "20"] and kview.extra["x_label"] == "k (neighbours)"
    with Store.open(zoo) as s:
        x, y = s.activations(VIT, "norm", np.arange(n)), s.activations(RESNET, "layer4.0", np.arange(n))
    for k, value in zip((5, 10, 20), kview.matrix[:, 0]):
        assert value == pytest.approx(mg.pair(mg.layer_grams([x])[0], mg.layer_grams([y])[0], "mknn", k=k))


def test_curve_errors_are_one_line(zoo, capsys):
    spec = f"curve:{VIT}:{RESNET}"
    for args, words in (
        (["--curve-measure", "cka"], "--curve-measure cka"),
        (["--curve-over", "k", "--curve-measure", "rsa"], "has no k"),
        (["--curve-layers", "blocks.1"], "two layers"),
        (["--curve-layers", "blocks.1,nope"], "no layer 'nope'"),
        (["--curve-first", "4"], "too small"),
    ):
        code, _, err = run_cli(["show", zoo, spec, *args], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)

"""The zoo as a view (engine/analyses/zoo.py): its numbers against each pair's CKA view computed on its own, its JSON
as issue 21 lists it, a distance measure summarised by minima, and the errors a user can cause."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import RESNET, VIT, run_cli
from helpers.stores import ZOO_CFG, ZOO_MODELS
from vitsee.analyses import REGISTRY, Result
from vitsee.store import Store, copy_store
from vitsee.analyses.views import load_view


def best_match_by_loops(m: np.ndarray) -> float:
    """(mean over rows of the row's max + mean over columns of the column's max) / 2, in plain Python floats."""
    rows = [max(float(v) for v in row) for row in m]
    cols = [max(float(m[i][j]) for i in range(len(m))) for j in range(len(m[0]))]
    return (sum(rows) / len(rows) + sum(cols) / len(cols)) / 2


MEASURE_VALUES = {"mknn": {"k": 10}, "procrustes": {"alpha": 1.0}}  # the measures' defaults


class TestNumbers:
    def test_each_value_is_the_best_match_of_the_pairs_own_cka_view(self, zoo_store):
        view = load_view(zoo_store, "zoo")
        assert view.rows == view.cols == ZOO_MODELS and view.models == []
        for i, a in enumerate(ZOO_MODELS):
            for j, b in enumerate(ZOO_MODELS):
                pair = load_view(zoo_store, f"cka:{a}:{b}")  # the pair's view, cut from the cached CKA
                assert view.matrix[i, j] == pytest.approx(best_match_by_loops(pair.matrix), abs=1e-12)
        np.testing.assert_allclose(np.diag(view.matrix), 1.0, atol=1e-12)
        order = view.extra["order"]
        assert sorted(order) == list(range(4)) and view.extra["families"] == ["ViT", "ResNet", "ViT", "ResNet"]
        off = ~np.eye(len(ZOO_MODELS), dtype=bool)  # a model with itself is 1 whatever the images: no interval
        assert (view.ci_low[off] <= view.matrix[off]).all() and (view.matrix[off] <= view.ci_high[off]).all()
        assert np.isnan(np.diag(view.ci_low)).all()

    def test_the_last_layer_summary_and_its_interval_are_the_cka_cell_of_the_last_layers(self, zoo_store, tmp_path):
        path = copy_store(zoo_store, tmp_path / "zoo.h5")
        view = load_view(path, "zoo", options={"zoo_summary": "layer"})  # computed: the same CKA, its batches
        assert view.value_name == "last-layer CKA"
        pair = load_view(path, f"cka:{VIT}:{RESNET}")
        assert view.matrix[0, 1] == pair.matrix[-1, -1]
        # the jackknife of the same images: the zoo's leaves each image out exactly, the cell's by the delta method
        half, cell_half = view.ci_high[0, 1] - view.matrix[0, 1], pair.ci_high[-1, -1] - pair.matrix[-1, -1]
        assert half == pytest.approx(cell_half, rel=0.05) and half > 0
        assert view.matrix[0, 1] - view.ci_low[0, 1] == pytest.approx(half, rel=1e-9)

    def test_a_distance_measure_is_summarised_by_its_minima_without_intervals(self, zoo_store, tmp_path, monkeypatch):
        from vitsee.analyses.similarity import LayerPairMeasure

        class OneMinusCKA(LayerPairMeasure):  # a distance: 0 for a layer with itself
            label = "1-CKA"
            title = option_help = "one minus full-batch linear CKA"
            higher_is_better = False
            value_range = (None, None)

            def measure(self, a, b):
                a, b = a - a.mean(axis=0), b - b.mean(axis=0)
                ka, kb = a @ a.T, b @ b.T
                return 1.0 - float((ka * kb).sum() / np.sqrt((ka * ka).sum() * (kb * kb).sum()))

        OneMinusCKA.name = "distance"  # set after the class: not registered for the rest of the session
        monkeypatch.setitem(REGISTRY._by_name, "distance", OneMinusCKA())
        path = copy_store(zoo_store, tmp_path / "zoo.h5")
        view = load_view(path, "zoo", ZOO_CFG.with_options({"zoo_measure": "distance"}))
        with Store.open(path) as s:
            (cached,) = s.results("distance")
            result = Result.load(s, "distance", cached["params"])
        joint, model = np.asarray(result["matrix"]), np.asarray(result["model"])
        block = joint[np.ix_(model == 0, model == 1)]
        rows, cols = block.min(axis=1).mean(), block.min(axis=0).mean()
        assert view.matrix[0, 1] == pytest.approx((rows + cols) / 2, abs=1e-12)
        np.testing.assert_allclose(np.diag(view.matrix), 0.0, atol=1e-12)
        assert view.ci_low is None and view.extra["interval"].startswith(
            "none: 1-CKA keeps no per-batch terms or resamples"
        )
        c = next(c for c in view.extra["correspondences"] if (c["a"], c["b"]) == (VIT, RESNET))
        assert c["argmax"] == [int(j) for j in block.argmin(axis=1)]  # the nearest layer, not the farthest

    @pytest.mark.parametrize("measure", ["mknn", "procrustes"])
    def test_a_measures_own_resamples_give_each_pairs_interval(self, zoo_store, tmp_path, measure):
        """With --measure-bootstrap N, a zoo of a Gram measure has intervals from the measure's own N groups of
        images, each left out once: the `layer` summary's interval is then that cell's own interval (the same
        leave-outs), and the best-match interval is the summary -/+ t x the jackknife sd of each leave-out's best
        match, here recomputed by loops."""
        from scipy import stats as sps

        from vitsee.measures import jackknife
        from vitsee.measures.grams import LayerGrams

        path = copy_store(zoo_store, tmp_path / "zoo.h5")
        options = {"zoo_measure": measure, "measure_bootstrap": 8, "max_images": 24}
        last = load_view(path, "zoo", ZOO_CFG.with_options({**options, "zoo_summary": "layer"}))
        pair = load_view(path, f"{measure}:{VIT}:{RESNET}", ZOO_CFG.with_options(options))
        assert last.matrix[0, 1] == pair.matrix[-1, -1]
        assert last.ci_low[0, 1] == pytest.approx(pair.ci_low[-1, -1], abs=1e-12)
        assert last.ci_high[0, 1] == pytest.approx(pair.ci_high[-1, -1], abs=1e-12)
        assert "8 groups of the 24 images" in last.extra["interval"] and not last.rough

        view = load_view(path, "zoo", ZOO_CFG.with_options(options))
        with Store.open(path) as s:
            (cached,) = [r for r in s.results(measure) if (r["params"].get("stats") or {}).get("groups")]
            result = Result.load(s, measure, cached["params"])
            rows = np.asarray(result["images"])
            grams = {
                m: [LayerGrams.from_features(s.activations(m, layer, rows), layer, "cpu") for layer in s.layers(m)]
                for m in (VIT, RESNET)
            }
        values = MEASURE_VALUES[measure]
        reps = list(jackknife.iter_jackknife_replicates(grams[VIT], grams[RESNET], measure, 8, 0, **values))
        sign = 1.0 if measure == "mknn" else -1.0  # a distance: each layer's nearest, the mean of minima
        draws = np.array([sign * best_match_by_loops(sign * r) for r in reps])
        half = sps.t.ppf(0.975, 7) * np.sqrt(7 / 8 * ((draws - draws.mean()) ** 2).sum())
        assert view.ci_low[0, 1] == pytest.approx(view.matrix[0, 1] - half, abs=1e-9)
        assert view.ci_high[0, 1] == pytest.approx(view.matrix[0, 1] + half, abs=1e-9)
        assert view.ci_low[1, 0] == view.ci_low[0, 1] and view.ci_low[0, 1] <= view.ci_high[0, 1]

    def test_a_gram_measure_without_resamples_names_the_option_that_gives_intervals(self, zoo_store, tmp_path):
        path = copy_store(zoo_store, tmp_path / "zoo.h5")
        view = load_view(path, "zoo", ZOO_CFG.with_options({"zoo_measure": "mknn", "max_images": 24}))
        assert view.ci_low is None
        assert view.extra["interval"] == (
            "none: mknn was computed without intervals: add "
            "--measure-bootstrap 20 to `vitsee analyze --zoo --zoo-measure mknn`"
        )


class TestCommandLine:
    def test_export_json_has_the_fields_the_issue_lists(self, zoo_store, tmp_path, capsys):
        out = tmp_path / "zoo.json"
        code, _, err = run_cli(["export", zoo_store, "zoo", "--out", out], capsys)
        assert code == 0, err
        got = json.loads(out.read_text())
        assert got["models"] == ZOO_MODELS and got["families"] == ["ViT", "ResNet", "ViT", "ResNet"]
        assert got["summary"] == "best_match" and sorted(got["order"]) == [0, 1, 2, 3]
        assert np.asarray(got["values"]).shape == np.asarray(got["ci_low"]).shape == np.asarray(got["ci_high"]).shape
        assert len(got["correspondences"]) == 4 * 3
        for c in got["correspondences"]:  # each layer of a mapped onto b, never back to a shallower one
            assert len(c["path"]) == len(c["rows"]) and all(x <= y for x, y in zip(c["path"], c["path"][1:]))

    def test_show_prints_the_numbers_and_each_models_most_alike_other(self, zoo_store, capsys):
        code, text, err = run_cli(["show", zoo_store, "zoo", "--color", "none"], capsys)
        assert code == 0, err
        view = load_view(zoo_store, "zoo")
        assert view.title in text and "most alike other model of each:" in text
        assert f"{view.matrix[0, 1]:.3f}" in text and "jackknife interval, each of the 48 images left out" in text
        assert "calibrated" in text and "null: 999 permutations of each model's images" in text

    @pytest.mark.parametrize(
        "args, message",
        [
            (
                ["show", "STORE", "zoo", "--zoo-measure", "attention"],
                "--zoo-measure attention is not a layer x layer measure: choose from cka, rbf_cka, procrustes",
            ),
            (
                ["show", "STORE", "zoo", "--zoo-summary", "mean"],
                "--zoo-summary mean is not a zoo summary: choose from best_match, layer",
            ),
            (["show", "STORE", "zoo", "--zoo-layers", f"{VIT}=blocks.1"], "add --zoo-summary layer"),
            (
                ["show", "STORE", "zoo", "--zoo-summary", "layer", "--zoo-layers", f"{VIT}=blocks.99"],
                "has no layer 'blocks.99'",
            ),
            (["show", "STORE", f"zoo:{VIT}"], "is a view of every model of the store: use zoo"),
        ],
    )
    def test_a_bad_option_is_one_line_naming_the_way_out(self, zoo_store, capsys, args, message):
        code, _, err = run_cli([zoo_store if a == "STORE" else a for a in args], capsys)
        assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def test_a_store_of_one_model_is_told_the_zoo_compares_models(self, tiny_store, tmp_path, capsys):
        from vitsee.extraction.extract import ExtractConfig, run_extraction

        path = tmp_path / "one.h5"
        run_extraction(
            ExtractConfig(
                store=path,
                models=[RESNET],
                dataset="synthetic",
                n_images=8,
                batch_size=8,
                img_size=32,
                device="cpu",
                workers=0,
            )
        )
        code, _, err = run_cli(["analyze", path, "--zoo", "-q"], capsys)
        assert code == 2 and "the zoo compares the models of a store and one.h5 holds one" in err


@pytest.mark.parametrize("command", ["show", "analyze"])
def test_a_streaming_store_is_told_a_gram_measures_zoo_needs_activations(tmp_path, capsys, command):
    """A store streamed without activations has no Gram measure to summarise: one line naming why and the way out
    (it was an IndexError traceback)."""
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    path = tmp_path / "stream.h5"
    common = dict(dataset="synthetic", n_images=8, batch_size=8, img_size=32, device="cpu", workers=0)
    run_extraction(ExtractConfig(store=path, models=[VIT, RESNET], streaming=True, **common))
    args = ["show", path, "zoo"] if command == "show" else ["analyze", path, "--zoo", "-q"]
    code, _, err = run_cli([*args, "--zoo-measure", "svcca"], capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--streaming" in err and "SVCCA cannot be computed" in err and "re-extract without --streaming" in err


def test_a_grams_store_gives_the_zoo_and_intervals_of_its_activations(zoo_store, tmp_path, capsys):
    """A zoo streamed as Grams (`extract --grams`, no activations) has the values and intervals the same models over
    the same images and batches give from their activations."""
    from conftest import IMG
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    path = tmp_path / "grams.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[VIT, RESNET],
            dataset="synthetic",
            n_images=48,
            batch_size=16,
            img_size=IMG,
            device="cpu",
            workers=0,
            grams=True,
        )
    )
    code, _, err = run_cli(["analyze", path, "--zoo", "-q"], capsys)  # from the streamed CKA and the Grams
    assert code == 0, err
    streamed, stored = load_view(path, "zoo"), load_view(zoo_store, "zoo")
    assert streamed.extra["interval"].startswith("0.95 jackknife interval, each of the 48 images left out once")
    for name in ("calibrated", "p_value"):  # the null from the stored Grams, the same permutations
        np.testing.assert_allclose(streamed.extra[name], stored.extra[name][:2, :2], atol=1e-5)
    for name in ("matrix", "ci_low", "ci_high"):
        np.testing.assert_allclose(getattr(streamed, name), getattr(stored, name)[:2, :2], atol=1e-6)

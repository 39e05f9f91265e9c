"""`import vitsee`: the store, its views as results, their tables, arrays and figures, and the errors, which are the
CLI's own lines. The numbers and figures are the CLI's exports' (compared against `vitsee export` here)."""

from __future__ import annotations

import doctest
import html
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitsee
from conftest import RESNET, VIT, run_cli
from vitsee.store import Store as EngineStore
from vitsee.store import copy_store

FAST = {"shuffles": 0, "batch_size": 16, "device": "cpu"}  # the estimator of these tests' results
FAST_CLI = ["--shuffles", "0", "--batch-size", "16", "--device", "cpu"]
CKA_AB = f"cka:{VIT}:{RESNET}"


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory) -> vitsee.Store:
    """A copy of the tiny store with CKA across the two models and the ViT's attention cached."""
    path = copy_store(tiny_store, tmp_path_factory.mktemp("library") / "lib.h5")
    opened = vitsee.open(path)
    opened.cka(VIT, RESNET, **FAST, progress=False)
    opened.attention(VIT, **FAST, progress=False)
    return opened


def nan(values) -> np.ndarray:
    """Returns a JSON export's nested list as floats, null as NaN."""
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)


class TestOpen:
    def test_a_store_lists_its_models_layers_images_and_views(self, store, tiny_store):
        with EngineStore.open(tiny_store) as s:
            assert store.models == s.models == [VIT, RESNET]
            assert store.layers("test_resnet") == s.layers(RESNET)  # a unique prefix names a model
            assert np.array_equal(store.images.labels, s.labels) and np.array_equal(store.images.index, s.indices)
        assert len(store.images) == 48 and store.images.dataset == "synthetic" and store.images.class_names
        table = store.images.to_pandas()
        assert list(table.columns) == ["index", "label", "class_name"] and len(table) == 48
        assert table.class_name[0] == store.images.class_names[store.images.labels[0]]
        assert CKA_AB in store.views() and f"attention:{VIT}" in store.views()

    def test_info_is_what_vitsee_info_prints_as_data(self, store):
        info = store.info()
        assert info["n_images"] == 48 and info["dataset"] == "synthetic" and info["complete"] and not info["streaming"]
        assert info["models"][VIT]["family"] == "vit" and info["models"][RESNET]["weights"]["kind"] == "random"
        assert list(info["models"][VIT]["layers"]) == store.layers(VIT)
        assert info["models"][VIT]["layers"]["blocks.0"] == (17, 64) and info["models"][VIT]["rows_done"] == 48
        assert {r["analysis"] for r in info["results"]} == {"cka", "attention"}

    def test_the_store_names_itself_in_a_notebook(self, store):
        assert repr(store).startswith(f"<vitsee.Store {store.path}: 48 images of synthetic; {VIT}")
        assert f"<code>{VIT}</code>" in store._repr_html_() and os.fspath(store) == str(store.path)

    @pytest.mark.parametrize("make", ["missing", "empty", "not hdf5", "a folder"])
    def test_what_is_no_store_is_the_cli_line(self, make, tmp_path, capsys):
        path = tmp_path / "run.h5"
        if make == "empty":
            path.touch()
        elif make == "not hdf5":
            path.write_text("hello")
        elif make == "a folder":
            path.mkdir()
        with pytest.raises(vitsee.VitseeError) as caught:
            vitsee.open(path)
        code, _, err = run_cli(["info", path], capsys)
        assert code == 2 and err.strip() == f"error: {caught.value}"


class TestViews:
    def test_to_pandas_equals_the_json_export(self, store, tmp_path, capsys):
        out = tmp_path / "cka.json"
        code, _, err = run_cli(["export", store.path, CKA_AB, "--out", out, *FAST_CLI], capsys)
        assert code == 0, err
        exported = json.loads(out.read_text())
        df = store.cka(VIT, RESNET, **FAST).to_pandas()
        assert list(df.columns) == ["row", "col", "value", "ci_low", "ci_high", "p_value"]
        assert len(df) == len(exported["rows"]) * len(exported["cols"])
        for name in ("value", "ci_low", "ci_high", "p_value"):
            table = df.pivot(index="row", columns="col", values=name).loc[exported["rows"], exported["cols"]]
            expected = nan(exported["values" if name == "value" else name])
            assert np.array_equal(table.to_numpy(), expected, equal_nan=True)
        assert df.attrs["view"] == CKA_AB and df.attrs["params"] == exported["params"]

    def test_to_numpy_and_to_xarray_hold_the_same_numbers_with_their_labels(self, store, tmp_path, capsys):
        result = store.cka(VIT, RESNET, **FAST)
        exported = result.to_json()
        assert np.array_equal(result.to_numpy(), nan(exported["values"]), equal_nan=True)
        ds = result.to_xarray()
        assert ds.value.dims == ("row", "col") and list(ds.row.values) == exported["rows"]
        assert list(ds.col.values) == exported["cols"]
        assert float(ds.value.sel(row="blocks.3", col="layer2.0")) == result.values[4, 2]
        assert np.array_equal(ds.p_value.values, nan(exported["p_value"]), equal_nan=True)
        assert ds.attrs["view"] == CKA_AB and json.loads(ds.attrs["params"]) == exported["params"]
        assert ds.attrs["ci_level"] == 0.95

    @pytest.mark.parametrize("spec", [CKA_AB, f"attention:{VIT}"])
    def test_plot_draws_the_png_export_pixel_for_pixel(self, store, spec, tmp_path, capsys):
        out = tmp_path / "view.png"
        code, _, err = run_cli(["export", store.path, spec, "--out", out, *FAST_CLI], capsys)
        assert code == 0, err
        result = store.view(spec, **FAST)
        fig = result.plot()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=150, metadata={"Software": "vitsee", "Title": result.title})
        drawn, exported = np.asarray(Image.open(buffer)), np.asarray(Image.open(out))
        assert drawn.shape == exported.shape and np.array_equal(drawn, exported)
        heatmap = [ax for ax in fig.axes if ax.get_label() == "heatmap"]
        if spec == CKA_AB:
            names = store.names  # the models' display names, not their store keys
            assert (
                heatmap[0].get_ylabel() == f"{names[VIT]} layer" and heatmap[0].get_xlabel() == f"{names[RESNET]} layer"
            )

    def test_a_selection_by_labels_marks_that_cell(self, store):
        result = store.cka(VIT, RESNET, **FAST)
        marked = [a for a in result.plot(selection=("blocks.3", "layer2.0")).findobj() if a.get_gid() == "selection"]
        assert marked
        for bad in [("blocks.99", "layer2.0"), (0, 99)]:
            with pytest.raises(vitsee.VitseeError, match="blocks.99|column 99 is outside"):
                result.plot(selection=bad)

    def test_save_writes_what_vitsee_export_writes(self, store, tmp_path, capsys):
        result = store.cka(VIT, RESNET, **FAST)
        for suffix in (".json", ".csv"):
            mine, theirs = tmp_path / f"mine{suffix}", tmp_path / f"cli{suffix}"
            assert result.save(mine) == mine
            run_cli(["export", store.path, CKA_AB, "--out", theirs, *FAST_CLI], capsys)
            assert mine.read_text() == theirs.read_text()
        with pytest.raises(vitsee.VitseeError, match="use a .png, .json or .csv file name"):
            result.save(tmp_path / "view.txt")

    def test_a_notebook_shows_the_figure_and_one_summary_line(self, store):
        result = store.cka(VIT, RESNET, **FAST)
        page = result._repr_html_()
        assert page.startswith('<div><img src="data:image/png;base64,') and html.escape(result.summary()) in page
        r, c = np.unravel_index(np.nanargmax(result.values), result.values.shape)
        summary = result.summary()
        assert summary.startswith(
            f"{result.title}: CKA, 8 x 5; highest {result.rows[r]} x {result.cols[c]} {result.values[r, c]:.4f} ["
        ) and summary.endswith("; 48 images")
        assert repr(result) == f"<vitsee.Result {summary}>"

    def test_the_result_carries_its_labels_statistics_and_parameters(self, store):
        result = store.cka(VIT, RESNET, **FAST)
        assert result.kind == "cka" and result.models == [VIT, RESNET] and result.value_name == "CKA"
        assert result.rows == store.layers(VIT) and result.cols == store.layers(RESNET)
        assert result.ci_low.shape == result.ci_high.shape == result.p_value.shape == result.values.shape
        assert np.all(result.ci_low <= result.values + 1e-12) and np.all(result.values <= result.ci_high + 1e-12)
        assert result.ci_level == 0.95 and result.params["batch_size"] == 16 and result.n_images == 48
        attention = store.attention(VIT, **FAST)
        assert attention.p_value is None and "uniform_px" in attention.extra

    def test_a_cached_view_is_read_not_computed_again(self, store):
        before = len(store.info()["results"])
        again = store.cka(VIT, RESNET, **FAST)
        anyone = store.cka(VIT, RESNET)  # no estimator options: any cached estimate serves
        assert len(store.info()["results"]) == before
        assert np.array_equal(again.values, anyone.values, equal_nan=True)

    def test_the_shortcuts_name_the_view_strings_of_vitsee_show(self, store, monkeypatch):
        asked = []
        monkeypatch.setattr(vitsee.Store, "view", lambda self, spec, **options: asked.append((spec, options)))
        store.cka("a")
        store.cka("a", "b", shuffles=3)
        store.attention("a")
        store.probes("a")
        store.skip("a")
        store.spatial("a")
        store.spatial("a", "blocks.2")
        store.heads("a", "b")
        store.erf("a")
        store.erf("a", "layer1")
        store.measure("procrustes", "a", "b", procrustes_alpha=0.5)
        store.measure("rsa", "a")
        store.agree("a", "b")
        store.zoo()
        store.zoo("mknn", "layer", {"a": "blocks.1", "b": "layer2"}, knn_k=5)
        assert [spec for spec, _ in asked] == [
            "cka:a",
            "cka:a:b",
            "attention:a",
            "probes:a",
            "skip:a",
            "spatial:a",
            "spatial:a:blocks.2",
            "heads:a:b",
            "erf:a",
            "erf:a:layer1",
            "procrustes:a:b",
            "rsa:a",
            "agree:a:b",
            "zoo",
            "zoo",
        ]
        assert asked[1][1] == {"shuffles": 3} and asked[10][1] == {"procrustes_alpha": 0.5} and asked[13][1] == {}
        assert asked[14][1] == {
            "zoo_measure": "mknn",
            "zoo_summary": "layer",
            "zoo_layers": "a=blocks.1,b=layer2",
            "knn_k": 5,
        }

    def test_a_measure_and_the_zoo_are_the_numbers_vitsee_export_writes(self, store, tmp_path, capsys):
        rsa = store.measure("rsa", VIT, RESNET, max_images=32, progress=False)
        code, _, err = run_cli(
            ["export", store.path, f"rsa:{VIT}:{RESNET}", "--max-images", "32", "--out", tmp_path / "rsa.json"], capsys
        )
        assert code == 0, err
        exported = json.loads((tmp_path / "rsa.json").read_text())
        assert np.array_equal(rsa.values, nan(exported["values"]), equal_nan=True)
        assert rsa.params["max_images"] == 32 and exported["params"]["max_images"] == 32
        zoo = store.zoo(progress=False)
        code, _, err = run_cli(["export", store.path, "zoo", "--out", tmp_path / "zoo.json"], capsys)
        assert code == 0, err
        exported = json.loads((tmp_path / "zoo.json").read_text())
        assert exported["models"] == store.models == zoo.rows
        assert np.array_equal(zoo.values, nan(exported["values"]), equal_nan=True)
        assert list(zoo.extra["order"]) == exported["order"]

    def test_what_is_no_measure_or_no_option_is_one_line(self, store):
        with pytest.raises(vitsee.VitseeError, match=r"^'attention' is not a layer x layer measure: use one of cka, "):
            store.measure("attention", VIT)
        with pytest.raises(
            vitsee.VitseeError,
            match=r"^no view takes the option zoo_meassure=: the analyses' options "
            r"are .*zoo_measure",
        ):
            store.view("zoo", zoo_meassure="rsa")

    @pytest.mark.parametrize(
        "spec",
        [
            "nope:test_vit",
            "cka:nosuch",
            "spatial:test_vit:blocks.77",
            "attention:test_resnet",
            "heads:test_vit",
            "cka:test_vit:test_resnet:x",
        ],
    )
    def test_a_view_that_cannot_be_is_the_line_vitsee_show_prints(self, store, spec, capsys):
        with pytest.raises(vitsee.VitseeError) as caught:
            store.view(spec, **FAST)
        code, _, err = run_cli(["show", store.path, spec, *FAST_CLI], capsys)
        assert code == 2 and err.strip() == f"error: {caught.value}"

    @pytest.mark.parametrize(
        "options", [{"batch_size": 2}, {"shuffles": -1}, {"ci": 1.5}, {"permutations": -1}, {"device": "tpu"}]
    )
    def test_a_bad_estimator_option_is_the_cli_line(self, store, options, capsys):
        with pytest.raises(vitsee.VitseeError) as caught:
            store.view(f"spatial:{VIT}:blocks.1", **options)
        flag, value = next(iter(options.items()))
        flag = f"--{flag.replace('_', '-')}"
        code, _, err = run_cli(["show", store.path, f"spatial:{VIT}:blocks.1", flag, value], capsys)
        assert code == 2 and err.strip() == f"error: {caught.value}"

    def test_the_view_options_build_the_config_the_cli_builds(self):
        from vitsee.library.store import view_config
        from vitsee import cli

        cases = [
            {},
            {"device": "cpu"},
            {"batch_size": 32},
            {"shuffles": 0, "seed": 3},
            {"ci": 0},
            {"ci": 0.9},
            {"permutations": 0},
            {"batch_size": 8, "device": "cpu", "ci": 0.5, "permutations": 9},
        ]
        for options in cases:
            args = [options.get(k) for k in ("batch_size", "shuffles", "seed", "device", "ci", "permutations")]
            assert view_config(**options) == cli._view_config(*args), options

    def test_without_pandas_or_xarray_the_conversion_says_what_to_install(self, store, monkeypatch):
        result = store.cka(VIT, RESNET, **FAST)
        monkeypatch.setitem(sys.modules, "pandas", None)
        monkeypatch.setitem(sys.modules, "xarray", None)
        with pytest.raises(vitsee.VitseeError, match=r"to_pandas\(\) needs pandas, .*pip install pandas"):
            result.to_pandas()
        with pytest.raises(vitsee.VitseeError, match=r"to_xarray\(\) needs xarray, .*pip install xarray"):
            result.to_xarray()


class TestProgress:
    def test_a_computed_view_draws_a_bar_and_progress_false_draws_nothing(self, tiny_store, tmp_path, capsys):
        store = vitsee.open(copy_store(tiny_store, tmp_path / "fresh.h5"))
        store.skip(VIT, progress=False, device="cpu")
        quiet = capsys.readouterr()
        assert quiet.out == "" and quiet.err == ""
        store.skip(RESNET, device="cpu")
        drawn = capsys.readouterr().err
        assert "skip" in drawn and "100%" in drawn

    def test_a_warning_of_a_run_is_a_vitsee_warning_even_without_bars(self):
        from vitsee.library.progress import Bars
        from vitsee.extraction.plan import Progress

        with pytest.warns(vitsee.VitseeWarning, match="2 layer"):
            Bars(enabled=False).extraction(Progress("warning", message="2 layer(s) hold non-finite values"))


def test_reading_a_cached_view_imports_no_torch(store):
    code = f"""
import sys, vitsee
store = vitsee.open({str(store.path)!r})
result = store.cka({VIT!r}, {RESNET!r})
result.to_pandas(), result.to_xarray(), result.plot(), result._repr_html_(), store.info(), store.images, store.views()
store.attention({VIT!r}).plot()
print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm')))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_the_public_api_is_documented_like_the_readme():
    import pydoc

    for name in ("open", "extract", "train", "from_features"):
        doc = getattr(vitsee, name).__doc__
        assert all(section in doc for section in ("Args:", "Returns:", "Raises:")), name
    for method in (vitsee.Store.view, vitsee.Result.to_pandas, vitsee.Result.to_xarray, vitsee.Result.plot):
        assert "Returns:" in method.__doc__ and "Raises:" in method.__doc__
    text = pydoc.render_doc(vitsee.open, renderer=pydoc.plaintext)
    assert "Returns the vitsee store at `path`" in text and "store.cka(vit, resnet).to_pandas()" in text
    assert sorted(vitsee.__all__) == [
        "Images",
        "Result",
        "SeedSpread",
        "Store",
        "VitseeError",
        "VitseeWarning",
        "across_seeds",
        "extract",
        "from_features",
        "measures",
        "open",
        "train",
    ]


def test_measures_are_the_engines_functions_under_the_public_name():
    from vitsee.measures import rbf_cka
    from vitsee.measures.registry import REGISTRY

    assert rbf_cka is REGISTRY["rbf_cka"].direct  # the function the analyses' measure declares, not a copy
    assert sorted(vitsee.measures.__all__) == sorted(
        ["linear_cka", "rbf_cka", "procrustes", "svcca", "pwcca", "mknn", "cknna", "rsa"]
        + ["soft_matching", "linear_predictivity"]
    )  # the promised names, each its measure's direct form
    assert all(getattr(vitsee.measures, name) is REGISTRY[name].direct for name in vitsee.measures.__all__)
    x = np.random.default_rng(0).normal(size=(12, 5))
    assert vitsee.measures.linear_cka(x, x) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "module", ["vitsee.library.store", "vitsee.library.result", "vitsee.library.run", "vitsee.library.features"]
)
def test_the_doctest_examples_run(module):
    import importlib

    failed, attempted = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert failed == 0 and (attempted > 0 or module != "vitsee.library.store")


def test_import_vitsee_is_engine_and_its_rooms_are_its_sub_packages():
    import vitsee.store
    import vitsee.tui

    root = Path(__file__).resolve().parents[1]
    assert Path(vitsee.__file__).resolve() == root / "engine" / "__init__.py"
    assert Path(vitsee.store.__file__).resolve() == root / "engine" / "store" / "__init__.py"
    assert Path(vitsee.tui.__file__).resolve() == root / "tui" / "__init__.py"

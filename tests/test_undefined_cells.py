"""A cell without a value says what made it so: a constant layer (no variance), a layer RSA cannot use (one feature),
NaN/Inf in the stored activations only where there are some; in `vitsee show`, the JSON, the figure and the app's
status line. `vitsee analyze` says a layer's warning in one line of its own, once.

The issue's store: `from_features` with a constant layer, a 1-feature layer and a layer of values ~1e-30, then
`show` said "12 non-finite cell(s), from NaN/Inf in the stored activations" while `vitsee info` showed none.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import vitsee
from conftest import run_cli
from vitsee.analyses.driver import AnalyzeConfig, run_analyses
from vitsee.analyses.views import load_view
from vitsee.store import copy_store

CONSTANT = "const does not vary across the images (no variance)"
CKA_CONSTANT = "const does not vary across the images, or in too few of them for minibatch CKA"
MOSTLY_SAME = "same has the same features in most pairs of images: RBF CKA's bandwidth, their median distance, is 0"
ONE_FEATURE = "one has images whose features are all equal (one feature?): RSA correlates each image's features"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Returns the issue's store (and a layer with a NaN in two images), CKA and RSA cached."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 20))
    nans = rng.normal(size=(64, 8))
    nans[[3, 40], 0] = np.nan
    features = {"normal": x, "const": np.ones((64, 10)), "one": rng.normal(size=(64, 1)), "tiny": 1e-30 * x}
    same = np.r_[np.ones((60, 5)), rng.normal(size=(4, 5))]  # 4 images differ: the median distance is 0
    path = tmp_path_factory.mktemp("undefined") / "f.h5"
    vitsee.from_features(path, {"m": {**features, "nans": nans, "same": same}})
    with pytest.warns(UserWarning, match="const does not vary"):  # said once per layer by the measure
        run_analyses(path, ["cka", "rsa", "rbf_cka"], AnalyzeConfig(device="cpu", batch_size=32, shuffles=0))
    return path


CFG = AnalyzeConfig(device="cpu", batch_size=32, shuffles=0)


def _why(view, row: str, col: str) -> str:
    return view.cell_text(view.rows.index(row), view.cols.index(col))


def test_each_cell_says_what_made_it_undefined_and_nan_inf_only_where_there_are_some(store):
    cka, rsa, rbf = (load_view(store, f"{m}:m", CFG) for m in ("cka", "rsa", "rbf_cka"))
    assert _why(cka, "normal", "const").startswith(f"undefined: {CKA_CONSTANT}")
    assert _why(cka, "const", "one").startswith(f"undefined: {CKA_CONSTANT}")
    assert _why(cka, "normal", "nans") == "non-finite (2 of 64 images)"
    assert _why(cka, "const", "nans") == "non-finite (2 of 64 images)"  # the NaN/Inf behind it come first
    assert _why(cka, "normal", "tiny") == "1.0000"  # a tiny layer has a value (tests/test_tiny_layers.py)
    assert _why(rsa, "normal", "one").startswith(f"undefined: {ONE_FEATURE}")
    assert _why(rsa, "const", "one") == f"undefined: {CONSTANT}; " + _why(rsa, "normal", "one").removeprefix(
        "undefined: "
    )
    assert _why(rsa, "normal", "const") == f"undefined: {CONSTANT}"
    assert _why(rbf, "normal", "same") == f"undefined: {MOSTLY_SAME}"
    assert _why(rbf, "normal", "const") == f"undefined: {CONSTANT}"
    note = cka.nonfinite_note()
    assert note.startswith("11 non-finite cell(s), from NaN/Inf in the stored activations, in nans")
    assert f"9 undefined cell(s): {CKA_CONSTANT}" in note
    assert "tiny" not in note and "one" not in note and "same" not in note  # defined for CKA


def test_show_and_the_json_name_the_reason(store, tmp_path, capsys):
    code, out, _ = run_cli(["show", store, "rsa:m"], capsys)
    assert code == 0
    note = next(line for line in out.splitlines() if "cell(s)" in line)
    assert "from NaN/Inf in the stored activations, in nans" in note
    assert CONSTANT in note and ONE_FEATURE in note
    code, _, _ = run_cli(["export", store, "rsa:m", "--out", tmp_path / "rsa.json"], capsys)
    cells = {(c["row_label"], c["col_label"]): c for c in json.loads((tmp_path / "rsa.json").read_text())["nonfinite"]}
    assert cells["normal", "const"]["why"] == f"undefined: {CONSTANT}" and cells["normal", "const"]["images"] == 0
    assert cells["normal", "one"]["why"].startswith(f"undefined: {ONE_FEATURE}")
    assert cells["normal", "nans"]["why"] == "non-finite (2 of 64 images)" and cells["normal", "nans"]["images"] == 2


def test_the_figure_caption_names_the_reason(store):
    from vitsee.output.figures import figure_for

    fig = figure_for(load_view(store, "cka:m", CFG))
    notes = [t.get_text() for t in fig.texts if t.get_gid() == "nonfinite-note"]
    assert notes and CKA_CONSTANT in notes[0].replace("\n", " ")


def test_a_result_cached_before_reasons_were_kept_blames_nan_inf_only_where_there_are_some(store, tmp_path):
    path = tmp_path / "old.h5"
    copy_store(store, path)
    results = sorted((tmp_path / "old.h5.d" / "results" / "cka").glob("*.h5"))
    assert results
    for result in results:
        with h5py.File(result, "r+") as f:
            del f["undefined"]  # what a result of the code before holds: no per-layer codes
    view = load_view(path, "cka:m", CFG)
    assert view.reasons is None
    assert _why(view, "normal", "const") == "undefined: not from NaN/Inf (the stored activations hold none)"
    assert _why(view, "normal", "nans") == "non-finite (2 of 64 images)"
    assert "from NaN/Inf in the stored activations, in nans" in view.nonfinite_note()
    assert "9 undefined cell(s): not from NaN/Inf" in view.nonfinite_note()


def test_analyze_says_a_constant_layer_once_in_one_line_of_its_own(store, tmp_path, capsys):
    path = tmp_path / "f.h5"
    copy_store(store, path)
    args = ["analyze", path, "--measures", "all", "--measure-bootstrap", "5", "--recompute", "--device", "cpu", "-q"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    # the run printed 12 lines: Python's UserWarning with its source path and code line, once per resample
    assert lines == [
        "warning: m const does not vary across the images (no variance): every layer measure of it is undefined (NaN)"
    ], err


async def test_the_apps_status_line_names_the_reason(store, tmp_path):
    from helpers.app import SIZE, make_app, settle, status, view_shown

    path = tmp_path / "f.h5"
    copy_store(store, path)
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"), timeout=120)
        await pilot.press("down")  # const x normal
        await settle(pilot)
        assert f"const x normal  CKA undefined: {CKA_CONSTANT}" in status(app), status(app)
        await pilot.press("down", "down", "down")  # nans x normal
        await settle(pilot)
        assert "nans x normal  CKA non-finite (2 of 64 images)" in status(app), status(app)

"""Every registered analysis through the same path, the way timm's tests run every registered model: its params,
run, cached rerun, view, PNG figure, `vitsee show` text, JSON export, its pane in the app (Enter on the first
cell), its dossier section, and "does not apply" on a model it does not apply to. A new analysis gets all of this
by being registered (engine/analyses/contract.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from helpers.app import SIZE, make_app, settle, view_shown
from vitsee.analyses import REGISTRY, Result, Shape, View
from vitsee.analyses.contract import Request
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.store import Store
from vitsee.analyses.views import load_view, request_of

CFG = AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", erf_images=4, permutations=9)
NAMES = list(REGISTRY)
LAYER = "blocks.1"  # a ViT layer every view of one layer can be of (a token grid, a centre position)


def spec_of(name: str) -> str:
    """Returns the view string the contract test opens for an analysis: of the ViT (and the ResNet, for two)."""
    analysis = REGISTRY[name]
    keys = [VIT, RESNET][: analysis.models[0]]
    return ":".join([name, *keys, *([LAYER] if analysis.takes_layer else [])])


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory) -> Path:
    """A copy of the tiny store the analyses here cache their results in."""
    path = tmp_path_factory.mktemp("contract") / "tiny.h5"
    shutil.copy(tiny_store, path)
    return path


@pytest.fixture(scope="module")
def zoo(zoo_store, tmp_path_factory) -> Path:
    """A copy of the zoo store (four models, two families), for a view of the whole store that compares families."""
    from vitsee.store import copy_store

    path = tmp_path_factory.mktemp("contract-zoo") / "zoo.h5"
    copy_store(zoo_store, path)
    return path


def _home(name: str, store: Path, zoo: Path) -> Path:
    """Returns the store an analysis is run on: the tiny store, or for a view of the whole store that has nothing to
    compare there (the separability of families needs two models of one family) the zoo store."""
    analysis = REGISTRY[name]
    if analysis.models == (0, 0):
        with Store.open(store) as s:
            if not analysis.requests(s):
                return zoo
    return store


@pytest.fixture(scope="module")
def streamed(tmp_path_factory) -> Path:
    """A streaming store of both models (no activations, no input, no head outputs): what reads them is n/a."""
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    path = tmp_path_factory.mktemp("contract-stream") / "stream.h5"
    run_extraction(
        ExtractConfig(
            store=path,
            models=[VIT, RESNET],
            dataset="synthetic",
            n_images=8,
            batch_size=8,
            img_size=IMG,
            device="cpu",
            workers=0,
            streaming=True,
        )
    )
    return path


def _computed(store: Path, name: str) -> Result:
    with Store.writer(store) as s:
        request = request_of(s, spec_of(name))
        return request.analysis.run(s, request, CFG)


@pytest.mark.parametrize("name", NAMES)
def test_declares_what_the_cli_the_views_and_the_app_ask_of_it(name):
    analysis = REGISTRY[name]
    assert analysis.name == name and analysis.label and analysis.title and analysis.option_help
    assert isinstance(analysis.shape, Shape) and analysis.identity
    least, most = analysis.models
    assert analysis.usage.startswith(name + (":" if least else "")) and 0 <= least <= most <= 2
    assert len(analysis.model_fields) == min(most, 1 if analysis.models == (1, 1) else 2)  # (0, 0): the whole store
    assert all(o.name and o.help and o.type in (int, float, str) for o in analysis.options)


@pytest.mark.parametrize("name", NAMES)
def test_params_run_and_a_rerun_served_from_the_cache(store, zoo, name):
    analysis = REGISTRY[name]
    store = _home(name, store, zoo)
    with Store.open(store) as s:
        request = request_of(s, spec_of(name))
        params = analysis.params(s, request, CFG)
    assert json.loads(json.dumps(params)) == params  # the cache key is plain JSON
    assert all(key in params for key in analysis.identity)
    result = _computed(store, name)
    assert isinstance(result, Result) and result.params == params and len(result) > 0
    with Store.open(store) as s:
        files = len(s.results(name))
        assert Result.load(s, name, params) is not None
    again = _computed(store, name)  # read back, not computed: no new result, the same arrays
    with Store.open(store) as s:
        assert len(s.results(name)) == files
    assert sorted(again) == sorted(result)
    for key in result:
        np.testing.assert_array_equal(np.asarray(again[key]), np.asarray(result[key]))


@pytest.mark.parametrize("name", NAMES)
def test_its_view_draws_prints_and_exports_the_same_numbers(store, zoo, name, tmp_path, capsys):
    store = _home(name, store, zoo)
    _computed(store, name)
    view = load_view(store, spec_of(name))
    assert isinstance(view, View) and view.analysis is REGISTRY[name] and view.spec == spec_of(name)
    assert view.matrix.ndim == 2 and view.matrix.shape == (len(view.rows), len(view.cols))
    assert np.isfinite(view.matrix).any()

    png = tmp_path / "view.png"
    code, _, err = run_cli(["export", store, view.spec, "--out", png], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    out = tmp_path / "view.json"
    code, _, err = run_cli(["export", store, view.spec, "--out", out], capsys)
    assert code == 0, err
    exported = json.loads(out.read_text())
    assert exported["view"] == name and exported["rows"] == view.rows and exported["cols"] == view.cols
    fields = view.analysis.model_fields
    assert [exported[f] for f in fields] == [*view.models[:1], *view.models[-1:]][: len(fields)]
    values = np.array([[np.nan if v is None else v for v in row] for row in exported["values"]], dtype=float)
    np.testing.assert_array_equal(values, view.matrix)

    code, text, err = run_cli(["show", store, view.spec, "--color", "none"], capsys)
    assert code == 0, err
    assert view.title in text and "Traceback" not in err


@pytest.mark.parametrize("name", NAMES)
async def test_its_pane_shows_the_view_and_enter_on_the_first_cell_opens_its_detail(store, zoo, name, tmp_path):
    from vitsee.tui.screens.explorer import ExplorerScreen
    from vitsee.tui.widgets.panes import KINDS, TAB_LABELS

    store = _home(name, store, zoo)
    _computed(store, name)
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown(KINDS[0]))
        if REGISTRY[name].takes_layer:
            app.screen.picked_layer[(name, VIT)] = LAYER
        if name in TAB_LABELS:  # its number key
            await pilot.press(str(list(TAB_LABELS).index(name) + 1))
        else:  # shown in its family's tab: the jump list (:) names every view
            await pilot.press("colon")
            await settle(pilot)
            await pilot.press(*["down"] * KINDS.index(name), "enter")
        await settle(pilot, view_shown(name), timeout=60)
        pane = app.screen.pane(name)
        assert pane.loaded.spec == app.screen.spec_for(name)[0] and not pane.loaded.computed  # read from the cache
        assert pane.loaded.spec.startswith(spec_of(name).rsplit(f":{LAYER}", 1)[0])
        assert pane.view.title in str(pane.query_one(".pane--title").render())
        explorer, seen = app.screen, len(app.notes_seen)
        await pilot.press("enter")
        await settle(pilot)
        # a detail opened, another view of the cell (the zoo's pair, the measure under the cursor of the measures'
        # comparison), or it said why not
        assert app.screen is not explorer or explorer.kind != name or len(app.notes_seen) > seen
        if app.screen is not explorer:
            await pilot.press("escape")
            await settle(pilot)
            assert isinstance(app.screen, ExplorerScreen)


@pytest.mark.parametrize("name", [n for n in NAMES if REGISTRY[n].dossier_title])
def test_its_dossier_section_is_about_the_layer(store, name):
    from vitsee.tui.dossier import section_of

    _computed(store, name)
    view = load_view(store, spec_of(name))
    section = section_of(REGISTRY[name], VIT, LAYER, view)
    assert section.kind == name and section.model == VIT and section.available
    assert section.lines and all(isinstance(line, str) and line for line in section.lines)
    assert section.title.startswith(REGISTRY[name].dossier_title)


def _not_applicable(stores: list[Path], name: str) -> tuple[Path, str, str] | None:
    """Returns (store, model, reason) of the first model the analysis does not apply to, if any."""
    for path in stores:
        with Store.open(path) as s:
            for key in s.models:
                reason = REGISTRY[name].not_applicable(s, key)
                if reason:
                    return path, key, reason
    return None


@pytest.mark.parametrize("name", NAMES)
async def test_a_model_it_does_not_apply_to_is_told_why_by_the_driver_the_view_and_the_app(
    store, streamed, name, tmp_path, capsys
):
    from vitsee.analyses.driver import plan
    from vitsee.tui.results import read_summary

    found = _not_applicable([store, streamed], name)
    if found is None:  # CKA, skip ratios: they apply to every model of both stores
        for path in (store, streamed):
            with Store.open(path) as s:
                assert all(REGISTRY[name].not_applicable(s, key) is None for key in s.models)
        return
    path, key, reason = found
    assert len(reason.splitlines()) == 1 and len(reason) > 20
    with Store.open(path) as s:
        jobs = plan(s, [name]) if any(REGISTRY[name].not_applicable(s, k) is None for k in s.models) else None
        assert jobs is None or all(key not in job.keys[:1] for job in jobs)  # the driver leaves that model out
    if jobs is None:  # applies to no model here: naming it is the one-line error
        code, _, err = run_cli(["analyze", path, f"--{name}", "-q"], capsys)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    summary = read_summary(path)
    assert summary.model(key).reason(name) == reason  # what the app and the dossier say

    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda a: a.screen.summary is not None)
        screen = app.screen
        screen.model_a = key
        spec, why = screen.spec_for(name)
        assert spec is None and why.startswith(reason)


def test_the_registry_finds_the_layer_similarity_family_and_views_name_their_requests(store):
    from vitsee.analyses.contract import analyses_of
    from vitsee.analyses.views import available_views

    assert REGISTRY["cka"] in analyses_of(REGISTRY["cka"].family)
    views = available_views(store)
    assert views[:2] == [f"cka:{VIT}", f"cka:{VIT}:{RESNET}"]
    assert f"attention:{VIT}" in views and f"attention:{RESNET}" not in views
    assert Request("cka", (VIT, RESNET)).spec == f"cka:{VIT}:{RESNET}"

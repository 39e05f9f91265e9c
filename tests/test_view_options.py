"""Every option a user gives `vitsee show`, `vitsee export` or `store.view()` either selects a cached result made
with that value or computes one; never silently another (issue 29, point 4: `--max-images 64` returned the cached
256-image mknn, whose cell read 0.298 where 64 images give 0.531). One test over every option: the estimator's and
every option an analysis declares (a new option fails `test_every_option_is_in_the_table` until it is added)."""

from __future__ import annotations

import json

import pytest

import vitsee
from conftest import RESNET, VIT, run_cli
from vitsee.analyses import REGISTRY
from vitsee.analyses.contract import param_at
from vitsee.store import copy_store

# option (its Python name) -> (a view that takes it, a value, another value, other options it needs, where the
# result's params keep it); the values differ from each other, and the first is not always the default
ESTIMATOR = {
    "batch_size": (f"cka:{VIT}", 16, 24, {}, "batch_size"),
    "shuffles": (f"cka:{VIT}", 0, 2, {}, "shuffles"),
    "seed": (f"cka:{VIT}", 0, 1, {}, "seed"),
    "ci": (f"cka:{VIT}", 0.95, 0.9, {}, "stats.ci"),
    "permutations": (f"cka:{VIT}", 9, 19, {}, "stats.permutations"),
}
OWN = {
    "max_images": (f"mknn:{VIT}:{RESNET}", 24, 40, {}, None),
    "measure_bootstrap": (f"rbf_cka:{VIT}", 0, 4, {}, None),
    "measure_permutations": (f"rsa:{VIT}", 0, 4, {}, None),
    "rbf_threshold": (f"rbf_cka:{VIT}:{RESNET}", 0.5, 0.8, {}, None),
    "rbf_hsic": (f"rbf_cka:{VIT}:{RESNET}", "unbiased", "biased", {}, None),
    "procrustes_alpha": (f"procrustes:{VIT}", 1.0, 0.5, {}, None),
    "cca_keep": (f"svcca:{VIT}", 0.99, 0.9, {}, None),
    "knn_k": (f"cknna:{VIT}", 10, 5, {}, None),
    "spatial_layer": (f"spatial:{VIT}", "blocks.5", "blocks.2", {}, None),
    "probe_max_dim": (f"probes:{VIT}", 1024, 0, {}, None),
    "erf_images": (f"erf:{VIT}", 2, 3, {}, None),
    "zoo_measure": ("zoo", "cka", "rsa", {}, None),
    "zoo_summary": ("zoo", "best_match", "layer", {}, None),
    "zoo_permutations": ("zoo", 0, 19, {}, None),
    "zoo_layers": ("zoo", f"{VIT}=blocks.5", f"{VIT}=blocks.2", {"zoo_summary": "layer"}, None),
    "soft_matching_units": (f"soft_matching:{VIT}", 16, 32, {}, None),
    "predictivity_folds": (f"linear_predictivity:{VIT}", 5, 3, {}, None),
    "curve_measure": (f"curve:{VIT}:{RESNET}", "mknn", "rsa", {"curve_layers": "blocks.5,layer4.0"}, None),
    "curve_layers": (f"curve:{VIT}:{RESNET}", "blocks.5,layer4.0", "blocks.2,layer1.0", {}, None),
    "curve_over": (f"curve:{VIT}:{RESNET}", "n", "k", {"curve_layers": "blocks.5,layer4.0"}, None),
    "curve_first": (f"curve:{VIT}:{RESNET}", 16, 24, {"curve_layers": "blocks.5,layer4.0"}, None),
    # separability needs two models of one family: the zoo store's four
    "separability_measures": ("separability", "cka", "cka,rsa", {}, None),
    "families": ("separability", "", f"{VIT}=odd,{RESNET}=odd", {"separability_measures": "cka"}, None),
    "separate_by": (  # the zoo's models are all random inits: one is called trained, so there are two groups
        "separability",
        "family",
        "trained",
        {"separability_measures": "cka", "families": f"{VIT}=trained"},
        None,
    ),
}
ON_ZOO = {"separability_measures", "families", "separate_by"}
LISTS = {"curve_layers", "separability_measures"}  # kept as lists: a,b -> [a, b]
TABLE = {**ESTIMATOR, **OWN}
CHEAP = {"permutations": 0, "ci": 0}  # the estimator of the CKA the zoo and the others do not ask for


def flag(attr: str) -> str:
    own = next((o.name for a in REGISTRY.values() for o in a.options if o.attr == attr), None)
    return f"--{own or attr.replace('_', '-')}"


def test_every_option_is_in_the_table():
    declared = {o.attr for a in REGISTRY.values() for o in a.options}
    assert declared | set(ESTIMATOR) == set(TABLE)


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory) -> vitsee.Store:
    return vitsee.open(copy_store(tiny_store, tmp_path_factory.mktemp("options") / "options.h5"))


def ask(store: vitsee.Store, how: str, spec: str, options: dict, tmp_path, capsys) -> dict:
    """Returns the params of the result `how` (view, show or export) gives for a view with these options."""
    if how == "view":
        return store.view(spec, progress=False, **options).params
    args = [a for attr, value in options.items() for a in (flag(attr), str(value))]
    out = tmp_path / "view.json"
    cli = (
        ["show", store.path, spec, "--format", "json"] if how == "show" else ["export", store.path, spec, "--out", out]
    )
    code, printed, err = run_cli([*cli, *args], capsys)
    assert code == 0, err
    return json.loads(printed if how == "show" else out.read_text())["params"]


@pytest.fixture(scope="module")
def zoo(zoo_store, tmp_path_factory) -> vitsee.Store:
    return vitsee.open(copy_store(zoo_store, tmp_path_factory.mktemp("options-zoo") / "zoo.h5"))


@pytest.mark.parametrize("how", ["view", "show", "export"])
@pytest.mark.parametrize("attr", list(TABLE))
def test_an_option_given_selects_a_result_made_with_its_value_or_computes_one(store, zoo, how, attr, tmp_path, capsys):
    store = zoo if attr in ON_ZOO else store
    spec, first, second, needs, path = TABLE[attr]
    kind = spec.partition(":")[0]
    path = path or REGISTRY[kind].option_paths(attr)[0]
    base = {**({} if attr in ESTIMATOR or kind != "cka" else CHEAP), **needs}
    seen = {}
    for value in (first, second, first, second):  # the second asking of each finds it cached and must take it
        params = ask(store, how, spec, {**base, attr: value}, tmp_path, capsys)
        shown = param_at(params, path)
        if value in seen:
            assert params == seen[value]  # the same result as the first time: the one cached
        else:
            seen[value] = params
        wanted = dict([value.split("=")]) if attr == "zoo_layers" else value  # kept as {model: layer}
        wanted = value.split(",") if attr in LISTS else wanted
        wanted = {"unbiased": True, "biased": False}[value] if attr == "rbf_hsic" else wanted  # kept as `debiased`
        assert shown == wanted or (not wanted and not shown), (attr, value, path, shown)
    assert len(seen) == 2


@pytest.mark.parametrize("how", ["view", "show"])
def test_device_says_where_to_compute_and_any_cached_result_serves(store, how, tmp_path, capsys):
    spec = f"skip:{VIT}"
    cpu = ask(store, how, spec, {"device": "cpu"}, tmp_path, capsys)
    before = len(store.info()["results"])
    assert ask(store, how, spec, {"device": "auto"}, tmp_path, capsys) == cpu  # the same estimate, wherever it was made
    assert len(store.info()["results"]) == before


def test_an_option_a_view_does_not_take_is_refused_in_one_line(store, capsys):
    code, out, err = run_cli(["show", store.path, f"cka:{VIT}", "--max-images", "16"], capsys)
    assert code == 2 and out == ""
    assert "--max-images is no option of cka views (it is one of rbf_cka," in err and err.count("\n") <= 2
    with pytest.raises(vitsee.VitseeError, match="--knn-k is no option of skip views"):
        store.skip(VIT, knn_k=5)


def test_a_measure_without_an_interval_says_so_and_how_to_get_one(store, capsys):
    spec = f"rsa:{VIT}:{RESNET}"  # issue 29, point 8: `RBF CKA 0.7304` with no interval and no word on it
    bare = store.view(spec, progress=False, measure_bootstrap=0)
    assert bare.ci_low is None and "no interval: --measure-bootstrap 200 gives one" in bare.summary()
    code, out, err = run_cli(["show", store.path, spec, "--measure-bootstrap", "0", "--color", "none"], capsys)
    assert code == 0 and "no interval: --measure-bootstrap 200 gives one" in out, err
    with_ci = store.view(spec, progress=False, measure_bootstrap=4)
    assert with_ci.ci_low is not None and "no interval" not in with_ci.summary() and " [" in with_ci.summary()
    assert "no interval" not in store.cka(VIT, progress=False).summary()  # CKA has its interval

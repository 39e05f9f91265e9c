"""Display names (issue 29, point 3): a store key (`vit_tiny_patch16_224@file:demo-...-s0`) identifies a model and
stays in the JSON; every title, axis, legend, file name and message calls the model by a short name instead,
automatic or set (CLI, library, app) and kept in the store. A figure shows no absolute path and, exported, no
cursor unless asked."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from matplotlib.text import Text

import vitsee
from conftest import RESNET, VIT, run_cli
from vitsee.store import Store, copy_store
from vitsee.store.names import automatic_names

ABSOLUTE_PATH = re.compile(r"(?:^|[\s:(=])/[\w.-]+/")  # '/root/...', 'npz:/home/...'; not '||z||/||f(z)||'
FAST = {"shuffles": 0, "batch_size": 16, "device": "cpu", "permutations": 0}


def record(name: str, kind: str, **weights) -> dict:
    return {"name": name, "tag": weights.pop("tag", None), "weights": {"kind": kind, **weights}}


def test_automatic_names_are_the_timm_name_and_the_weights_in_a_word():
    names = automatic_names(
        {
            "vit_base_patch16_224.augreg_in21k": record("vit_base_patch16_224", "pretrained", tag="augreg_in21k"),
            "resnet18@random:0": record("resnet18", "random", seed=0),
            "vit_tiny@file:vit": record(
                "vit_tiny", "file", path="/w/vit.safetensors", trained="digits (1438 images, 15 epochs, ...)"
            ),
            "vit_tiny@file:vit-init": record(
                "vit_tiny",
                "file",
                path="/w/vit-init.safetensors",
                trained="digits (1438 images, 0 epochs: the seeded init, test accuracy 0.114)",
            ),
            "resnet50@file:mine": record("resnet50", "file", path="/w/mine.pth"),
            "alexnet": record("alexnet", "features"),
        }
    )
    assert list(names.values()) == [
        "vit_base_patch16_224 (pretrained)",
        "resnet18 (random init)",
        "vit_tiny (trained here)",
        "vit_tiny (random init)",
        "resnet50 (mine)",
        "alexnet",  # from another tool's features: the name it was given
    ]


def test_models_that_would_read_alike_are_told_apart_by_seed_or_weights_file():
    names = automatic_names(
        {
            "r@random:0": record("resnet18", "random", seed=0),
            "r@random:1": record("resnet18", "random", seed=1),
            "v@file:f01": record("vit", "file", path="/w/f01-steps.safetensors", trained="digits (..., 150 epochs)"),
            "v@file:f03": record("vit", "file", path="/w/f03-steps.safetensors", trained="digits (..., 50 epochs)"),
        }
    )
    assert list(names.values()) == [
        "resnet18 (random init, seed 0)",
        "resnet18 (random init, seed 1)",
        "vit (f01-steps)",
        "vit (f03-steps)",
    ]


@pytest.fixture
def named(tiny_store, tmp_path) -> Path:
    return copy_store(tiny_store, tmp_path / "named.h5")


def test_a_name_set_on_the_command_line_is_kept_in_the_store_and_read_back(named, capsys):
    code, _, err = run_cli(["name", named, VIT, "ViT-6 (random init)"], capsys)
    assert code == 0, err
    assert vitsee.open(named).names[VIT] == "ViT-6 (random init)"
    code, out, _ = run_cli(["name", named, "ViT-6 (random init)"], capsys)  # a model by its display name
    assert out.strip() == f"ViT-6 (random init)  ({VIT})"
    code, out, _ = run_cli(["info", named], capsys)
    assert "called 'ViT-6 (random init)'" in out
    code, _, err = run_cli(["name", named, VIT, "--automatic"], capsys)
    assert code == 0 and vitsee.open(named).names[VIT] == "test_vit (random init)"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("   ", "an empty name"),
        ("ViT: six blocks", "holds a ':'"),
        ("test_resnet (random init)", "already names test_resnet@random:0"),
        ("x" * 61, "a label takes at most 60"),
    ],
)
def test_a_bad_name_is_refused_in_one_line_naming_the_way_out(named, capsys, name, says):
    code, out, err = run_cli(["name", named, VIT, name], capsys)
    assert code == 2 and out == "" and says in err and err.count("\n") <= 2
    assert vitsee.open(named).names[VIT] == "test_vit (random init)"  # nothing changed


def test_the_library_sets_a_name_and_takes_a_model_by_it(named):
    store = vitsee.open(named)
    assert store.set_name(RESNET, "ResNet (untrained)") == "ResNet (untrained)"
    assert vitsee.open(named).names == {VIT: "test_vit (random init)", RESNET: "ResNet (untrained)"}
    result = store.cka("test_vit (random init)", "ResNet (untrained)", **FAST, progress=False)
    assert result.models == [VIT, RESNET]  # the keys, as the JSON keeps them
    assert result.title == "CKA: test_vit (random init) x ResNet (untrained)"
    assert result.to_json()["model_b"] == RESNET and result.to_json()["names"][RESNET] == "ResNet (untrained)"
    store.set_name(RESNET, None)
    assert store.names[RESNET] == "test_resnet (random init)"


def test_a_names_file_left_by_another_store_is_not_read(named, tiny_store, tmp_path):
    vitsee.open(named).set_name(VIT, "mine")
    other = copy_store(tiny_store, tmp_path / "other.h5")
    shutil.copy(named.with_name("named.h5.d") / "names.h5", other.with_name("other.h5.d") / "names.h5")
    with Store.open(other) as s:  # a copy of the same store: the same store_id, so its names
        assert s.display_names()[VIT] == "mine"
    vitsee.extract(tmp_path / "third.h5", models=[VIT], dataset="synthetic", n_images=8, img_size=64, progress=False)
    third = tmp_path / "third.h5"
    shutil.copy(named.with_name("named.h5.d") / "names.h5", third.with_name("third.h5.d") / "names.h5")
    with Store.open(third) as s:  # another store's file: not its names
        assert s.display_names()[VIT] == "test_vit (random init)"


def texts(fig) -> list[str]:
    """Returns every text the figure draws (titles, axis labels, tick labels, legends, captions)."""
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def test_every_figure_of_the_demo_store_calls_its_models_by_their_names_and_shows_no_path(demo_home):
    path = next((demo_home / ".cache" / "vitsee").glob("demo-*.h5"))
    store = vitsee.open(path)
    assert Path(store.images.dataset.partition(":")[2]).is_absolute()  # npz:/.../demo-digits-test-s0.npz
    names = store.names
    kinds: dict[str, str] = {}  # one view of each analysis: across two models where it can be (ERF reloads models)
    for spec in store.views():
        kind = spec.partition(":")[0]
        if kind != "erf" and (kind not in kinds or spec.count("@") > kinds[kind].count("@")):
            kinds[kind] = spec
    specs = list(kinds.values())
    assert len(specs) >= 10
    # the views of issue 33 at their cheap settings (soft matching's 1024 units a layer take ~25 s on this store;
    # an n-curve needs 16 images, the tiny demo has 12)
    cheap = {
        "soft_matching": {"soft_matching_units": 32},
        "separability": {"separability_measures": "cka,mknn,rsa"},
        "curve": {"curve_over": "k", "curve_measure": "mknn"},
    }
    assert set(cheap) <= {s.partition(":")[0] for s in specs}
    for spec in specs:
        result = store.view(spec, **FAST, **cheap.get(spec.partition(":")[0], {}), progress=False)
        shown = texts(result.plot())
        words = " ".join(shown)
        assert not any(key in words for key in store.models), (spec, words)
        assert not ABSOLUTE_PATH.search(words) and str(demo_home) not in words, (spec, words)
        for key in result.models:
            assert names[key] in words, (spec, names[key])
        assert result.summary().startswith(result.title) and "@" not in result.summary()
    zoo = store.zoo(**FAST, progress=False)
    words = " ".join(texts(zoo.plot()))
    assert all(name in words for name in names.values()) and not any(key in words for key in store.models)


def test_a_figure_takes_a_title_and_labels_of_its_own(demo_home):
    store = vitsee.open(next((demo_home / ".cache" / "vitsee").glob("demo-*.h5")))
    vit, resnet = store.models[:2]
    result = store.cka(vit, resnet, **FAST, progress=False)
    fig = result.plot(title="Fig. 2", labels={vit: "ViT", "ResNet (trained here)": "ResNet"})
    shown = texts(fig)
    heatmap = next(ax for ax in fig.axes if ax.get_label() == "heatmap")
    assert "Fig. 2" in shown and heatmap.get_ylabel() == "ViT layer" and heatmap.get_xlabel() == "ResNet layer"
    assert store.names[vit] == "ViT (trained here)"  # the store keeps its names
    with pytest.raises(vitsee.VitseeError, match="no model 'nope'"):
        result.plot(labels={"nope": "x"})


def test_vitsee_export_draws_no_cursor(demo_home, tmp_path, capsys, monkeypatch):
    store = vitsee.open(next((demo_home / ".cache" / "vitsee").glob("demo-*.h5")))
    import vitsee.output.export as export

    drawn = []
    real = export.save_png

    def save_png(view, out, selection=None, **kw):
        drawn.append(selection)
        return real(view, out, selection=selection, **kw)

    monkeypatch.setattr(export, "save_png", save_png)
    code, _, err = run_cli(["export", store.path, f"cka:{store.models[0]}", "--out", tmp_path / "f.png"], capsys)
    assert code == 0, err
    assert drawn == [None]


async def test_the_apps_export_marks_the_cursor_only_when_the_config_asks(store, tmp_path, monkeypatch):
    import vitsee.output.export as export
    from helpers.app import make_app, settle, view_shown
    from vitsee.tui.config import SETTINGS

    assert SETTINGS["export_marks"].default is False
    drawn = []
    real = export.save_png

    def save_png(view, out, selection=None, **kw):
        drawn.append(selection)
        return real(view, out, selection=selection, **kw)

    monkeypatch.setattr(export, "save_png", save_png)
    exported = {}
    for marks in (False, True):
        app = make_app(store, tmp_path / str(marks))
        app.options.export_marks = marks
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, view_shown("cka"))
            await pilot.press("down", "right", "e")
            await settle(pilot, lambda a: any("exported" in m for m, _ in a.notes_seen))
        path = next((tmp_path / str(marks) / "exports").glob("*.json"))
        assert "test_vit_random_init" in path.name and "@" not in path.name  # named by the display names
        exported[marks] = json.loads(path.read_text())
    assert drawn == [None, (1, 1)]
    assert exported[False]["selection"]["row"] == exported[True]["selection"]["row"] == 1  # the JSON says where


@pytest.mark.parametrize("pretrained", [False, True])
def test_the_demo_names_its_models_for_what_they_are(tmp_path, monkeypatch, pretrained):
    from vitsee.tui import demo

    cached = (lambda name: tmp_path / f"{name}.safetensors") if pretrained else (lambda name: None)
    monkeypatch.setattr("vitsee.models.load.cached_pretrained_file", cached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    names = list(demo.model_names(demo.choose(folder=tmp_path, device="cpu")).values())
    if pretrained:
        assert names == [
            "ViT-Ti/16 (pretrained)",
            "ResNet-18 (pretrained)",
            "ViT-Ti/16 (random init)",
            "ResNet-18 (random init)",
        ]
    else:  # a 4-px-patch, 6-block ViT: not timm's vit_tiny_patch16_224, whose name would mislead
        assert names == [
            "ViT (trained here)",
            "ResNet-18 (trained here)",
            "ViT (random init)",
            "ResNet-18 (random init)",
        ]

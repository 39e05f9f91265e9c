"""The smaller things a newcomer met in the first hour (issue 29, points 9 and 10): one bar for the demo's build,
one rule for a missing --out folder, NO_COLOR without colours, a short unknown-view error, the reason a store of
another tool's features has no attention, and a zoo figure that neither hides a curve nor claims an interval it
does not have."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib.text import Text

import vitsee
from conftest import VIT, run_cli
from vitsee.analyses import REGISTRY
from vitsee.store import copy_store

README = Path(__file__).resolve().parents[1] / "README.md"


# --- the demo: what to expect, one bar ---------------------------------------------------------------------------


def test_the_readme_says_what_pip_brings_and_how_long_the_demo_takes_offline():
    first = README.read_text().split("## The terminal app", 1)[0]
    assert "5.9 GB" in first and "CUDA" in first
    assert re.search(r"offline, the first `--demo`.*minute", first, re.S | re.I) and "ETA" in first


def test_the_demos_build_is_one_bar_whose_parts_follow_each_other(tmp_path, monkeypatch):
    from vitsee.training.train import TrainEvent
    from vitsee.tui import demo

    monkeypatch.setattr("vitsee.models.load.cached_pretrained_file", lambda name: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    clock = demo.BuildClock.for_choice(demo.choose(folder=tmp_path, device="cpu"))
    assert [name for name, _ in clock.parts] == ["training the ViT", "training the ResNet-18", "extracting 4 models"]
    vit, resnet, extraction = (seconds for _, seconds in clock.parts)
    assert vit > resnet > extraction > 0  # 15 epochs of 45 steps, 6 of 23, 1436 image passes (measured rates)
    total, seen = clock.total, []
    for part, epochs, steps in (("training the ViT", 15, 45), ("training the ResNet-18", 6, 23)):
        clock.begin(part)
        for epoch in range(1, epochs + 1):
            for step in (1, steps):
                clock.train_step(TrainEvent("step", epoch=epoch, epochs=epochs, done=step, total=steps))
                seen.append(clock.done)
    assert clock.describe("now").endswith("then extracting 4 models")
    clock.extracting()
    for done in (0, 180, 359):
        clock.advance(done / 359)
        seen.append(clock.done)
    assert clock.total == total and seen == sorted(seen) and seen[-1] == pytest.approx(total)
    assert seen[2 * 15 - 1] == pytest.approx(vit)  # the ViT's last step: its share of the bar, no more


# --- --out into a folder that is not there -------------------------------------------------------------------------


def test_a_snapshot_into_a_missing_folder_is_refused_as_export_refuses_it(store, tmp_path, capsys):
    from vitsee.tui.app import main

    out = tmp_path / "no" / "such" / "dir" / "x.png"
    code, _, export_err = run_cli(["export", store, f"cka:{VIT}", "--out", out], capsys)
    assert code == 2
    with pytest.raises(SystemExit) as exit_:
        main([str(store), "--snapshot", "cka", "--out", str(out)])
    snapshot_err = capsys.readouterr().err
    assert exit_.value.code == 2 and not out.parent.exists()  # nothing made
    said = f"folder {out.parent} does not exist: create it (mkdir -p {out.parent}) or choose another --out"
    assert said in export_err.replace("\n", " ") and said in snapshot_err.replace("\n", " ")


# --- NO_COLOR ------------------------------------------------------------------------------------------------------


async def test_no_color_sends_no_colour_at_all_not_even_greys(store, tmp_path, monkeypatch):
    from rich.console import Console

    from helpers.app import make_app, settle, view_shown
    from vitsee.output.colormap import ColorMode

    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(store, tmp_path, color=ColorMode.NONE)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, view_shown("cka"))
        console = Console(width=100, height=30, force_terminal=True, color_system="256", file=None)
        update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
        with console.capture() as captured:
            console.print(update)
        text = captured.get()  # the screen as a 256-colour terminal gets it
    colours = re.findall(r"\x1b\[[0-9;]*?(?:38|48);5;\d+", text)
    assert not colours, colours[:5]  # frames, tabs and panels were 256-colour greys (Textual's Monochrome)
    assert "\x1b[7m" in text or ";7m" in text or "\x1b[7;" in text  # what a colour marked is reverse video now


# --- errors --------------------------------------------------------------------------------------------------------


def test_an_unknown_view_is_a_short_line_that_names_the_closest_kinds(store, capsys):
    code, out, err = run_cli(["show", store, "ck:x"], capsys)
    line = err.strip().replace("\n", " ")
    kinds = ", ".join(REGISTRY)  # the list grows with the analyses; the rest of the line is what must stay short
    assert code == 2 and out == "" and kinds in line and len(line) - len(kinds) < 125, len(line)  # was 396 in all
    assert "did you mean cka or cknna?" in line and "`vitsee show --help` gives each form" in line


def test_a_store_of_another_tools_features_says_why_it_has_no_attention(tmp_path):
    rng = np.random.default_rng(0)
    features = {"alexnet": {"features.10": rng.normal(size=(24, 16)).astype("float32")}}
    store = vitsee.from_features(tmp_path / "feat.h5", features, images="digits")
    for spec, what in (("attention:alexnet", "attention distances"), ("skip:alexnet", "skip-connection ratios")):
        with pytest.raises(vitsee.VitseeError) as error:
            store.view(spec, progress=False)
        assert str(error.value).startswith("alexnet holds another tool's activations (vitsee.from_features)")
        assert what in str(error.value) and "other model" not in str(error.value)  # not its family's fault


# --- the zoo figure ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_batch_zoo(zoo_store, tmp_path_factory) -> vitsee.Store:
    """The zoo store with its CKA in one minibatch (batch size over its 48 images) and its zoo on that."""
    from vitsee.analyses.driver import AnalyzeConfig, run_analyses

    path = copy_store(zoo_store, tmp_path_factory.mktemp("zoo1") / "zoo.h5")
    shutil.rmtree(path.with_name("zoo.h5.d") / "results", ignore_errors=True)
    run_analyses(path, ["cka", "zoo"], AnalyzeConfig(batch_size=64, shuffles=0, device="cpu", permutations=0))
    return vitsee.open(path)


def test_a_zoo_of_one_minibatch_claims_no_interval(one_batch_zoo):
    zoo = one_batch_zoo.zoo(progress=False)
    assert zoo.ci_low is None  # every replicate redraws the one batch: the "interval" was the value itself
    words = " ".join(t.get_text() for t in zoo.plot().findobj(Text))
    assert "over 1 minibatches" not in words and "one minibatch of images, nothing to resample" in words


def test_zoo_curves_that_coincide_are_each_visible_and_named(zoo_store):
    zoo = vitsee.open(zoo_store).zoo(progress=False)
    fig = zoo.plot()
    lines = [line for line in fig.findobj() if getattr(line, "get_gid", lambda: None)() == "correspondence"]
    assert len(lines) == len(zoo.rows) - 1
    assert len({(line.get_linestyle(), line.get_marker()) for line in lines}) == len(lines)  # told apart
    curves = [(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in lines]
    for k, line in enumerate(lines):
        same = [j for j in range(k) if curves[j] == curves[k]]
        assert ("(the same as " in line.get_label()) == bool(same), line.get_label()
        if same:
            assert line.get_linewidth() > lines[same[0]].get_linewidth()  # drawn wider underneath: it shows

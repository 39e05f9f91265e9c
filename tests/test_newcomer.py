"""What a newcomer meets on the command line (issue 13): a way out named in each message, output that survives a
pipe, degenerate random inits said where they show, and a cached store read without torch."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from conftest import RESNET, VIT, run_cli
from helpers.stores import analysed_store
from vitsee.output.colormap import ASCII_RAMP, ColorScale
from vitsee.analyses.views import load_view

OTHER = "mobilenetv3_small_050"  # outside the ViT/ResNet/Mixer/Swin families: no blocks or sublayers defined


def test_layers_of_a_model_outside_the_families_lists_its_module_paths_and_says_so(capsys):
    import timm

    code, out, err = run_cli(["layers", OTHER, "--img-size", "64"], capsys)
    assert code == 0, err
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    model = timm.create_model(OTHER, pretrained=False)
    assert names == [n for n, _ in model.named_modules() if n]
    assert "--granularity modules" in err and "\n" not in err.strip()


def test_asking_such_a_model_for_sublayers_names_the_option_that_works(capsys):
    code, out, err = run_cli(["layers", OTHER, "--img-size", "64", "--granularity", "sublayers"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "`vitsee layers MODEL --granularity modules`" in err
    code, _, err = run_cli(["layers", OTHER, "--granularity", "layer"], capsys)
    assert code == 2 and "--granularity 'layer'" in err and "blocks, sublayers, modules" in err


# --- vitsee show into a pipe or a file ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tiny_store):
    return analysed_store(tiny_store)


def _csv_matrix(text: str) -> tuple[list[str], list[str], np.ndarray]:
    """Returns (row labels, column labels, values) of a CSV the way View.to_csv writes it."""
    header, *rows = list(csv.reader(io.StringIO(text)))
    values = np.array([[float(v) if v else np.nan for v in row[1:]] for row in rows])
    return [row[0] for row in rows], header[1:], values


def test_show_into_a_pipe_prints_the_ascii_ramp_and_then_every_number(store, monkeypatch, capsys):
    monkeypatch.setenv("COLORTERM", "truecolor")  # a colour terminal, but stdout (capsys) is not a tty
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("VITSEE_COLOR", raising=False)
    spec = f"cka:{VIT}:{RESNET}"
    code, out, err = run_cli(["show", store, spec], capsys)
    assert code == 0, err
    assert "\x1b" not in out and "\u2580" not in out and out.isascii()
    view = load_view(store, spec)
    heatmap, _, numbers = out.partition("CKA values (as --format csv prints them):\n")
    grid = [line for line in heatmap.splitlines() if line.lstrip().split(" ")[0] in view.rows]
    levels = ColorScale(0.0, 1.0, len(ASCII_RAMP), "viridis").quantize(view.matrix)
    gutter = len(grid[0]) - 2 * len(view.cols)
    assert [line[gutter:] for line in grid] == ["".join(ASCII_RAMP[lv] * 2 for lv in row) for row in levels]
    rows, cols, values = _csv_matrix(numbers)
    assert rows == view.rows and cols == view.cols
    assert np.array_equal(values, view.matrix.astype(float), equal_nan=True)  # every digit, not a rounding


def test_show_format_csv_and_json_print_the_numbers_only(store, capsys):
    spec = f"skip:{VIT}"
    view = load_view(store, spec)
    code, out, err = run_cli(["show", store, spec, "--format", "csv"], capsys)
    assert code == 0, err
    rows, cols, values = _csv_matrix(out)
    assert rows == view.rows and cols == view.cols
    assert np.array_equal(values, view.matrix.astype(float), equal_nan=True)
    code, out, err = run_cli(["show", store, spec, "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["rows"] == view.rows and data["view"] == "skip"
    expected = [[None if not np.isfinite(v) else float(v) for v in row] for row in view.matrix]
    assert data["values"] == expected
    code, out, err = run_cli(["show", store, spec, "--format", "png"], capsys)
    assert code == 2 and out == "" and "--format 'png'" in err and "text, csv, json" in err


# --- random-init CNNs -------------------------------------------------------------------------------------


def test_info_says_a_random_init_resnet_has_zero_residual_branches_and_why(tiny_store, capsys):
    code, out, err = run_cli(["info", tiny_store], capsys)
    assert code == 0, err
    sections = {block.split()[0]: block for block in out.split("\n\n") if block.strip()}
    assert "\u2016f(z)\u2016 = 0: timm initialises this branch to zero" in sections[RESNET]
    assert "timm initialises" not in sections[VIT]


def test_the_note_is_true_timm_zeroes_the_last_norm_of_every_resnet_block():
    import timm
    from timm.models.resnet import BasicBlock, Bottleneck

    model = timm.create_model(RESNET.partition("@")[0], pretrained=False)
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock | Bottleneck)]
    assert blocks and all(not (b.bn3 if isinstance(b, Bottleneck) else b.bn2).weight.any() for b in blocks)


def test_random_init_note_names_resnet_and_convnext_only_for_random_weights():
    from vitsee.models.init_notes import TINY_BRANCH, ZERO_BRANCH, random_init_note

    def info(name, family="resnet", kind="random"):
        return {"timm_name": name, "family": family, "weights": {"kind": kind}}

    assert random_init_note(info("resnet50")) == ZERO_BRANCH
    assert random_init_note(info("convnext_tiny")) == TINY_BRANCH
    assert random_init_note(info("resnetv2_50")) is None  # zero_init_last=False in timm's ResNetV2
    assert random_init_note(info("resnet50", kind="pretrained")) is None
    assert random_init_note(info("resnet50", kind="file")) is None  # e.g. trained with `vitsee train`
    assert random_init_note(info("vit_tiny_patch16_224", family="vit")) is None


# --- a cached store opens without torch ----------------------------------------------------------------------

OPEN_CACHED = """
import asyncio, sys
from pathlib import Path
from vitsee.output.colormap import ColorMode
from vitsee.analyses.views import load_view
from vitsee.tui.app import VitseeApp
from vitsee.tui.options import AppOptions
from vitsee.tui.results import read_summary, read_view

path, folder = Path(sys.argv[1]), Path(sys.argv[2])
read_summary(path)
for spec in sys.argv[3:]:
    read_view(path, spec, None)
    load_view(path, spec)

async def first_heatmap():
    app = VitseeApp(path, options=AppOptions(color_mode=ColorMode.TRUECOLOR, export_dir=folder, folder=folder))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(3000):
            await pilot.pause(0.01)
            panes = app.screen.query("#pane-cka")
            if panes and panes.first().loaded is not None:
                return panes.first().loaded.computed
    raise SystemExit("no heatmap")

computed = asyncio.run(first_heatmap())
print("computed" if computed else "cached", "torch" in sys.modules)
"""


@pytest.fixture(scope="module")
def app_store(tiny_store, tmp_path_factory):
    from helpers.app import analysed_copy

    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())  # every analysis cached, as test_tui's


def test_a_cached_store_opens_and_reads_every_view_without_importing_torch(app_store, tmp_path):
    import os
    import subprocess
    import sys

    specs = [
        f"cka:{VIT}",
        f"cka:{VIT}:{RESNET}",
        f"attention:{VIT}",
        f"probes:{VIT}",
        f"skip:{VIT}",
        f"skip:{RESNET}",
        f"spatial:{VIT}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", OPEN_CACHED, str(app_store), str(tmp_path), *specs],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["cached", "False"]  # read from the cache, and torch never imported

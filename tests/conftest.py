"""Shared fixtures: tiny timm models (img_size 64, grid 4x4) over tiny image sets, extracted once."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # these machines have no network: fail fast, never retry
os.environ.setdefault("VITSEE_TEST", "1")
# the app reads $XDG_CONFIG_HOME/vitsee/config.toml: tests (and the app they start) never see the user's
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="vitsee-test-config-")
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="vitsee-test-state-")  # the app's log file goes there

VIT = "test_vit@random:0"
RESNET = "test_resnet@random:0"
IMG = 64


@pytest.fixture
def one_thread():
    """Computes on one torch thread, restored after: small decompositions on the shared 2-core machines are thread
    hand-offs (two spinning threads ran 10x slower than one), and runs compared bit for bit use one thread.
    A test file asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    from vitsee.threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory) -> Path:
    """A complete store: a 6-block ViT and a ResNet, random init, 48 synthetic images, batches of 16."""
    from vitsee.extraction.extract import ExtractConfig, run_extraction

    path = tmp_path_factory.mktemp("stores") / "tiny.h5"
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
        )
    )
    return path


@pytest.fixture(scope="session")
def store(tiny_store, tmp_path_factory) -> Path:
    """The tiny store with every default analysis cached (helpers.app.analysed_copy), for the app's tests; a test
    module that analyses a store of its own defines its own `store`."""
    from helpers.app import analysed_copy

    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def zoo_store(tiny_store) -> Path:
    """The tiny store and a second seed of both models (four models, two families), CKA and the zoo cached."""
    from helpers.stores import zoo_store as build

    return build(tiny_store)


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> Path:
    """A home folder whose ~/.cache/vitsee holds the demo store the demo's own builder makes, at a tiny size (four
    models: two trained here and their random-init twins, named, over held-out digits; helpers.stores.tiny_demo)."""
    from helpers.stores import tiny_demo

    home = tmp_path_factory.mktemp("home")
    tiny_demo(home)
    return home


@pytest.fixture(scope="session")
def paper_store(tiny_store, tmp_path_factory) -> Path:
    """A copy of the tiny store with head-level CKA (paper Fig. 5) and ERFs (Fig. 6) cached."""
    import shutil

    from vitsee.analyses.driver import AnalyzeConfig, run_analyses

    path = tmp_path_factory.mktemp("paper") / "paper.h5"
    shutil.copy(tiny_store, path)
    run_analyses(path, ["heads", "erf"], AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", erf_images=4))
    return path


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Runs `vitsee ARGS` in-process; returns (exit code, stdout, stderr)."""
    from vitsee.cli import main

    old = sys.argv
    sys.argv = ["vitsee", *map(str, args)]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return code, captured.out, captured.err

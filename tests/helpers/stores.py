"""Stores the figure, show and newcomer tests share: the tiny store with every view's analysis cached."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from conftest import RESNET, VIT
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.analyses.views import load_view

VIEWS_CFG = AnalyzeConfig(shuffles=0, batch_size=16, device="cpu")
VIEWS = {  # short name -> view string
    "cka": f"cka:{VIT}",
    "ckax": f"cka:{VIT}:{RESNET}",
    "attention": f"attention:{VIT}",
    "probes": f"probes:{VIT}",
    "probes:resnet": f"probes:{RESNET}",
    "skip": f"skip:{VIT}",
    "skip:resnet": f"skip:{RESNET}",
    "spatial": f"spatial:{VIT}",
    "spatial:resnet": f"spatial:{RESNET}",
}


def analysed_store(tiny_store: Path) -> Path:
    """Returns a copy of the tiny store with every view's analysis cached; made once per session.

    test_figures.py, test_show.py and test_newcomer.py use it. The copy keeps these caches out of the store other
    test files read.
    """
    path = tiny_store.with_name("views.h5")
    if path.exists():
        return path
    partial = path.with_suffix(".partial.h5")
    shutil.copy(tiny_store, partial)
    # Batched eigh on 2 busy cores runs ~50x slower with 2 threads than with 1 (per-token probes: 15 s vs 0.5 s);
    # the numbers are the same either way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for spec in VIEWS.values():
            load_view(partial, spec, VIEWS_CFG)
    finally:
        torch.set_num_threads(threads)
    partial.rename(path)
    return path


ZOO_MODELS = [VIT, RESNET, "test_vit@random:1", "test_resnet@random:1"]  # two ViTs and two ResNets, random init
ZOO_CFG = AnalyzeConfig(shuffles=0, batch_size=16, device="cpu", permutations=0)  # intervals, no p-values


def zoo_store(tiny_store: Path) -> Path:
    """Returns a copy of the tiny store with a second seed of both models appended (a zoo of four models of two
    families) and its CKA and zoo cached; made once per session (the zoo's and the app's zoo tests use it)."""
    from conftest import IMG
    from vitsee.analyses.driver import run_analyses
    from vitsee.extraction.extract import ExtractConfig, run_extraction
    from vitsee.store import copy_store

    path = tiny_store.parent / "zoo" / "zoo.h5"
    if path.exists():
        return path
    building = tiny_store.parent / "zoo-building"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    store = copy_store(tiny_store, building / "zoo.h5")
    run_extraction(
        ExtractConfig(
            store=store,
            models=ZOO_MODELS,
            dataset="synthetic",
            n_images=48,
            batch_size=16,
            img_size=IMG,
            device="cpu",
            workers=0,
        )
    )
    run_analyses(store, ["cka", "zoo"], ZOO_CFG)
    building.rename(path.parent)
    return path


# the demo's plan made tiny (as tests/test_tui.py makes the app's demo): timm's test_vit and test_resnet trained one
# epoch on 60 digits, the 12 held out extracted with the random-init twin of each
TINY_DEMO = {
    "models": ("test_vit", "test_resnet"),
    "batch_size": 8,
    "train_n_images": 60,
    "train_epochs": 1,
    "trained": (("test_vit", {"patch_size": 8, "depth": 2}), ("test_resnet", {})),
}


def tiny_demo(home: Path) -> Path:
    """Returns the demo store that the demo's own builder (tui/demo.py `build`) makes, tiny, in home/.cache/vitsee:
    the shape `vitsee-tui --demo` gives a newcomer (two models trained here, their twins, named, held-out digits)."""
    import pytest

    from vitsee.tui import demo

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("vitsee.models.load.cached_pretrained_file", lambda name: None)  # so the demo trains its own
        mp.setenv("HF_HUB_OFFLINE", "1")
        choice = demo.choose(demo.DemoPlan(**TINY_DEMO), device="cpu", folder=home / ".cache" / "vitsee")
        return demo.build(choice)

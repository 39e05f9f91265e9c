"""Stores the figure, show and newcomer tests share: the tiny store with every view's analysis cached."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from conftest import RESNET, VIT
from vitsee.engine.analyze import AnalyzeConfig
from vitsee.engine.views import load_view

VIEWS_CFG = AnalyzeConfig(shuffles=0, batch_size=16, device="cpu")
VIEWS = {  # short name -> view string
    "cka": f"cka:{VIT}", "ckax": f"cka:{VIT}:{RESNET}", "attention": f"attention:{VIT}",
    "probes": f"probes:{VIT}", "probes:resnet": f"probes:{RESNET}", "skip": f"skip:{VIT}",
    "skip:resnet": f"skip:{RESNET}", "spatial": f"spatial:{VIT}", "spatial:resnet": f"spatial:{RESNET}",
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

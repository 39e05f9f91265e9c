"""examples/paper_figures.ipynb runs as it is: its code cells, in order, as one script, on a small store put where
the notebook looks for the demo store (`vitsee-tui --demo` takes minutes to build one; this is the tiny store, its
views cached as the app caches the demo's, with a cheaper estimator; computing on demand is test_library.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

import vitsee
from conftest import RESNET, VIT
from vitsee.store import copy_store

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "paper_figures.ipynb"


def code_cells(path: Path) -> list[str]:
    """Returns the source of a notebook's code cells, in order."""
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


def test_the_notebook_draws_fig_1_to_3_of_the_demo_store(tiny_store, tmp_path):
    home = tmp_path / "home"
    cache = home / ".cache" / "vitsee"
    cache.mkdir(parents=True)
    demo = copy_store(tiny_store, cache / "demo-x.h5")
    for view in (f"cka:{VIT}", f"cka:{VIT}:{RESNET}", f"attention:{VIT}"):  # as the app leaves the demo, cheaper
        vitsee.open(demo).view(view, shuffles=0, batch_size=16, permutations=0, device="cpu", progress=False)
    script = tmp_path / "paper_figures.py"
    script.write_text("\n\n".join(code_cells(NOTEBOOK)) + "\n")
    env = {**os.environ, "HOME": str(home), "MPLBACKEND": "Agg"}
    env.pop("XDG_CACHE_HOME", None)
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    store = vitsee.open(demo)
    expected = [store.cka(VIT).summary(), store.cka(VIT, RESNET).summary(), store.attention(VIT).summary()]
    assert run.stdout.splitlines()[-3:] == expected  # the views it computed are cached in the store
    for name in ("fig1", "fig2", "fig3"):
        assert np.asarray(Image.open(tmp_path / f"{name}.png")).ndim == 3


def test_the_readme_shows_the_notebooks_first_cells():
    readme = (NOTEBOOK.parents[1] / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    for cell in code_cells(NOTEBOOK)[:3]:
        for line in cell.splitlines():
            assert line in section, line

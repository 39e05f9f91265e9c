"""examples/paper_figures.ipynb runs as a newcomer runs it: in a fresh Jupyter kernel (nbclient, headless), cell by
cell, on a store of the demo's own shape, made by the demo's own builder (tui/demo.py `build`: two models trained
here and the random-init twin of each, extracted over the held-out digits and named) at a tiny size: its two models
are timm's test_vit and test_resnet, trained one epoch on 60 digits. Each figure a cell ends with is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

import vitsee

nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' brings nbclient and ipykernel")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "paper_figures.ipynb"


def code_cells(path: Path) -> list[str]:
    """Returns the source of a notebook's code cells, in order."""
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


@pytest.fixture(scope="module")
def home(demo_home) -> Path:
    return demo_home


def run_notebook(path: Path, home: Path, cwd: Path, monkeypatch) -> nbformat.NotebookNode:
    """Returns the notebook at path after running it in a fresh python3 kernel whose home is `home`."""
    monkeypatch.setenv("HOME", str(home))  # the kernel inherits it: the notebook looks in ~/.cache/vitsee
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # as a fresh Jupyter kernel starts: matplotlib_inline's backend
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()  # a cell that raises raises here, with its traceback
    return nb


def test_the_demo_store_has_four_models_named_for_a_figure(home):
    store = vitsee.open(next((home / ".cache" / "vitsee").glob("demo-*.h5")))
    assert len(store.models) == 4  # each model and its random-init twin, as `vitsee-tui --demo` builds it
    assert list(store.names.values()) == [
        "ViT (trained here)",
        "ResNet (trained here)",  # timm's test_resnet; the demo's resnet18 is 'ResNet-18'
        "ViT (random init)",
        "ResNet (random init)",
    ]


def test_the_notebook_runs_in_a_fresh_kernel_on_the_demo_store_and_shows_every_figure(home, tmp_path, monkeypatch):
    nb = run_notebook(NOTEBOOK, home, tmp_path, monkeypatch)
    cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    for cell in cells:
        last = cell.source.strip().splitlines()[-1]
        if ".plot(" in last:  # a figure as the cell's last line: Jupyter shows it as an image
            shown = [o for o in cell.outputs if o.output_type == "execute_result"]
            assert shown and "image/png" in shown[0].data, (last, [list(o.get("data", {})) for o in cell.outputs])
    store = vitsee.open(next((home / ".cache" / "vitsee").glob("demo-*.h5")))
    vit, resnet = store.models[:2]
    printed = "".join(o.text for o in cells[-1].outputs if o.output_type == "stream").splitlines()
    expected = [store.cka(vit).summary(), store.cka(vit, resnet).summary(), store.attention(vit).summary()]
    assert printed == expected  # the views it computed are cached in the store, titled by the models' names
    assert all("@" not in line for line in printed)  # no store key in what it prints
    for name in ("fig1", "fig2", "fig3"):
        assert Image.open(tmp_path / f"{name}.png").size[0] > 500


def test_a_plot_as_a_cells_last_line_shows_the_figure_in_a_fresh_kernel(home, tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import glob, os, vitsee\n"
            "store = vitsee.open(glob.glob(os.path.expanduser('~/.cache/vitsee/demo-*.h5'))[0])\n"
            "store.cka(store.models[0]).plot()"
        )
    ]
    path = tmp_path / "one.ipynb"
    nbformat.write(nb, path)
    ran = run_notebook(path, home, tmp_path, monkeypatch)
    (result,) = [o for o in ran.cells[0].outputs if o.output_type == "execute_result"]
    assert "image/png" in result.data  # not only the text '<Figure size 990x900 with 2 Axes>'


def test_the_readme_shows_the_notebooks_first_cells():
    readme = (NOTEBOOK.parents[1] / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    for cell in code_cells(NOTEBOOK)[:3]:
        for line in cell.splitlines():
            assert line in section, line

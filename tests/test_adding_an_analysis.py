"""engine/analyses/README.md's "Adding an analysis" works as written: its example module, saved into a copy of the
package with no other file touched, gives `vitsee analyze --NAME`, `vitsee show` and `export` of its views, a tab
in the app and `vitsee-tui --snapshot`, and numbers that match the formula. The block is read from the document
itself, so the document cannot rot."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from conftest import RESNET, VIT

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "engine" / "analyses" / "README.md"


def example_module() -> tuple[str, str]:
    """Returns (path, source) of the README's example: the ```python block whose first line names its file."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    named = [b for b in blocks if re.match(r"# (engine/analyses/\w+\.py)\n", b)]
    assert len(named) == 1, "the README has one example module, its first line '# engine/analyses/NAME.py'"
    return named[0].splitlines()[0][2:], named[0]


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_store) -> dict:
    """A copy of the vitsee package (engine/ copied as the package, tui/ and assets/ linked into it as pyproject's
    package-dir places them) with the example saved into it, and a copy of the tiny store; returns where they are
    and how to run the CLI and the app from them."""
    base = tmp_path_factory.mktemp("adding")
    pkg = base / "vitsee"
    shutil.copytree(ROOT / "engine", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = _digest(pkg)
    path, source = example_module()
    (pkg / path.removeprefix("engine/")).write_text(source, encoding="utf-8")
    after = _digest(pkg)
    for part in ("tui", "assets"):
        (pkg / part).symlink_to(ROOT / part, target_is_directory=True)
    touched = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    store = base / "tiny.h5"
    shutil.copy(tiny_store, store)
    env = {**os.environ, "PYTHONPATH": str(base), "HF_HUB_OFFLINE": "1", "VITSEE_TEST": "1", "NO_COLOR": "1"}
    name = Path(path).stem
    return {"base": base, "store": store, "env": env, "name": name, "touched": touched, "path": path}


def run(package: dict, module: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env=package["env"],
        cwd=package["base"],
        timeout=timeout,
    )


def cli(package: dict, *args) -> subprocess.CompletedProcess:
    done = run(package, "vitsee.cli", *args)
    assert done.returncode == 0, done.stderr
    return done


def test_the_example_is_one_new_file_and_the_copy_runs_it(package):
    assert package["touched"] == [package["path"].removeprefix("engine/")]  # one file, and nothing else changed
    done = run(package, "vitsee.cli", "analyze", "--help")
    assert done.returncode == 0 and f"--{package['name']}" in done.stdout, done.stdout + done.stderr


def test_vitsee_analyze_named_computes_it_and_show_prints_it(package):
    name, store = package["name"], package["store"]
    done = cli(package, "analyze", store, f"--{name}", "--device", "cpu")
    assert f"{name} ready" in done.stderr
    shown = cli(package, "show", store, f"{name}:{VIT}", "--color", "none")
    # the layer x layer heatmap, in ASCII, titled by the model's display name
    assert "dCor: test_vit (random init)" in shown.stdout and "rows: " in shown.stdout


def test_the_exported_numbers_are_the_distance_correlation_of_the_layers(package):
    from vitsee.store import Store

    name, store, out = package["name"], package["store"], package["base"] / "dcor.json"
    cli(package, "analyze", store, f"--{name}", "--device", "cpu", "-q")
    cli(package, "export", store, f"{name}:{VIT}:{RESNET}", "--out", out)
    exported = json.loads(out.read_text())
    assert exported["view"] == name and exported["model_a"] == VIT and exported["model_b"] == RESNET
    values = np.array(exported["values"], dtype=float)
    with Store.open(store) as s:
        assert exported["rows"] == s.layers(VIT) and exported["cols"] == s.layers(RESNET)
        for i, j in ((0, 0), (3, 2), (len(exported["rows"]) - 1, len(exported["cols"]) - 1)):
            x = s.activations(VIT, exported["rows"][i]).reshape(s.n_images, -1).astype(np.float64)
            y = s.activations(RESNET, exported["cols"][j]).reshape(s.n_images, -1).astype(np.float64)
            # the module takes distances through the fp64 Gram (one BLAS product a layer), which loses a few
            # digits to cancellation between close images: 3e-9 relative here
            np.testing.assert_allclose(values[i, j], _dcor(x, y), rtol=1e-7)
    assert exported["params"]["max_images"] == 48 and np.all((values >= 0) & (values <= 1 + 1e-12))


def _dcor(x: np.ndarray, y: np.ndarray) -> float:
    """dCor by Székely et al.'s definition: double-centred distance matrices, their mean products."""

    def centred(z):
        d = cdist(z, z)
        return d - d.mean(axis=0, keepdims=True) - d.mean(axis=1, keepdims=True) + d.mean()

    a, b = centred(x), centred(y)
    return float(np.sqrt((a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean())))


def test_it_exports_a_png(package):
    name, store, out = package["name"], package["store"], package["base"] / "dcor.png"
    cli(package, "analyze", store, f"--{name}", "--device", "cpu", "-q")
    cli(package, "export", store, f"{name}:{VIT}", "--out", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_app_has_its_tab_and_snapshots_its_view(package):
    name, store, out = package["name"], package["store"], package["base"] / "dcor.svg"
    cli(package, "analyze", store, f"--{name}", "--device", "cpu", "-q")
    done = run(package, "vitsee.tui.app", store, "--snapshot", f"{name}:{VIT}", "--out", out)
    assert done.returncode == 0, done.stderr
    assert f"({name}:{VIT} at 120x40)" in done.stdout
    svg = out.read_text().replace("&#160;", " ")
    # its tab (key 9, after the zoo) and its view's title
    assert "9 dCor" in svg and "dCor: test_vit (random init)" in svg

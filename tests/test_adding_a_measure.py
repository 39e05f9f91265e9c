"""engine/measures/README.md's "Adding a measure" works as written: its example module, saved into a copy of the
package with no other file touched, is a measure like the seven -- `vitsee analyze --NAME` with its own option,
intervals and p-values over the shared Grams, `vitsee show` and `export`, the zoo, the app's `m` -- and its numbers
match the formula. The block is read from the document itself, so the document cannot rot."""

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

from conftest import RESNET, VIT

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "engine" / "measures" / "README.md"
K, REPLICATES, PERMUTATIONS = 5, 20, 19


def example_module() -> tuple[str, str]:
    """Returns (path, source) of the README's example: the ```python block whose first line names its file."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    named = [b for b in blocks if re.match(r"# (engine/measures/catalog/\w+\.py)\n", b)]
    assert len(named) == 1, "the README has one example module, its first line '# engine/measures/catalog/NAME.py'"
    return named[0].splitlines()[0][2:], named[0]


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_store) -> dict:
    """A copy of the vitsee package (engine/ copied as the package, tui/ and assets/ linked into it) with the
    example saved into it, and a copy of the tiny store with CKA and the new measure cached (with intervals and
    p-values); returns where they are and how to run the CLI from them."""
    base = tmp_path_factory.mktemp("adding-a-measure")
    pkg = base / "vitsee"
    shutil.copytree(ROOT / "engine", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = _digest(pkg)
    path, source = example_module()
    (pkg / path.removeprefix("engine/")).write_text(source, encoding="utf-8")
    touched = sorted(k for k, v in _digest(pkg).items() if before.get(k) != v)
    for part in ("tui", "assets"):
        (pkg / part).symlink_to(ROOT / part, target_is_directory=True)
    store = base / "tiny.h5"
    shutil.copy(tiny_store, store)
    env = {**os.environ, "PYTHONPATH": str(base), "HF_HUB_OFFLINE": "1", "VITSEE_TEST": "1", "NO_COLOR": "1"}
    out = {"base": base, "store": store, "env": env, "name": Path(path).stem, "touched": touched, "path": path}
    stats = ["--measure-bootstrap", REPLICATES, "--measure-permutations", PERMUTATIONS]
    cli(out, "analyze", store, "--cka", f"--{out['name']}", "--jaccard-k", K, *stats, "--device", "cpu", "-q")
    return out


def run(package: dict, *args, module: str = "vitsee.cli", timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env=package["env"],
        cwd=package["base"],
        timeout=timeout,
    )


def cli(package: dict, *args) -> subprocess.CompletedProcess:
    done = run(package, *args)
    assert done.returncode == 0, done.stderr
    return done


def export(package: dict, spec: str) -> dict:
    out = package["base"] / f"{spec.replace(':', '_').replace('@', '_')}.json"
    cli(package, "export", package["store"], spec, "--out", out)
    return json.loads(out.read_text())


def _jaccard(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Jaccard similarity of kNN sets by its definition: cosine neighbours as sets, |A & B| / |A | B| per image."""

    def neighbours(z):
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
        s = z @ z.T
        np.fill_diagonal(s, -np.inf)
        return [set(np.argsort(-row, kind="stable")[:k]) for row in s]

    return float(np.mean([len(a & b) / len(a | b) for a, b in zip(neighbours(x), neighbours(y))]))


def test_the_example_is_one_new_file_and_gives_a_flag_and_an_option(package):
    assert package["touched"] == [package["path"].removeprefix("engine/")]  # one file, and nothing else changed
    done = cli(package, "analyze", "--help")
    assert f"--{package['name']}" in done.stdout and "--jaccard-k" in done.stdout


def test_its_numbers_are_the_jaccard_similarity_of_the_layers_neighbours(package):
    from vitsee.store import Store

    exported = export(package, f"jaccard:{VIT}:{RESNET}")
    values = np.array(exported["values"], dtype=float)
    assert exported["params"]["k"] == K and exported["params"]["max_images"] == 48
    with Store.open(package["store"]) as s:
        assert exported["rows"] == s.layers(VIT) and exported["cols"] == s.layers(RESNET)
        for i, row in enumerate(exported["rows"]):
            x = s.activations(VIT, row).reshape(s.n_images, -1).astype(np.float64)
            for j, col in enumerate(exported["cols"]):
                y = s.activations(RESNET, col).reshape(s.n_images, -1).astype(np.float64)
                assert values[i, j] == pytest.approx(_jaccard(x, y, K), abs=1e-12), (row, col)


def test_it_gets_intervals_and_p_values_over_the_images(package):
    within = export(package, f"jaccard:{VIT}")
    value, low, high, p = (np.array(within[key], dtype=float) for key in ("values", "ci_low", "ci_high", "p_value"))
    assert value.shape == low.shape == high.shape == p.shape
    assert np.all(low <= high + 1e-12) and np.all((p >= 1 / (PERMUTATIONS + 1)) & (p <= 1))
    # a layer with itself: every resample keeps it identical to itself (1), and no shuffle of its images reaches 1
    np.testing.assert_array_equal(np.diag(value), 1.0)
    np.testing.assert_array_equal(np.diag(low), 1.0)
    np.testing.assert_allclose(np.diag(p), 1 / (PERMUTATIONS + 1))
    assert np.any(high - low > 0.01)  # elsewhere the images' draw moves the value
    shown = cli(package, "show", package["store"], f"jaccard:{VIT}", "--color", "none").stdout
    assert (
        f"{REPLICATES} groups of the 48 images each left out once" in shown
        and "more shared neighbours than images paired" in shown
    )


def test_a_bad_parameter_is_one_line_naming_the_option(package):
    done = run(package, "analyze", package["store"], "--jaccard", "--jaccard-k", "48", "--device", "cpu")
    assert done.returncode != 0
    assert "--jaccard-k 48: jaccard k=48 needs 1 <= k < 48" in done.stderr and "Traceback" not in done.stderr


def test_the_zoo_summarises_every_pair_of_models_by_it(package):
    done = cli(package, "show", package["store"], "zoo", "--zoo-measure", "jaccard", "--format", "json")
    zoo = json.loads(done.stdout)
    assert zoo["measure"] == "jaccard" and "Jaccard" in zoo["title"]
    m = np.array(export(package, f"jaccard:{VIT}:{RESNET}")["values"], dtype=float)
    best_match = (m.max(axis=1).mean() + m.max(axis=0).mean()) / 2  # engine/zoo/summaries.py's default summary
    a, b = zoo["models"].index(VIT), zoo["models"].index(RESNET)
    assert zoo["values"][a][b] == pytest.approx(best_match, abs=1e-12)
    assert zoo["ci_low"][a][b] <= zoo["ci_high"][a][b]  # from the result's own bootstrap resamples


APP = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from helpers.app import SIZE, make_app, settle, view_shown
from pathlib import Path

async def main():
    app = make_app(Path({store!r}), Path({folder!r}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        await pilot.press("m")
        await settle(pilot, view_shown("jaccard"))
        print(app.screen.kind, "|", app.screen.query_one("#tab-cka").label)

asyncio.run(main())
"""


def test_the_apps_m_cycles_from_cka_to_it(package):
    folder = package["base"] / "app"
    folder.mkdir(exist_ok=True)
    script = APP.format(tests=str(ROOT / "tests"), store=str(package["store"]), folder=str(folder))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=package["env"], timeout=300
    )
    assert done.returncode == 0, done.stderr
    kind, tab = done.stdout.strip().splitlines()[-1].split(" | ")
    assert kind == "jaccard" and tab.endswith("Jaccard"), done.stdout

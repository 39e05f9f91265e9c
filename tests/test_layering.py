"""The layering written in pyproject.toml ([tool.importlinter]) holds for this checkout: each room of engine/ (the
package `vitsee`) imports only from the floors below it, the app above them all; the engine never imports Textual,
the public API never imports Typer, and no module imports itself round a cycle."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str | None:
    here = Path(sys.executable).with_name("lint-imports")  # the venv running the tests first
    return str(here) if here.exists() else shutil.which("lint-imports")


def _namespace(tmp_path: Path) -> Path:
    """Returns a folder holding `vitsee` as an install makes it: engine/'s files and rooms with tui/ among them (the
    package-dir of pyproject.toml). import-linter then analyses this checkout, not whatever vitsee is installed."""
    pkg = tmp_path / "vitsee"
    pkg.mkdir()
    for entry in ROOT.joinpath("engine").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (pkg / "tui").symlink_to(ROOT / "tui", target_is_directory=True)
    return tmp_path


def test_the_import_linter_contracts_are_kept(tmp_path):
    command = _lint_imports()
    if command is None:
        pytest.skip("lint-imports is not installed (pip install 'vitsee[test]')")
    env = {**os.environ, "PYTHONPATH": str(_namespace(tmp_path))}
    run = subprocess.run(
        [command, "--config", "pyproject.toml", "--no-cache", "--no-logo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 4 kept, 0 broken." in run.stdout


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Returns the project modules that module `name` (file path) imports anywhere, inside functions too."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            submodules = {f"{target}.{a.name}" for a in node.names} & modules
            # `from vitsee import stats` imports the module stats; the package's own names only if it takes one
            out |= submodules | ({target} if len(submodules) < len(node.names) else set())
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules and m != name}


def _packages() -> dict[str, Path]:
    """Returns {package name: folder} for every package of the distribution, as pyproject.toml's package-dir maps
    them (engine/ is `vitsee`, tui/ `vitsee.tui`)."""
    out = {}
    for top, name in (("engine", "vitsee"), ("tui", "vitsee.tui"), ("assets", "vitsee.assets")):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / top)
            out[".".join([name, *rel.parts])] = init.parent
    return out


def test_every_package_folder_is_in_pyproject():
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(listed) == sorted(_packages())


def test_no_module_of_the_engine_or_the_app_is_on_an_import_cycle():
    files = {}
    for name, folder in _packages().items():
        for f in folder.glob("*.py"):
            files[(name + "." + f.stem).replace(".__init__", "")] = f
    graph = {name: _imports(path, name, set(files)) for name, path in files.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    on_cycle = sorted(name for name in graph if reaches(name, name))
    assert on_cycle == []


def test_every_registered_analysis_has_its_view_string_and_its_shape_a_figure_a_drawing_and_a_pane():
    from vitsee.output import figures, render
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.views import view_help
    from vitsee.tui.widgets.panes import PANES
    from vitsee.tui.widgets.view_pane import PANE_CLASSES

    assert list(REGISTRY) == list(PANES)
    for name, analysis in REGISTRY.items():
        assert analysis.name == name and analysis.usage in view_help()
        assert analysis.usage.startswith(f"{name}:") or analysis.usage == name  # a view of the whole store: 'zoo'
        assert analysis.shape in figures.DRAWINGS and analysis.shape in render.DRAWINGS, name
        assert PANES[name] is PANE_CLASSES[analysis.shape], name


# --- no analysis known by name outside engine/analyses/ -------------------------------------------------------


KIND_LIKE = re.compile(r"kind|name|analysis|which|chosen|spec|view")  # what holds an analysis's name


def _names_compared(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Returns (line, what) for every place that compares a kind with an analysis's name (`kind == "cka"`,
    `view.kind in ("probes", "spatial")`, `"cka" in which`), keys a dict literal by several (a table per
    analysis), looks the registry up by one, or matches one. A word that is also an analysis's name used for
    something else (a record's "heads" field) is no comparison of a kind."""

    def literals(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [v for e in node.elts for v in literals(e)]
        return []

    def kind_like(node: ast.AST) -> bool:
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return bool(KIND_LIKE.search(word.lower()))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(kind_like(side) for side in sides):
                found += [
                    (node.lineno, f"compares a kind with '{v}'") for side in sides for v in literals(side) if v in names
                ]
        elif isinstance(node, ast.Dict):
            keyed = [v for k in node.keys if k is not None for v in literals(k) if v in names]
            if len(keyed) > 1:
                found += [(node.lineno, f"a dict keyed by {', '.join(repr(v) for v in keyed)}")]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "REGISTRY":
            found += [(node.lineno, f"REGISTRY['{v}']") for v in literals(node.slice) if v in names]
        elif isinstance(node, ast.match_case):
            found += [
                (node.pattern.lineno, f"matches '{v.value}'")
                for v in ast.walk(node.pattern)
                if isinstance(v, ast.Constant) and v.value in names
            ]
    return found


def test_no_module_outside_the_analyses_compares_a_kind_with_an_analysis_name():
    # what an analysis is, does or is drawn as is asked of the analysis (REGISTRY[kind]) or of its view's shape:
    # a new analysis then needs no edit elsewhere (the issue counted 56 such comparisons in nine files)
    from vitsee.analyses import REGISTRY

    names = set(REGISTRY)
    offenders = []
    for folder in ("engine", "tui"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if (ROOT / "engine" / "analyses") in path.parents:
                continue
            offenders += [
                f"{path.relative_to(ROOT)}:{line}: {what}"
                for line, what in _names_compared(ast.parse(path.read_text()), names)
            ]
    assert offenders == []


def test_the_name_check_finds_the_comparisons_it_is_for():
    source = """
if kind == "cka": pass
if view.kind in ("probes", "spatial"): pass
TITLES = {"attention": "Attention distances", "probes": "Linear probes"}
draw = REGISTRY["heads"]
if point.kind == "input": pass
if "cka" in which: pass
record = {"blocks": 2, "heads": 3}
if "heads" not in group: pass
"""
    found = _names_compared(ast.parse(source), {"cka", "probes", "spatial", "attention", "heads"})
    assert [line for line, _ in found] == [2, 3, 3, 4, 5, 7]


def test_the_suite_runs_on_the_python_the_package_declares_or_later():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = tuple(int(part) for part in re.fullmatch(r">=\s*(\d+)\.(\d+)", declared.strip()).groups())
    assert sys.version_info[:2] >= floor, (
        f"the suite runs on {sys.version.split()[0]}, below requires-python {declared}"
    )
    assert floor >= (3, 11)  # tui/config.py imports tomllib, which Python 3.10 lacks

"""The layering written in pyproject.toml ([tool.importlinter]) holds for this checkout: the engine never imports
Textual or the app, the analyses never import the CLI or the figures, the public API (`import vitsee`) never imports
the CLI, and no module imports itself round a cycle."""
from __future__ import annotations

import ast
import os
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
    """Returns a folder where `vitsee` is a namespace package of this checkout's engine/ and tui/, as an install
    makes it: import-linter then analyses this code, not whatever vitsee the environment has installed."""
    pkg = tmp_path / "vitsee"
    pkg.mkdir()
    for part in ("engine", "tui"):
        (pkg / part).symlink_to(ROOT / part, target_is_directory=True)
    return tmp_path


def test_the_import_linter_contracts_are_kept(tmp_path):
    command = _lint_imports()
    if command is None:
        pytest.skip("lint-imports is not installed (pip install 'vitsee[test]')")
    env = {**os.environ, "PYTHONPATH": str(_namespace(tmp_path))}
    run = subprocess.run([command, "--config", "pyproject.toml", "--no-cache", "--no-logo"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
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
            out |= {target} | {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules and m != name}


def test_no_module_of_the_engine_or_the_app_is_on_an_import_cycle():
    files = {}
    for folder in ("engine", "engine/analyses", "engine/public", "tui", "tui/widgets", "tui/screens"):
        for f in (ROOT / folder).glob("*.py"):
            files[("vitsee." + folder.replace("/", ".") + "." + f.stem).replace(".__init__", "")] = f
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


def test_every_registered_analysis_has_its_view_string_its_drawings_and_a_pane():
    from vitsee.engine import figures, render
    from vitsee.engine.analyses import REGISTRY
    from vitsee.engine.views import VIEW_HELP, VIEW_KINDS
    from vitsee.tui.screens.explorer import PANES

    assert list(VIEW_KINDS) == list(REGISTRY) == list(PANES)
    for name, spec in REGISTRY.items():
        assert spec.name == name and spec.usage.startswith(f"{name}:") and spec.usage in VIEW_HELP
        assert callable(getattr(figures, f"_{spec.figure}")) and callable(getattr(render, f"_{spec.figure}")), name

"""The code passes `ruff check` with the rules pyproject.toml configures (pyflakes, pycodestyle errors, bugbear), and is
laid out as `ruff format` lays it out."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (installed with the test extras)
    except ImportError:
        if shutil.which("ruff") is None:
            pytest.skip("ruff is not installed: pip install -e '.[test]'")
        return ["ruff"]
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_passes():
    done = subprocess.run(
        [
            *_ruff(),
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "engine",
            "tui",
            "tests",
            "benchmarks",
            "examples",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_the_code_as_it_is():
    done = subprocess.run(
        [*_ruff(), "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout + done.stderr


def test_the_rules_are_configured_in_pyproject():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert config["line-length"] == 120
    assert {"E4", "E7", "E9", "F", "B"} <= set(config["lint"]["select"])
    assert "format" in config

"""benchmarks/gpu.py, the script a GPU runs the day one is lent: its dry run on the CPU goes through every step (the
same code, tiny sizes), so it cannot rot between the days a GPU is at hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitsee.analyses import REGISTRY

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu.py"


def test_the_dry_run_gives_every_figure_for_every_registered_analysis(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path / "table"), "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "table.json").read_text())
    steps = {step["step"]: step for step in report["steps"]}
    assert list(steps) == ["env", "gemm", "tests", "agreement", "extract", "cka", *[n for n in REGISTRY if n != "cka"]]
    assert not [(name, step["error"]) for name, step in steps.items() if step["error"]]
    figures = {step["step"]: dict(step["rows"]) for step in report["steps"]}
    # every analysis compared, and on the CPU against itself the results are the same bit for bit
    agreement = figures["agreement"]
    assert sorted(agreement) == sorted(f"{name}: max |CPU - GPU|" for name in REGISTRY)
    assert all(value.startswith("0.00e+00 over ") for value in agreement.values()), agreement
    assert "collected" in next(iter(figures["tests"].values()))  # the CUDA tests are found (a dry run only collects)
    assert "images/s" in figures["extract"]["plain timm forward, both models"]
    assert "images/s" in figures["extract"]["extract (hooks, fp16 copies, loader, writer, HDF5)"]
    assert any(name.startswith("all-pairs CKA") and "TFLOP/s" in value for name, value in figures["cka"].items())
    for name in REGISTRY:  # each analysis timed on the extracted store, per model it applies to
        if name != "cka":
            assert figures[name] and all(value.endswith(" s") for value in figures[name].values()), figures[name]
    markdown = (tmp_path / "table.md").read_text()
    assert markdown == done.stdout.strip() + "\n" and "| extract | store size |" in markdown
    assert not list((tmp_path / "work").glob("*.h5.tmp*"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device is visible")
def test_without_a_cuda_device_it_says_so_in_one_line_and_exits_non_zero(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "table")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "no CUDA device is visible" in done.stderr
    assert "--dry-run" in done.stderr and not (tmp_path / "table.json").exists()

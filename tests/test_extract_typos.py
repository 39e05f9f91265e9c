"""A typo in `vitsee extract` is said before torch and timm are imported (issue 29, point 5: `unknown dataset 'digit'`
came after 57-60 s on a loaded machine, 38.5 s of them importing torch and timm): the dataset, the weights part of a
model spec, a path, and the model name against timm's names as this machine last listed them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

RUN = """
import sys
from vitsee.cli import main
sys.argv = ["vitsee", "extract", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    print("exit", exc.code)
print("imported", "torch" in sys.modules, "timm" in sys.modules)
"""


def extract(args: list[str], env: dict) -> tuple[str, str]:
    """Returns (stdout, stderr) of `vitsee extract ARGS` in a fresh interpreter."""
    run = subprocess.run([sys.executable, "-c", RUN, *args], env=env, capture_output=True, text=True, timeout=300)
    return run.stdout, run.stderr


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """An environment whose cache folder keeps timm's names, as any earlier run that imported timm leaves them."""
    cache = tmp_path_factory.mktemp("cache")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "HF_HUB_OFFLINE": "1"}
    code = "from vitsee.models.load import parse_model_spec; parse_model_spec('resnet18@random')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert list((cache / "vitsee").glob("timm-models-*.txt"))
    return env


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["-m", "vit_tiny_patch16_224x@random"],
            "unknown model 'vit_tiny_patch16_224x': did you mean vit_tiny_patch16_224",
        ),
        (["-m", "resnet18@randm"], "is not pretrained, random[:SEED] or an existing file (did you mean @random?)"),
        (["-m", "resnet18@random:x"], "seed 'x' in 'resnet18@random:x' is not an integer"),
        (["-m", "resnet18@/no/such/weights.safetensors"], "weights '/no/such/weights.safetensors' in"),
        (["-m", "resnet18@random", "--dataset", "digit"], "unknown dataset 'digit' (did you mean digits?)"),
        (["-m", "resnet18@random", "--dataset", "npz:/no/such.npz"], "dataset path /no/such.npz does not exist"),
        (["-m", "resnet18@random", "--models-from", "/no/models.txt"], "--models-from /no/models.txt does not exist"),
    ],
)
def test_a_typo_is_said_in_one_line_before_torch_or_timm_is_imported(env, tmp_path, args, says):
    out, err = extract([str(tmp_path / "run.h5"), "--dataset", "digits", *args], env)
    assert "exit 2" in out and "imported False False" in out, (out, err)
    assert says in err and err.strip().count("\n") == 0, err


def test_a_store_in_a_missing_folder_is_said_before_torch_is_imported(env, tmp_path):
    out, err = extract([str(tmp_path / "no" / "run.h5"), "-m", "resnet18@random", "--dataset", "digits"], env)
    assert "exit 2" in out and "imported False False" in out
    assert f"folder {tmp_path / 'no'} does not exist: create it first" in err


def test_a_name_timm_has_passes_the_check_and_an_unknown_one_without_kept_names_still_meets_timm(tmp_path):
    from vitsee.models.specs import precheck_spec

    precheck_spec("vit_base_patch16_224_in21k@random")  # deprecated in timm, still built: kept names include it
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    out, err = extract([str(tmp_path / "run.h5"), "-m", "vit_tiny_patch16_224x@random", "--dataset", "digits"], env)
    assert "exit 2" in out and "unknown model 'vit_tiny_patch16_224x'" in err  # told by timm itself

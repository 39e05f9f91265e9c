"""Every user-caused failure: one line naming the bad value and the way out, a non-zero exit, nothing lost."""

from __future__ import annotations

import hashlib
import shutil

import h5py
import numpy as np
import pytest

from conftest import IMG, VIT, run_cli

BASE = [
    "--dataset",
    "digits",
    "--n-images",
    "8",
    "--batch-size",
    "4",
    "--img-size",
    str(IMG),
    "--device",
    "cpu",
    "--workers",
    "0",
    "--quiet",
]


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "model, needles",
    [
        ("vit_tny_patch16_224", ["unknown model 'vit_tny_patch16_224'", "did you mean vit_tiny_patch16_224"]),
        ("vit_tiny_patch16_224.nope", ["unknown tag 'nope'", "augreg_in21k"]),
        ("test_vit@/no/such/weights.safetensors", ["/no/such/weights.safetensors", "check the path"]),
        ("test_vit@random:x", ["seed 'x'", "@random:SEED"]),
        ("test_vit", ["not in the local cache", "@random", "safetensors", "HF_HOME"]),
    ],
)
def test_bad_models(tmp_path, capsys, model, needles):
    code, _, err = run_cli(["extract", tmp_path / "s.h5", "--model", model, *BASE], capsys)
    _one_line_error(code, err, *needles)
    assert not (tmp_path / "s.h5").exists()


def test_weights_that_do_not_fit_name_the_keys(tmp_path, capsys):
    import timm
    from safetensors.torch import save_file

    weights = tmp_path / "resnet.safetensors"
    save_file(timm.create_model("test_resnet").state_dict(), str(weights))
    code, _, err = run_cli(["extract", tmp_path / "s.h5", "--model", f"test_vit@{weights}", *BASE], capsys)
    _one_line_error(code, err, "do not fit VisionTransformer", "missing", "unexpected", "bn1.num_batches_tracked")


def test_a_file_that_is_not_weights(tmp_path, capsys):
    weights = tmp_path / "junk.pth"
    weights.write_bytes(b"not a checkpoint at all")
    code, _, err = run_cli(["extract", tmp_path / "s.h5", "--model", f"test_vit@{weights}", *BASE], capsys)
    _one_line_error(code, err, "cannot read weights file", "junk.pth")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--dataset", "imagefolder:/no/such/folder"], ["/no/such/folder does not exist"]),
        (["--dataset", "mnist"], ["unknown dataset 'mnist'", "digits, samples, synthetic"]),
        (["--n-images", "5000"], ["--n-images 5000", "1797", "--n-images 1797"]),
        (["--n-images", "0"], ["--n-images 0 is too few", "at least 4", "--n-images 4 or more"]),
        (["--n-images", "3"], ["--n-images 3 is too few", "at least 4", "--n-images 4 or more"]),
        (["--layers", "blocks.1,blocks.99"], ["unknown layer 'blocks.99'", "close matches"]),
        (["--device", "cuda"], ["no CUDA GPU", "--device cpu"]),
        (["--dtype", "bfloat8"], ["unknown --dtype 'bfloat8'"]),
        (
            ["--img-size", "72"],
            ["--img-size 72 is not a multiple of the 16-px patches of test_vit", "--img-size 64 or 80"],
        ),
    ],
)
def test_bad_run_options(tmp_path, capsys, args, needles):
    code, _, err = run_cli(["extract", tmp_path / "s.h5", "--model", VIT, *BASE, *args], capsys)
    _one_line_error(code, err, *needles)
    assert not (tmp_path / "s.h5").exists()


def test_an_empty_image_folder(tmp_path, capsys):
    (tmp_path / "imgs" / "cats").mkdir(parents=True)
    code, _, err = run_cli(
        ["extract", tmp_path / "s.h5", "--model", VIT, *BASE, "--dataset", f"imagefolder:{tmp_path / 'imgs'}"], capsys
    )
    _one_line_error(code, err, "no images found", "one sub-folder per class")


def test_a_dataset_of_fewer_than_four_images(tmp_path, capsys):
    np.savez(tmp_path / "three.npz", images=np.zeros((3, 8, 8), dtype=np.uint8))
    code, _, err = run_cli(
        [
            "extract",
            tmp_path / "s.h5",
            "--model",
            VIT,
            "--dataset",
            tmp_path / "three.npz",
            "--img-size",
            "64",
            "--device",
            "cpu",
        ],
        capsys,
    )
    _one_line_error(code, err, "holds only 3 image(s)", "at least 4", "add images")
    assert not (tmp_path / "s.h5").exists()


def test_missing_corrupt_and_foreign_stores(tmp_path, capsys):
    for command in ("info", "analyze", "show"):  # readers and writers (analyze takes the store's write lock)
        extra = ["cka:x"] if command == "show" else []
        code, _, err = run_cli([command, tmp_path / "missing.h5", *extra], capsys)
        _one_line_error(code, err, "missing.h5 does not exist", "vitsee extract")
    code, _, err = run_cli(["analyze", tmp_path], capsys)
    _one_line_error(code, err, "is a folder", ".h5 store file")
    empty = tmp_path / "empty.h5"
    empty.touch()
    code, _, err = run_cli(["analyze", empty], capsys)
    _one_line_error(code, err, "empty.h5 is an empty file", "vitsee extract", "--overwrite")
    assert empty.stat().st_size == 0  # left as it was

    corrupt = tmp_path / "corrupt.h5"
    corrupt.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00garbage" * 100)
    code, _, err = run_cli(["info", corrupt], capsys)
    _one_line_error(code, err, "corrupt.h5 is not a readable vitsee store", "--overwrite")

    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2, 3]
    code, _, err = run_cli(["info", foreign], capsys)
    _one_line_error(code, err, "not a vitsee store")


def test_a_truncated_store_is_reported_not_crashed(tiny_store, tmp_path, capsys):
    cut = tmp_path / "cut.h5"
    data = tiny_store.read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    code, _, err = run_cli(["info", cut], capsys)
    _one_line_error(code, err, "cut.h5 is not a readable vitsee store", "truncated file")


def test_existing_store_with_other_images_is_refused_and_kept(tiny_store, tmp_path, capsys):
    copy = tmp_path / "copy.h5"
    shutil.copy(tiny_store, copy)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    code, _, err = run_cli(["extract", copy, "--model", VIT, *BASE], capsys)
    _one_line_error(code, err, "holds 48 images of 'synthetic'", "--overwrite")
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


def test_same_model_with_other_layers_is_refused(tiny_store, tmp_path, capsys):
    copy = tmp_path / "copy.h5"
    shutil.copy(tiny_store, copy)
    args = [
        "--dataset",
        "synthetic",
        "--n-images",
        "48",
        "--batch-size",
        "16",
        "--img-size",
        str(IMG),
        "--quiet",
        "--workers",
        "0",
        "--layers",
        "sublayers",
    ]
    code, _, err = run_cli(["extract", copy, "--model", VIT, *args], capsys)
    _one_line_error(code, err, f"{VIT} is already in", "other layers", "--overwrite")


def test_overwrite_replaces(tiny_store, tmp_path, capsys):
    copy = tmp_path / "copy.h5"
    shutil.copy(tiny_store, copy)
    code, _, err = run_cli(["extract", copy, "--model", VIT, *BASE, "--overwrite"], capsys)
    assert code == 0, err
    from vitsee.store import Store

    with Store.open(copy) as s:
        assert s.dataset_spec == "digits" and s.n_images == 8 and s.models == [VIT]


def test_info_prints_everything(tiny_store, capsys):
    code, out, err = run_cli(["info", tiny_store], capsys)
    assert code == 0, err
    for needle in [
        "complete",
        "48 of synthetic",
        "10 classes",
        VIT,
        "test_resnet@random:0",
        "random seed 0",
        "grid 4x4 of 16 px",
        "blocks.5",
        "17x64",
        "layer4.0",
        "attention_distance",
        "48/48 rows done",
    ]:
        assert needle in out, needle


def test_models_lists_family_and_cache(capsys):
    code, out, _ = run_cli(["models", "test_vit"], capsys)
    assert code == 0
    assert "test_vit.r160_in1k" in out and "vit" in out
    code, _, err = run_cli(["models", "no_such_model_zzz"], capsys)
    _one_line_error(code, err, "no timm model matches 'no_such_model_zzz'")


def test_layers_lists_points(capsys):
    code, out, _ = run_cli(["layers", "test_vit", "--img-size", "64"], capsys)
    assert code == 0
    assert "blocks.0.resid1" in out and "input of blocks.0.norm2" in out and "blocks.5.mlp.act" in out

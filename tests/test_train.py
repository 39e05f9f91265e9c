"""`vitsee train`: learning, the no-skip intervention against a hand-written forward, resuming after kill -9, the
record in the weights file and extraction from it, and every bad input as one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import load_file

from conftest import run_cli
from vitsee.data import train_test_split
from vitsee.errors import VitseeError
from vitsee.models.interventions import remove_skips
from vitsee.models.load import load_model
from vitsee.models.load import read_record
from vitsee.training import checkpoint
from vitsee.training.train import TrainConfig, checkpoint_path, lock_path, train

TINY_VIT = {
    "model": "test_vit",
    "model_args": {"patch_size": 8, "depth": 3},
    "img_size": 32,
    "dataset": "digits",
    "device": "cpu",
}
REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after

LOCK_HOLDER = """
import fcntl, sys, time
fh = open(sys.argv[1], "a+")
try:
    fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("busy", flush=True)
    sys.exit(0)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def lock_is_free(out: Path) -> bool:
    """Whether another process can take OUT's lock now (POSIX locks never conflict within one process)."""
    held = subprocess.run([sys.executable, "-c", LOCK_HOLDER, str(lock_path(out)), "0"], capture_output=True, text=True)
    return held.stdout.strip() == "held"


def tiny_vit(out: Path, **kwargs) -> TrainConfig:
    return TrainConfig(out=out, **{**TINY_VIT, "n_images": 120, "epochs": 1, "batch_size": 32, **kwargs})


def test_a_small_resnet18_learns_digits_well_above_chance(tmp_path):
    cfg = TrainConfig(
        out=tmp_path / "r18.safetensors",
        model="resnet18",
        model_args={"channels": [16, 32, 64, 128]},
        img_size=32,
        dataset="digits",
        n_images=600,
        epochs=5,
        batch_size=32,
        device="cpu",
        workers=2,
    )
    result = train(cfg)
    # chance on ten balanced digits is 0.1
    assert result.record["test_accuracy"] > 0.5
    assert result.record["n_test"] == 120 and result.record["n_train"] == 480
    assert [row["epoch"] for row in result.record["history"]] == [1, 2, 3, 4, 5]
    assert not checkpoint_path(cfg.out).exists() and lock_is_free(cfg.out)


def test_the_split_is_seeded_disjoint_and_fractions_nest_inside_one_training_split():
    train_all, test = train_test_split(1797, 0.2, seed=3)
    assert len(test) == 359 and len(train_all) == 1438
    assert not set(test) & set(train_all) and len(set(test) | set(train_all)) == 1797
    tenth, test_b = train_test_split(1797, 0.2, seed=3, data_fraction=0.1)
    third, _ = train_test_split(1797, 0.2, seed=3, data_fraction=0.3)
    assert np.array_equal(test, test_b)
    assert len(tenth) == 144 and set(tenth) <= set(third) <= set(train_all)
    assert not np.array_equal(train_test_split(1797, 0.2, seed=4)[1], test)


def _hand_forward(model, x, no_skip: dict[int, set[str]]):
    """The ViT forward written out, with the residual adds of no_skip left out."""
    x = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    for i, b in enumerate(model.blocks):
        a = b.attn(b.norm1(x))
        x = a if "attn" in no_skip.get(i, ()) else x + a
        m = b.mlp(b.norm2(x))
        x = m if "mlp" in no_skip.get(i, ()) else x + m
    return model.forward_head(model.norm(x))


def test_the_no_skip_forward_equals_a_hand_written_forward_without_those_adds():
    torch.manual_seed(0)
    model = timm.create_model("test_vit", patch_size=8, depth=4, img_size=32, num_classes=10).eval()
    keys = list(model.state_dict())
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        intact = model(x)
        assert torch.allclose(intact, _hand_forward(model, x, {}), atol=1e-6)
        remove_skips(model, ["blocks.1.attn", "blocks.1.mlp", "blocks.3.mlp"])
        cut = model(x)
        expected = _hand_forward(model, x, {1: {"attn", "mlp"}, 3: {"mlp"}})
    assert torch.allclose(cut, expected, atol=1e-6)
    assert (cut - intact).abs().max() > 1e-2  # the intervention changes the function
    assert list(model.state_dict()) == keys  # timm's own keys: the file loads into timm as it is


def test_the_record_round_trips_and_name_at_file_rebuilds_the_architecture(tmp_path, capsys):
    out = tmp_path / "cut.safetensors"
    result = train(tiny_vit(out, no_skip=["blocks.1"], pool="avg", data_fraction=0.5))
    record = read_record(out)
    assert record == result.record
    assert record["model"] == "test_vit" and record["model_args"] == {"patch_size": 8, "depth": 3}
    assert record["kwargs"] == {
        "patch_size": 8,
        "depth": 3,
        "class_token": False,
        "global_pool": "avg",
        "num_classes": 10,
        "img_size": 32,
    }
    assert record["interventions"] == {"no_skip": ["blocks.1.attn", "blocks.1.mlp"], "pool": "avg"}
    assert record["split"] == {"seed": 0, "test_fraction": 0.2, "n_images": 120, "data_fraction": 0.5}
    assert (record["n_train"], record["n_test"]) == (48, 24)
    assert record["dataset"] == "digits" and record["versions"]["timm"] == timm.__version__
    assert record["test_accuracy"] == record["history"][-1]["test_accuracy"]
    assert set(record["recipe"]) >= {"lr", "weight_decay", "warmup_epochs", "label_smoothing", "epochs", "batch_size"}

    plain = timm.create_model("test_vit", **record["kwargs"])
    plain.load_state_dict(load_file(out))  # timm's own keys, no class token
    loaded = load_model(f"test_vit@{out}")
    assert loaded.num_prefix_tokens == 0 and loaded.model.blocks[1]._vitsee_no_skip == {"attn", "mlp"}
    assert not hasattr(loaded.model.blocks[0], "_vitsee_no_skip")
    x = torch.randn(2, 3, 32, 32)
    remove_skips(plain.eval(), record["interventions"]["no_skip"])
    with torch.no_grad():
        assert torch.equal(loaded.model(x), plain(x))

    store = tmp_path / "s.h5"
    code, _, err = run_cli(
        ["extract", store, "-m", f"test_vit@{out}", "--dataset", "digits", "-n", 16, "-q", "--workers", 0], capsys
    )
    assert code == 0, err
    code, text, _ = run_cli(["info", store], capsys)
    assert code == 0
    assert "trained here on digits (48 images, 1 epochs" in text
    assert "no skip in blocks.1.attn, blocks.1.mlp; GAP classifier, no class token; data fraction 0.5" in text

    code, _, err = run_cli(
        ["extract", tmp_path / "t.h5", "-m", f"test_resnet@{out}", "--dataset", "digits", "-n", 8, "-q"], capsys
    )
    assert code == 2 and err.strip().splitlines() == [
        f"error: {out} was trained as test_vit, not test_resnet: use -m test_vit@{out}"
    ]
    assert not (tmp_path / "t.h5").exists()


def test_kept_tensors_of_a_fixed_transform_equal_a_fresh_transform_and_random_ones_are_not_kept():
    import timm.data

    from vitsee.data import open_dataset
    from vitsee.training.train import _Images

    digits = open_dataset("digits")
    fixed = timm.data.create_transform(input_size=(3, 32, 32), interpolation="bicubic", crop_pct=0.9)
    kept = _Images(digits, np.arange(5, 25), fixed, fixed=True)
    first = [kept[j][0] for j in range(len(kept))]
    again = [kept[j] for j in range(len(kept))]
    assert all(
        torch.equal(a, fixed(digits.image(5 + j))) and b is a and y == digits.labels()[5 + j]
        for j, (a, (b, y)) in enumerate(zip(first, again))
    )
    crop = timm.data.create_transform(input_size=(3, 32, 32), is_training=True, scale=(0.5, 1.0), hflip=0.0)
    drawn = _Images(digits, np.arange(5, 25), crop, fixed=False)
    assert not any(torch.equal(drawn[j][0], drawn[j][0]) for j in range(len(drawn)))  # a new crop each time


def _train_command(out: Path, epochs: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vitsee.cli",
        "train",
        str(out),
        "-m",
        "test_vit",
        "--model-arg",
        "patch_size=8",
        "--model-arg",
        "depth=3",
        "--img-size",
        "32",
        "--dataset",
        "digits",
        "-n",
        "200",
        "--epochs",
        str(epochs),
        "--batch-size",
        "16",
        "--device",
        "cpu",
        "-q",
    ]


def test_kill_9_mid_training_and_a_rerun_give_the_weights_of_an_uninterrupted_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "killed.safetensors"
    proc = subprocess.Popen(_train_command(out, 3), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not checkpoint_path(out).exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpoint_path(out).exists(), (
            proc.stderr.read().decode() if proc.poll() is not None else "no checkpoint"
        )
        # a second run into the same OUT while the first trains is refused, and leaves the first's files alone
        with pytest.raises(VitseeError, match="another `vitsee train` is writing"):
            train(
                TrainConfig(
                    out=out,
                    **{
                        **TINY_VIT,
                        "model_args": {"patch_size": 8, "depth": 3},
                        "n_images": 200,
                        "epochs": 3,
                        "batch_size": 16,
                    },
                )
            )
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()  # OUT appears only when training ends
    assert checkpoint.read(checkpoint_path(out))["epoch"] < 3

    resumed = subprocess.run(_train_command(out, 3), env=env, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()
    whole = tmp_path / "whole.safetensors"
    subprocess.run(_train_command(whole, 3), env=env, check=True, capture_output=True, timeout=300)
    a, b = load_file(out), load_file(whole)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert read_record(out)["history"][-1]["test_accuracy"] == read_record(whole)["history"][-1]["test_accuracy"]
    assert not checkpoint_path(out).exists() and lock_is_free(out)


def test_the_lock_file_stays_after_a_run_so_whoever_opened_it_still_excludes_the_next(tmp_path):
    out = tmp_path / "m.safetensors"
    train(tiny_vit(out))
    # the file is kept, never unlinked: a process that opened it before the run ended locks the live file
    assert lock_path(out).exists() and lock_is_free(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(lock_path(out)), "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(VitseeError, match="another `vitsee train` is writing"):
            train(tiny_vit(out, overwrite=True))
    finally:
        holder.kill()
        holder.wait()
    assert out.exists() and not checkpoint_path(out).exists()


def test_training_on_cpu_uses_one_thread_unless_told_and_gives_the_old_count_back(tmp_path):
    torch.set_num_threads(2)
    seen = []
    train(tiny_vit(tmp_path / "a.safetensors"), progress=lambda e: seen.append(torch.get_num_threads()))
    assert set(seen) == {1} and torch.get_num_threads() == 2
    seen.clear()
    train(tiny_vit(tmp_path / "b.safetensors", threads=2), progress=lambda e: seen.append(torch.get_num_threads()))
    assert set(seen) == {2}
    torch.set_num_threads(1)


def _unlabelled(tmp_path: Path) -> str:
    path = tmp_path / "data" / "nolabels.npz"
    path.parent.mkdir()
    np.savez(path, images=np.zeros((40, 8, 8), dtype=np.uint8))
    return f"npz:{path}"


VIT_ARGS = ["-m", "test_vit", "--model-arg", "patch_size=8"]
BASE = ["--img-size", "32", "--dataset", "digits", "-n", "60", "--epochs", "1", "--device", "cpu", "-q"]
BAD_INPUTS = {
    "kwargs timm cannot build": (["--model-arg", "no_such_arg=3"], "timm cannot build test_vit with"),
    "no block of that name": (["--no-skip", "blocks.9"], "--no-skip blocks.9: test_vit has no block 'blocks.9'"),
    "a model without residual blocks": (
        ["-m", "test_resnet", "--no-skip", "layer1.0"],
        "--no-skip layer1.0: test_resnet has no transformer blocks",
    ),
    "--pool avg on a CNN": (["-m", "test_resnet", "--pool", "avg"], "--pool avg chooses a ViT's classifier"),
    "fraction 0": (["--data-fraction", "0"], "--data-fraction 0.0 is outside (0, 1]"),
    "fraction above 1": (["--data-fraction", "1.5"], "--data-fraction 1.5 is outside (0, 1]"),
    "a dataset without labels": (["--dataset", "UNLABELLED"], "has 40 of 40 images without a label"),
    "too few images for the split": (["-n", "12"], "12 images give 10 to train on and 2 to test"),
    "CUDA absent": (["--device", "cuda"], "--device cuda but no CUDA GPU"),
    "no threads": (["--threads", "0"], "--threads must be at least 1, got 0"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_every_bad_input_is_one_line_exit_2_and_leaves_nothing_behind(case, tmp_path, capsys):
    if case == "CUDA absent" and torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    extra, message = BAD_INPUTS[case]
    extra = [_unlabelled(tmp_path) if a == "UNLABELLED" else a for a in extra]
    work = tmp_path / "work"
    work.mkdir()
    model = [] if "test_resnet" in extra else VIT_ARGS
    code, _, err = run_cli(["train", work / "m.safetensors", *model, *BASE, *extra], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert list(work.iterdir()) == []


def test_an_existing_out_is_refused_without_overwrite_and_kept(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"keep me")
    code, _, err = run_cli(["train", out, *VIT_ARGS, *BASE], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {out} exists: pass --overwrite to replace it, or choose another OUT"
    ]
    assert out.read_bytes() == b"keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_the_cli_trains_with_loader_workers_and_prints_one_line_per_epoch(tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    code, _, err = run_cli(
        ["train", out, *VIT_ARGS, *[a for a in BASE if a != "-q"], "--epochs", "2", "--workers", "2"], capsys
    )
    assert code == 0, err
    epochs = [line for line in err.splitlines() if line.startswith("epoch ") and "test acc" in line]
    assert [line.split()[1] for line in epochs] == ["1/2", "2/2"]
    assert read_record(out)["recipe"]["epochs"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors", "w.safetensors.lock"]


def test_the_held_out_file_holds_exactly_the_test_split_with_its_labels(tmp_path):
    from vitsee.data import open_dataset
    from vitsee.training.train import write_held_out

    cfg = tiny_vit(tmp_path / "m.safetensors")
    write_held_out(cfg, tmp_path / "test.npz")
    _, test = train_test_split(1797, 0.2, 0, 120)
    digits = open_dataset("digits")
    held = open_dataset(f"npz:{tmp_path / 'test.npz'}")
    assert len(held) == len(test) == 24 and np.array_equal(held.labels(), digits.labels()[test])
    assert all(np.array_equal(np.asarray(held.image(j)), np.asarray(digits.image(int(i)))) for j, i in enumerate(test))
    assert held.class_names == [str(d) for d in range(10)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.npz"]


def test_the_demo_keys_its_cached_weights_by_the_recipe_so_a_new_recipe_trains_anew(tmp_path, monkeypatch):
    from vitsee.training import train as train_mod
    from vitsee.tui import demo

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("vitsee.models.load.cached_pretrained_file", lambda name: None)  # so the demo trains
    now = demo.choose(folder=tmp_path, device="cpu")
    names = [t.out.name for t in now.training]
    assert names[0].startswith("demo-vit_tiny_patch16_224-digits32-r") and names[0].endswith("-s0.safetensors")
    assert "vit_tiny_patch16_224 15 epochs, resnet18 6 epochs" in now.weights_note
    monkeypatch.setitem(train_mod.RECIPES, "vit", {**train_mod.RECIPES["vit"], "lr": 1e-3})
    later = demo.choose(folder=tmp_path, device="cpu")
    assert [t.out.name for t in later.training][0] != names[0] and later.config.store != now.config.store
    fixed = demo.choose(demo.DemoPlan(train_epochs=2), folder=tmp_path, device="cpu")
    assert [t.out.name for t in fixed.training] == [
        "demo-vit_tiny_patch16_224-digits32-e2-s0.safetensors",
        "demo-resnet18-digits32-e2-s0.safetensors",
    ]


@pytest.mark.parametrize(
    "held_out, message",
    [
        ("FOLDER", "--held-out TMP/held.npz is a folder: name the .npz file to write"),
        ("OUT", "is OUT itself"),
        ("TMP/nowhere/test.npz", "folder TMP/nowhere does not exist"),
    ],
)
def test_a_held_out_path_that_cannot_be_written_is_refused_before_training(tmp_path, capsys, held_out, message):
    (tmp_path / "held.npz").mkdir()
    out = tmp_path / "m.safetensors"
    path = {"FOLDER": tmp_path / "held.npz", "OUT": out}.get(held_out) or held_out.replace("TMP", str(tmp_path))
    if held_out == "OUT":  # an .npz OUT is refused first for its suffix: check the function itself
        from vitsee.training.train import check_held_out

        with pytest.raises(VitseeError, match=message):
            check_held_out(out.with_suffix(".npz"), out.with_suffix(".npz"))
        return
    started = time.monotonic()
    code, _, err = run_cli(["train", out, *VIT_ARGS, *BASE, "--held-out", path], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and message.replace("TMP", str(tmp_path)) in lines[0], err
    assert not out.exists() and not checkpoint_path(out).exists() and time.monotonic() - started < 10  # no training


def test_train_onto_a_folder_names_it_and_does_not_offer_overwrite(tmp_path, capsys):
    out = tmp_path / "runs.safetensors"
    out.mkdir()
    code, _, err = run_cli(["train", out, *VIT_ARGS, *BASE, "--overwrite"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"{out} is a folder: name the weights file" in lines[0], err
    assert "--overwrite" not in lines[0] and out.is_dir() and list(out.iterdir()) == []


def test_the_temporaries_of_a_run_killed_while_writing_are_removed_by_the_next_run(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    out = tmp_path / "m.safetensors"
    try:
        left = [tmp_path / f".m.safetensors.ckpt.tmp{dead.pid}", tmp_path / f".m.safetensors.tmp{dead.pid}"]
        writing = tmp_path / f".m.safetensors.ckpt.tmp{alive.pid}"  # another process still writing: not ours
        other = tmp_path / f".other.safetensors.ckpt.tmp{dead.pid}"
        for p in (*left, writing, other):
            p.write_bytes(b"half a checkpoint")
        train(tiny_vit(out))
        assert not any(p.exists() for p in left)
        assert writing.exists() and other.exists() and out.exists()
    finally:
        alive.kill()
        alive.wait()


def test_write_initial_writes_the_seeded_init_a_run_starts_from_with_a_record_of_no_epochs(tmp_path):
    from vitsee.training.train import write_initial

    cfg = tiny_vit(tmp_path / "init.safetensors", seed=3)
    record = write_initial(cfg)
    torch.manual_seed(3)  # what a run seeds before it builds its model: its weights before the first step
    fresh = timm.create_model("test_vit", pretrained=False, patch_size=8, depth=3, img_size=32, num_classes=10)
    written = load_file(str(cfg.out))
    assert sorted(written) == sorted(fresh.state_dict())
    assert all(torch.equal(written[k], v) for k, v in fresh.state_dict().items())
    assert record["history"] == [] and 0.0 <= record["test_accuracy"] <= 0.3  # ten classes, untrained
    loaded = load_model(f"test_vit@{cfg.out}")  # the run's architecture, rebuilt from the record
    assert loaded.grid_size == (4, 4) and "0 epochs: the seeded init" in loaded.weights["trained"]

"""kill -9 or a cancel at any moment loses nothing written; `vitsee extract STORE` resumes the run the store
records to the same values, bit for bit (one compute thread throughout: a convolution's rounding depends on it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.store import Store

ARGS = [
    "--model",
    VIT,
    "--dataset",
    "digits",
    "--n-images",
    "160",
    "--batch-size",
    "2",
    "--img-size",
    str(IMG),
    "--layers",
    "sublayers",
    "--device",
    "cpu",
    "--workers",
    "0",
    "--quiet",
    "--threads",
    "1",
]


def _extract_cmd(store) -> list[str]:
    return [sys.executable, "-m", "vitsee.cli", "extract", str(store), *ARGS]


def _batches_done(store) -> int:
    try:
        with h5py.File(store, "r", locking=False) as f:
            return int(f[f"models/{VIT}/done"][:].sum())
    except (OSError, KeyError):
        return 0


def _arrays(store) -> dict[str, np.ndarray]:
    with Store.open(store) as s:
        out = {f"act/{layer}": s.activations(VIT, layer) for layer in s.layers(VIT)}
        out.update({f"stat/{name}": s.stat(VIT, name) for name in s.stats(VIT)})
        out["input"] = s.model_input(VIT)
    return out


def test_a_killed_run_resumed_by_vitsee_extract_store_alone_ends_with_the_values_of_an_uninterrupted_run(tmp_path):
    store = tmp_path / "killed.h5"
    proc = subprocess.Popen(_extract_cmd(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while _batches_done(store) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _batches_done(store)
    assert 3 <= done < 80, f"the kill should land mid-run, landed after {done} of 80 batches"

    with Store.open(store) as s:  # a reader of the killed store sees finished rows only, and is told so
        assert not s.complete
        assert s.rows_done(VIT) == 2 * done
        assert s.activations(VIT, "blocks.5").shape[0] == 2 * done

    # the store's record alone (the same command rerun is tested in test_crash_safety.py)
    rerun = subprocess.run(
        [sys.executable, "-m", "vitsee.cli", "extract", str(store), "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stderr.startswith(
        f"resuming {store}: {VIT} ({2 * done}/160 images); digits, batch size 2, layers sublayers, float16, 64 px"
    )

    reference = tmp_path / "straight.h5"
    run_extraction(
        ExtractConfig(
            store=reference,
            models=[VIT],
            dataset="digits",
            n_images=160,
            batch_size=2,
            img_size=IMG,
            layers="sublayers",
            device="cpu",
            workers=0,
        )
    )
    resumed, straight = _arrays(store), _arrays(reference)
    assert resumed.keys() == straight.keys()
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
    with Store.open(store) as s:
        assert s.complete
    # no temporary leftovers: beside each store only its folder with the write lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.h5", "killed.h5.d", "straight.h5", "straight.h5.d"]
    assert [p.name for p in (tmp_path / "killed.h5.d").iterdir()] == ["lock"]


# --- resuming from the run the store records (`vitsee extract STORE`) ----------------------------------------


SMALL = dict(dataset="synthetic", n_images=48, batch_size=8, img_size=IMG, device="cpu", workers=0)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


def _cancelled_run(path, batches: int, **cfg) -> None:
    """Extracts into path and cancels once `batches` batches are done (as the app's x does)."""
    cancel = threading.Event()

    def progress(event) -> None:
        if event.stage == "extract" and event.done >= batches * cfg["batch_size"]:
            cancel.set()

    result = run_extraction(ExtractConfig(store=path, **cfg), progress, cancel)
    assert result.cancelled


def _all_arrays(store) -> dict[str, np.ndarray]:
    with Store.open(store) as s:
        out = {}
        for key in s.models:
            if not s.streaming:
                out.update({f"{key}/act/{layer}": s.activations(key, layer) for layer in s.layers(key)})
                out[f"{key}/input"] = s.model_input(key)
            out.update({f"{key}/stat/{name}": s.stat(key, name) for name in s.stats(key)})
        state = s.streamed_cka_state()
        if state is not None:
            out["streamed_cka"] = state[0]
    return out


def _assert_same_arrays(a, b) -> None:
    got, want = _all_arrays(a), _all_arrays(b)
    assert got.keys() == want.keys() and got
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("streaming", [False, True], ids=["activations", "streaming"])
def test_extract_store_alone_resumes_a_cancelled_run_to_the_values_of_an_uninterrupted_one(streaming, tmp_path, capsys):
    cfg = dict(SMALL, models=[VIT, RESNET], streaming=streaming)
    path = tmp_path / "cancelled.h5"
    _cancelled_run(path, 2, **cfg)
    with Store.open(path) as s:
        assert not s.complete and s.rows_done(VIT) < 48

    code, _, err = run_cli(["extract", path, "--threads", "1"], capsys)
    assert code == 0, err
    first = err.splitlines()[0]
    assert first.startswith(f"resuming {path}: {VIT} (") and "/48 images)" in first
    assert "synthetic, batch size 8, layers blocks, float16, 64 px" in first
    assert ("streaming" in first) == streaming

    reference = tmp_path / "straight.h5"
    run_extraction(ExtractConfig(store=reference, **cfg))
    _assert_same_arrays(path, reference)
    with Store.open(path) as s:
        assert s.complete

    code, _, err = run_cli(["extract", path], capsys)  # a complete store says so, and is left as it is
    assert code == 0 and err.strip() == f"{path} is complete: every model has all 48 images; nothing to resume"


def test_the_store_records_its_run_and_an_appended_model_records_its_own(tmp_path, capsys):
    path = tmp_path / "two-runs.h5"
    run_extraction(ExtractConfig(store=path, models=[VIT], **SMALL))
    # a second run appends the ResNet with another batch size, and is cancelled
    _cancelled_run(path, 1, **dict(SMALL, models=[RESNET], batch_size=4))
    with Store.open(path) as s:
        main, added = s.run_config(), s.run_config(RESNET)
        assert s.run_config(VIT) == main
    assert [m["key"] for m in main["models"]] == [VIT] and main["batch_size"] == 8
    assert [m["key"] for m in added["models"]] == [RESNET] and added["batch_size"] == 4
    assert {k: main[k] for k in ("dataset", "n_images", "img_size", "layers", "dtype", "streaming", "device")} == {
        "dataset": "synthetic",
        "n_images": 48,
        "img_size": IMG,
        "layers": "blocks",
        "dtype": "float16",
        "streaming": False,
        "device": "cpu",
    }

    code, _, err = run_cli(["extract", path, "--quiet", "--threads", "1"], capsys)
    assert code == 0, err
    reference = tmp_path / "straight.h5"
    run_extraction(ExtractConfig(store=reference, models=[VIT], **SMALL))
    run_extraction(ExtractConfig(store=reference, models=[RESNET], **dict(SMALL, batch_size=4)))
    _assert_same_arrays(path, reference)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    path = tmp_path_factory.mktemp("interrupted") / "half.h5"
    _cancelled_run(path, 2, **dict(SMALL, models=[VIT]))
    return path


@pytest.mark.parametrize(
    "typed, refused",
    [
        (["--batch-size", "4"], "--batch-size 4 contradicts the run {path} records (--batch-size 8)"),
        (["--n-images", "40"], "--n-images 40 contradicts the run {path} records (--n-images 48)"),
        (["--dataset", "digits"], "--dataset digits contradicts the run {path} records (--dataset synthetic)"),
        (["--layers", "sublayers"], "--layers sublayers contradicts the run {path} records (--layers blocks)"),
        (["--img-size", "32"], "--img-size 32 contradicts the run {path} records (--img-size 64)"),
        (["--dtype", "float32"], "--dtype float32 contradicts the run {path} records (--dtype float16)"),
        (["--shuffle-seed", "3"], "--shuffle-seed 3 contradicts the run {path} records (--shuffle-seed None)"),
        (["--streaming"], "--streaming contradicts the run {path} records (no --streaming)"),
        (["--overwrite"], "--overwrite needs --model: with no model, `vitsee extract STORE` resumes the run"),
    ],
)
def test_options_that_contradict_the_recorded_run_are_refused_in_one_line_and_nothing_changes(
    interrupted, typed, refused, capsys
):
    with Store.open(interrupted) as s:
        before = s.done_batches(VIT)
    code, _, err = run_cli(["extract", interrupted, *typed], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: " + refused.format(path=interrupted))
    with Store.open(interrupted) as s:
        np.testing.assert_array_equal(s.done_batches(VIT), before)


def test_options_the_record_agrees_with_or_does_not_fix_are_accepted(interrupted, tmp_path, capsys):
    from vitsee.extraction.run_config import plan_resume

    resume = plan_resume(
        interrupted,
        {"--batch-size": 8, "--n-images": 48, "--dataset": "synthetic", "--layers": "blocks", "--streaming": False},
        workers=0,
    )
    assert [cfg.models for cfg in resume.configs] == [[VIT]]
    assert resume.configs[0].workers == 0 and resume.progress == {VIT: 16}


def test_info_on_an_incomplete_store_prints_the_exact_resume_command(interrupted, capsys):
    code, out, _ = run_cli(["info", interrupted], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith(f"incomplete (resume it with `vitsee extract {interrupted}`)")
    assert lines[1] == (
        f"made by: vitsee extract {interrupted} --model {VIT} --dataset synthetic --n-images 48 "
        f"--batch-size 8 --img-size {IMG} --device cpu"
    )


def test_an_old_store_without_a_record_is_told_the_way_out_and_a_missing_one_too(interrupted, tmp_path, capsys):
    from vitsee.store import copy_store

    old = copy_store(interrupted, tmp_path / "old.h5")
    with h5py.File(old, "r+") as f:
        del f.attrs["run_config"]
    code, _, err = run_cli(["extract", old], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.strip() == (
        f"error: {old} records no run configuration (made by an older vitsee): resume it with the "
        f"command that made it, `vitsee extract {old} --model {VIT}` with its other options"
    )
    code, out, _ = run_cli(["info", old], capsys)
    assert "incomplete (rerun the `vitsee extract` command that made it to resume)" in out.splitlines()[0]
    with h5py.File(old, "r+") as f:  # an old store that is complete needs no record to say so
        f[f"models/{VIT}/done"][:] = 1
    code, _, err = run_cli(["extract", old], capsys)
    assert code == 0 and err.strip() == f"{old} is complete: every model has all 48 images; nothing to resume"
    code, _, err = run_cli(["extract", tmp_path / "none.h5"], capsys)
    assert code == 2 and f"{tmp_path / 'none.h5'} does not exist: give --model NAME to create it" in err

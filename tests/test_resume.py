"""kill -9 at any moment loses nothing written; rerunning the same command resumes to the same values."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

from conftest import IMG, VIT
from vitsee.engine.extract import ExtractConfig, run_extraction
from vitsee.engine.store import Store

ARGS = ["--model", VIT, "--dataset", "digits", "--n-images", "160", "--batch-size", "2", "--img-size", str(IMG),
        "--layers", "sublayers", "--device", "cpu", "--workers", "0", "--quiet"]


def _extract_cmd(store) -> list[str]:
    return [sys.executable, "-m", "vitsee.engine.cli", "extract", str(store), *ARGS]


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


def test_killed_run_resumes_to_the_values_of_an_uninterrupted_run(tmp_path):
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

    rerun = subprocess.run(_extract_cmd(store), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr

    reference = tmp_path / "straight.h5"
    run_extraction(ExtractConfig(store=reference, models=[VIT], dataset="digits", n_images=160, batch_size=2,
                                 img_size=IMG, layers="sublayers", device="cpu", workers=0))
    resumed, straight = _arrays(store), _arrays(reference)
    assert resumed.keys() == straight.keys()
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
    with Store.open(store) as s:
        assert s.complete
    # no temporary leftovers: beside each store only its folder with the write lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.h5", "killed.h5.d", "straight.h5", "straight.h5.d"]
    assert [p.name for p in (tmp_path / "killed.h5.d").iterdir()] == ["lock"]

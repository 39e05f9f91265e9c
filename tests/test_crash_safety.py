"""A store survives kills at any write, full disks, second writers, crafted files and foreign shards.

The fault-injection tests kill a process on entry to its N-th pwrite64 (strace's syscall injection), for every N
of a result being cached and of a model being appended, then check that the store opens, that rerunning the
same command succeeds, and that the store then holds what an uninterrupted run gives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from vitsee.errors import VitseeError
from vitsee.store import Store, copy_store
from vitsee.store.lock import WriteLock

DRIVER = str(Path(__file__).with_name("store_driver.py"))
STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _writes(cmd: list[str]) -> int:
    """Returns how many pwrite64 calls the main thread of cmd makes (it must succeed)."""
    log = subprocess.run(
        [STRACE, "-qq", "-e", "trace=pwrite64", "-o", "/dev/stdout", *cmd],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert log.returncode == 0, log.stderr
    return sum(1 for line in log.stdout.splitlines() if line.startswith("pwrite64("))


def _killed_at(cmd: list[str], n: int) -> int:
    """Runs cmd, killed on entry to its main thread's n-th pwrite64; returns the exit status."""
    run = subprocess.run(
        [STRACE, "-qq", "-o", "/dev/null", "-e", "trace=pwrite64", "-e", f"inject=pwrite64:signal=KILL:when={n}", *cmd],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    return run.returncode


def snapshot(path: Path, models: list[str] | None = None) -> dict:
    """Returns everything a store holds that a rerun must reproduce: model arrays (of every model, or of
    those named) and cached results."""
    out = {}
    with Store.open(path) as s:
        out["models"] = np.array(s.models)
        for key in s.models if models is None else models:
            out[f"{key}/done"] = s.done_batches(key)
            for layer in s.layers(key):
                out[f"{key}/{layer}"] = s.activations(key, layer)
            for name in s.stats(key):
                out[f"{key}/stat/{name}"] = s.stat(key, name)
        for r in s.results():
            arrays = s.get_result(r["analysis"], r["params"])
            for name, value in arrays.items():
                if not name.startswith("_"):
                    out[f"result/{r['analysis']}/{json.dumps(r['params'], sort_keys=True)}/{name}"] = value
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def opens(path: Path) -> None:
    """What `vitsee info` needs: the store, its models, layers and results can be read."""
    with Store.open(path) as s:
        for key in s.models:
            s.layers(key), s.rows_done(key), s.model_info(key)
        s.results()


@pytest.fixture()
def base(tiny_store, tmp_path) -> Path:
    return copy_store(tiny_store, tmp_path / "base.h5")


@needs_strace
@pytest.mark.parametrize("op", ["result", "append"])
def test_a_kill_at_every_write_of_the_store_leaves_it_readable_and_the_rerun_completes_it(op, base, tmp_path):
    reference = copy_store(base, tmp_path / "reference.h5")
    cmd = [sys.executable, DRIVER, str(reference), op]
    total = _writes(cmd)
    assert total >= 3
    added = ["extra"] if op == "append" else []  # the base store's own models are checked untouched below
    want = snapshot(reference, added)
    base_before = snapshot(base)
    for n in range(1, total + 1):
        store = copy_store(base, tmp_path / f"killed-{n}.h5")
        status = _killed_at([sys.executable, DRIVER, str(store), op], n)
        assert status != 0, f"write {n} of {total} did not kill the driver"
        opens(store)
        rerun = subprocess.run([sys.executable, DRIVER, str(store), op], capture_output=True, text=True, env=_env())
        assert rerun.returncode == 0, f"rerun after a kill at write {n}: {rerun.stderr}"
        assert_same(snapshot(store, added), want)
        shutil.rmtree(tmp_path / f"killed-{n}.h5.d", ignore_errors=True)
        os.unlink(store)
    got = snapshot(reference)
    assert_same(
        {k: v for k, v in got.items() if k in base_before and k != "models"},
        {k: v for k, v in base_before.items() if k != "models"},
    )


@needs_strace
def test_a_kill_during_vitsee_analyze_leaves_the_store_readable_and_the_rerun_caches_the_same_cka(base, tmp_path):
    reference = copy_store(base, tmp_path / "reference.h5")
    # the reference and the killed runs on one thread, the reruns on two: the thread count follows the load, and the
    # promise is the uninterrupted run's arrays bit for bit whatever it is
    analyze = [
        sys.executable,
        "-m",
        "vitsee.cli",
        "analyze",
        "--cka",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--quiet",
    ]
    two = [*analyze[:-3], "--threads", "2", "--quiet"]
    total = _writes([*analyze[:4], str(reference), *analyze[4:]])
    want = snapshot(reference)
    for n in sorted({1, total // 2, total}):  # the first, a middle and the last write of the result file
        store = copy_store(base, tmp_path / f"killed-{n}.h5")
        assert _killed_at([*analyze[:4], str(store), *analyze[4:]], n) != 0
        opens(store)
        code, out, err = run_cli(["info", store], _Capture())
        assert code == 0, err
        rerun = subprocess.run([*two[:4], str(store), *two[4:]], capture_output=True, text=True, env=_env())
        assert rerun.returncode == 0, rerun.stderr
        assert_same(snapshot(store), want)


class _Capture:
    """A stand-in for pytest's capsys where a test calls run_cli more than once in a loop."""

    def readouterr(self):
        class R:
            out = ""
            err = ""

        return R()


def test_a_result_is_written_whole_in_a_file_of_its_own_and_the_store_file_is_not_touched(base):
    before = base.read_bytes()
    with Store.writer(base) as s:
        s.put_result("cka", {"x": 1}, {"v": np.arange(3.0)})
    assert base.read_bytes() == before
    files = list((base.parent / "base.h5.d" / "results" / "cka").iterdir())
    assert [p.suffix for p in files] == [".h5"]
    with h5py.File(files[0], "r") as f:  # plain h5py reads it
        np.testing.assert_array_equal(f["v"][:], np.arange(3.0))
        assert json.loads(f.attrs["params"]) == {"x": 1}


def test_a_format_1_store_opens_as_it_is_and_keeps_its_cached_results(base):
    with h5py.File(base, "r+") as f:  # what vitsee 0.1 wrote: results inside the store, format 1
        f.attrs["vitsee_format"] = 1
        del f.attrs["store_id"]
        group = f.create_group(f"results/cka/{Store.result_id({'old': True})}")
        group.create_dataset("v", data=np.ones(2))
        group.attrs["params"] = json.dumps({"old": True})
        group.attrs["complete"] = True
    with Store.writer(base) as s:
        assert s.get_result("cka", {"old": True})["v"].tolist() == [1.0, 1.0]
        s.put_result("cka", {"new": True}, {"v": np.zeros(2)})
    with Store.open(base) as s:
        assert sorted(json.dumps(r["params"]) for r in s.results("cka")) == ['{"new": true}', '{"old": true}']


def test_results_left_by_a_replaced_store_are_not_read_as_this_stores(base, tmp_path, monkeypatch):
    with Store.writer(base) as s:
        s.put_result("cka", {"x": 1}, {"v": np.arange(3.0)})
    with Store.open(base) as s:
        old_id = s.store_id
    old_results = list((tmp_path / "base.h5.d" / "results").rglob("*.h5"))
    from vitsee import store as store_mod

    with monkeypatch.context() as m:
        m.setattr("vitsee.store.write.tidy", lambda *a, **k: [])  # --overwrite, killed before it removed them
        with store_mod.creating(base, overwrite=True) as h5:
            store_mod.write_images(h5, "synthetic", np.arange(4), np.zeros(4), None, None)
    assert all(p.exists() for p in old_results)
    with Store.open(base) as s:
        assert s.results() == [] and s.get_result("cka", {"x": 1}) is None
    with pytest.warns(UserWarning, match="moved 1 file"), Store.writer(base):
        pass  # the next writer cannot tell them from a moved store's: aside, not deleted
    aside = tmp_path / f"base.h5.d.store-{old_id[:12]}"
    assert not any(p.exists() for p in old_results)
    assert [p.relative_to(aside) for p in aside.rglob("*.h5")] == [
        p.relative_to(tmp_path / "base.h5.d") for p in old_results
    ]
    with store_mod.creating(base, overwrite=True) as h5:  # an --overwrite that finishes removes them itself
        store_mod.write_images(h5, "synthetic", np.arange(4), np.zeros(4), None, None)
    with Store.writer(base) as s:
        s.put_result("cka", {"x": 2}, {"v": np.arange(3.0)})
    with store_mod.creating(base, overwrite=True) as h5:
        store_mod.write_images(h5, "synthetic", np.arange(4), np.zeros(4), None, None)
    assert list((tmp_path / "base.h5.d").rglob("*.h5")) == []


# --- the lock --------------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_with_the_first_ones_pid(base):
    with Store.writer(base):
        code = f"from vitsee.store import Store\nStore.writer({str(base)!r})\n"
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode != 0
        assert f"being written by process {os.getpid()}" in other.stderr
        with pytest.raises(VitseeError, match="being written by this process"):
            Store.writer(base)
    with Store.writer(base):  # released on close
        pass


def test_overwrite_is_refused_while_another_process_holds_the_lock(base, tmp_path):
    before = snapshot(base)
    with WriteLock(base, command="vitsee analyze"):
        code, _out, err = _subprocess_cli(
            [
                "extract",
                base,
                "--model",
                VIT,
                "--dataset",
                "synthetic",
                "--n-images",
                "8",
                "--img-size",
                IMG,
                "--device",
                "cpu",
                "--workers",
                "0",
                "--overwrite",
            ]
        )
    assert code == 2
    assert "being written by process" in err and "vitsee analyze" in err
    assert_same(snapshot(base), before)


def _subprocess_cli(args) -> tuple[int, str, str]:
    run = subprocess.run(
        [sys.executable, "-m", "vitsee.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    return run.returncode, run.stdout, run.stderr


def test_two_extractions_into_one_new_path_never_both_succeed(tmp_path):
    path = tmp_path / "race.h5"
    common = [
        "--dataset",
        "synthetic",
        "--n-images",
        "16",
        "--batch-size",
        "8",
        "--img-size",
        str(IMG),
        "--device",
        "cpu",
        "--workers",
        "0",
        "--quiet",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vitsee.cli", "extract", str(path), "--model", m, *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for m in (VIT, RESNET)
    ]
    outs = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = [c for c, _ in outs]
    assert sorted(codes) == [0, 2], outs
    loser = next(err for c, err in outs if c == 2)
    assert "being written by" in loser or "already exists" in loser or "created by another vitsee process" in loser
    winner = [VIT, RESNET][codes.index(0)]
    with Store.open(path) as s:
        assert s.models == [winner] and s.complete


def test_a_killed_extraction_with_loader_workers_can_be_rerun_at_once(tmp_path):
    path = tmp_path / "killed.h5"
    cmd = [
        sys.executable,
        "-m",
        "vitsee.cli",
        "extract",
        str(path),
        "--model",
        VIT,
        "--dataset",
        "digits",
        "--n-images",
        "200",
        "--batch-size",
        "4",
        "--img-size",
        str(IMG),
        "--device",
        "cpu",
        "--workers",
        "2",
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with Store.open(path) as s:
                if s.rows_done(VIT) >= 8:
                    break
        except VitseeError:
            pass
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)  # no wait for the workers
    assert rerun.returncode == 0, rerun.stderr
    with Store.open(path) as s:
        assert s.complete


# --- crafted and damaged files -----------------------------------------------------------------------------


def _crafted(base: Path, tmp_path: Path, how: str) -> Path:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"do not touch" * 100)
    with h5py.File(base, "r+") as f:
        layer = f"models/{VIT}/acts/blocks.0"
        shape, dtype = f[layer].shape, f[layer].dtype
        if how == "external storage":
            del f[layer]
            f.create_dataset(layer, shape=shape, dtype=dtype, external=[(str(victim), 0, h5py.h5f.UNLIMITED)])
        elif how == "external link":
            with h5py.File(tmp_path / "other.h5", "w") as other:
                other.create_group("results")
            f["results"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/results")
        elif how == "soft link":
            f["models/alias"] = h5py.SoftLink(f"/models/{VIT}")
        elif how == "virtual dataset elsewhere":
            with h5py.File(tmp_path / "elsewhere.h5", "w") as other:
                other.create_dataset("x", shape=shape, dtype=dtype)
            del f[layer]
            vds = h5py.VirtualLayout(shape=shape, dtype=dtype)
            vds[:] = h5py.VirtualSource(str(tmp_path / "elsewhere.h5"), "x", shape=shape)
            f.create_virtual_dataset(layer, vds)
    return victim


@pytest.mark.parametrize("how", ["external storage", "external link", "soft link", "virtual dataset elsewhere"])
def test_a_store_that_points_elsewhere_is_refused_before_anything_is_read_or_written(how, base, tmp_path):
    victim = _crafted(base, tmp_path, how)
    before = victim.read_bytes()
    for args in (["info", base], ["analyze", base, "--cka", "--device", "cpu"], ["show", base, f"cka:{VIT}"]):
        code, _out, err = _subprocess_cli(args)
        assert code == 2, (args, err)
        assert "is not a store vitsee wrote" in err and "Traceback" not in err
    assert victim.read_bytes() == before


def test_a_read_only_store_is_reported_as_read_only_not_as_corrupt(base, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads and writes through any permission bits")
    os.chmod(base, 0o444)
    with pytest.raises(VitseeError, match="read-only") as info:
        Store.writer(base, rows=True)
    assert "--overwrite" not in str(info.value)


def test_a_read_only_folder_is_named_as_the_cause(base, tmp_path, monkeypatch):
    import errno

    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if str(path).endswith("base.h5.d/lock") or str(path) == "lock" and "dir_fd" in kwargs:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(VitseeError) as info:
        Store.writer(base)
    text = str(info.value)
    assert "read-only" in text and "intact" in text and "--overwrite" not in text


def test_a_read_only_mount_is_named_as_the_cause_without_offering_chmod(base, monkeypatch):
    import errno

    real_open, real_statvfs = os.open, os.statvfs

    def refusing(path, flags, *args, **kwargs):
        if str(path) == "lock" and "dir_fd" in kwargs:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(VitseeError) as info:
        Store.writer(base)
    assert "read-only file system" in str(info.value) and "chmod" not in str(info.value)
    monkeypatch.setattr(os, "open", real_open)

    class ReadOnly:
        def __init__(self, where):
            self.f_flag = real_statvfs(where).f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", ReadOnly)  # the mount says read-only although root could write
    with pytest.raises(VitseeError) as info:
        Store.writer(base, rows=True)
    text = str(info.value)
    assert "on a read-only file system" in text and "intact" in text and "chmod" not in text


def test_a_damaged_result_file_is_computed_again_not_fatal(base):
    with Store.writer(base) as s:
        rid = s.put_result("cka", {"x": 1}, {"v": np.arange(3.0)})
    p = base.parent / "base.h5.d" / "results" / "cka" / f"{rid}.h5"
    p.write_bytes(p.read_bytes()[:100])
    with Store.open(base) as s:
        assert s.get_result("cka", {"x": 1}) is None
        assert s.results() == []


# --- a full disk ---------------------------------------------------------------------------------------------


@pytest.fixture()
def small_disk(tmp_path):
    """A 16 MB tmpfs (root only), unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_disk_too_small_is_refused_up_front_and_a_rerun_after_freeing_space_completes(small_disk, tmp_path):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (12 << 20))  # leaves 4 MB for a store of 8.6 MB
    path = small_disk / "full.h5"
    args = [
        "extract",
        path,
        "--model",
        VIT,
        "--dataset",
        "digits",
        "--n-images",
        "64",
        "--batch-size",
        "8",
        "--img-size",
        IMG,
        "--layers",
        "sublayers",
        "--device",
        "cpu",
        "--workers",
        "0",
        "--force",
    ]
    code, _out, err = _subprocess_cli(args)
    assert code == 2 and "Traceback" not in err
    assert "not enough disk space" in err and str(path.name) in err
    assert not path.exists()  # nothing half-made: the store appears whole or not at all
    filler.unlink()
    code, _out, err = _subprocess_cli(args)
    assert code == 0, err
    with Store.open(path) as s:
        assert s.complete and s.rows_done(VIT) == 64
        assert np.isfinite(s.activations(VIT, "blocks.5")).all()
        assert np.abs(s.activations(VIT, "blocks.5")[-8:]).sum() > 0  # the last rows hold data, not zeros


def test_a_full_disk_while_caching_a_result_leaves_the_store_as_it_was(small_disk, tiny_store):
    path = copy_store(tiny_store, small_disk / "store.h5")
    before = snapshot(path)
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * max(0, free - (8 << 10)))
    with Store.writer(path) as s:
        with pytest.raises(VitseeError, match="not enough disk space"):
            s.put_result("cka", {"x": 1}, {"v": np.zeros((512, 512))})
    assert_same(snapshot(path), before)
    assert not [p for p in (small_disk / "store.h5.d").rglob("*") if p.is_file() and p.name != "lock"]


# --- readers racing a writer ---------------------------------------------------------------------------------


def test_readers_never_see_a_half_written_result(base):
    code = (
        "import numpy as np\n"
        "from vitsee.store import Store\n"
        f"with Store.writer({str(base)!r}) as s:\n"
        "    for i in range(40):\n"
        "        s.put_result('cka', {'x': 1}, {'v': np.full((64, 64), float(i)), 'w': np.full(64, float(i))})\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], env=_env())
    seen = 0
    try:
        while writer.poll() is None:
            with Store.open(base) as s:
                r = s.get_result("cka", {"x": 1})
            if r is not None:
                assert r["v"].shape == (64, 64) and float(r["v"][0, 0]) == float(r["w"][-1])
                seen += 1
    finally:
        writer.wait()
    assert writer.returncode == 0


def test_a_failed_write_never_marks_its_batch_done(base, monkeypatch):
    import errno as errno_mod

    with Store.writer(base, rows=True) as s:
        key = s.models[0]
        s.model_group(key)["done"][0] = 0
        shapes = {layer: s.layer_shape(key, layer) for layer in s.layers(key)}

        def failing(*args, **kwargs):
            raise OSError(errno_mod.ENOSPC, "No space left on device")

        monkeypatch.setattr(s, "_write_rows", failing)
        acts = {layer: np.zeros((16, *shape), np.float16) for layer, shape in shapes.items()}
        with pytest.raises(VitseeError, match="not enough disk space"):
            s.write_batch(key, 0, acts, {}, None, [0] * len(shapes))
    with Store.open(base) as s:
        assert not s.done_batches(s.models[0])[0] and s.rows_done(s.models[0]) == 0

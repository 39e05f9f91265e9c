"""`vitsee rm STORE` removes a store's file and everything of it beside it, and nothing else; a store deleted by hand
leaves its folder, which `vitsee info` names and `vitsee rm STORE --leftover` removes unless a moved store claims it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import vitsee
from conftest import run_cli
from vitsee.store import copy_store

STRACE = shutil.which("strace")


def _store(path: Path, seed: int = 0) -> Path:
    """Returns a small store at path with a cached result in its folder beside it."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    vitsee.from_features(path, {"m": {"a": rng.normal(size=(16, 5)), "b": rng.normal(size=(16, 3))}}).cka("m")
    assert list((path.parent / f"{path.name}.d" / "results").rglob("*.h5"))
    return path


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_rm_removes_the_store_and_its_folder_and_leaves_what_is_not_its_own(tmp_path, capsys):
    store = _store(tmp_path / "run.h5")
    other = _store(tmp_path / "other.h5", seed=1)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "run.h5.d"
    (folder / "results" / "cka" / "link.h5").symlink_to(victim)  # never deleted through
    foreign = next((tmp_path / "other.h5.d" / "results" / "cka").glob("*.h5"))
    shutil.copy(foreign, folder / "results" / "cka" / "foreign.h5")  # another store's file in this folder
    (folder / "notes.txt").write_text("mine\n")  # not vitsee's
    capsys.readouterr()
    code, out, err = run_cli(["rm", store], capsys)
    assert code == 0, err
    assert "removed" in out and "left 3 that are not this store's" in out
    assert not store.exists()
    assert _files(folder) == ["notes.txt", "results", "results/cka", "results/cka/foreign.h5", "results/cka/link.h5"]
    assert victim.read_text() == "precious\n" and vitsee.open(other).models == ["m"]  # the other store whole


def test_rm_refuses_what_is_not_a_store_in_one_line_and_removes_nothing(tmp_path, capsys):
    store = _store(tmp_path / "s.h5")
    (tmp_path / "notes.txt").write_text("a file\n")
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["x"] = np.zeros(3)
    (tmp_path / "folder.h5").mkdir()
    (tmp_path / "link.h5").symlink_to(store)
    before = _files(tmp_path)
    capsys.readouterr()
    for target, says in [
        ("notes.txt", "notes.txt cannot be read as a vitsee store"),
        ("data.h5", "data.h5 is an HDF5 file but not a vitsee store"),
        ("folder.h5", "folder.h5 is a folder, not a store file"),
        ("link.h5", "link.h5 is a symbolic link (to"),
        ("missing.h5", "missing.h5 does not exist: nothing to remove"),
    ]:
        code, _, err = run_cli(["rm", tmp_path / target], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and says in lines[0], err
    assert _files(tmp_path) == before


def test_rm_is_refused_while_another_process_writes_the_store(tmp_path, capsys):
    store = _store(tmp_path / "s.h5")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from vitsee.store.lock import WriteLock; import time; l = WriteLock({str(store)!r});"
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = run_cli(["rm", store], capsys)
        assert code == 2 and "is being written by" in err, err
    finally:
        holder.kill()
        holder.wait()
    assert vitsee.open(store).models == ["m"]


def test_a_store_deleted_by_hand_leaves_its_folder_which_info_names_and_leftover_removes(tmp_path, capsys):
    store = _store(tmp_path / "s.h5")
    store.unlink()
    code, _, err = run_cli(["info", store], capsys)
    assert code == 2 and "its folder" in err and f"vitsee rm {store} --leftover" in err, err
    code, _, err = run_cli(["rm", store], capsys)
    assert code == 2 and "--leftover" in err  # the folder alone is removed only when asked
    assert (tmp_path / "s.h5.d").exists()
    code, out, err = run_cli(["rm", store, "--leftover"], capsys)
    assert code == 0 and "removed the folder" in out, err
    assert list(tmp_path.iterdir()) == []


def test_the_folder_of_a_moved_store_is_named_not_removed(tmp_path, capsys):
    store = _store(tmp_path / "s.h5")
    store.rename(tmp_path / "moved.h5")  # `mv s.h5 moved.h5`: the folder stays as s.h5.d
    code, _, err = run_cli(["rm", store, "--leftover"], capsys)
    assert code == 2 and "holds the files of moved.h5" in err and "mv " in err and "nothing was removed" in err, err
    (tmp_path / "s.h5.d").rename(tmp_path / "moved.h5.d")  # the way out it names
    assert vitsee.open(tmp_path / "moved.h5").cka("m")._view.matrix.shape == (2, 2)


def test_info_says_how_to_remove_a_store(tmp_path, capsys):
    store = _store(tmp_path / "s.h5")
    code, out, _ = run_cli(["info", store], capsys)
    assert code == 0 and f"remove it with `vitsee rm {store}`" in out


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)")
def test_a_kill_at_any_unlink_of_rm_leaves_a_store_or_a_leftover_and_the_rerun_finishes(tmp_path):
    base = _store(tmp_path / "base" / "s.h5")
    cmd = [sys.executable, "-m", "vitsee.cli", "rm"]
    count = tmp_path / "count"
    count.mkdir()
    copy_store(base, count / "s.h5")
    log = subprocess.run(
        [STRACE, "-qq", "-e", "trace=unlink,unlinkat,rmdir", "-o", "/dev/stdout", *cmd, str(count / "s.h5")],
        capture_output=True,
        text=True,
    )
    assert log.returncode == 0, log.stderr
    calls = [line for line in log.stdout.splitlines() if line.startswith(("unlink", "rmdir"))]
    assert sum(str(count) in line for line in calls) >= 4, calls  # the store, its result, its lock, the folders
    n_calls = len(calls)  # strace counts every call; a kill before ours leaves the store whole
    for n in range(1, n_calls + 1):
        work = tmp_path / f"kill{n}"
        work.mkdir()
        copy_store(base, work / "s.h5")
        (work / "keep.txt").write_text("mine\n")
        killed = subprocess.run(
            [
                STRACE,
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                "trace=unlink,unlinkat,rmdir",
                "-e",
                f"inject=unlink,unlinkat,rmdir:signal=KILL:when={n}",
                *cmd,
                str(work / "s.h5"),
            ],
            capture_output=True,
        )
        if killed.returncode == 0:  # this run made fewer calls than the counted one: nothing was killed
            assert "removed" in killed.stdout.decode()
        elif (work / "s.h5").exists():  # the whole store is left: the rerun removes it
            assert vitsee.open(work / "s.h5").models == ["m"]
            again = subprocess.run([*cmd, str(work / "s.h5")], capture_output=True, text=True)
            assert again.returncode == 0, (n, again.stderr)
        else:  # its folder without it, or nothing: --leftover removes what is left
            again = subprocess.run([*cmd, str(work / "s.h5"), "--leftover"], capture_output=True, text=True)
            assert again.returncode == 0 or "does not exist: nothing is left" in again.stderr, (n, again.stderr)
        assert sorted(p.name for p in work.iterdir()) == ["keep.txt"], (n, list(work.iterdir()))

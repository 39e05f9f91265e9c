"""The store's folder (STORE.d) is as guarded as its file: crafted layouts change nothing outside the store and
lose nothing of it.

One table: (id, craft, command, expected). craft(c) turns a fresh copy of a store with an appended model and a
cached result (and, beside it in victim/, a file and another store) into the layout of the row; command(c) is the
argv of `vitsee`; expected is the substring of the one-line error, or None where the command succeeds. Every row
checks by sha256 that nothing under victim/ changed and that every file of the store is still somewhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import IMG, VIT, run_cli
from vitsee.store import Store, copy_store

EXTRA = "test_vit@random:1"  # the appended model, a file of its own in STORE.d/models
EXTRA_FILE = "test_vit%40random%3A1.h5"
RUN = [
    "--dataset",
    "synthetic",
    "--n-images",
    "48",
    "--batch-size",
    "16",
    "--img-size",
    str(IMG),
    "--device",
    "cpu",
    "--workers",
    "0",
    "--quiet",
]


def _new_identity(path: Path, store_id: str) -> None:
    with h5py.File(path, "r+") as f:  # a store of its own: another store_id
        f.attrs["store_id"] = store_id


@pytest.fixture(scope="module")
def template(tiny_store, tmp_path_factory) -> Path:
    """A folder with s.h5 (an appended model, the skip ratios cached) and victim/ (a file and another store, with
    its own appended model and result)."""
    root = tmp_path_factory.mktemp("layout")
    store = copy_store(tiny_store, root / "s.h5")
    for argv in (
        ["extract", store, "--model", EXTRA, *RUN],
        ["analyze", store, "--skip", "--device", "cpu", "--quiet"],
    ):
        code, _out, err = run_cli(argv, _NoCapture())
        assert code == 0, err
    (root / "victim").mkdir()
    (root / "victim" / "notes.txt").write_text("precious\n")
    other = copy_store(store, root / "victim" / "other.h5")
    _new_identity(other, "0123456789ab" + "0" * 20)
    for p in (root / "victim" / "other.h5.d").rglob("*.h5"):
        _new_identity(p, "0123456789ab" + "0" * 20)
    return root


class _NoCapture:
    def readouterr(self):
        class R:
            out = err = ""

        return R()


class Case:
    """A fresh copy of the template and the paths a row needs."""

    def __init__(self, root: Path):
        self.root = root
        self.store = root / "s.h5"
        self.folder = root / "s.h5.d"
        self.victim = root / "victim"
        self.other = self.victim / "other.h5.d"
        self.saved = root / "saved"  # where a row puts what it replaces: the store's data, still there
        self.saved.mkdir()

    @property
    def model_file(self) -> Path:
        return self.folder / "models" / EXTRA_FILE

    @property
    def result_file(self) -> Path:
        return next((self.folder / "results" / "skip").glob("*.h5"))

    def put_away(self, path: Path) -> Path:
        """Moves path into saved/ (what a row replaces), returns where it is now."""
        dest = self.saved / path.name
        os.rename(path, dest)
        return dest

    def link(self, path: Path, target: Path) -> None:
        self.put_away(path)
        path.symlink_to(target)

    def file_at(self, path: Path) -> None:
        self.put_away(path)
        path.write_text("not vitsee's\n")

    def folder_at(self, path: Path) -> None:
        self.put_away(path)
        path.mkdir()

    def foreign_files(self) -> None:
        """Copies the other store's appended model and result into the store's folder (a moved store's files)."""
        for p in self.other.rglob("*.h5"):
            dest = self.folder / p.relative_to(self.other)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():
                dest = dest.with_name("other-" + dest.name)
            shutil.copy2(p, dest)

    def result_of(self, model: str) -> Path:
        """Returns the file of the cached skip ratios of model."""
        with Store.open(self.store) as s:
            rid = next(r["id"] for r in s.results("skip") if r["params"]["model"] == model)
        return self.folder / "results" / "skip" / f"{rid}.h5"

    def analyze(self) -> list:
        """A writer that caches what is not cached (a result it cannot read is not)."""
        return ["analyze", self.store, "--skip", "--device", "cpu", "--quiet"]

    def append(self) -> list:
        """A writer of rows: appending a model opens every model file read-write."""
        return ["extract", self.store, "--model", "test_vit@random:2", *RUN]


def _hashes(folder: Path, skip: Path | None = None) -> dict[str, str]:
    """Returns {relative path: sha256, or '-> target' for a link} of everything under folder, links not followed."""
    out = {}
    for top, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            p = Path(top) / name
            rel = str(p.relative_to(folder))
            if skip is not None and (p == skip or skip in p.parents):
                continue
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _data_hashes(root: Path, victim: Path) -> set[str]:
    """Returns the sha256 of every regular file under root outside victim/, lock files left out."""
    return {h for rel, h in _hashes(root, skip=victim).items() if not h.startswith("->") and Path(rel).name != "lock"}


LAYOUTS = [
    # the lock, written by every writer
    (
        "lock-link-to-a-file",
        lambda c: c.link(c.folder / "lock", c.victim / "notes.txt"),
        Case.analyze,
        "lock is a symbolic link",
    ),
    (
        "lock-hard-link",
        lambda c: (c.put_away(c.folder / "lock"), os.link(c.victim / "notes.txt", c.folder / "lock")),
        Case.analyze,
        "lock is a file with 2 names",
    ),
    ("lock-folder", lambda c: c.folder_at(c.folder / "lock"), Case.analyze, "lock is a folder"),
    (
        "lock-pipe",
        lambda c: (c.put_away(c.folder / "lock"), os.mkfifo(c.folder / "lock")),
        Case.analyze,
        "lock is a special file",
    ),
    # the folder beside the store, and its models/ and results/
    ("folder-link-to-another-store", lambda c: c.link(c.folder, c.other), Case.analyze, "s.h5.d is a symbolic link"),
    ("folder-file", lambda c: c.file_at(c.folder), Case.analyze, "s.h5.d is a file, not the folder"),
    ("folder-link-for-a-new-model", lambda c: c.link(c.folder, c.other), Case.append, "s.h5.d is a symbolic link"),
    (
        "models-link",
        lambda c: c.link(c.folder / "models", c.other / "models"),
        Case.analyze,
        "models is a symbolic link",
    ),
    ("models-file", lambda c: c.file_at(c.folder / "models"), Case.analyze, "models is a file, not the folder"),
    (
        "results-link",
        lambda c: c.link(c.folder / "results", c.other / "results"),
        Case.analyze,
        "results is a symbolic link",
    ),
    ("results-file", lambda c: c.file_at(c.folder / "results"), Case.analyze, "results is a file, not the folder"),
    (
        "results-of-an-analysis-link",
        lambda c: c.link(c.folder / "results" / "skip", c.other / "results" / "skip"),
        Case.analyze,
        "skip is a symbolic link",
    ),
    (
        "results-of-an-analysis-file",
        lambda c: c.file_at(c.folder / "results" / "skip"),
        Case.analyze,
        "skip is a file, not the folder",
    ),
    # one model file, one result file
    (
        "model-file-link-written-by-a-writer-of-rows",
        lambda c: c.link(c.model_file, c.saved / EXTRA_FILE),
        Case.append,
        "test_vit%40random%3A1.h5 is a symbolic link",
    ),
    ("model-file-link-read-by-analyze", lambda c: c.link(c.model_file, c.saved / EXTRA_FILE), Case.analyze, None),
    ("model-file-folder", lambda c: c.folder_at(c.model_file), Case.analyze, "test_vit%40random%3A1.h5 is a folder"),
    ("result-file-link-outside", lambda c: c.link(c.result_file, c.victim / "notes.txt"), Case.analyze, None),
    ("result-file-folder", lambda c: c.folder_at(c.result_file), Case.analyze, "is a folder where s.h5 keeps a file"),
    # files of another store (one moved without its folder): moved aside, never deleted
    ("another-stores-files", Case.foreign_files, Case.analyze, None),
]


@pytest.mark.parametrize("craft, command, expected", [pytest.param(c, m, e, id=i) for i, c, m, e in LAYOUTS])
def test_a_crafted_folder_changes_nothing_outside_the_store_and_loses_nothing_of_it(
    template, tmp_path, capsys, craft, command, expected
):
    root = tmp_path / "case"
    shutil.copytree(template, root, symlinks=True)
    case = Case(root)
    own = _data_hashes(root, case.victim)  # the store, its model file, its results
    craft(case)
    own |= _data_hashes(root, case.victim)  # and what the row put in its folder (another store's files)
    outside = _hashes(case.victim)
    code, _out, err = run_cli(command(case), capsys)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note: ")]
    assert "Traceback" not in err, err
    if expected is None:
        assert code == 0, err
    else:
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
        assert expected in lines[0], lines[0]
    assert _hashes(case.victim) == outside  # nothing outside the store was written, truncated or deleted
    assert own <= _data_hashes(root, case.victim)  # every file of the store is still there, byte for byte


def test_a_result_link_is_never_read_and_the_rerun_puts_a_file_in_its_place(template, tmp_path, capsys):
    root = tmp_path / "case"
    shutil.copytree(template, root, symlinks=True)
    case = Case(root)
    result = case.result_of(VIT)
    with Store.open(case.store) as s:
        params = next(r["params"] for r in s.results("skip") if r["id"] == result.stem)
    copy = case.victim / "copy.h5"
    shutil.copy2(result, copy)
    result.unlink()
    result.symlink_to(copy)
    with Store.open(case.store) as s:  # a link is not the store's file: not read
        assert result.stem not in [r["id"] for r in s.results("skip")] and s.get_result("skip", params) is None
    code, _out, err = run_cli(case.analyze(), capsys)
    assert code == 0, err
    assert result.is_file() and not result.is_symlink()
    with Store.open(case.store) as s:
        assert s.get_result("skip", params) is not None


def test_another_stores_files_move_aside_in_one_line_and_the_moved_store_is_told_where(template, tmp_path, capsys):
    """`mv s.h5 old.h5`, then a new s.h5: the folder's models and results are old.h5's, not the new store's."""
    root = tmp_path / "case"
    shutil.copytree(template, root, symlinks=True)
    case, old = Case(root), root / "old.h5"
    os.rename(case.store, old)
    shutil.copy2(old, case.store)
    _new_identity(case.store, "f" * 32)  # the new store: the same images, its own identity
    with Store.open(old) as s:
        old_id = s.store_id
    before = {rel: h for rel, h in _hashes(case.folder).items() if rel.endswith(".h5")}
    code, _out, err = run_cli(case.analyze(), capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    aside = root / f"s.h5.d.store-{old_id[:12]}"
    assert len(notes) == 1 and f"moved {len(before)} file(s) of another store" in notes[0], err
    assert aside.name in notes[0]
    assert {rel: h for rel, h in _hashes(aside).items() if rel.endswith(".h5")} == before  # as they were, by name
    code, out, err = run_cli(["info", old], capsys)
    assert code == 0, err
    assert f"{aside} holds appended models or cached results of this store" in out
    assert f"mv {aside} {root / 'old.h5.d'}" in out
    os.rename(aside, root / "old.h5.d")  # the way out it names
    with Store.open(old) as s:
        assert EXTRA in s.models and len(s.results("skip")) == 3


def test_overwrite_removes_the_replaced_stores_files_and_moves_any_other_aside(template, tmp_path):
    from vitsee import store as store_mod

    root = tmp_path / "case"
    shutil.copytree(template, root, symlinks=True)
    case = Case(root)
    case.foreign_files()
    with pytest.warns(UserWarning, match="moved 4 file"), store_mod.creating(case.store, overwrite=True) as h5:
        store_mod.write_images(h5, "synthetic", np.arange(4), np.zeros(4), None, None)
    assert list(case.folder.rglob("*.h5")) == []  # the replaced store's files went with it, the other's aside
    aside = root / "s.h5.d.store-0123456789ab"
    assert sorted(h for rel, h in _hashes(aside).items()) == sorted(
        h for rel, h in _hashes(case.other).items() if rel.endswith(".h5")
    )


def _declare_huge(result: Path) -> str:
    """Replaces the result's first array by a (10^6, 10^6) float64 one: 8 TB declared, none of it stored."""
    with h5py.File(result, "r+") as f:
        name = next(iter(f))
        del f[name]
        f.create_dataset(name, shape=(10**6, 10**6), dtype="f8")
    return name


@pytest.mark.parametrize("command", ["show", "analyze"])
def test_a_result_declaring_a_huge_shape_is_ignored_in_one_line_and_computed_again(template, tmp_path, capsys, command):
    root = tmp_path / "case"
    shutil.copytree(template, root, symlinks=True)
    case = Case(root)
    result = case.result_of(VIT)
    name = _declare_huge(result)
    argv = ["show", case.store, f"skip:{VIT}", "--format", "json"] if command == "show" else case.analyze()
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("note: ") and "ignored the cached result" in lines[0], err
    assert "more than its file's" in lines[0]
    with h5py.File(result, "r") as f:
        assert f[name].shape != (10**6, 10**6)  # computed again, in its place

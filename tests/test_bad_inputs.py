"""Every bad input is one line `error: ...` naming the value, exit code 2, and nothing written.

One table: (id, setup, expected substring). A setup takes a Case (a fresh folder, a copy of the tiny store,
helpers to write bad files) and returns the argv of `vitsee`. Adding a case is one line.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from conftest import IMG, VIT, run_cli

RUN = ["--n-images", "8", "--batch-size", "4", "--img-size", str(IMG), "--device", "cpu", "--workers", "0", "--quiet"]


class Case:
    """A fresh folder to build one bad input in, and the paths a row needs."""

    def __init__(self, tmp: Path, tiny_store: Path):
        self.tmp, self._tiny = tmp, tiny_store
        self.cleanups: list = []

    def extract(self, *extra, dataset: str = "digits", model: str = VIT) -> list:
        return ["extract", self.tmp / "new.h5", "--model", model, "--dataset", dataset, *RUN, *extra]

    def store(self, damage=None) -> Path:
        """Returns a copy of the tiny store, changed by damage(h5py.File) or damage(Path) if given."""
        path = self.tmp / "s.h5"
        shutil.copyfile(self._tiny, path)
        if damage is not None:
            damage(path)
        return path

    def analyze(self, *extra, damage=None) -> list:
        return ["analyze", self.store(damage), "--device", "cpu", "--quiet", *extra]

    def train(self, out: Path, *extra) -> list:
        return [
            "train",
            out,
            "-m",
            "test_vit",
            "--model-arg",
            "patch_size=8",
            "--img-size",
            "32",
            "--dataset",
            "digits",
            "-n",
            "60",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "-q",
            *extra,
        ]

    def export(self, out: str | Path = "x.png", *extra) -> list:
        return ["export", self.store(), "attention:test_vit", "--out", self.tmp / out, "--device", "cpu", *extra]

    def npz(self, images=None, **arrays) -> list:
        path = self.tmp / "d.npz"
        images = np.zeros((8, 16, 16, 3), np.uint8) if images is None else images
        np.savez(path, images=images, **arrays)
        return self.extract(dataset=f"npz:{path}")

    def file(self, name: str, data: bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def cifar(self, batch: bytes) -> list:
        self.file("cifar/test_batch", batch)
        return self.extract(dataset=f"cifar10:{self.tmp / 'cifar'}")

    def image_folder(self, bad: bytes) -> list:
        """Eight good PNGs in classes a/ and b/, then b/zz.png holding `bad` (the ninth image, batch 3)."""
        for i in range(8):
            buf = io.BytesIO()
            Image.new("RGB", (16, 16), (30 * i, 0, 0)).save(buf, "PNG")
            self.file(f"imgs/{'ab'[i // 4]}/{i}.png", buf.getvalue())
        self.file("imgs/b/zz.png", bad)
        return self.extract("--n-images", "9", "--workers", "2", dataset=f"imagefolder:{self.tmp / 'imgs'}")

    def read_only_folder(self) -> Path:
        folder = self.tmp / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        self.cleanups.append(lambda: folder.chmod(0o755))
        if os.geteuid() == 0:  # root writes through permission bits; an immutable folder stops it too
            if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
                pytest.skip("running as root without chattr: cannot make a folder read-only")
            self.cleanups.append(lambda: subprocess.run(["chattr", "-i", str(folder)]))
        return folder


class RunsCode:
    """Pickles to a call of os.system: what a crafted CIFAR batch would do to whoever loads it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def drop_images(path: Path) -> None:
    with h5py.File(path, "r+") as f:
        del f["images"]


def lock_linked_to_a_file(path: Path) -> None:
    """STORE.d/lock -> notes.txt beside the store: every writer used to truncate it with its pid."""
    (path.parent / "notes.txt").write_text("precious\n")
    folder = path.with_name(path.name + ".d")
    folder.mkdir(exist_ok=True)
    (folder / "lock").symlink_to(path.parent / "notes.txt")


def results_a_file(path: Path) -> None:
    folder = path.with_name(path.name + ".d")
    folder.mkdir(exist_ok=True)
    (folder / "results").write_text("")


def newer_format(path: Path) -> None:
    with h5py.File(path, "r+") as f:
        f.attrs["vitsee_format"] = 99


def damage_metadata(path: Path) -> None:
    """Overwrites the signature of the store's global heap, where HDF5 keeps its string attributes."""
    data = bytearray(path.read_bytes())
    at = data.find(b"GCOL")
    assert at >= 0
    data[at : at + 4] = b"XXXX"
    path.write_bytes(bytes(data))


u8 = np.uint8
BAD_INPUTS = [
    ("img-size-0", lambda c: c.extract("--img-size", "0"), "--img-size 0"),
    ("img-size-negative", lambda c: c.extract("--img-size", "-32"), "--img-size -32"),
    ("shuffle-seed-negative", lambda c: c.extract("--shuffle-seed", "-1"), "--shuffle-seed -1"),
    ("shuffle-seed-too-large", lambda c: c.extract("--shuffle-seed", str(2**64)), f"--shuffle-seed {2**64}"),
    ("analyze-seed-negative", lambda c: c.analyze("--cka", "--seed", "-1"), "--seed -1"),
    ("analyze-shuffles-negative", lambda c: c.analyze("--cka", "--shuffles", "-1"), "--shuffles -1"),
    ("workers-negative", lambda c: c.extract("--workers", "-1"), "--workers -1"),
    (
        "random-seed-too-large",
        lambda c: c.extract(model="test_vit@random:99999999999999999999"),
        "99999999999999999999",
    ),
    ("layers-empty", lambda c: c.extract("--layers", ""), "--layers ''"),
    ("layers-only-commas", lambda c: c.extract("--layers", " , "), "--layers ' , '"),
    ("analyze-batch-size-0", lambda c: c.analyze("--cka", "--batch-size", "0"), "--batch-size 0"),
    ("probe-max-dim-negative", lambda c: c.analyze("--probes", "--probe-max-dim", "-1"), "--probe-max-dim -1"),
    ("npz-5-channels", lambda c: c.npz(np.zeros((8, 16, 16, 5), u8)), "(8, 16, 16, 5) has 5 channels"),
    ("npz-zero-height", lambda c: c.npz(np.zeros((8, 0, 16, 3), u8)), "(8, 0, 16, 3)"),
    ("npz-zero-width", lambda c: c.npz(np.zeros((8, 16, 0), u8)), "(8, 16, 0)"),
    ("npz-no-images", lambda c: c.npz(np.zeros((0, 16, 16, 3), u8)), "(0, 16, 16, 3) holds no images"),
    ("npz-empty-file", lambda c: c.extract(dataset=f"npz:{c.file('empty.npz', b'')}"), "empty.npz"),
    ("npz-string-labels", lambda c: c.npz(labels=np.array(["cat"] * 8)), "'cat'"),
    ("npz-labels-2d", lambda c: c.npz(labels=np.zeros((8, 2), np.int64)), "shape (8, 2)"),
    ("npz-fractional-labels", lambda c: c.npz(labels=np.full(8, 0.5)), "float label 0.5"),
    ("cifar-pickle-of-a-list", lambda c: c.cifar(pickle.dumps([1, 2, 3])), "test_batch holds a list"),
    (
        "cifar-pickle-runs-code",
        lambda c: c.cifar(pickle.dumps({b"data": RunsCode(c.tmp / "ran"), b"labels": []})),
        "posix.system",
    ),
    ("store-without-images", lambda c: ["info", c.store(drop_images)], "lacks images"),
    ("store-metadata-damaged", lambda c: ["info", c.store(damage_metadata)], "metadata cannot be read"),
    ("store-newer-format", lambda c: ["info", c.store(newer_format)], "newer vitsee (format 99"),
    ("export-read-only-folder", lambda c: c.export(c.read_only_folder() / "x.png"), "/ro ("),
    ("export-onto-a-folder", lambda c: c.export(c.file("out/keep", b"").parent), "out is a folder"),
    ("export-unknown-suffix", lambda c: c.export("x.pdf"), "'x.pdf'"),
    ("export-cmap-jet", lambda c: c.export("x.png", "--cmap", "jet"), "'jet'"),
    ("show-cmap-jet", lambda c: ["show", c.store(), "attention:test_vit", "--cmap", "jet", "--device", "cpu"], "'jet'"),
    ("corrupt-png-after-the-first", lambda c: c.image_folder(b"not a png at all"), "zz.png"),
    ("store-lock-a-link", lambda c: c.analyze("--skip", damage=lock_linked_to_a_file), "lock is a symbolic link"),
    ("store-results-a-file", lambda c: c.analyze("--skip", damage=results_a_file), "results is a file, not the folder"),
    (
        "train-held-out-a-folder",
        lambda c: c.train(c.tmp / "m.safetensors", "--held-out", c.file("held.npz/keep", b"").parent),
        "held.npz is a folder",
    ),
    (
        "train-onto-a-folder",
        lambda c: c.train(c.file("runs.safetensors/keep", b"").parent),
        "runs.safetensors is a folder: name the weights file",
    ),
    (
        "train-overwrite-onto-a-folder",
        lambda c: c.train(c.file("runs.safetensors/keep", b"").parent, "--overwrite"),
        "runs.safetensors is a folder: name the weights file",
    ),
    *[
        (
            f"train{flag}-{side}-a-folder",
            lambda c, side=side, flag=flag: c.train(
                c.file(f"m.safetensors.{side}/keep", b"").parent.with_suffix(""), *[flag] if flag else []
            ),
            f"m.safetensors.{side} is a folder where vitsee train keeps",
        )
        for side in ("ckpt", "lock")
        for flag in ("", "--overwrite")
    ],
    # the issue's `mkdir -p e.h5/sub; vitsee extract e.h5 ... --overwrite` ran the whole extraction, then died with
    # IsADirectoryError at the rename; without --overwrite it offered --overwrite
    *[
        (
            f"extract{'-' + '-'.join(f.strip('-') for f in flags) if flags else ''}-onto-a-folder",
            lambda c, flags=flags: [
                "extract",
                c.file("e.h5/sub/keep", b"").parent.parent,
                "--model",
                VIT,
                "--dataset",
                "digits",
                *RUN,
                *flags,
            ],
            "e.h5 is a folder, not a store file: name the store to write, such as",
        )
        for flags in ([], ["--overwrite"], ["--grams"], ["--streaming", "--overwrite"])
    ],
]


def snapshot(folder: Path) -> dict[str, str]:
    """Returns {relative path: sha256} of every file under folder."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("setup, expected", [pytest.param(s, e, id=i) for i, s, e in BAD_INPUTS])
def test_a_bad_input_is_one_line_and_writes_nothing(tmp_path, tiny_store, capsys, setup, expected):
    case = Case(tmp_path, tiny_store)
    try:
        argv = setup(case)
        before = snapshot(tmp_path)
        code, _, err = run_cli(argv, capsys)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2, err
        assert "Traceback" not in err, err
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert expected in lines[0], lines[0]
        assert snapshot(tmp_path) == before  # no new file, the store byte for byte as it was
    finally:
        for undo in reversed(case.cleanups):
            undo()


def test_an_image_damaged_past_its_header_stops_the_run_in_one_line_and_the_rerun_resumes(tmp_path, tiny_store, capsys):
    """The header check passes it; decoding fails in a DataLoader worker, whose traceback must not reach the user."""
    from vitsee.store import Store

    buf = io.BytesIO()
    Image.effect_noise((16, 16), 60).convert("RGB").save(buf, "PNG")
    truncated = buf.getvalue()[: len(buf.getvalue()) // 2]
    case = Case(tmp_path, tiny_store)
    argv = case.image_folder(truncated)
    code, _, err = run_cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "zz.png" in lines[0] and "rerun the same command to resume" in lines[0]
    # the failed run shut its loader workers down: torch's SIGCHLD check finds none of them dead and
    # registered (it would raise inside whatever this process runs next, the terminal app's event loop)
    from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

    _error_if_any_worker_fails()
    with Store.open(tmp_path / "new.h5") as s:
        assert s.rows_done(s.models[0]) == 8 and not s.complete  # the two batches before it are kept
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, "PNG")
    (tmp_path / "imgs/b/zz.png").write_bytes(buf.getvalue())
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    with Store.open(tmp_path / "new.h5") as s:
        assert s.complete and s.n_images == 9


def test_files_a_killed_start_left_are_removed_at_the_next_start_unless_their_process_lives(tmp_path, capsys):
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        left = tmp_path / f".new.h5.creating-{dead.pid}"
        building = tmp_path / f".new.h5.creating-{alive.pid}"
        other = tmp_path / f".other.h5.creating-{dead.pid}"
        for path in (left, building, other):
            path.write_bytes(b"half an HDF5 file")
        code, _, err = run_cli(Case(tmp_path, tmp_path).extract(), capsys)
        assert code == 0, err
        assert not left.exists()  # its process is gone: nothing will finish it
        assert building.exists() and other.exists()  # a live start, and another store's
        assert (tmp_path / "new.h5").exists()
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize(
    "build, needle",
    [
        (lambda: new_run_config(img_size=0), "--img-size 0"),
        (lambda: new_run_config(img_size=-8), "--img-size -8"),
        (lambda: new_run_config(layers=" , "), "--layers ' , '"),
        (lambda: new_run_config(workers=-1), "--workers -1"),
        (lambda: new_run_config(shuffle_seed=-3), "--shuffle-seed -3"),
        (lambda: analyze_config(batch_size=0), "--batch-size 0"),
        (lambda: analyze_config(seed=-1), "--seed -1"),
        (lambda: analyze_config(probe_max_dim=-5), "--probe-max-dim -5"),
    ],
)
def test_the_configs_the_app_builds_refuse_the_same_values(build, needle):
    from vitsee.errors import VitseeError

    with pytest.raises(VitseeError) as info:
        build()
    assert needle in str(info.value) and "\n" not in str(info.value)


def new_run_config(**fields):
    """Returns the ExtractConfig the app's new-run form builds from its fields."""
    from vitsee.tui.screens.new_run import extract_config

    return extract_config(
        {
            "store": Path("s.h5"),
            "models": [VIT],
            "dataset": "digits",
            "n_images": 8,
            "device": "cpu",
            "layers": "blocks",
            "img_size": None,
            "streaming": False,
            **fields,
        }
    )


def analyze_config(**fields):
    from vitsee.analyses.driver import AnalyzeConfig

    return AnalyzeConfig(**fields)

"""Image sets: built-in ones, user folders / CIFAR pickles / npz, and image selection."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
from PIL import Image

from vitsee.data import SAMPLE_PHOTOS, open_dataset, select_indices
from vitsee.errors import VitseeError


def test_digits_are_1797_labelled_rgb_images():
    d = open_dataset("digits")
    assert len(d) == 1797 and d.spec == "digits"
    img = d.image(0)
    assert img.mode == "RGB" and img.size == (8, 8)
    arr = np.asarray(img)
    assert np.array_equal(arr[..., 0], arr[..., 1])  # grey became RGB
    assert arr.max() == 255 or arr.max() > 200
    assert list(d.labels()[:10]) == list(range(10))


def test_samples_start_with_the_photographs_themselves():
    d = open_dataset("samples")
    assert len(d) == 15 * 16
    first = [d.image(i) for i in range(len(SAMPLE_PHOTOS))]
    assert all(im.mode == "RGB" and im.size[0] == im.size[1] for im in first)
    assert list(d.labels()[:17]) == list(range(15)) + [0, 1]
    assert d.class_names[0] == "astronaut"
    assert np.asarray(d.image(15)).shape != np.asarray(d.image(0)).shape or not np.array_equal(
        np.asarray(d.image(15)), np.asarray(d.image(0))
    )


def test_synthetic_is_deterministic_and_puts_objects_in_their_boxes():
    d = open_dataset("synthetic")
    a, b = np.asarray(d.image(17)), np.asarray(open_dataset("synthetic").image(17))
    assert np.array_equal(a, b) and a.shape == (64, 64, 3)
    x0, y0, x1, y1 = d.boxes()[17]
    square = np.asarray(d.image(1)).astype(float)  # label 1: a filled square
    sx0, sy0, sx1, sy1 = d.boxes()[1]
    inside = square[sy0 + 2 : sy1 - 2, sx0 + 2 : sx1 - 2]
    assert inside.std(axis=(0, 1)).max() < 1.0  # one flat colour inside the box
    assert d.labels()[17] == 7 and 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64


def test_imagefolder_sorts_classes_and_files(tmp_path):
    for cls, colour in (("dogs", 200), ("cats", 50)):
        (tmp_path / cls).mkdir()
        for k in range(3):
            Image.fromarray(np.full((10, 12), colour + k, dtype=np.uint8)).save(tmp_path / cls / f"{k}.png")
    d = open_dataset(f"imagefolder:{tmp_path}")
    assert d.class_names == ["cats", "dogs"] and len(d) == 6
    assert list(d.labels()) == [0, 0, 0, 1, 1, 1]
    assert np.asarray(d.image(3))[0, 0, 0] == 200 and d.image(0).mode == "RGB"
    assert open_dataset(str(tmp_path)).spec == d.spec  # a bare folder is recognised


def test_cifar10_pickles(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    test = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    with open(root / "test_batch", "wb") as fh:
        pickle.dump({b"data": test, b"labels": [3, 1, 4, 1]}, fh)
    with open(root / "data_batch_1", "wb") as fh:
        pickle.dump({b"data": test[::-1].copy(), b"labels": [9, 2, 6, 5]}, fh)
    with open(root / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, fh)
    d = open_dataset(f"cifar10:{tmp_path}")
    assert len(d) == 8 and list(d.labels()) == [3, 1, 4, 1, 9, 2, 6, 5]
    assert np.array_equal(np.asarray(d.image(0)), test[0].reshape(3, 32, 32).transpose(1, 2, 0))
    assert d.class_names[3] == "c3"
    assert open_dataset(str(root)).spec == d.spec


def _cifar_batch(data: np.ndarray, labels: list[int], protocol: int, numpy_path: str | None = None) -> bytes:
    """Returns a CIFAR batch pickled the way the originals were written: bytes keys, `data` a uint8 array,
    `labels` a list; numpy_path rewrites numpy's module path as an older numpy wrote it."""
    blob = pickle.dumps(
        {
            b"batch_label": b"testing batch 1 of 1",
            b"labels": labels,
            b"data": data,
            b"filenames": [f"{i}.png".encode() for i in range(len(labels))],
        },
        protocol=protocol,
    )
    if numpy_path is not None:  # protocol 2 names globals as text lines: the path can be swapped in place
        blob = blob.replace(b"numpy._core.multiarray", numpy_path.encode())
    return blob


@pytest.mark.parametrize("protocol, numpy_path", [(2, None), (2, "numpy.core.multiarray"), (4, None), (5, None)])
def test_cifar_pickles_load_through_the_unpickler_that_builds_only_arrays(tmp_path, protocol, numpy_path):
    data = np.random.default_rng(2).integers(0, 256, size=(4, 3072), dtype=np.uint8)
    (tmp_path / "test_batch").write_bytes(_cifar_batch(data, [7, 0, 7, 3], protocol, numpy_path))
    d = open_dataset(f"cifar10:{tmp_path}")
    assert list(d.labels()) == [7, 0, 7, 3]
    assert np.array_equal(np.asarray(d.image(2)), data[2].reshape(3, 32, 32).transpose(1, 2, 0))


@pytest.mark.parametrize("target", [eval, os.system, shutil.rmtree, np.load])
def test_a_cifar_pickle_naming_anything_else_is_refused_before_it_runs(tmp_path, target):
    class Crafted:
        def __reduce__(self):
            return target, ("x",)

    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": Crafted(), b"labels": [0]}, protocol=2))
    with pytest.raises(
        VitseeError,
        match=rf"test_batch as a cifar10 pickle .*asks for \S*{target.__name__}, "
        "which a CIFAR pickle never holds; nothing was run",
    ):
        len(open_dataset(f"cifar10:{tmp_path}"))


def test_npz_labels_float_whole_numbers_are_class_indices_fractions_are_refused(tmp_path):
    images = np.zeros((4, 8, 8, 3), np.uint8)
    np.savez(tmp_path / "f.npz", images=images, labels=np.array([0.0, 2.0, -1.0, 1.0], np.float32))
    labels = open_dataset(f"npz:{tmp_path / 'f.npz'}").labels()
    assert labels.dtype == np.int64 and list(labels) == [0, 2, -1, 1]
    for bad, needle in (
        (np.array([0, 1, np.nan, 1]), "float label nan \\(image 2\\)"),
        (np.array([0, 1, 2, 2.25]), "float label 2.25 \\(image 3\\)"),
        (np.array([0, -2, 1, 1]), "label -2 is not a class index"),
    ):
        np.savez(tmp_path / "b.npz", images=images, labels=bad)
        with pytest.raises(VitseeError, match=needle):
            open_dataset(f"npz:{tmp_path / 'b.npz'}")


def test_npz_images_saved_channels_first_are_named_so(tmp_path):
    np.savez(tmp_path / "c.npz", images=np.zeros((4, 3, 8, 8), np.uint8))
    with pytest.raises(
        VitseeError, match=r"\(4, 3, 8, 8\) has 8 channels.*looks channels-first.*transpose\(0, 2, 3, 1\)"
    ):
        open_dataset(f"npz:{tmp_path / 'c.npz'}")


def test_npz_with_and_without_labels(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, size=(5, 9, 9), dtype=np.uint8)
    np.savez(tmp_path / "a.npz", images=images, labels=np.array([0, 1, 0, 1, 1]))
    np.savez(tmp_path / "b.npz", images=images)
    a, b = open_dataset(f"npz:{tmp_path / 'a.npz'}"), open_dataset(str(tmp_path / "b.npz"))
    assert list(a.labels()) == [0, 1, 0, 1, 1] and a.has_labels
    assert not b.has_labels and list(b.labels()) == [-1] * 5
    assert a.image(2).mode == "RGB"
    np.savez(tmp_path / "bad.npz", images=images.astype(np.float32))
    with pytest.raises(VitseeError, match="must be uint8"):
        open_dataset(f"npz:{tmp_path / 'bad.npz'}")


def test_selection_first_n_or_seeded_shuffle():
    assert list(select_indices(10, 4)) == [0, 1, 2, 3]
    a, b = select_indices(100, 10, shuffle_seed=3), select_indices(100, 10, shuffle_seed=3)
    assert np.array_equal(a, b) and len(set(a.tolist())) == 10 and not np.array_equal(a, np.arange(10))
    assert not np.array_equal(a, select_indices(100, 10, shuffle_seed=4))
    with pytest.raises(VitseeError, match="--n-images 11 asks for more images than the dataset holds \\(10\\)"):
        select_indices(10, 11)


# --- timm's datasets: tar, torchvision CIFAR, Hugging Face ---------------------------------------------


def _write_class_tar(tmp_path, n_per_class: int = 3, classes=("dogs", "cats", "birds")):
    """Writes PNGs CLASS/K.png (one flat colour coding class and k) into a folder and a tar of it; returns
    (tar path, folder, {colour: (class, k)})."""
    import tarfile

    folder, colours = tmp_path / "imgs", {}
    for c, cls in enumerate(classes):
        (folder / cls).mkdir(parents=True)
        for k in range(n_per_class):
            colour = (40 * c + 10, 20 * k + 5, 200)
            Image.fromarray(np.full((9, 7, 3), colour, dtype=np.uint8)).save(folder / cls / f"{k}.png")
            colours[colour] = (cls, k)
    tar_path = tmp_path / "set.tar"
    with tarfile.open(tar_path, "w") as tf:
        for cls in classes:
            tf.add(folder / cls, arcname=cls)
    return tar_path, folder, colours


def test_tar_of_class_folders_gives_each_written_image_once_with_its_folder_label(tmp_path):
    tar_path, _, colours = _write_class_tar(tmp_path)
    d = open_dataset(f"tar:{tar_path}")
    assert d.spec == f"tar:{tar_path.resolve()}" and len(d) == 9
    assert d.class_names == ["birds", "cats", "dogs"]
    seen = []
    for i in range(len(d)):
        img = d.image(i)
        assert img.mode == "RGB" and img.size == (7, 9)
        cls, k = colours[tuple(int(v) for v in np.asarray(img)[0, 0])]
        assert d.labels()[i] == d.class_names.index(cls)
        seen.append((cls, k))
    assert sorted(seen) == sorted(colours.values())
    assert open_dataset(str(tar_path)).spec == d.spec  # a bare .tar is recognised
    d.check_readable(np.arange(len(d)))


def test_tar_set_pickles_without_its_open_tar_and_reads_after(tmp_path):
    tar_path, _, _ = _write_class_tar(tmp_path, n_per_class=2)
    d = open_dataset(f"tar:{tar_path}")
    first = np.asarray(d.image(0))  # opens the tar inside timm's reader
    back = pickle.loads(pickle.dumps(d))
    assert np.array_equal(np.asarray(back.image(0)), first) and np.array_equal(back.labels(), d.labels())


def test_tar_that_is_not_one_or_has_no_images_is_named(tmp_path):
    (tmp_path / "x.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(VitseeError, match="is not a tar file"):
        open_dataset(f"tar:{tmp_path / 'x.tar'}")
    import tarfile

    (tmp_path / "notes.txt").write_text("hi")
    with tarfile.open(tmp_path / "empty.tar", "w") as tf:
        tf.add(tmp_path / "notes.txt", arcname="cls/notes.txt")
    with pytest.raises(VitseeError, match="no images found in .*empty.tar"):
        open_dataset(str(tmp_path / "empty.tar"))


def _fake_torchvision_cifar10(root, per_batch: int = 2):
    """Writes cifar-10-batches-py/ in torchvision's layout (latin1-readable pickles); returns
    (images in vitsee's order: test, then data_batch_1..5, labels)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    images, labels = [], []
    for part in ["test_batch"] + [f"data_batch_{k}" for k in range(1, 6)]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        part_labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        with open(folder / part, "wb") as fh:
            pickle.dump({"data": data, "labels": part_labels}, fh)
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels += part_labels
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": [f"c{k}" for k in range(10)]}, fh)
    return np.concatenate(images), labels


def test_torch_cifar10_from_a_local_root_gives_test_then_train(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    images, labels = _fake_torchvision_cifar10(tmp_path)
    # torchvision md5-checks the real archive's files; these fake ones pass only with the check patched
    monkeypatch.setattr(CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *a, **k: True)
    d = open_dataset(f"torch/cifar10:{tmp_path}")
    assert d.spec == f"torch/cifar10:{tmp_path.resolve()}" and len(d) == 12
    assert list(d.labels()) == labels and d.class_names == [f"c{k}" for k in range(10)]
    for i in (0, 1, 2, 11):
        img = d.image(i)
        assert img.mode == "RGB" and np.array_equal(np.asarray(img), images[i])
    # the extracted folder itself is taken for its parent
    assert open_dataset(f"torch/cifar10:{tmp_path / 'cifar-10-batches-py'}").spec == d.spec


def test_torch_cifar_never_downloads_a_missing_or_unchecked_root(tmp_path):
    with pytest.raises(VitseeError, match=r"root folder .*nowhere does not exist, and vitsee never downloads") as e:
        open_dataset(f"torch/cifar100:{tmp_path / 'nowhere'}")
    assert "\n" not in str(e.value) and "cifar-100-python" in str(e.value)
    _fake_torchvision_cifar10(tmp_path)  # files that fail torchvision's md5 check
    with pytest.raises(VitseeError, match="never downloads: extract cifar-10-python.tar.gz"):
        open_dataset(f"torch/cifar10:{tmp_path}")
    assert not list(tmp_path.glob("*.tar.gz"))
    with pytest.raises(VitseeError, match="torch/cifar10:ROOT"):
        open_dataset("torch/mnist:/tmp")


def test_hfds_without_the_datasets_package_names_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(VitseeError) as e:
        open_dataset("hfds/uoft-cs/cifar10:test")
    msg = str(e.value)
    assert "\n" not in msg and "hfds/uoft-cs/cifar10" in msg and "pip install datasets" in msg
    assert "HF_HUB_OFFLINE" in msg


def test_extract_reads_a_tar_spec_end_to_end_as_the_same_images_in_a_folder(tmp_path, capsys):
    from conftest import IMG, VIT, run_cli
    from vitsee.store import Store

    tar_path, folder, _ = _write_class_tar(tmp_path, n_per_class=2)
    common = ["--model", VIT, "--batch-size", "3", "--img-size", str(IMG), "--device", "cpu", "--quiet"]
    code, _, err = run_cli(
        ["extract", tmp_path / "t.h5", "--dataset", f"tar:{tar_path}", "--workers", "1", *common], capsys
    )
    assert code == 0, err
    code, _, err = run_cli(["extract", tmp_path / "f.h5", "--dataset", str(folder), "--workers", "0", *common], capsys)
    assert code == 0, err
    with Store.open(tmp_path / "t.h5") as t, Store.open(tmp_path / "f.h5") as f:
        assert t.dataset_spec == f"tar:{tar_path.resolve()}" and t.n_images == 6
        assert list(t.labels) == [0, 0, 1, 1, 2, 2] and t.class_names == ["birds", "cats", "dogs"]
        model = t.models[0]
        for layer in t.layers(model):
            assert np.array_equal(t.activations(model, layer), f.activations(model, layer)), layer

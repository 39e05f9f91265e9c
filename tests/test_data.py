"""Image sets: built-in ones, user folders / CIFAR pickles / npz, and image selection."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from vitsee.engine.data import SAMPLE_PHOTOS, open_dataset, select_indices
from vitsee.engine.errors import VitseeError


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
    assert np.asarray(d.image(15)).shape != np.asarray(d.image(0)).shape or not np.array_equal(np.asarray(d.image(15)), np.asarray(d.image(0)))


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

"""Image sets vitsee can read, addressed by a dataset spec string, and the choice of which images to use.

Specs: `digits`, `samples`, `synthetic`, `imagefolder:PATH`, `cifar10:PATH`, `cifar100:PATH`, `npz:PATH`;
a bare existing folder or .npz file is recognised by itself. Every set gives RGB PIL images in a fixed
order and integer labels (-1 where a set has none).
"""
from __future__ import annotations

import os
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import VitseeError

BUILTIN_DATASETS = ("digits", "samples", "synthetic")
PATH_DATASETS = ("imagefolder", "cifar10", "cifar100", "npz")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
DATASET_HELP = (
    "digits, samples, synthetic, imagefolder:PATH, cifar10:PATH, cifar100:PATH, npz:PATH, "
    "or an existing folder / .npz file"
)


class ImageSet(ABC):
    """A labelled, ordered collection of images. Subclasses load lazily so they pickle cheaply."""

    spec: str = ""
    class_names: list[str] | None = None

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def image(self, i: int) -> Image.Image:
        """Returns image i as an RGB PIL image."""

    def labels(self) -> np.ndarray:
        """Returns the (len,) int64 labels, -1 where the set has none."""
        return np.full(len(self), -1, dtype=np.int64)

    @property
    def has_labels(self) -> bool:
        return bool((self.labels() >= 0).any())


def _to_rgb(array: np.ndarray) -> Image.Image:
    array = np.asarray(array)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim == 3 and array.shape[-1] == 4:
        array = array[..., :3]
    if array.dtype != np.uint8:
        raise VitseeError(f"images must be uint8, got {array.dtype}: convert them with np.uint8 first")
    return Image.fromarray(array).convert("RGB")


# --- built-in sets --------------------------------------------------------------------------------


class DigitsSet(ImageSet):
    """scikit-learn's 1,797 labelled 8x8 handwritten digits, as grey images (upsampled by the transform)."""

    spec = "digits"
    class_names = [str(d) for d in range(10)]

    def __init__(self):
        self._images = None
        self._labels = None

    def _load(self):
        if self._images is None:
            from sklearn.datasets import load_digits

            digits = load_digits()
            self._images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
            self._labels = digits.target.astype(np.int64)

    def __len__(self) -> int:
        return 1797

    def image(self, i: int) -> Image.Image:
        self._load()
        return _to_rgb(self._images[i])

    def labels(self) -> np.ndarray:
        self._load()
        return self._labels


SAMPLE_PHOTOS = (
    "astronaut", "camera", "coffee", "chelsea", "rocket", "coins", "hubble_deep_field",
    "immunohistochemistry", "moon", "brick", "grass", "gravel", "retina", "clock", "cell",
)
SAMPLE_CROPS_PER_PHOTO = 16


class SamplesSet(ImageSet):
    """scikit-image's bundled photographs: each photo whole, then seeded random crops of it.

    Image i is crop i // 15 of photo i % 15 (crop 0 is the whole photo, centre-cropped square), so the
    first 15 images are the photographs themselves; the label is the photo, so probes have a task.
    """

    spec = "samples"
    class_names = list(SAMPLE_PHOTOS)

    def __init__(self):
        self._photos: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(SAMPLE_PHOTOS) * SAMPLE_CROPS_PER_PHOTO

    def _photo(self, p: int) -> np.ndarray:
        if p not in self._photos:
            import skimage.data

            self._photos[p] = np.asarray(getattr(skimage.data, SAMPLE_PHOTOS[p])())
        return self._photos[p]

    def image(self, i: int) -> Image.Image:
        n_photos = len(SAMPLE_PHOTOS)
        p, crop = i % n_photos, i // n_photos
        img = _to_rgb(self._photo(p))
        w, h = img.size
        if crop == 0:
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            return img.crop((left, top, left + side, top + side))
        rng = np.random.default_rng([7, p, crop])
        side = int(min(w, h) * rng.uniform(0.3, 0.9))
        left = int(rng.integers(0, w - side + 1))
        top = int(rng.integers(0, h - side + 1))
        out = img.crop((left, top, left + side, top + side))
        return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out

    def labels(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64) % len(SAMPLE_PHOTOS)


SYNTHETIC_SHAPES = ("disc", "square", "triangle", "cross", "ring", "hbar", "vbar", "diamond", "checker", "dots")
SYNTHETIC_SIZE = 64
SYNTHETIC_LENGTH = 10_000


class SyntheticSet(ImageSet):
    """Generated 64x64 images of one of ten shapes at a known position on a textured background.

    Deterministic by index (seeded per image); the label is the shape; `boxes()` gives each object's
    (x0, y0, x1, y1) in pixels of the 64x64 image.
    """

    spec = "synthetic"
    class_names = list(SYNTHETIC_SHAPES)

    def __len__(self) -> int:
        return SYNTHETIC_LENGTH

    def _params(self, i: int):
        rng = np.random.default_rng([11, i])
        label = i % len(SYNTHETIC_SHAPES)
        size = int(rng.integers(16, 33))
        x0 = int(rng.integers(0, SYNTHETIC_SIZE - size + 1))
        y0 = int(rng.integers(0, SYNTHETIC_SIZE - size + 1))
        return rng, label, size, x0, y0

    def image(self, i: int) -> Image.Image:
        rng, label, size, x0, y0 = self._params(i)
        s = SYNTHETIC_SIZE
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
        base = rng.uniform(20, 120, size=3)
        slope = rng.uniform(-1, 1, size=(2, 3))
        background = base + xx[..., None] * slope[0] + yy[..., None] * slope[1]
        background += rng.normal(0, 12, size=(s, s, 3))
        # object mask in the box's own coordinates u, v in [-1, 1]
        u = (xx - (x0 + size / 2)) / (size / 2)
        v = (yy - (y0 + size / 2)) / (size / 2)
        inside = (np.abs(u) <= 1) & (np.abs(v) <= 1)
        r = np.hypot(u, v)
        shape = SYNTHETIC_SHAPES[label]
        mask = {
            "disc": r <= 1,
            "square": inside,
            "triangle": inside & (v >= 2 * np.abs(u) - 1),
            "cross": inside & ((np.abs(u) < 0.25) | (np.abs(v) < 0.25)),
            "ring": (r <= 1) & (r >= 0.6),
            "hbar": inside & (np.abs(v) < 0.3),
            "vbar": inside & (np.abs(u) < 0.3),
            "diamond": np.abs(u) + np.abs(v) <= 1,
            "checker": inside & (((np.floor((u + 1) * 2) + np.floor((v + 1) * 2)) % 2) == 0),
            "dots": inside & (np.hypot((u + 1) % 1 - 0.5, (v + 1) % 1 - 0.5) < 0.3),
        }[shape]
        colour = rng.uniform(140, 255, size=3)
        out = np.where(mask[..., None], colour, background)
        return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8), "RGB")

    def labels(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64) % len(SYNTHETIC_SHAPES)

    def boxes(self) -> np.ndarray:
        """Returns (len, 4) int object boxes (x0, y0, x1, y1) in the 64x64 image."""
        out = np.empty((len(self), 4), dtype=np.int64)
        for i in range(len(self)):
            _, _, size, x0, y0 = self._params(i)
            out[i] = (x0, y0, x0 + size, y0 + size)
        return out


# --- user data ------------------------------------------------------------------------------------


class ImageFolderSet(ImageSet):
    """PATH/CLASS/IMAGE files: classes and files in sorted order, the label is the class folder."""

    def __init__(self, root: Path):
        self.root = root
        self.spec = f"imagefolder:{root}"
        classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        files, labels = [], []
        for label, name in enumerate(classes):
            for f in sorted((root / name).rglob("*")):
                if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file():
                    files.append(str(f.relative_to(root)))
                    labels.append(label)
        if not files:
            raise VitseeError(
                f"no images found in {root}: an image folder needs one sub-folder per class holding "
                f"{'/'.join(sorted(s.lstrip('.') for s in IMAGE_SUFFIXES))} files"
            )
        self.class_names = classes
        self._files = files
        self._labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._files)

    def image(self, i: int) -> Image.Image:
        path = self.root / self._files[i]
        try:
            with Image.open(path) as img:
                return img.convert("RGB")
        except OSError as exc:
            raise VitseeError(f"cannot read image {path}: {exc}; remove or replace the file") from exc

    def labels(self) -> np.ndarray:
        return self._labels


class CifarSet(ImageSet):
    """CIFAR-10/100 in the python pickle layout: the test split first, then the training batches."""

    def __init__(self, root: Path, variant: str):
        self.variant = variant
        if variant == "cifar10":
            sub, parts, label_key, meta, names_key = (
                "cifar-10-batches-py",
                ["test_batch"] + [f"data_batch_{k}" for k in range(1, 6)],
                b"labels",
                "batches.meta",
                b"label_names",
            )
        else:
            sub, parts, label_key, meta, names_key = (
                "cifar-100-python", ["test", "train"], b"fine_labels", "meta", b"fine_label_names",
            )
        if not (root / parts[0]).exists() and (root / sub / parts[0]).exists():
            root = root / sub
        if not (root / parts[0]).exists():
            raise VitseeError(
                f"{root} does not hold the {variant} python pickles ({parts[0]} is missing): point "
                f"{variant}:PATH at the extracted '{sub}' folder"
            )
        self.root = root
        self.spec = f"{variant}:{root}"
        self._parts = [p for p in parts if (root / p).exists()]
        self._label_key = label_key
        self._meta, self._names_key = meta, names_key
        self._images = None
        self._labels = None
        self._length = None

    def _load(self):
        if self._images is not None:
            return
        images, labels = [], []
        for part in self._parts:
            try:
                with open(self.root / part, "rb") as fh:
                    batch = pickle.load(fh, encoding="bytes")
                images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                labels.append(np.asarray(batch[self._label_key], dtype=np.int64))
            except (OSError, KeyError, pickle.UnpicklingError, EOFError, ValueError) as exc:
                raise VitseeError(
                    f"cannot read {self.root / part} as a {self.variant} pickle ({exc}): re-extract the archive"
                ) from exc
        self._images = np.concatenate(images).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
        self._labels = np.concatenate(labels)
        try:
            with open(self.root / self._meta, "rb") as fh:
                names = pickle.load(fh, encoding="bytes")[self._names_key]
            self.class_names = [n.decode() for n in names]
        except (OSError, KeyError, pickle.UnpicklingError, EOFError):
            self.class_names = None

    def __len__(self) -> int:
        self._load()
        return len(self._labels)

    def image(self, i: int) -> Image.Image:
        self._load()
        return Image.fromarray(self._images[i], "RGB")

    def labels(self) -> np.ndarray:
        self._load()
        return self._labels


class NpzSet(ImageSet):
    """An .npz with `images` (N, H, W[, C]) uint8 and optional `labels` (N,) and `class_names`."""

    def __init__(self, path: Path):
        self.path = path
        self.spec = f"npz:{path}"
        try:
            with np.load(path, allow_pickle=False) as z:
                if "images" not in z:
                    raise VitseeError(f"{path} has no 'images' array (found: {', '.join(z.files)}): save one with np.savez(path, images=..., labels=...)")
                images = z["images"]
                labels = z["labels"] if "labels" in z else None
                names = [str(n) for n in z["class_names"]] if "class_names" in z else None
        except (OSError, ValueError) as exc:
            raise VitseeError(f"cannot read {path} as .npz ({exc}): write it with np.savez") from exc
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise VitseeError(
                f"{path}: 'images' must be uint8 (N, H, W) or (N, H, W, C), got {images.dtype} {images.shape}"
            )
        if labels is not None and len(labels) != len(images):
            raise VitseeError(f"{path}: {len(labels)} labels for {len(images)} images; they must match")
        self._images = images
        self._labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.class_names = names

    def __len__(self) -> int:
        return len(self._images)

    def image(self, i: int) -> Image.Image:
        return _to_rgb(self._images[i])

    def labels(self) -> np.ndarray:
        return self._labels if self._labels is not None else super().labels()


# --- specs ----------------------------------------------------------------------------------------


def open_dataset(spec: str) -> ImageSet:
    """Returns the image set a dataset spec names; the set's `.spec` is the canonical form to record."""
    spec = spec.strip()
    if spec == "digits":
        return DigitsSet()
    if spec == "samples":
        return SamplesSet()
    if spec == "synthetic":
        return SyntheticSet()
    kind, sep, rest = spec.partition(":")
    if sep and kind in PATH_DATASETS:
        path = Path(os.path.expanduser(rest)).resolve()
        if not path.exists():
            raise VitseeError(f"dataset path {rest} does not exist: check the path given to --dataset {kind}:PATH")
        if kind == "imagefolder":
            if not path.is_dir():
                raise VitseeError(f"imagefolder:{rest} is not a folder: give a folder with one sub-folder per class")
            return ImageFolderSet(path)
        if kind in ("cifar10", "cifar100"):
            return CifarSet(path, kind)
        return NpzSet(path)
    path = Path(os.path.expanduser(spec))
    if path.exists():
        path = path.resolve()
        if path.is_dir():
            if (path / "test_batch").exists() or (path / "cifar-10-batches-py").exists():
                return CifarSet(path, "cifar10")
            if (path / "cifar-100-python").exists() or ((path / "test").is_file() and (path / "meta").is_file()):
                return CifarSet(path, "cifar100")
            return ImageFolderSet(path)
        if path.suffix == ".npz":
            return NpzSet(path)
    raise VitseeError(f"unknown dataset '{spec}': use one of {DATASET_HELP}")


MIN_IMAGES = 4  # the unbiased HSIC of a batch needs 4 examples, so no analysis runs on fewer images


def select_indices(n_available: int, n_images: int | None, shuffle_seed: int | None = None) -> np.ndarray:
    """Returns which images to use: the first n in the set's order, or n from a seeded shuffle."""
    if n_images is not None and n_images < MIN_IMAGES:
        raise VitseeError(
            f"--n-images {n_images} is too few: CKA needs at least {MIN_IMAGES} images (a few hundred give stable "
            f"estimates); use --n-images {MIN_IMAGES} or more"
        )
    if n_images is None:
        n_images = n_available
    if n_available < MIN_IMAGES:
        raise VitseeError(
            f"the dataset holds only {n_available} image(s) and CKA needs at least {MIN_IMAGES}: add images to it"
        )
    if n_images > n_available:
        raise VitseeError(
            f"--n-images {n_images} asks for more images than the dataset holds ({n_available}): "
            f"use --n-images {n_available} or a larger dataset"
        )
    if shuffle_seed is None:
        return np.arange(n_images, dtype=np.int64)
    return np.random.default_rng(shuffle_seed).permutation(n_available)[:n_images].astype(np.int64)


@dataclass
class Selection:
    """The images of a run: the set, which of its images, and their labels."""

    images: ImageSet
    indices: np.ndarray
    shuffle_seed: int | None = None
    labels: np.ndarray = field(init=False)

    def __post_init__(self):
        self.labels = self.images.labels()[self.indices]

    def __len__(self) -> int:
        return len(self.indices)


def train_test_split(
    n_available: int, test_fraction: float, seed: int, n_images: int | None = None, data_fraction: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (train, test) image indices: a seeded split of the set (or of a seeded n_images of it), then a
    seeded data_fraction of the training part.

    The test part depends only on (n_available, n_images, test_fraction, seed), so runs with different data
    fractions share it, and the fractions nest (the 10% is inside the 30%). Test images are never in train.
    """
    if not 0 < data_fraction <= 1:
        raise VitseeError(f"--data-fraction {data_fraction} is outside (0, 1]: use e.g. 0.1 for a tenth of the training split")
    if not 0 < test_fraction < 1:
        raise VitseeError(f"--test-fraction {test_fraction} is outside (0, 1): use e.g. 0.2")
    if n_images is not None and n_images > n_available:
        raise VitseeError(
            f"--n-images {n_images} asks for more images than the dataset holds ({n_available}): use --n-images {n_available} or fewer"
        )
    order = np.random.default_rng([seed, 0]).permutation(n_available)[: n_images or n_available]
    n_test = int(round(len(order) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    n_train = int(round(len(train) * data_fraction))
    if n_test < MIN_IMAGES or n_train < MIN_IMAGES:
        raise VitseeError(
            f"{len(order)} images give {n_train} to train on and {n_test} to test (--test-fraction {test_fraction}, "
            f"--data-fraction {data_fraction}); each part needs at least {MIN_IMAGES}: use more images or larger fractions"
        )
    keep = np.random.default_rng([seed, 1]).permutation(len(train))[:n_train]
    return np.sort(train[keep]).astype(np.int64), np.sort(test).astype(np.int64)

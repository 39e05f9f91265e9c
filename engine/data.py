"""Image sets vitsee can read, addressed by a dataset spec string, and the choice of which images to use.

Specs: `digits`, `samples`, `synthetic`, `imagefolder:PATH`, `cifar10:PATH`, `cifar100:PATH`, `npz:PATH`,
and timm's own datasets (`timm.data.create_dataset`, never downloading): `torch/cifar10:ROOT`,
`torch/cifar100:ROOT`, `tar:PATH.tar`, `hfds/NAME[:SPLIT]`; a bare existing folder, .npz or .tar file is
recognised by itself. Every set gives RGB PIL images in a fixed
order and integer labels (-1 where a set has none).
"""

from __future__ import annotations

import builtins
import codecs
import difflib
import importlib.util
import os
import pickle
import tarfile
import zipfile
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from vitsee.errors import VitseeError, brief

BUILTIN_DATASETS = ("digits", "samples", "synthetic")
PATH_DATASETS = ("imagefolder", "cifar10", "cifar100", "npz", "tar")
# what PIL raises for a file it cannot decode (SyntaxError for some broken PNG chunks)
UNREADABLE_IMAGE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
DATASET_HELP = (
    "digits, samples, synthetic, imagefolder:PATH, cifar10:PATH, cifar100:PATH, npz:PATH, "
    "torch/cifar10:ROOT, torch/cifar100:ROOT, tar:PATH.tar, hfds/NAME[:SPLIT], "
    "or an existing folder / .npz / .tar file"
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

    def check_readable(self, indices: np.ndarray) -> None:  # noqa: B027 (a hook: nothing to check by default)
        """Raises a VitseeError naming an image of `indices` that cannot be read (sets held in memory
        were checked when they were loaded)."""


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
    "astronaut",
    "camera",
    "coffee",
    "chelsea",
    "rocket",
    "coins",
    "hubble_deep_field",
    "immunohistochemistry",
    "moon",
    "brick",
    "grass",
    "gravel",
    "retina",
    "clock",
    "cell",
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
        except UNREADABLE_IMAGE as exc:
            raise VitseeError(f"cannot read image {path} ({brief(exc)}): remove or replace the file") from exc

    def check_readable(self, indices: np.ndarray) -> None:
        """Raises a VitseeError naming the first image of `indices` that is not an image file at all.

        Only the headers are read (a few KB each), so a file that is not an image stops the run before
        anything is written; a file damaged further in is found when it is decoded, mid-run."""
        bad = []
        for i in indices:
            path = self.root / self._files[int(i)]
            try:
                with Image.open(path):
                    pass
            except UNREADABLE_IMAGE as exc:
                bad.append((path, exc))
        if bad:
            path, exc = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise VitseeError(f"cannot read image {path}{more} ({brief(exc)}): remove or replace the file")

    def labels(self) -> np.ndarray:
        return self._labels


def _numpy_rebuilders() -> dict[tuple[str, str], object]:
    """Returns the functions numpy's pickles name to rebuild arrays, dtypes and scalars, under the module
    paths of numpy 1 and 2 (a pickle keeps the path of the numpy that wrote it)."""
    reconstruct = np.zeros(1).__reduce__()[0]  # protocols 2-4
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]  # protocol 5
    scalar = np.int64(0).__reduce__()[0]
    out = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        out[(f"{core}.multiarray", "scalar")] = scalar
        out[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return out


# Everything a CIFAR pickle may name: builtin containers and scalars, numpy's rebuilders, and the str ->
# bytes helper Python 3 writes for bytes under protocol 2. Anything else (os.system, eval, ...) is refused
# before it is called, so a crafted file cannot run code.
_PICKLE_GLOBALS = {
    **{
        ("builtins", n): getattr(builtins, n)
        for n in ("set", "frozenset", "bytearray", "bytes", "complex", "int", "float", "str", "list", "dict", "tuple")
    },
    ("_codecs", "encode"): codecs.encode,
    **_numpy_rebuilders(),
}


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that builds only builtin values and numpy arrays."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(
                f"it asks for {module}.{name}, which a CIFAR pickle never holds; nothing was run"
            )
        return _PICKLE_GLOBALS[(module, name)]


def load_cifar_pickle(path: Path):
    """Returns the object in a CIFAR python pickle (bytes keys, as the Python 2 originals were written),
    refusing any pickle that names something other than builtin values and numpy arrays."""
    with open(path, "rb") as fh:
        return _ArrayUnpickler(fh, encoding="bytes").load()


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
                "cifar-100-python",
                ["test", "train"],
                b"fine_labels",
                "meta",
                b"fine_label_names",
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
            data, part_labels = self._read_batch(self.root / part)
            images.append(data)
            labels.append(part_labels)
        self._images = np.concatenate(images).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
        self._labels = np.concatenate(labels)
        try:
            names = load_cifar_pickle(self.root / self._meta)[self._names_key]
            self.class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        except (OSError, KeyError, TypeError, pickle.UnpicklingError, EOFError, ValueError):
            self.class_names = None  # the names are a nicety: the images and labels are what a run needs

    def _read_batch(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """Returns (images (n, 3, 32, 32) uint8, labels (n,) int64) of one CIFAR batch file."""
        way_out = f"re-extract the {self.variant} python archive (cifar-{self.variant[5:]}-python.tar.gz)"
        try:
            batch = load_cifar_pickle(path)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
            raise VitseeError(f"cannot read {path} as a {self.variant} pickle ({brief(exc)}): {way_out}") from exc
        what = f"a dict with keys {list(batch)[:4]}" if isinstance(batch, dict) else f"a {type(batch).__name__}"
        if not isinstance(batch, dict) or b"data" not in batch or self._label_key not in batch:
            raise VitseeError(
                f"{path} holds {what}, not a {self.variant} batch "
                f"(a dict of b'data' and {self._label_key!r}): {way_out}"
            )
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[self._label_key])
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise VitseeError(
                f"{path}: b'data' is {data.dtype} {data.shape}, not uint8 (N, 3072) rows of 32x32 RGB: {way_out}"
            )
        if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
            raise VitseeError(
                f"{path}: {labels.dtype} labels of shape {labels.shape} for {len(data)} images: {way_out}"
            )
        return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)

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
    """An .npz with `images` (N, H, W[, C]) uint8, C 1, 3 or 4, and optional `labels` (N,) and `class_names`.

    Labels are class indices (-1: unlabelled). Float labels are taken when every value is a whole number
    (as tools that go through float arrays write them) and refused otherwise, never truncated.
    """

    def __init__(self, path: Path):
        self.path = path
        self.spec = f"npz:{path}"
        try:
            with np.load(path, allow_pickle=False) as z:
                if "images" not in z:
                    found = f"found: {', '.join(z.files)}" if z.files else "it holds no arrays"
                    raise VitseeError(
                        f"{path} has no 'images' array ({found}): save one with np.savez(path, images=..., labels=...)"
                    )
                images = z["images"]
                labels = z["labels"] if "labels" in z else None
                names = z["class_names"] if "class_names" in z else None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise VitseeError(
                f"cannot read {path} as .npz ({brief(exc)}): write it with np.savez(path, images=..., labels=...)"
            ) from exc
        _check_npz_images(path, images)
        self._images = images
        self._labels = None if labels is None else _npz_labels(path, labels, len(images))
        if names is not None and names.ndim != 1:
            raise VitseeError(f"{path}: 'class_names' has shape {names.shape}: save a 1-D list of names")
        self.class_names = None if names is None else [str(n) for n in names]

    def __len__(self) -> int:
        return len(self._images)

    def image(self, i: int) -> Image.Image:
        return _to_rgb(self._images[i])

    def labels(self) -> np.ndarray:
        return self._labels if self._labels is not None else super().labels()


def _check_npz_images(path: Path, images: np.ndarray) -> None:
    """Raises a VitseeError naming what is wrong with an .npz's `images` array."""
    shape = tuple(images.shape)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise VitseeError(f"{path}: 'images' must be uint8 (N, H, W) or (N, H, W, C), got {images.dtype} {shape}")
    if shape[0] == 0:
        raise VitseeError(f"{path}: 'images' {shape} holds no images: save at least {MIN_IMAGES}")
    if 0 in shape[1:3]:
        raise VitseeError(
            f"{path}: 'images' {shape} has images of zero height or width: save (N, H, W[, C]) with H, W >= 1"
        )
    if images.ndim == 4 and shape[3] not in (1, 3, 4):
        hint = " (it looks channels-first: save images.transpose(0, 2, 3, 1))" if shape[1] in (1, 3, 4) else ""
        raise VitseeError(
            f"{path}: 'images' {shape} has {shape[3]} channels; vitsee reads 1 (grey), 3 (RGB) or 4 (RGBA){hint}"
        )


def _npz_labels(path: Path, labels: np.ndarray, n_images: int) -> np.ndarray:
    """Returns an .npz's labels as (N,) int64 class indices, or raises a VitseeError naming the bad ones."""
    if labels.ndim != 1:
        raise VitseeError(
            f"{path}: 'labels' has shape {labels.shape}; save one class index per image, shape ({n_images},)"
        )
    if len(labels) != n_images:
        raise VitseeError(f"{path}: {len(labels)} labels for {n_images} images; they must match")
    if labels.dtype.kind not in "iubf":
        first = labels[0].item() if len(labels) else ""
        raise VitseeError(
            f"{path}: 'labels' are {labels.dtype} (e.g. {first!r}), not class indices: save integers 0..K-1 "
            "and the names as class_names"
        )
    if labels.dtype.kind == "f":
        whole = np.isfinite(labels) & (labels == np.round(labels))
        if not whole.all():
            bad = labels[~whole][0].item()
            raise VitseeError(
                f"{path}: float label {bad!r} (image {int(np.flatnonzero(~whole)[0])}) is not a class index: "
                "save integer labels (np.int64), -1 for an unlabelled image"
            )
    out = labels.astype(np.int64)
    if len(out) and out.min() < -1:
        raise VitseeError(
            f"{path}: label {int(out.min())} is not a class index: use 0..K-1, or -1 for an unlabelled image"
        )
    return out


# --- timm's datasets ------------------------------------------------------------------------------


class _TimmSet(ImageSet):
    """A set read through `timm.data.create_dataset`. The timm dataset is built lazily and left out of
    the pickle (loader workers get the set pickled: an open tar file cannot travel, CIFAR's arrays need
    not), so each process builds its own."""

    _ds = None

    @abstractmethod
    def _build(self):
        """Returns the timm / torchvision dataset, or raises a VitseeError saying why it cannot be had."""

    @property
    def ds(self):
        if self._ds is None:
            self._ds = self._build()
        return self._ds

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_ds", None)
        return state

    def labels(self) -> np.ndarray:
        return self._labels


def _open_image(fileobj, what: str, way_out: str) -> Image.Image:
    """Returns the image in a file object as RGB, or raises a VitseeError naming `what`."""
    try:
        with Image.open(fileobj) as img:
            return img.convert("RGB")
    except UNREADABLE_IMAGE as exc:
        raise VitseeError(f"cannot read image {what} ({brief(exc)}): {way_out}") from exc


class TarSet(_TimmSet):
    """A .tar holding one folder per class, read by timm's tar reader: images in timm's (natural) path
    order, the label is the class folder, known from the member names without decoding an image."""

    def __init__(self, path: Path):
        if not path.is_file() or not tarfile.is_tarfile(path):
            raise VitseeError(f"tar:{path} is not a tar file: give a .tar holding one folder per class of images")
        self.path = path
        self.spec = f"tar:{path}"
        reader = self.ds.reader
        names = [reader.class_idx_to_name[k] for k in range(len(reader.class_idx_to_name))]
        self._labels = np.asarray(reader.targets, dtype=np.int64)
        if names == [""]:  # images at the top of the tar, in no class folder: the set has no labels
            names, self._labels = None, np.full(len(self._labels), -1, dtype=np.int64)
        self.class_names = names

    def _build(self):
        from timm.data import create_dataset

        try:
            return create_dataset("", root=str(self.path))
        except ValueError as exc:  # timm unpacks an empty sample list
            raise VitseeError(
                f"no images found in {self.path}: the tar needs one folder per class holding image files"
            ) from exc
        except (tarfile.TarError, OSError) as exc:
            raise VitseeError(f"cannot read {self.path} as a tar ({brief(exc)}): re-create the archive") from exc

    def __len__(self) -> int:
        return len(self._labels)

    def _member(self, i: int):
        # the reader, not timm's ImageDataset: that one silently hands over the next image when one is broken
        fileobj, _ = self.ds.reader[int(i)]
        return fileobj, f"{self.ds.reader.samples[int(i)][0].name} in {self.path}"

    def image(self, i: int) -> Image.Image:
        fileobj, what = self._member(i)
        return _open_image(fileobj, what, "remove or replace it in the tar")

    def check_readable(self, indices: np.ndarray) -> None:
        """Raises a VitseeError naming the first image of `indices` whose header is not an image's."""
        for i in indices:
            fileobj, what = self._member(i)
            try:
                with Image.open(fileobj):
                    pass
            except UNREADABLE_IMAGE as exc:
                raise VitseeError(f"cannot read image {what} ({brief(exc)}): remove or replace it in the tar") from exc


TORCH_CIFAR = {
    "cifar10": ("cifar-10-batches-py", "cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", "cifar-100-python.tar.gz"),
}


class TorchCifarSet(_TimmSet):
    """torchvision's CIFAR-10/100 from a local root, never downloaded: the test split first, then the
    training split (the order of `cifar10:PATH`). torchvision md5-checks every file before unpickling it."""

    def __init__(self, root: Path, variant: str):
        folder, archive = TORCH_CIFAR[variant]
        if root.name == folder:  # the extracted folder itself was given
            root = root.parent
        self.root, self.variant = root, variant
        self._missing = (
            f"torch/{variant}:{root} does not hold {folder}/ with torchvision's md5-checked files, and "
            f"vitsee never downloads: extract {archive} into {root}"
        )
        if not root.is_dir():
            raise VitseeError(
                f"torch/{variant} root folder {root} does not exist, and vitsee never downloads: "
                f"give the folder holding {folder}/ (extract {archive} there)"
            )
        self.spec = f"torch/{variant}:{root}"
        test, train = self.ds
        self._n_test = len(test)
        # the targets lists torchvision keeps: no image is decoded for them
        self._labels = np.concatenate([np.asarray(test.targets), np.asarray(train.targets)]).astype(np.int64)
        self.class_names = [str(c) for c in test.classes]

    def _build(self):
        from timm.data import create_dataset

        parts = []
        for split in ("validation", "train"):
            try:
                parts.append(create_dataset(f"torch/{self.variant}", root=str(self.root), split=split, download=False))
            except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted"
                raise VitseeError(self._missing) from exc
        return parts

    def __len__(self) -> int:
        return len(self._labels)

    def image(self, i: int) -> Image.Image:
        test, train = self.ds
        img, _ = test[i] if i < self._n_test else train[i - self._n_test]
        return img.convert("RGB")


class HfdsSet(_TimmSet):
    """A Hugging Face dataset split through timm's reader, from the Hub or the local cache. Labels come
    from the label column, without decoding an image."""

    def __init__(self, name: str, split: str):
        self.name, self.split = name, split
        self.spec = f"hfds/{name}:{split}"
        reader = self.ds.reader
        names = sorted(reader.class_to_idx or {}, key=lambda n: reader.class_to_idx[n])
        self.class_names = [str(n) for n in names] or None
        if reader.label_key in reader.dataset.column_names:
            self._labels = np.asarray(reader.dataset[reader.label_key], dtype=np.int64)
        else:
            self._labels = np.full(len(reader.dataset), -1, dtype=np.int64)

    def _build(self):
        offline = "offline, it must be in the Hugging Face cache (~/.cache/huggingface) with HF_HUB_OFFLINE=1 set"
        if importlib.util.find_spec("datasets") is None:
            raise VitseeError(
                f"hfds/{self.name} needs Hugging Face's datasets package, which is not installed: "
                f"pip install datasets; {offline}"
            )
        from timm.data import create_dataset

        try:
            return create_dataset(f"hfds/{self.name}", split=self.split)
        except Exception as exc:  # datasets raises its own zoo of errors for a name or split it cannot get
            raise VitseeError(
                f"cannot load Hugging Face dataset {self.name} split {self.split} ({brief(exc)}): check the name "
                f"and split; {offline}"
            ) from exc

    def __len__(self) -> int:
        return len(self._labels)

    def image(self, i: int) -> Image.Image:
        fileobj, _ = self.ds.reader[int(i)]
        return _open_image(fileobj, f"{i} of hfds/{self.name}:{self.split}", "check the dataset's image column")


# --- specs ----------------------------------------------------------------------------------------


def check_dataset_spec(spec: str) -> None:
    """Raises the VitseeError a dataset spec meets when it is opened, where it can be told without opening it: a
    kind vitsee does not read (with the names closest to it: 'digit' -> digits), a path that is not there, a
    folder where a file belongs. `vitsee extract` runs it before importing torch."""
    spec = spec.strip()
    if spec in BUILTIN_DATASETS or spec[:5].lower() == "hfds/":
        return
    kind, sep, rest = spec.partition(":")
    if kind[:6].lower() == "torch/":
        if kind[6:].lower() not in TORCH_CIFAR or not sep or not rest:
            raise VitseeError(
                f"unknown dataset '{spec}': vitsee reads torch/cifar10:ROOT and torch/cifar100:ROOT "
                "(ROOT: the folder holding the extracted archive)"
            )
        return
    if sep and kind in PATH_DATASETS:
        path = Path(os.path.expanduser(rest))
        if not path.exists():
            raise VitseeError(f"dataset path {rest} does not exist: check the path given to --dataset {kind}:PATH")
        if kind == "imagefolder" and not path.is_dir():
            raise VitseeError(f"imagefolder:{rest} is not a folder: give a folder with one sub-folder per class")
        return
    if Path(os.path.expanduser(spec)).exists():
        return
    words = [*BUILTIN_DATASETS, *(f"{k}:" for k in PATH_DATASETS)]
    close = difflib.get_close_matches(f"{kind}:" if sep else spec, words, n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(c + rest if c.endswith(':') else c for c in close)}?)" if close else ""
    raise VitseeError(f"unknown dataset '{spec}'{hint}: use one of {DATASET_HELP}")


def open_dataset(spec: str) -> ImageSet:
    """Returns the image set a dataset spec names; the set's `.spec` is the canonical form to record."""
    spec = spec.strip()
    check_dataset_spec(spec)
    if spec == "digits":
        return DigitsSet()
    if spec == "samples":
        return SamplesSet()
    if spec == "synthetic":
        return SyntheticSet()
    if spec[:5].lower() == "hfds/":
        name, _, split = spec[5:].partition(":")
        if not name:
            raise VitseeError(f"'{spec}' names no dataset: use hfds/NAME[:SPLIT], e.g. hfds/uoft-cs/cifar10:test")
        return HfdsSet(name, split or "train")
    kind, sep, rest = spec.partition(":")
    if kind[:6].lower() == "torch/":  # the spec's form and its paths: checked above (check_dataset_spec)
        return TorchCifarSet(Path(os.path.expanduser(rest)).resolve(), kind[6:].lower())
    if sep and kind in PATH_DATASETS:
        path = Path(os.path.expanduser(rest)).resolve()
        if kind == "imagefolder":
            return ImageFolderSet(path)
        if kind in ("cifar10", "cifar100"):
            return CifarSet(path, kind)
        if kind == "tar":
            return TarSet(path)
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
        if path.suffix.lower() == ".tar":
            return TarSet(path)
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
    n_available: int,
    test_fraction: float,
    seed: int,
    n_images: int | None = None,
    data_fraction: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (train, test) image indices: a seeded split of the set (or of a seeded n_images of it), then a
    seeded data_fraction of the training part.

    The test part depends only on (n_available, n_images, test_fraction, seed), so runs with different data
    fractions share it, and the fractions nest (the 10% is inside the 30%). Test images are never in train.
    """
    if not 0 < data_fraction <= 1:
        raise VitseeError(
            f"--data-fraction {data_fraction} is outside (0, 1]: use e.g. 0.1 for a tenth of the training split"
        )
    if not 0 < test_fraction < 1:
        raise VitseeError(f"--test-fraction {test_fraction} is outside (0, 1): use e.g. 0.2")
    if n_images is not None and n_images > n_available:
        raise VitseeError(
            f"--n-images {n_images} asks for more images than the dataset holds ({n_available}): "
            f"use --n-images {n_available} or fewer"
        )
    order = np.random.default_rng([seed, 0]).permutation(n_available)[: n_images or n_available]
    n_test = int(round(len(order) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    n_train = int(round(len(train) * data_fraction))
    if n_test < MIN_IMAGES or n_train < MIN_IMAGES:
        raise VitseeError(
            f"{len(order)} images give {n_train} to train on and {n_test} to test (--test-fraction {test_fraction}, "
            f"--data-fraction {data_fraction}); each part needs at least {MIN_IMAGES}: "
            "use more images or larger fractions"
        )
    keep = np.random.default_rng([seed, 1]).permutation(len(train))[:n_train]
    return np.sort(train[keep]).astype(np.int64), np.sort(test).astype(np.int64)


@contextmanager
def loader_batches(loader):
    """Yields an iterator over a torch DataLoader and shuts its worker processes down when the block ends,
    however it ends. Left to the garbage collector after an error or a cancel (the traceback keeps the
    iterator alive), a finished worker stays registered with torch's SIGCHLD handler, which then raises
    inside whatever this process runs next: the terminal app's event loop."""
    it = iter(loader)
    try:
        yield it
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)  # multi-process iterators only
        if shutdown is not None:
            shutdown()

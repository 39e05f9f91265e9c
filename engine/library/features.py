"""`vitsee.from_features`: a store from activations another tool extracted (engine/extraction/features.py writes it)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from vitsee.extraction.features import check_features, feature_images, write_feature_store

from vitsee.library.store import Store


def from_features(
    path: str | os.PathLike,
    features: Mapping[str, Mapping[str, object]],
    images: str | None = None,
    *,
    shuffle_seed: int | None = None,
    labels: Sequence[int] | None = None,
    class_names: Sequence[str] | None = None,
    prefix_tokens: int = 0,
    dtype: str = "float32",
    batch_size: int = 64,
    overwrite: bool = False,
) -> Store:
    """Returns a new store of activations another tool extracted, so vitsee's analyses and the app work on them.

    Every analysis that needs only activations runs on the store (CKA within and across models, probes when
    the images have labels), `vitsee show`/`export` and `vitsee-tui` open it; attention distances, skip ratios,
    spatial maps, head-level CKA and ERFs need what only `vitsee extract` records and say so.

    Args:
        path: the store to write (`run.h5`).
        features: `{model: {layer: array}}`, each array (images, ...) with the same images in the same order:
            (N, D) vectors, (N, T, D) tokens or (N, C, H, W) feature maps; numpy arrays or torch tensors, as
            thingsvision's `extractor.extract_features(...)` returns them per module. Layers in forward order.
        images: the dataset spec (`vitsee extract --dataset`) of the images the rows are, the first N of it (or N
            seeded with `shuffle_seed`), whose labels and class names the store then records; None: unnamed images.
        shuffle_seed: the rows are the seeded subset `vitsee extract --shuffle-seed` takes.
        labels: (N,) class indices of the rows (-1: none), instead of the dataset's; probes need labels.
        class_names: the names of the classes.
        prefix_tokens: how many tokens (CLS first, then registers) lead each (N, T, D) layer; they are left out of
            the probes' GAP readout, and the first one is the CLS readout.
        dtype: float32 (as given) or float16 (half the disk) for the stored activations.
        batch_size: rows per stored chunk.
        overwrite: replace an existing store.

    Returns:
        The new store, opened (`vitsee.open(path)`).

    Raises:
        VitseeError: features not shaped `{model: {layer: array}}`, layers with different numbers of images,
            fewer than 4 images, a name the store cannot key (a '/' or, for models, a ':'), labels of the wrong
            shape, an unknown dataset spec, or a store that exists without `overwrite`.

    Example:
        acts = extractor.extract_features(batches, module_name="features.10")   # thingsvision
        store = vitsee.from_features("alexnet.h5", {"alexnet": {"features.10": acts}}, images="imagefolder:things")
        store.cka("alexnet")
    """
    n, arrays = check_features(features)
    chosen = feature_images(n, images, shuffle_seed, labels, class_names)
    write_feature_store(
        path, arrays, chosen, dtype=dtype, batch_size=batch_size, prefix_tokens=prefix_tokens, overwrite=overwrite
    )
    return Store(path)

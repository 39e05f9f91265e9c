"""Refusing store files that point elsewhere.

HDF5 lets a file reach outside itself: external links, soft links, datasets whose raw data lives in another
file (external storage), and virtual datasets mapping rows of other files. A crafted store could use them to
make vitsee overwrite another file on a resumed extraction, modify another store when caching a result, or
return an unrelated file's bytes as activations. vitsee writes none of these except virtual datasets over its
own torchrun shards, by relative path into STORE.shards/, so anything else is refused before a byte is read
or written.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from vitsee.errors import VitseeError


def _refuse(store: Path, file: Path, name: str, what: str) -> VitseeError:
    return VitseeError(
        f"{store} is not a store vitsee wrote: {file.name}:/{name} is {what}, which vitsee never makes; "
        "refusing to read or write it (re-create the store with `vitsee extract`)"
    )


def check_own_file(store: Path, file: h5py.File) -> None:
    """Raises VitseeError unless every object in file is vitsee's own kind (see the module docstring)."""
    file_path = Path(file.filename)
    shards = (store.parent / (store.name + ".shards")).resolve()

    def visit(group: h5py.Group, prefix: str) -> None:
        for name in group:
            full = f"{prefix}{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise _refuse(store, file_path, full, f"an external link to {link.filename}:{link.path}")
            if isinstance(link, h5py.SoftLink):
                raise _refuse(store, file_path, full, f"a soft link to {link.path}")
            obj = group[name]
            if isinstance(obj, h5py.Group):
                visit(obj, full + "/")
            elif isinstance(obj, h5py.Dataset):
                _check_dataset(store, file_path, full, obj, shards)

    visit(file, "")


def _check_dataset(store: Path, file_path: Path, name: str, ds: h5py.Dataset, shards: Path) -> None:
    if ds.external:
        raise _refuse(store, file_path, name, f"a dataset stored in the external file {ds.external[0][0]!r}")
    if not ds.is_virtual:
        return
    for source in ds.virtual_sources():
        target = source.file_name
        if target == ".":
            raise _refuse(store, file_path, name, "a virtual dataset over the file itself")
        if os.path.isabs(target):
            raise _refuse(store, file_path, name, f"a virtual dataset over the absolute path {target}")
        resolved = (file_path.parent / target).resolve()
        if shards not in resolved.parents:
            raise _refuse(store, file_path, name, f"a virtual dataset over {target}, outside {shards.name}/")

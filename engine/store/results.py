"""Cached results: one file per result in STORE.d/results/ANALYSIS/ID.h5 (or, in a format-1 store, /results).

`StoreResults` is the part of `Store` (store/__init__.py) that lists, reads and writes them; it uses `file`, `path`,
`sidecar`, `store_id`, `writable` and `_own` of Store. A result is keyed by the hash of its parameters, written
whole under a temporary name and renamed; one that belongs to another store, is a link, is damaged or declares
more data than its file holds is not read (it counts as not cached and is computed again).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import h5py
import numpy as np

from vitsee.errors import VitseeError, VitseeNote
from vitsee.store.check import check_own_file
from vitsee.store.files import is_real_file, open_h5, write_file_atomically
from vitsee.store.layout import human_bytes, json_attr, versions


class StoreResults:
    """The cached-results methods of Store (see store/__init__.py)."""

    # --- where results live ----------------------------------------------------------------------------------

    def _result_file(self, analysis: str, rid: str) -> Path:
        return self.sidecar / "results" / analysis / f"{rid}.h5"

    def _legacy_results(self) -> h5py.Group | None:
        """Returns the /results group of a format-1 store (results cached inside the store file)."""
        return self.file["results"] if "results" in self.file else None

    def _result_files(self, analysis: str | None) -> list[tuple[str, str, Path]]:
        """Returns (analysis, id, path) of the result files: regular files only, a link is never read (a reader
        follows a linked folder, whose files' store_id must still be this store's; a writer refuses one)."""
        root = self.sidecar / "results"
        if not root.is_dir():
            return []
        out = []
        for folder in sorted(root.iterdir()) if analysis is None else [root / analysis]:
            if folder.is_dir():
                out += [
                    (folder.name, p.name[:-3], p)
                    for p in sorted(folder.glob("*.h5"))
                    if not p.name.startswith(".") and is_real_file(p)
                ]
        return out

    def _open_result(self, p: Path) -> h5py.File | None:
        """Opens a cached result file, or None when it belongs to another store, is a link or cannot be read."""
        if not is_real_file(p):
            return None  # a link is never read through: the result is missing, analyze writes it in the link's place
        try:
            f = open_h5(p, "r")
        except OSError:
            return None  # damaged (a disk error): the result is missing, it will be computed again
        try:
            if not self._own(f) or not f.attrs.get("complete", False):
                f.close()
                return None
        except (OSError, ValueError, TypeError):  # attributes that do not decode
            f.close()
            return None
        check_own_file(self.path, f)
        return f

    # --- listing, reading and caching ------------------------------------------------------------------------

    def results(self, analysis: str | None = None) -> list[dict]:
        """Returns [{analysis, id, params, provenance}] for the cached results."""
        out, seen = [], set()
        for name, rid, p in self._result_files(analysis):
            f = self._open_result(p)
            if f is None:
                continue
            with f:
                entry = _result_entry(name, rid, f)
            if entry is not None:
                out.append(entry)
                seen.add((name, rid))
        legacy = self._legacy_results()
        if legacy is not None:
            for name, group in legacy.items():
                if analysis is not None and name != analysis:
                    continue
                for rid, res in group.items():
                    if (name, rid) not in seen and res.attrs.get("complete", False):
                        entry = _result_entry(name, rid, res)
                        out += [entry] if entry is not None else []
        return out

    @staticmethod
    def result_id(params: dict) -> str:
        import hashlib

        return hashlib.sha1(json_attr(params).encode()).hexdigest()[:16]

    def get_result(self, analysis: str, params: dict) -> dict[str, np.ndarray] | None:
        """Returns the cached arrays of an analysis run with these params, or None."""
        rid = self.result_id(params)
        p = self._result_file(analysis, rid)
        if p.exists():
            f = self._open_result(p)
            if f is not None:
                with f:
                    return _read_result(f, self.path)
        legacy = self._legacy_results()
        if legacy is not None and f"{analysis}/{rid}" in legacy:
            group = legacy[f"{analysis}/{rid}"]
            if group.attrs.get("complete", False):
                return _read_result(group, self.path)
        return None

    def put_result(self, analysis: str, params: dict, arrays: dict, provenance: dict | None = None) -> str:
        """Caches an analysis result (arrays keyed by name, '/' makes sub-groups) in a file of its own,
        written whole and renamed into place; returns its id."""
        if not self.writable:
            raise VitseeError(f"{self.path} is open read-only: reopen it for writing to cache results")
        rid = self.result_id(params)
        now = time.time()  # created_unix orders results made within the same second
        provenance = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)),
            "created_unix": now,
            **versions(),
            **(provenance or {}),
        }

        def fill(f: h5py.File) -> None:
            for name, value in arrays.items():
                value = np.asarray(value)
                if value.dtype.kind == "U":
                    value = value.astype(h5py.string_dtype())
                f.create_dataset(name, data=value)
            f.attrs["analysis"] = analysis
            f.attrs["store_id"] = self.store_id
            f.attrs["params"] = json_attr(params)
            f.attrs["provenance"] = json_attr(provenance)
            f.attrs["complete"] = True

        write_file_atomically(self._result_file(analysis, rid), fill, self.path)
        return rid


def _result_entry(analysis: str, rid: str, node) -> dict | None:
    """Returns {analysis, id, params, provenance} of a cached result, None when its attributes do not decode."""
    try:
        return {
            "analysis": analysis,
            "id": rid,
            "params": json.loads(node.attrs["params"]),
            "provenance": json.loads(node.attrs.get("provenance", "{}")),
        }
    except (KeyError, OSError, ValueError, TypeError):
        return None


def _read_result(group, store: Path) -> dict | None:
    """Returns a cached result's arrays (text as str) with its _params and _provenance, or None (with a
    VitseeNote) when it is damaged or declares more data than its file holds (see _implausible)."""
    out: dict = {}
    try:
        datasets: list[tuple[str, h5py.Dataset]] = []
        group.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
        for name, obj in datasets:
            problem = _implausible(obj)
            if problem is not None:
                raise ValueError(f"its array {name} {problem}")
        for name, obj in datasets:
            is_text = h5py.check_string_dtype(obj.dtype) is not None
            value = obj.asstr()[()] if is_text else obj[()]
            out[name] = value.astype(str) if is_text and isinstance(value, np.ndarray) else value
        out["_params"] = json.loads(group.attrs["params"])
        out["_provenance"] = json.loads(group.attrs.get("provenance", "{}"))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        where = f"{Path(group.file.filename).name}:{group.name}"
        warnings.warn(
            f"{store}: ignored the cached result {where}, which is damaged ({exc}); it counts as not "
            "cached, and `vitsee analyze` computes it again",
            VitseeNote,
            stacklevel=2,
        )
        return None
    return out


def _implausible(ds: h5py.Dataset) -> str | None:
    """Returns why a result array cannot be what vitsee wrote, or None: vitsee writes results whole and
    uncompressed, so an array never holds more bytes than its file, nor fewer on disk than its shape says
    (a crafted (10^6, 10^6) array would otherwise be read into memory whole)."""
    size = os.path.getsize(ds.file.filename)
    if ds.nbytes > size:
        return (
            f"declares {tuple(ds.shape)} of {ds.dtype} ({human_bytes(ds.nbytes)}), "
            f"more than its file's {human_bytes(size)}"
        )
    if ds.chunks is None and not ds.is_virtual and ds.id.get_storage_size() < ds.nbytes and ds.size:
        return f"declares {tuple(ds.shape)} but holds {ds.id.get_storage_size()} of its {ds.nbytes} bytes"
    return None

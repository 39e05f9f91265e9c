"""Modules imported on first use: reading a cached view needs h5py and numpy, not torch (seconds to import).

`torch = lazy_module("torch")` binds a stand-in that imports torch the first time one of its attributes is read,
so a module whose functions compute with torch can still be imported, and its pure-numpy functions called,
without it. The real module never goes into sys.modules before that first read.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class _LazyModule:
    """Stands in for a module until an attribute is read, then forwards every read to the real one."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_real", None)

    def _module(self) -> ModuleType:
        real = object.__getattribute__(self, "_real")
        if real is None:  # kept once imported: import_module takes ~60 us a call, and hot loops read torch.*
            real = importlib.import_module(object.__getattribute__(self, "_name"))
            object.__setattr__(self, "_real", real)
        return real

    def __getattr__(self, attr: str):
        return getattr(self._module(), attr)

    def __repr__(self) -> str:
        return f"<lazy module {object.__getattribute__(self, '_name')!r}>"


def lazy_module(name: str):
    """Returns a stand-in for module `name` that imports it on first attribute access."""
    return _LazyModule(name)

"""`vitsee.across_seeds`: one view's numbers over stores of several training seeds, their mean and spread.

The paper's interventions (a block without skips, CLS against GAP, less data) are claims about training, and a
second training seed moves the numbers as much as some of the effects: an interval over images says nothing about
it (the model is fixed). Train the runs with `vitsee train ... --seeds 0,1,2` (one split, three inits), extract each
seed's models into a store of its own over the same held-out images, and ask the same view of every store:

    runs = vitsee.across_seeds(["fig8-s0.h5", "fig8-s1.h5", "fig8-s2.h5"], "cka:vit_tiny_patch16_224@file:noskip")
    runs.mean, runs.std          # (rows, cols): the mean over seeds and the sample standard deviation (ddof 1)
    runs.values                  # (seeds, rows, cols): each seed's matrix
    runs.to_pandas()             # row, col, mean, std, min, max, n_seeds

The model of each store may be named by a unique prefix of its key (each seed's weights file has its own name), or
one view string per store may be given. The rows and columns must be the same in every store (the same architecture
over the same layers); cells that are NaN in a seed are left out of that cell's mean.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vitsee.errors import VitseeError
from vitsee.library.result import Result


@dataclass
class SeedSpread:
    """A view's numbers over several seeds: `values` (seeds, rows, cols), their `mean` and `std` (ddof 1: the spread
    of one seed's number about the mean), `min` and `max`, with the view's labels and each store's view string."""

    values: np.ndarray
    rows: list[str]
    cols: list[str]
    value_name: str
    specs: list[str]

    @property
    def n_seeds(self) -> np.ndarray:
        """Returns (rows, cols) how many seeds have a finite value in each cell."""
        return np.isfinite(self.values).sum(axis=0)

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.nanmean(np.where(np.isfinite(self.values), self.values, np.nan), axis=0)

    @property
    def std(self) -> np.ndarray:
        """Returns (rows, cols) the sample standard deviation over seeds (NaN where fewer than two have a value)."""
        finite = np.where(np.isfinite(self.values), self.values, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            sd = np.nanstd(finite, axis=0, ddof=1)
        return np.where(self.n_seeds >= 2, sd, np.nan)

    @property
    def min(self) -> np.ndarray:
        return np.nanmin(np.where(np.isfinite(self.values), self.values, np.nan), axis=0)

    @property
    def max(self) -> np.ndarray:
        return np.nanmax(np.where(np.isfinite(self.values), self.values, np.nan), axis=0)

    def to_pandas(self):
        """Returns a long DataFrame: row, col, mean, std, min, max, n_seeds, one line per cell."""
        import pandas as pd

        r, c = np.meshgrid(np.arange(len(self.rows)), np.arange(len(self.cols)), indexing="ij")
        return pd.DataFrame(
            {
                "row": np.asarray(self.rows, dtype=object)[r.ravel()],
                "col": np.asarray(self.cols, dtype=object)[c.ravel()],
                "mean": self.mean.ravel(),
                "std": self.std.ravel(),
                "min": self.min.ravel(),
                "max": self.max.ravel(),
                "n_seeds": self.n_seeds.ravel(),
            }
        )

    def __repr__(self) -> str:
        return (
            f"<vitsee.SeedSpread {self.value_name}, {len(self.rows)} x {len(self.cols)} over {len(self.values)} seeds; "
            f"mean sd over cells {np.nanmean(self.std):.4f}>"
        )


def across_seeds(stores: Sequence, spec: str | Sequence[str], **options) -> SeedSpread:
    """Returns the mean and spread of one view's numbers over stores of several training seeds (see the module).

    Args:
        stores: paths of stores (or `vitsee.Store`s), one per seed, over the same images.
        spec: a view string for every store (models by a unique prefix of their keys, e.g.
            `cka:vit_tiny_patch16_224@file:vit`), or one per store.
        **options: as `Store.view` (computed and cached in each store when missing).

    Returns:
        A `SeedSpread`: each seed's values and their mean, standard deviation, min and max per cell.

    Raises:
        VitseeError: fewer than two stores, a list of view strings of another length, views whose rows and columns
            differ between stores, or as `Store.view`.
    """
    from vitsee.library.store import Store

    stores = [s if isinstance(s, Store) else Store(os.fspath(s)) for s in stores]
    if len(stores) < 2:
        raise VitseeError(f"across_seeds needs the stores of at least two seeds, got {len(stores)}: pass a list")
    specs = [spec] * len(stores) if isinstance(spec, str) else list(spec)
    if len(specs) != len(stores):
        raise VitseeError(f"{len(specs)} view strings for {len(stores)} stores: give one, or one per store")
    results: list[Result] = [store.view(s, **options) for store, s in zip(stores, specs)]
    first = results[0]
    for store, r in zip(stores[1:], results[1:]):
        if r.rows != first.rows or r.cols != first.cols:
            raise VitseeError(
                f"{r.spec} of {store.path} has other rows or columns than {first.spec} of {stores[0].path}: "
                "compare the same view of the same architecture in every store"
            )
    return SeedSpread(
        np.stack([np.asarray(r.values, dtype=np.float64) for r in results]),
        list(first.rows),
        list(first.cols),
        first.value_name,
        [r.spec for r in results],
    )

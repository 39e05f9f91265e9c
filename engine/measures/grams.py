"""Every measure for every pair of many layers, from one n x n Gram per layer: what their all-pairs forms share.

A pass over a layer's features (fp64, in column chunks, centred before the product) builds its LayerGrams:

    K0 = Xc Xc'                       (n, n)  Xc: the features centred over the n examples (their mean mu)
    v = Xc mu, w = Xc mu_r, s = Xc 1  (n,)    mu_r = mu - mean(mu); and |mu|^2, |mu_r|^2 and d, the feature count

Everything else is O(n^2) from these, with no second pass over the features:

    centred Gram             K0 (H K0[idx, idx] H for a resample)        linear CKA
    squared distances        K0_ii + K0_jj - 2 K0_ij                     RBF CKA
    raw Gram X X'            K0 + v1' + 1v' + |mu|^2 -> cosine kernel     mknn, cknna (L2-normalised rows)
    row-centred Gram         K0 - ss'/d + w1' + 1w' + |mu_r|^2           rsa (Pearson r between examples)
    eigh(K0) = U diag(lam) U'  Xc = U diag(sqrt(lam)) V' (the thin SVD)   procrustes (any alpha), svcca, pwcca

The eigendecomposition is the thin SVD of the centred features, exactly: Procrustes' nuclear norm ||Xw' Yw||_* is
the sum of singular values of (Ux Gx)' (Uy Gy), G the whitened scales (catalog/procrustes.py) -- the dual form,
for any alpha, which equals sum(sqrt(eig(Kx Ky))) at alpha = 1 -- and SVCCA's SVD step is U's leading columns, so
no randomised SVD is needed: the Gram, built once for the other measures, gives the reduction free. The cached
derived parts (spectrum, kNN masks, RDM ranks) are built on first use by whichever measure needs them.

`pairwise(grams_a, grams_b, measure)` fills a layer x layer matrix with the registered measure's all-pairs form
(each in its module of catalog/): linear and RBF CKA, mknn and rsa as one product of stacked, flattened per-layer
matrices (`stack_products`, the shape of engine/analyses/cka.py), Procrustes as one batched SVD per row layer,
SVCCA, PWCCA and CKNNA pair by pair from per-layer parts built once. All in fp64, so TF32 never enters.

A subset of at most max_images images (seeded, recorded) bounds the memory: about BYTES_PER_ENTRY bytes per image
pair per layer when every measure's parts are cached (Gram 8, eigenvectors 8, RDM ranks 4, kNN mask 1), so
default_max_images gives the largest n with n^2 x 21 B x layers <= GRAM_MEMORY (2 GiB), at most MAX_IMAGES (2048:
on one busy CPU core one layer's eigendecomposition took ~5 s at n = 2000 and Procrustes ~0.4 s a pair at n = 1000,
benchmarks/README.md "Measures beyond linear CKA").
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitsee.measures import floor, kernels, registry
from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module

torch = lazy_module("torch")

GRAM_MEMORY = 2 << 30  # bytes the cached per-layer parts may take, by default
BYTES_PER_ENTRY = 21  # per image pair per layer: Gram (8) + eigenvectors (8) + RDM ranks (half of 8) + kNN mask (1)
MAX_IMAGES = 2048
MIN_IMAGES = 16
CHUNK_BYTES = 256 << 20  # fp64 column chunk of the features while a Gram is built; stacked matrices per product
KEPT_UNITS = 1024  # soft matching's units: the responses of at most this many of a layer's units are kept
UNIT_SEED = 0


# ----------------------------------------------------------------------------------------------------------------
# The image subset


def default_max_images(n_layers: int, memory: int = GRAM_MEMORY) -> int:
    """Returns the most images whose per-layer parts for n_layers layers fit in `memory` bytes (at most MAX_IMAGES)."""
    n = math.isqrt(int(memory) // (BYTES_PER_ENTRY * max(1, int(n_layers))))
    return max(MIN_IMAGES, min(MAX_IMAGES, n))


def choose_images(n_images: int, max_images: int, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Returns (indices, record): a seeded subset of at most max_images of n_images images, in store order, and the
    {max_images, seed, n_images} a result records (all images, seed None, when they fit)."""
    if max_images < kernels.MIN_DEBIASED:
        raise VitseeError(
            f"--max-images {max_images} is too few: the measures need at least {kernels.MIN_DEBIASED} images"
        )
    if n_images <= max_images:
        return np.arange(n_images), {"max_images": int(max_images), "seed": None, "n_images": int(n_images)}
    rows = np.sort(np.random.default_rng(seed).choice(n_images, size=max_images, replace=False))
    return rows, {"max_images": int(max_images), "seed": int(seed), "n_images": int(max_images)}


def varying_units(centred_norms: torch.Tensor, raw_norms: torch.Tensor) -> np.ndarray:
    """Returns the indices (ascending) of the units whose response varies over the examples: centred norm above
    CONSTANT_RTOL x its raw norm (a unit whose response is constant has no tuning curve)."""
    keep = (centred_norms > kernels.CONSTANT_RTOL * raw_norms) & (centred_norms > 0)
    return keep.nonzero().flatten().cpu().numpy()


def unit_order(varying: np.ndarray, seed: int = UNIT_SEED) -> np.ndarray:
    """Returns the varying units in a seeded random order: a sample of m units is its first m, so a smaller sample is
    part of a larger one, and the layer keeps the first KEPT_UNITS."""
    return np.asarray(varying)[np.random.default_rng(seed).permutation(len(varying))]


# ----------------------------------------------------------------------------------------------------------------
# One layer


@dataclass(eq=False)
class LayerGrams:
    """One layer's Gram of n examples and the few vectors every measure derives its parts from (see the module).

    ids: each row's source image (a bootstrap resample repeats some); rows of one id are the same example, never each
    other's neighbours nor a pair of an RDM. centred: gram is already centred over these rows (a resample's is not).
    """

    gram: torch.Tensor  # (n, n) (X - mu)(X - mu)'
    v: torch.Tensor  # (n,) (X - mu) mu
    w: torch.Tensor  # (n,) (X - mu)(mu - mean(mu))
    s: torch.Tensor  # (n,) (X - mu) 1
    mu_sq: float
    mur_sq: float
    d: int
    ids: torch.Tensor | None = None
    centred_rows: bool = True
    name: str = ""
    # (n, U) fp64: the responses of a seeded sample of the layer's varying units (unit_order's first KEPT_UNITS),
    # soft matching's tuning curves; None where the Gram was made without the features (a zoo's streamed Grams)
    units: torch.Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_features(cls, x: Any, name: str = "", device: Any = None) -> LayerGrams:
        """Returns the LayerGrams of features x (n, ...), numpy or torch, built in fp64 on device (default: x's)."""
        t = x.detach() if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(np.asarray(x)))
        if t.ndim < 2:
            raise VitseeError(
                f"{name or 'x'} must be (examples, features...), got shape {tuple(t.shape)}: add a feature axis"
            )
        t = t.reshape(t.shape[0], -1)
        dev = torch.device(device) if device is not None else t.device
        n, d = t.shape
        step = max(1, CHUNK_BYTES // (8 * n))
        mu = torch.cat([t[:, c : c + step].to(dev, torch.float64).mean(dim=0) for c in range(0, d, step)])
        if not bool(torch.isfinite(mu).all()):  # a nan or inf anywhere in a column makes its mean non-finite
            raise VitseeError(
                f"{name or 'x'} holds nan/inf values (fp16 overflow?): re-extract the layer in fp32 "
                "or leave those examples out"
            )
        mur = mu - mu.mean()
        gram = torch.zeros(n, n, dtype=torch.float64, device=dev)
        v, w, s = (torch.zeros(n, dtype=torch.float64, device=dev) for _ in range(3))
        # One thread on the CPU: the same bits at any --threads. torch's product, not numpy's syrk (floor's
        # symmetric_product, 2.0-2.3x faster here): the syrk's other rounding moved RSA by 5.6e-7 on the demo
        # store's collapsed layers (RDM entries 1 - r with r ~ 1 reorder) and PWCCA by 9.3e-4 where two layers
        # share directions (issue 32's bar: every stored value within 1e-12 of before)
        centred_norms, raw_norms = [], []
        with floor.one_thread() if dev.type == "cpu" else contextlib.nullcontext():
            for c in range(0, d, step):
                raw = t[:, c : c + step].to(dev, torch.float64)
                xc = raw - mu[c : c + step]  # (n, chunk), centred before the product
                gram.addmm_(xc, xc.T)
                v += xc @ mu[c : c + step]
                w += xc @ mur[c : c + step]
                s += xc.sum(dim=1)
                centred_norms.append(torch.linalg.vector_norm(xc, dim=0))
                raw_norms.append(torch.linalg.vector_norm(raw, dim=0))
        gram = (gram + gram.T) / 2  # exactly symmetric: a resample reads both (i, j) and (j, i), which must tie
        kept = unit_order(varying_units(torch.cat(centred_norms), torch.cat(raw_norms)))[:KEPT_UNITS]
        units = t[:, torch.as_tensor(kept, device=t.device)].to(dev, torch.float64)
        out = cls(gram, v, w, s, float(mu.square().sum()), float(mur.square().sum()), d, name=name, units=units)
        return out

    @property
    def n(self) -> int:
        return int(self.gram.shape[0])

    @property
    def device(self):
        return self.gram.device

    def take(self, rows: Any) -> LayerGrams:
        """Returns the LayerGrams of examples `rows` (an index array, repeats allowed: a bootstrap resample)."""
        idx = torch.as_tensor(np.asarray(rows), dtype=torch.int64, device=self.device)
        ids = idx if self.ids is None else self.ids[idx]
        out = LayerGrams(
            _rows_cols(self.gram, idx),
            self.v[idx],
            self.w[idx],
            self.s[idx],
            self.mu_sq,
            self.mur_sq,
            self.d,
            ids=ids,
            centred_rows=self.centred_rows,
            name=self.name,
            units=None if self.units is None else self.units.index_select(0, idx),
        )
        if len(idx) == self.n and bool((torch.bincount(idx, minlength=self.n) == 1).all()):
            # a permutation (the p-value's null): the examples are the same, so the centring, the spectrum and
            # the kNN masks move with the rows instead of being built again
            out._cache = {key: _permuted(key, part, idx) for key, part in self._cache.items() if key != "rdm"}
        else:
            out.centred_rows = False  # a resample has another mean: its gram is centred again on use
        return out

    # -- derived parts ------------------------------------------------------------------------------------------

    def centred(self) -> torch.Tensor:
        """Returns the (n, n) Gram of the features centred over these examples."""
        return self.gram if self.centred_rows else self._cached("centred", lambda: kernels.centre_gram(self.gram))

    @property
    def constant(self) -> bool:
        """True when these examples are all the same (zero variance): every measure of the layer is NaN."""
        return self._cached(
            "constant",
            lambda: kernels.is_constant(float(self.centred().diagonal().sum()), float(self.raw().diagonal().sum())),
        )

    def raw(self) -> torch.Tensor:
        """Returns the (n, n) Gram X X' of the features as stored (uncentred)."""
        return self.gram + (self.v[:, None] + self.v[None, :]) + self.mu_sq  # grouped so (i, j) and (j, i) tie

    def cosine(self) -> torch.Tensor:
        """Returns the (n, n) inner products of the L2-normalised rows (a zero row gives zeros, as F.normalize)."""
        raw = self.raw()
        norms = raw.diagonal().clamp_min(0).sqrt()
        norms = torch.where(norms > 0, norms, torch.ones_like(norms))
        return raw / torch.outer(norms, norms)  # outer keeps the symmetry exact (a product commutes)

    def correlation(self) -> torch.Tensor | None:
        """Returns the (n, n) Pearson correlations between examples over their features, None when an example's
        features are all equal."""
        k = self.gram - torch.outer(self.s, self.s) / self.d + (self.w[:, None] + self.w[None, :]) + self.mur_sq
        var = k.diagonal().clone()
        if bool((var <= (kernels.CONSTANT_RTOL**2) * self.raw().diagonal()).any()):
            return None
        sd = var.sqrt()
        return k / torch.outer(sd, sd)

    def spectrum(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (U, lam): the centred Gram's eigenvectors (n, r) and variance fractions (r,), descending, r its
        numerical rank -- Xc / ||Xc||_F = U diag(sqrt(lam)) V' (the thin SVD), cached."""

        def build():
            # torch's eigh as before (numpy's ran 1.3x faster here, but its other eigenvectors of a repeated
            # eigenvalue move PWCCA, see from_features), on one thread on the CPU: the same bits at any --threads
            with floor.one_thread() if self.device.type == "cpu" else small_lapack(self.n, self.device):
                lam, u = torch.linalg.eigh(self.centred())
            lam, u = lam.flip(0), u.flip(1)
            r = kernels.numerical_rank(lam, self.n, self.d)
            return u[:, :r], lam[:r] / lam[:r].sum()

        return self._cached("spectrum", build)

    def knn(self, k: int) -> torch.Tensor:
        """Returns the (n, n) bool mask of each example's k nearest others by cosine (copies of itself excluded; the
        columns kernels.knn_mask marks, by floor.knn_indices' topk in O(n^2) where the mask sorted every row)."""
        return self._cached(
            ("knn", k), lambda: floor.mask_from_indices(floor.knn_indices(self.cosine(), k, self.ids), self.n)
        )

    def knn_indices(self, k: int) -> torch.Tensor:
        """Returns (n, k) the columns of knn(k)'s mask, row by row in increasing order."""
        return self.knn(k).nonzero()[:, 1].view(self.n, k)

    def pair_mask(self) -> torch.Tensor | None:
        """Returns which pairs i < j are pairs of different images (None: all of them, no repeats)."""
        if self.ids is None:
            return None
        return self.ids[:, None] != self.ids[None, :]

    def rdm_ranks(self) -> torch.Tensor | None:
        """Returns the average ranks of the RDM entries 1 - r_ij over pairs i < j of different images (cached);
        None when an example's correlation is undefined."""

        def build():
            corr = self.correlation()
            return None if corr is None else kernels.average_ranks(kernels.upper(1 - corr, self.pair_mask()))

        return self._cached("rdm", build)

    def tuning_curves(self, units: int) -> torch.Tensor | None:
        """Returns (n, U): the responses of the first `units` kept units (unit_order) centred over these examples and
        scaled to unit length, those that do not vary over them left out (cached); None when none does."""
        if self.units is None:
            raise VitseeError(
                f"{self.name or 'this layer'}'s Grams were made without its features, so its units cannot be "
                "compared (soft matching): compute it from a store that keeps activations"
            )

        def build():
            x = self.units[:, :units]
            xc = x - x.mean(dim=0)
            norms = torch.linalg.vector_norm(xc, dim=0)
            keep = torch.as_tensor(varying_units(norms, torch.linalg.vector_norm(x, dim=0)), device=x.device)
            return xc.index_select(1, keep) / norms.index_select(0, keep) if len(keep) else None

        return self._cached(("curves", units), build)

    def _cached(self, key, build: Callable[[], Any]):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


def _permuted(key, part, idx: torch.Tensor):
    """Returns a cached part of a LayerGrams for its rows permuted by idx."""
    if key == "constant" or part is None:
        return part
    if key == "spectrum":
        return part[0][idx], part[1]
    if isinstance(key, tuple) and key[0] == "curves":  # units are columns: only the rows move
        return part.index_select(0, idx)
    return _rows_cols(part, idx)  # the centred Gram, a kNN mask


def _rows_cols(m: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Returns m[idx][:, idx] (index_select: advanced indexing of both axes is ~100x slower on small CPU Grams)."""
    return m.index_select(0, idx).index_select(1, idx)


SMALL_LAPACK = 256  # decompositions of matrices smaller than this run on one CPU thread


@contextlib.contextmanager
def small_lapack(n: int, device) -> Iterator[None]:
    """Run the body's decompositions of n x n matrices on one torch thread when n < SMALL_LAPACK on the CPU.

    A small eigh or SVD is all thread hand-offs: with another process on one of two cores, eigh of a 60 x 60
    Gram took 78 ms on two threads and 5 ms on one (300 x 300: 514 vs 25 ms); a bootstrap does hundreds.
    """
    if torch.device(device).type != "cpu" or n >= SMALL_LAPACK or torch.get_num_threads() == 1:
        yield
        return
    from vitsee.threads import torch_threads

    with torch_threads(1):
        yield


def layer_grams(layers: Sequence[Any], names: Sequence[str] | None = None, device: Any = None) -> list[LayerGrams]:
    """Returns the LayerGrams of each (n, ...) array of `layers` (the same n examples in the same order)."""
    names = list(names) if names is not None else [f"layer {i}" for i in range(len(layers))]
    grams = [LayerGrams.from_features(x, name, device) for x, name in zip(layers, names)]
    for g in grams[1:]:
        if g.n != grams[0].n:
            raise VitseeError(
                f"{g.name} has {g.n} examples but {grams[0].name} has {grams[0].n}: "
                "pass activations of the same images for every layer"
            )
    return grams


# ----------------------------------------------------------------------------------------------------------------
# All pairs


def stack_products(
    derive: Callable[[LayerGrams], torch.Tensor | None], a: list[LayerGrams], b: list[LayerGrams], scale: float = 1.0
) -> np.ndarray:
    """Returns (La, Lb) inner products of the flattened per-layer matrices derive(g) (None: a NaN row/column),
    chunked so the stacked matrices stay near CHUNK_BYTES."""
    n = a[0].n
    per = max(1, CHUNK_BYTES // (8 * n * n))
    out = np.full((len(a), len(b)), np.nan)

    def stack(layers):
        parts = [derive(g) for g in layers]
        ok = [i for i, p in enumerate(parts) if p is not None]
        flat = torch.stack([parts[i].reshape(-1) for i in ok]) if ok else None
        return ok, flat

    for i0 in range(0, len(a), per):
        rows, fa = stack(a[i0 : i0 + per])
        for j0 in range(0, len(b), per):
            cols, fb = stack(b[j0 : j0 + per]) if b is not a or j0 != i0 else (rows, fa)
            if fa is None or fb is None:
                continue
            prod = (fa @ fb.T * scale).cpu().numpy()
            out[np.ix_(np.array(rows) + i0, np.array(cols) + j0)] = prod
    return out


def _unit(m: torch.Tensor) -> torch.Tensor:
    return m / m.norm()


def cka_part(
    debiased: bool, kernel: Callable[[LayerGrams], torch.Tensor]
) -> Callable[[LayerGrams], torch.Tensor | None]:
    """Returns what stack_products multiplies for CKA of a kernel: the layer's centred (U-centred if debiased)
    kernel(g) at unit Frobenius norm, None for a constant layer."""
    centre = kernels.u_centre_gram if debiased else kernels.centre_gram

    def part(g: LayerGrams) -> torch.Tensor | None:
        return None if g.constant else _unit(centre(kernel(g)))

    return part


def build_parts(layers: Sequence[LayerGrams], part: Callable[[LayerGrams], Any]) -> None:
    """Builds part(g) (a cached part: g.spectrum, g.knn) of every distinct layer as tasks of one thread each on the
    CPU (floor.run_tasks: the same bits at any --threads), so a measure's pairs then find them cached."""
    unique = list({id(g): g for g in layers}.values())
    floor.run_tasks(part, unique, cpu=bool(unique) and unique[0].device.type == "cpu")


def check_rows(a: list[LayerGrams], least: int, measure: str) -> None:
    """Raises unless the layers hold at least `least` examples."""
    if not a or a[0].n < least:
        raise VitseeError(f"{measure} needs at least {least} examples, got {a[0].n if a else 0}: pass more images")


def neighbour_pool(a: list[LayerGrams]) -> int:
    """Returns how many candidates every example has for neighbours: n, less the largest number of copies of one
    image beyond the first (a bootstrap resample), so k < the result leaves each row k others."""
    g = a[0]
    if g.ids is None:
        return g.n
    return g.n - int(torch.bincount(g.ids).max()) + 1


# ----------------------------------------------------------------------------------------------------------------
# Any registered measure by name (measures/registry.py)


def pairwise(grams_a: Sequence[LayerGrams], grams_b: Sequence[LayerGrams] | None, name: str, **params) -> np.ndarray:
    """Returns the (La, Lb) matrix of measure `name` between every layer of grams_a (rows) and of grams_b (columns;
    None: grams_a against itself), with the measure's parameters (defaults: its Parameters). A constant layer gives a
    NaN row or column, with a warning."""
    m = registry.measure(name)
    unknown = set(params) - set(m.defaults)
    if unknown:
        raise VitseeError(
            f"{name} has no parameter {', '.join(sorted(unknown))}: its parameters are "
            f"{', '.join(m.defaults) or 'none'}"
        )
    a = list(grams_a)
    b = a if grams_b is None else list(grams_b)
    if not a or not b:
        raise VitseeError(f"{name} needs at least one layer on each side: pass LayerGrams built by layer_grams()")
    for g in b:
        if g.n != a[0].n:
            raise VitseeError(
                f"{g.name} has {g.n} examples but {a[0].name} has {a[0].n}: build every layer's Grams "
                "on the same image subset"
            )
    for g in {id(g): g for g in [*a, *b]}.values():
        if g.constant:
            warnings.warn(  # the same words for every measure: `vitsee analyze` says it once, not once per measure
                f"{g.name or 'a layer'} does not vary across the images (no variance): every layer measure of it is "
                "undefined (NaN)",
                stacklevel=2,
            )
    # one thread on the CPU, the work shared out as tasks (floor.run_tasks): the same bits at any --threads (torch's
    # 2-thread reductions moved linear and RBF CKA by 1e-16 and PWCCA by 2.2e-14 between --threads 1 and 2)
    with warnings.catch_warnings(), floor.one_thread_on(a[0].gram):
        warnings.simplefilter("ignore")  # said once per layer above
        return m.pairwise(a, b, **{**m.defaults, **params})


def why_undefined(g: LayerGrams | None, name: str) -> str:
    """Returns why measure `name` gives a layer no value (a code the views put in words: similarity.UNDEFINED), ''
    when it does: 'nonfinite' (no Grams: NaN/Inf in its activations), 'constant' (the images do not differ), or the
    measure's own reason (Measure.undefined: RSA's 'flat', RBF CKA's 'median')."""
    if g is None:
        return "nonfinite"
    if g.constant:
        return "constant"
    return registry.measure(name).undefined(g)  # a condition of the measure's own (RSA, RBF CKA)


def pair(grams_x: LayerGrams, grams_y: LayerGrams, name: str, **params) -> float:
    """Returns measure `name` of one pair of layers from their Grams (what measures.<name>(x, y) gives from
    features)."""
    return float(pairwise([grams_x], [grams_y], name, **params)[0, 0])

"""The peers' own code for each measure, as `benchmarks/measures.py --compare` times it against the direct functions.

Each peer is the published project's code, run unmodified: installed from PyPI where it installs (rsatoolbox,
pytorch-cka, torchtyping for thingsvision's torch class), otherwise read at run time from the git directory the
search tool's `fetch` leaves under --peers (default /work/.mirror: google+svcca, minyoungg+platonic-rep,
ahwillia+netrep, ViCCo-Group+thingsvision): the files are `git show`n into a temporary folder that goes on sys.path
for this process only. No peer code is kept in this repository.

What a peer is given and what it is asked is set here, so that it computes the quantity vitsee computes on the same
fp64 arrays (rows = examples):
- netrep `LinearMetric(alpha=1).fit_score` on the centred, Frobenius-normalised features (its angular distance equals
  vitsee's at alpha = 1 on such inputs). It SVDs the (d, d) cross-covariance, so at d > n it is also given the
  features rotated into their n principal directions (`netrep, PCA to n`, our preprocessing, its code): the faster of
  the two is its fastest form.
- thingsvision `CKANumPy` / `CKATorch` (kernel linear or rbf, biased): its RBF bandwidth is absolute, so it gets
  sigma = threshold x sqrt(median squared distance, zeros included) computed beforehand (vitsee's bandwidth; the
  peer is spared the median, which only flatters it).
- google/svcca: its README's recipe -- centre each neuron, `np.linalg.svd`, keep the leading directions holding 99%
  of the variance (vitsee's rule), `cca_core.get_cca_similarity(epsilon=0)`; SVCCA = the mean of all its
  `cca_coef1`. PWCCA: `pwcca.compute_pwcca` on the same reduced activations (it weights by the side with fewer
  directions and by uncentred activations: the value differs by design, see benchmarks/README.md).
- platonic-rep `AlignmentMetrics.mutual_knn` / `cknna` on F.normalize'd rows (its measure_alignment.py normalises
  first; the normalisation is timed). Its metrics.py imports torchaudio for an edit distance not timed here: where
  torchaudio is missing, an empty stand-in module is put beside the file.
- rsatoolbox `calc_rdm(Dataset(x), method="correlation")` + `compare(..., method="spearman")`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

MIRROR = Path("/work/.mirror")
REPOS = {  # module name -> (repository folder under the mirror, files to lay out)
    "svcca": ("google+svcca", ["cca_core.py", "pwcca.py"]),
    "platonic": ("minyoungg+platonic-rep", ["metrics.py"]),
    "netrep": ("ahwillia+netrep", ["netrep/"]),
    "thingsvision": ("ViCCo-Group+thingsvision", ["thingsvision/core/cka/"]),
}
_TMP = tempfile.TemporaryDirectory(prefix="vitsee-peers-")


def _lay_out(key: str, mirror: Path) -> Path:
    """Returns a folder holding the peer's files at its repository's HEAD, shown out of the fetched git directory."""
    folder, paths = REPOS[key]
    git_dir = mirror / folder / "repo"
    if not git_dir.exists():
        owner_name = folder.replace("+", "/")
        raise ImportError(f"{git_dir} is missing: fetch github:{owner_name} first")
    root = Path(_TMP.name) / key
    root.mkdir(exist_ok=True)
    files = subprocess.run(
        ["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", "HEAD", *paths],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        if not name.endswith(".py"):
            continue
        text = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"HEAD:{name}"], check=True, capture_output=True
        ).stdout
        dest = root / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(text)
    return root


def _on_path(root: Path) -> None:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def load(key: str, mirror: Path = MIRROR):
    """Returns the peer's module(s) for key, laid out from the mirror and imported; raises ImportError saying why."""
    root = _lay_out(key, mirror)
    _on_path(root)
    if key == "svcca":
        return importlib.import_module("cca_core"), importlib.import_module("pwcca")
    if key == "platonic":
        if importlib.util.find_spec("torchaudio") is None:  # only its edit distance uses it
            (root / "torchaudio").mkdir(exist_ok=True)
            (root / "torchaudio" / "__init__.py").write_text("")
            (root / "torchaudio" / "functional.py").write_text("")
        with contextlib.redirect_stdout(None):  # it prints a hint about pymp
            return importlib.import_module("metrics")
    if key == "netrep":
        # netrep/__init__ imports every metric (some need extra packages): load linear.py and what it needs alone
        pkg = root / "netrep"
        for sub in (pkg, pkg / "metrics"):
            (sub / "__init__.py").write_text("")
        return importlib.import_module("netrep.metrics.linear")
    if key == "thingsvision":
        cka = root / "thingsvision" / "core" / "cka"
        for sub in (root / "thingsvision", root / "thingsvision" / "core"):
            (sub / "__init__.py").write_text("")
        del cka
        return importlib.import_module("thingsvision.core.cka.helpers")
    raise KeyError(key)


# ----------------------------------------------------------------------------------------------------------------
# The peers as callables (x, y) -> float, on fp64 numpy arrays (n, d)


def _unit_centred(x: np.ndarray) -> np.ndarray:
    xc = x - x.mean(axis=0)
    return xc / np.linalg.norm(xc)


def _principal_coordinates(x: np.ndarray) -> np.ndarray:
    """Returns x centred and rotated into its principal directions, (n, min(n, d)): the same distances, angles and
    Procrustes distance as x, in n columns."""
    xc = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(xc, full_matrices=False)
    return u * s


def rbf_sigma(x: np.ndarray, threshold: float) -> float:
    """Returns vitsee's RBF bandwidth as an absolute sigma: threshold x sqrt(median of all n^2 squared distances)."""
    sq = (x * x).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0)
    np.fill_diagonal(d2, 0)
    return threshold * math.sqrt(float(np.median(d2)))


def _keep_rank(s: np.ndarray, keep: float) -> int:
    var = s**2
    cum = np.cumsum(var) / var.sum()
    return min(int((cum < keep * (1 - 1e-12)).sum()) + 1, len(s))


def _svcca_reduce(x: np.ndarray, keep: float) -> np.ndarray:
    """google/svcca's README step: neurons centred, SVD, the leading directions as (r, n) 'neurons'."""
    acts = x.T  # (neurons, datapoints), their layout
    cacts = acts - np.mean(acts, axis=1, keepdims=True)
    _, s, v = np.linalg.svd(cacts, full_matrices=False)
    r = _keep_rank(s, keep)
    return np.dot(s[:r] * np.eye(r), v[:r])


def peers(mirror: Path = MIRROR) -> tuple[dict[str, list[tuple[str, Callable]]], dict[str, str]]:
    """Returns ({measure: [(peer name, fn(x, y, **params) -> float)]}, {peer: why it is unavailable})."""
    out: dict[str, list[tuple[str, Callable]]] = {}
    missing: dict[str, str] = {}

    def add(measure: str, name: str, fn: Callable) -> None:
        out.setdefault(measure, []).append((name, fn))

    try:
        linear = load("netrep", mirror)

        def netrep(x, y, alpha=1.0):
            return float(linear.LinearMetric(alpha=alpha).fit_score(_unit_centred(x), _unit_centred(y)))

        def netrep_pca(x, y, alpha=1.0):
            return netrep(_principal_coordinates(x), _principal_coordinates(y), alpha)

        add("procrustes", "netrep", netrep)
        add("procrustes", "netrep, PCA to n", netrep_pca)
    except Exception as e:  # a peer that does not load is reported, not fatal
        missing["netrep"] = f"{type(e).__name__}: {e}"

    try:
        helpers = load("thingsvision", mirror)

        def tv(backend: str, kernel: str):
            def fn(x, y, threshold=0.5, debiased=False):
                sigma = rbf_sigma(x, threshold) if kernel == "rbf" else 1.0
                sigma_y = rbf_sigma(y, threshold) if kernel == "rbf" else 1.0
                extra = {"device": "cpu"} if backend == "torch" else {}
                # one object per side: its sigma is an attribute; the cross term needs both, as HSIC(K_x, L_y)
                cx = helpers.get_cka(backend, m=len(x), kernel=kernel, unbiased=debiased, sigma=sigma, **extra)
                cy = helpers.get_cka(backend, m=len(x), kernel=kernel, unbiased=debiased, sigma=sigma_y, **extra)
                if kernel == "linear":
                    return float(cx.compare(x, y))
                xs, ys = (torch.from_numpy(x), torch.from_numpy(y)) if backend == "torch" else (x, y)
                k, l_ = cx.centering(cx.apply_kernel(xs)), cy.centering(cy.apply_kernel(ys))
                summed = (lambda a, b: float((a * b).sum())) if backend == "torch" else (lambda a, b: np.sum(a * b))
                return float(summed(k, l_) / math.sqrt(summed(k, k) * summed(l_, l_)))

            return fn

        add("linear_cka", "thingsvision numpy", tv("numpy", "linear"))
        add("linear_cka", "thingsvision torch", tv("torch", "linear"))
        add("rbf_cka", "thingsvision numpy", tv("numpy", "rbf"))
        add("rbf_cka", "thingsvision torch", tv("torch", "rbf"))
    except Exception as e:
        missing["thingsvision"] = f"{type(e).__name__}: {e}"

    try:
        cca_core, pwcca = load("svcca", mirror)

        def google_svcca(x, y, keep=0.99):
            res = cca_core.get_cca_similarity(
                _svcca_reduce(x, keep), _svcca_reduce(y, keep), epsilon=0.0, verbose=False
            )
            return float(np.mean(res["cca_coef1"]))

        def google_pwcca(x, y, keep=0.99):
            return float(pwcca.compute_pwcca(_svcca_reduce(x, keep), _svcca_reduce(y, keep), epsilon=0.0)[0])

        add("svcca", "google/svcca", google_svcca)
        add("pwcca", "google/svcca pwcca", google_pwcca)
    except Exception as e:
        missing["google/svcca"] = f"{type(e).__name__}: {e}"

    try:
        metrics = load("platonic", mirror)
        normalize = torch.nn.functional.normalize

        def platonic(name: str):
            def fn(x, y, k=10):
                a, b = normalize(torch.from_numpy(x), dim=-1), normalize(torch.from_numpy(y), dim=-1)
                return float(getattr(metrics.AlignmentMetrics, name)(a, b, topk=k))

            return fn

        add("mknn", "platonic-rep", platonic("mutual_knn"))
        add("cknna", "platonic-rep", platonic("cknna"))
    except Exception as e:
        missing["platonic-rep"] = f"{type(e).__name__}: {e}"

    try:
        from rsatoolbox.data import Dataset
        from rsatoolbox.rdm import calc_rdm, compare

        def rsatoolbox(x, y):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rdms = [calc_rdm(Dataset(m), method="correlation") for m in (x, y)]
                return float(compare(rdms[0], rdms[1], method="spearman")[0, 0])

        add("rsa", "rsatoolbox", rsatoolbox)
    except Exception as e:
        missing["rsatoolbox"] = f"{type(e).__name__}: {e}"
    return out, missing

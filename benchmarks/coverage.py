"""How often vitsee's 95% intervals hold the value they are about: every measure at n = 30, 100 and 300 images.

    python benchmarks/coverage.py                      # every row, 200 draws each (about 15 minutes on one core)
    python benchmarks/coverage.py --draws 400 --rows cka rbf_cka --n 100

The simulation (DESIGN.md, "Statistics a reviewer accepts"): z ~ N(0, I_4) per image, X = zA + e (12 units),
Y = zB + e' (16 units), unit Gaussian noise, A and B drawn once (seed 0). Each draw is n new images; the interval
is vitsee's own, through the code the store runs: MinibatchCKA with jackknife=True for linear CKA (one minibatch of
all n images, and five minibatches of n/5), engine/measures/jackknife.py with 20 groups for the other measures,
engine/zoo/calibration.py ZooJackknife for the zoo's summaries of two three-layer models.

The value an interval should hold, per row:
- population: linear CKA, Procrustes, SVCCA and PWCCA in closed form from the population covariances
  (Sxx = A'A + I, Syy = B'B + I, Sxy = A'B; SVCCA/PWCCA keep the leading directions of 99% of the variance, as the
  measures do); RBF CKA and RSA the mean of --big-draws draws of --big-n images (their bias is O(1/n): below 0.002
  there); the zoo's summaries those of the population CKA matrix.
- mean at n: the mean of the draws' own estimates: what the interval holds when the estimator is biased (kNN measures
  with a fixed k are another number at every n by construction).
The table gives the coverage in % with its exact (Clopper-Pearson) 95% binomial interval, for both.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable

import numpy as np

from vitsee import stats

LEVEL = 0.95
GROUPS = 20
LATENT, DX, DY = 4, 12, 16


def design(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(LATENT, DX)), rng.normal(size=(LATENT, DY))


def draw(a, b, n, rng, noise_x=1.0, noise_y=1.0):
    z = rng.normal(size=(n, LATENT))
    return z @ a + noise_x * rng.normal(size=(n, a.shape[1])), z @ b + noise_y * rng.normal(size=(n, b.shape[1]))


# --- population values in closed form ---------------------------------------------------------------------


def covariances(a, b, noise_x=1.0, noise_y=1.0):
    return a.T @ a + noise_x**2 * np.eye(a.shape[1]), b.T @ b + noise_y**2 * np.eye(b.shape[1]), a.T @ b


def population_linear_cka(sxx, syy, sxy) -> float:
    """DESIGN.md's closed form: ||Sxy||_F^2 / (||Sxx||_F ||Syy||_F)."""
    return float(np.linalg.norm(sxy) ** 2 / (np.linalg.norm(sxx) * np.linalg.norm(syy)))


def population_procrustes(sxx, syy, sxy) -> float:
    """arccos(||Sxy||_* / sqrt(tr Sxx tr Syy)): the angular Procrustes distance (alpha = 1) of the populations."""
    return float(math.acos(np.linalg.svd(sxy, compute_uv=False).sum() / math.sqrt(np.trace(sxx) * np.trace(syy))))


def _reduce(s, keep=0.99):
    lam, u = np.linalg.eigh(s)
    lam, u = lam[::-1], u[:, ::-1]
    frac = lam / lam.sum()
    r = min(int((np.cumsum(frac) < keep * (1 - 1e-12)).sum()) + 1, len(lam))
    return u[:, :r], lam[:r], frac[:r]


def population_cca(sxx, syy, sxy, keep=0.99) -> tuple[float, float]:
    """Returns (SVCCA, PWCCA) of the populations: each side reduced to its leading principal directions of `keep` of
    its variance, the canonical correlations those of the whitened reduced coordinates, PWCCA's weights
    w_i = sum_j sqrt(frac_j) |a_ji| as measures/direct.py pwcca_from_basis takes them."""
    ux, lx, fx = _reduce(sxx, keep)
    uy, ly, _ = _reduce(syy, keep)
    c = np.diag(lx**-0.5) @ ux.T @ sxy @ uy @ np.diag(ly**-0.5)
    left, rho, _ = np.linalg.svd(c, full_matrices=False)
    rho = np.clip(rho, 0, 1)
    w = (np.sqrt(fx)[:, None] * np.abs(left)).sum(axis=0)
    return float(rho.mean()), float((w * rho).sum() / w.sum())


# --- one row of the table: an interval maker and its population value -------------------------------------


def measure_interval(name: str, **params) -> Callable:
    """Returns f(x, y) -> (estimate, low, high): vitsee's jackknife interval of a Gram measure (20 groups)."""
    from vitsee.measures import jackknife
    from vitsee.measures.grams import layer_grams, pairwise

    def interval(x, y, seed):
        gx, gy = layer_grams([x, y])
        est = pairwise([gx], [gy], name, **params)
        low, high = jackknife.jackknife_interval([gx], [gy], name, LEVEL, GROUPS, seed, estimate=est, **params)
        return float(est[0, 0]), float(low[0, 0]), float(high[0, 0])

    return interval


def cka_interval(batches: int) -> Callable:
    """Returns f(x, y) -> (estimate, low, high): minibatch CKA over `batches` minibatches and its jackknife interval."""
    from vitsee.analyses.cka import MinibatchCKA

    def interval(x, y, seed):
        n = len(x)
        size = -(-n // batches)
        acc = MinibatchCKA(2, jackknife=True)
        for s in range(0, n, size):
            acc.update([x[s : s + size], y[s : s + size]])
        st = acc.statistics(LEVEL)
        return float(acc.result()[0, 1]), float(st["ci_low"][0, 1]), float(st["ci_high"][0, 1])

    return interval


# the zoo: two models of three layers each, reading the latent with different loadings and noise
ZOO_NOISE_A, ZOO_NOISE_B = (0.5, 1.0, 2.0), (0.7, 1.4, 2.8)


def zoo_layers(seed: int = 1):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(LATENT, 10)) for _ in ZOO_NOISE_A], [rng.normal(size=(LATENT, 8)) for _ in ZOO_NOISE_B]


def zoo_population(summary: str) -> float:
    from vitsee.zoo.summaries import summarise

    la, lb = zoo_layers()
    m = np.array(
        [
            [population_linear_cka(*covariances(a, b, na, nb)) for b, nb in zip(lb, ZOO_NOISE_B)]
            for a, na in zip(la, ZOO_NOISE_A)
        ]
    )
    return float(summarise(m, summary))


def zoo_interval(summary: str) -> Callable:
    """Returns f(rng, n) -> (estimate, low, high): the zoo's summary of two three-layer models over one minibatch of n
    images, with its jackknife interval (engine/zoo/calibration.py ZooJackknife, as the zoo analysis runs it)."""
    from vitsee.analyses.cka import MinibatchCKA
    from vitsee.zoo import calibration

    la, lb = zoo_layers()
    idx = {"a": np.arange(3), "b": np.arange(3, 6)}
    cell = {"a": 2, "b": 2}

    def interval(rng, n):
        z = rng.normal(size=(n, LATENT))
        feats = [z @ a + s * rng.normal(size=(n, a.shape[1])) for a, s in zip(la, ZOO_NOISE_A)]
        feats += [z @ b + s * rng.normal(size=(n, b.shape[1])) for b, s in zip(lb, ZOO_NOISE_B)]
        acc = MinibatchCKA(6)
        acc.update(feats)
        sums = acc.hsic_sums.numpy()
        jack = calibration.ZooJackknife(sums, idx, ["a", "b"], summary, cell)
        again = MinibatchCKA(6)
        again.observers = [jack]
        again.update(feats)
        values = calibration.pair_summaries(stats.cka_from_hsic(sums)[None], idx, ["a", "b"], summary, cell)[0]
        low, high = jack.interval(values, LEVEL)
        return float(values[0, 1]), float(low[0, 1]), float(high[0, 1])

    return interval


def large_n_value(name: str, a, b, big_n: int, big_draws: int, **params) -> float:
    from vitsee.measures.grams import layer_grams, pairwise

    rng = np.random.default_rng(12345)
    values = []
    for _ in range(big_draws):
        gx, gy = layer_grams(list(draw(a, b, big_n, rng)))
        values.append(float(pairwise([gx], [gy], name, **params)[0, 0]))
    return float(np.mean(values))


def rows(a, b, big_n: int, big_draws: int) -> dict[str, tuple[str, Callable, Callable[[], float] | None]]:
    """Returns row -> (the interval in words, its maker, the population value or None: the mean at n only)."""
    cov = covariances(a, b)
    svcca, pwcca = population_cca(*cov)
    return {
        "cka": ("CKA, one minibatch: delete-one-image jackknife", cka_interval(1), lambda: population_linear_cka(*cov)),
        "cka5": (
            "CKA, 5 minibatches: delete-one-image jackknife",
            cka_interval(5),
            lambda: population_linear_cka(*cov),
        ),
        "rbf_cka": (
            "RBF CKA, unbiased HSIC (the store's): 20-group jackknife",
            measure_interval("rbf_cka", debiased=True),
            lambda: large_n_value("rbf_cka", a, b, big_n, big_draws, debiased=True),
        ),
        "rbf_cka_biased": (
            "RBF CKA, biased HSIC (--rbf-hsic biased): 20-group jackknife",
            measure_interval("rbf_cka", debiased=False),
            lambda: large_n_value("rbf_cka", a, b, big_n, big_draws, debiased=True),  # the same population value
        ),
        "procrustes": (
            "Procrustes (angular): 20-group jackknife",
            measure_interval("procrustes"),
            lambda: population_procrustes(*cov),
        ),
        "svcca": ("SVCCA: 20-group jackknife", measure_interval("svcca"), lambda: svcca),
        "pwcca": ("PWCCA: 20-group jackknife", measure_interval("pwcca"), lambda: pwcca),
        "mknn": ("mknn (k 10): 20-group jackknife", measure_interval("mknn"), None),
        "cknna": ("CKNNA (k 10): 20-group jackknife", measure_interval("cknna"), None),
        "rsa": (
            "RSA: 20-group jackknife",
            measure_interval("rsa"),
            lambda: large_n_value("rsa", a, b, big_n, big_draws),
        ),
        "zoo_best_match": (
            "zoo best match (CKA): jackknife of the summary",
            None,
            lambda: zoo_population("best_match"),
        ),
        "zoo_layer": ("zoo layer (CKA, last layers): jackknife of the summary", None, lambda: zoo_population("layer")),
    }


def coverage_text(hits: int, total: int) -> str:
    if total == 0:
        return "-"
    low, high = stats.clopper_pearson(np.array(hits), total, 0.95)
    return f"{100 * hits / total:.0f} [{100 * float(low):.0f}, {100 * float(high):.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200, help="draws per measure and n (default 200)")
    parser.add_argument("--n", type=int, nargs="+", default=[30, 100, 300], help="images per draw")
    parser.add_argument("--rows", nargs="+", default=None, help="rows to run (default all): " + "cka cka5 rbf_cka ...")
    parser.add_argument("--big-n", type=int, default=3000, help="images of a large-n draw (RBF CKA, RSA)")
    parser.add_argument("--big-draws", type=int, default=3, help="large-n draws averaged")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # many small decompositions: one thread is faster on a shared machine
    warnings.simplefilter("ignore")
    a, b = design()
    table = rows(a, b, args.big_n, args.big_draws)
    chosen = args.rows or list(table)
    print(
        f"95% intervals: coverage in % [exact binomial 95% interval] over {args.draws} draws; X = zA + e (12 units), "
        "Y = zB + e' (16 units), z in 4 dimensions, unit noise\n"
    )
    head = " | ".join(f"n = {n}: population / mean at n" for n in args.n)
    print(f"| row | population value | {head} | mean width at n = {args.n[-1]} | s |")
    print("|---|---:|" + "---|" * len(args.n) + "---:|---:|")
    for key in chosen:
        words, make, population = table[key]
        t0 = time.perf_counter()
        pop = population() if population is not None else None
        cells, width = [], float("nan")
        for n in args.n:
            rng = np.random.default_rng([7, n])
            results = []
            for d in range(args.draws):
                if key.startswith("zoo_"):
                    results.append(zoo_interval(key.removeprefix("zoo_"))(rng, n))
                else:
                    x, y = draw(a, b, n, rng)
                    results.append(make(x, y, [d, n]))
            res = np.array(results)  # (draws, 3): estimate, low, high
            ok = np.isfinite(res[:, 1])
            mean_at_n = float(res[:, 0].mean())
            hit_mean = int(((res[ok, 1] <= mean_at_n) & (mean_at_n <= res[ok, 2])).sum())
            text_pop = (
                coverage_text(int(((res[ok, 1] <= pop) & (pop <= res[ok, 2])).sum()), int(ok.sum()))
                if pop is not None
                else "-"
            )
            missing = f" ({int((~ok).sum())} without)" if (~ok).any() else ""
            cells.append(f"{text_pop} / {coverage_text(hit_mean, int(ok.sum()))}{missing}")
            width = float(np.mean(res[ok, 2] - res[ok, 1])) if ok.any() else float("nan")
        shown = f"{pop:.4f}" if pop is not None else "(mean at n)"
        print(f"| {words} | {shown} | {' | '.join(cells)} | {width:.3f} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()

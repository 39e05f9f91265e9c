"""Fingerprints every cached result and every view of a store, so a restructuring can prove it changed no number.

    python benchmarks/fingerprint.py build DIR [--bench]  # the reference stores: DIR/tiny.h5 (the suite's test store),
                                                          # DIR/stream.h5 (the same, streamed with --heads), and with
                                                          # --bench DIR/bench.h5 (benchmarks/probes.py's 32-image Mixer)
    python benchmarks/fingerprint.py run STORE... --out A.json [--threads N]  # default: 1 thread
    python benchmarks/fingerprint.py compare A.json B.json

`run` copies each store (and its folder) to a temporary place, runs `vitsee analyze COPY` (every analysis that
applies) and `vitsee analyze COPY --heads --erf` there through the CLI, then records:
- for every cached result file: its analysis, its id (the hash of its parameters, i.e. its cache key), the sha256 of
  its params JSON and the sha256 of every array (name, dtype, shape and bytes);
- for every view string the store's models make (cka:A, cka:A:B, attention:M, ...): the sha256 of
  `vitsee show COPY VIEW --format json`, or the one-line error it exits with.
It reads the result files with h5py directly, never through the engine's Store, so it measures the engine from
outside and survives any rewrite of it. `compare` prints every difference and exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

VIT, RESNET = "test_vit@random:0", "test_resnet@random:0"
MEASURES = ("cka", "rbf_cka", "procrustes", "svcca", "pwcca", "mknn", "cknna", "rsa")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VITSEE_TEST": "1", "NO_COLOR": "1"}


def _cli(*args: str, threads: int | None = None, check: bool = True) -> subprocess.CompletedProcess:
    # the console script beside this interpreter: the same command whichever module of the package holds the CLI
    cmd = [str(Path(sys.executable).with_name("vitsee")), *map(str, args)]
    if threads is not None and args[0] == "analyze":
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


def build(folder: Path, bench: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    common = [
        "--dataset",
        "synthetic",
        "--n-images",
        "48",
        "--batch-size",
        "16",
        "--img-size",
        "64",
        "--device",
        "cpu",
        "--workers",
        "0",
        "-q",
        "--overwrite",
    ]
    _cli("extract", folder / "tiny.h5", "-m", VIT, "-m", RESNET, *common)
    _cli("extract", folder / "stream.h5", "-m", VIT, "-m", RESNET, "--streaming", "--heads", *common)
    if bench:
        sys.path.insert(0, str(Path(__file__).parent))
        from probes import MIXER_BLOCKS, build_store

        build_store(folder / "bench.h5", "mixer_b16_224@random:0", 32, 224, MIXER_BLOCKS, "cpu")
    print(f"built the stores in {folder}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24]


def _arrays(node: h5py.Group) -> dict[str, str]:
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            value = obj[()]
            if isinstance(value, bytes) or (isinstance(value, np.ndarray) and value.dtype.kind in "OS"):
                value = np.asarray(value).astype("U")
            value = np.ascontiguousarray(np.asarray(value))
            out[name] = f"{value.dtype.str}{list(value.shape)}:{_sha(value.tobytes())}"

    node.visititems(visit)
    return out


def _results(store: Path) -> dict[str, dict]:
    out = {}
    root = Path(f"{store}.d") / "results"
    for file in sorted(root.glob("*/*.h5")) if root.is_dir() else []:
        if file.name.startswith("."):
            continue
        with h5py.File(file, "r") as f:
            params = f.attrs.get("params", "")
            out[f"{file.parent.name}/{file.stem}"] = {"params": _sha(str(params).encode()), "arrays": _arrays(f)}
    with h5py.File(store, "r") as f:  # format-1 stores keep results inside
        if "results" in f:
            for analysis, group in f["results"].items():
                for rid, res in group.items():
                    out[f"{analysis}/{rid}"] = {
                        "params": _sha(str(res.attrs.get("params", "")).encode()),
                        "arrays": _arrays(res),
                    }
    return out


def _models(store: Path) -> list[tuple[str, str]]:
    """Returns [(key, family)] in the store's order, read with h5py alone."""
    out = []
    with h5py.File(store, "r") as f:
        for key in f["models"]:
            out.append((key, json.loads(f["models"][key].attrs["record"]).get("family", "")))
    for file in sorted((Path(f"{store}.d") / "models").glob("*.h5")):
        with h5py.File(file, "r") as f:
            out.append(
                (
                    json.loads(f.attrs["record"])["key"] if "key" in json.loads(f.attrs["record"]) else file.stem,
                    json.loads(f.attrs["record"]).get("family", ""),
                )
            )
    return out


def _view_strings(models: list[tuple[str, str]]) -> list[str]:
    keys = [k for k, _ in models]
    views = [f"cka:{a}" for a in keys] + [f"cka:{a}:{b}" for a in keys for b in keys if a != b]
    views += [f"{m}:{a}:{b}" for m in (*MEASURES[1:], "agree") for a in keys for b in keys]
    views += [f"zoo --zoo-measure {m}" for m in MEASURES]  # a view string, then its options
    for key, family in models:
        views += [f"{kind}:{key}" for kind in ("attention", "probes", "skip", "spatial", "erf")]
        if family == "vit":
            views += [f"heads:{key}:{other}" for other in keys if other != key]
    return views


def _normalised(text: str) -> str:
    """The JSON export without what names the copy's place or time (provenance paths and dates)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text

    def scrub(obj):
        if isinstance(obj, dict):
            return {k: scrub(v) for k, v in obj.items() if k not in ("provenance", "created", "created_unix", "store")}
        if isinstance(obj, list):
            return [scrub(v) for v in obj]
        return obj

    return json.dumps(scrub(data), sort_keys=True)


def _placeless(text: str, copy: Path) -> str:
    """An error's text without the places of this run: the store's copy, the checkout and the interpreter (a
    traceback names the files of whichever checkout ran, and two checkouts are what a comparison compares)."""
    for place, name in ((copy, "STORE"), (Path(__file__).resolve().parents[1], "ROOT"), (Path(sys.prefix), "ENV")):
        text = text.replace(str(place), name)
    return text


def run(stores: list[Path], threads: int | None) -> dict:
    out = {}
    for store in stores:
        with tempfile.TemporaryDirectory(prefix="vitsee-fingerprint-") as tmp:
            copy = Path(tmp) / store.name
            shutil.copy2(store, copy)
            if Path(f"{store}.d").is_dir():
                shutil.copytree(f"{store}.d", f"{copy}.d", ignore=shutil.ignore_patterns("lock"))
            _cli("analyze", copy, "-q", "--device", "cpu", threads=threads)
            _cli("analyze", copy, "--heads", "--erf", "-q", "--device", "cpu", threads=threads, check=False)
            # every layer x layer measure with its intervals and p-values, their agreement, and the zoo of each
            stats = ["--measure-bootstrap", "8", "--measure-permutations", "8", "--seed", "0"]
            _cli("analyze", copy, "--measures", "all", *stats, "-q", "--device", "cpu", threads=threads, check=False)
            _cli("analyze", copy, "--agree", "-q", "--device", "cpu", threads=threads, check=False)
            for measure in MEASURES:
                _cli(
                    "analyze",
                    copy,
                    "--zoo",
                    "--zoo-measure",
                    measure,
                    *stats,
                    "-q",
                    "--device",
                    "cpu",
                    threads=threads,
                    check=False,
                )
            views = {}
            for view in _view_strings(_models(copy)):
                done = _cli("show", copy, *view.split(" "), "--format", "json", check=False)
                if done.returncode == 0:
                    views[view] = _sha(_normalised(done.stdout).encode())
                else:
                    views[view] = f"exit {done.returncode}: " + _placeless(done.stderr.strip(), copy)
            out[store.name] = {"results": _results(copy), "views": views}
        print(f"{store}: {len(out[store.name]['results'])} results, {len(out[store.name]['views'])} views", flush=True)
    return out


def compare(a: dict, b: dict) -> int:
    differences = 0
    for store in sorted(set(a) | set(b)):
        if store not in a or store not in b:
            print(f"{store}: only in {'the first' if store in a else 'the second'}")
            differences += 1
            continue
        for part in ("results", "views"):
            left, right = a[store][part], b[store][part]
            for key in sorted(set(left) | set(right)):
                if left.get(key) != right.get(key):
                    differences += 1
                    print(f"{store} {part} {key}:\n  - {left.get(key)}\n  + {right.get(key)}")
    print(f"{differences} difference(s)")
    return 1 if differences else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("folder", type=Path)
    b.add_argument("--bench", action="store_true", help="also the 32-image Mixer store of benchmarks/probes.py")
    r = sub.add_parser("run")
    r.add_argument("stores", type=Path, nargs="+")
    r.add_argument("--out", type=Path, required=True)
    # one thread by default: the Gram measures' BLAS reductions differ in their last bits between thread counts, and
    # `analyze` picks its count from how busy the other cores are, so two runs of one checkout would differ
    r.add_argument("--threads", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args()
    if args.cmd == "build":
        build(args.folder, args.bench)
        return 0
    if args.cmd == "run":
        args.out.write_text(json.dumps(run(args.stores, args.threads), indent=1, sort_keys=True))
        print(f"wrote {args.out}")
        return 0
    return compare(json.loads(args.a.read_text()), json.loads(args.b.read_text()))


if __name__ == "__main__":
    sys.exit(main())

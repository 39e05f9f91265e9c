"""Under torchrun (gloo, 2 CPU processes) extract and analyze give what one process gives: the same store
values, stitched from shards with virtual datasets, and the same CKA matrix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import IMG, RESNET, VIT, run_cli
from vitsee.analyses import driver as an
from vitsee.analyses.cka import cka_params, run_cka
from vitsee.extraction import shards
from vitsee.extraction.distributed import Rank, batch_range, shard_path
from vitsee.errors import VitseeError
from vitsee.extraction.extract import ExtractConfig
from vitsee.store import Store

# the run of conftest's tiny_store: 48 images in 3 batches, so the ranks get 1 and 2 batches
RUN = [
    "-m",
    VIT,
    "-m",
    RESNET,
    "--dataset",
    "synthetic",
    "-n",
    "48",
    "--batch-size",
    "16",
    "--img-size",
    str(IMG),
    "--device",
    "cpu",
    "--workers",
    "0",
    "--quiet",
]


def torchrun(*args: str) -> None:
    """Runs `torchrun --nproc-per-node 2 --no-python vitsee ARGS` the way a user would."""
    vitsee = Path(sys.executable).with_name("vitsee")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--no-python",
        str(vitsee),
        *args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def one_process(tiny_store, tmp_path_factory) -> Path:
    """conftest's store of the same run, copied: results cached here stay out of other modules' way."""
    return Path(shutil.copy(tiny_store, tmp_path_factory.mktemp("one") / "one.h5"))


@pytest.fixture(scope="module")
def stitched(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("torchrun") / "stitched.h5"
    torchrun("extract", str(path), *RUN)
    return path


def _datasets(path: Path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r", locking=False) as f:
        for top in ("images", "models"):
            f[top].visititems(
                lambda name, obj: out.__setitem__(f"{top}/{name}", obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
    return out


def test_shards_are_contiguous_whole_batches_of_near_equal_size():
    for n_batches, world in ((3, 2), (10, 4), (7, 7), (1000, 8)):
        ranges = [batch_range(n_batches, Rank(r, world, r)) for r in range(world)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n_batches
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [b - a for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_two_processes_write_the_values_one_process_writes(stitched, one_process):
    got, expected = _datasets(stitched), _datasets(one_process)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert sorted(p.name for p in stitched.with_name("stitched.h5.shards").glob("*.h5")) == [
        "rank-00000-of-00002.h5",
        "rank-00001-of-00002.h5",
    ]


def test_the_stitched_store_reads_its_shards_by_relative_path(stitched, tmp_path, capsys):
    code, out, _ = run_cli(["info", stitched], capsys)
    assert code == 0 and "complete" in out and "stitched from 2 torchrun shards in stitched.h5.shards/" in out
    with h5py.File(stitched, "r", locking=False) as f:
        ds = f[f"models/{VIT}/acts/blocks.0"]
        assert ds.is_virtual
        assert [s.file_name for s in ds.virtual_sources()] == [
            "stitched.h5.shards/rank-00000-of-00002.h5",
            "stitched.h5.shards/rank-00001-of-00002.h5",
        ]
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(stitched, moved / "stitched.h5")
    shutil.copytree(stitched.with_name("stitched.h5.shards"), moved / "stitched.h5.shards")
    with Store.open(moved / "stitched.h5") as s, Store.open(stitched) as original:
        assert s.complete and s.rows_done(RESNET) == 48
        np.testing.assert_array_equal(s.activations(VIT, "blocks.5"), original.activations(VIT, "blocks.5"))
        rows = np.array([40, 3, 17, 16])  # across both shards, any order
        np.testing.assert_array_equal(
            s.activations(RESNET, "layer2.0", rows), original.activations(RESNET, "layer2.0")[rows]
        )
    (moved / "stitched.h5.shards" / "rank-00001-of-00002.h5").unlink()
    with pytest.raises(VitseeError, match="rank-00001-of-00002.h5, which is missing"):
        Store.open(moved / "stitched.h5")


def test_two_processes_give_the_cka_matrix_of_one(stitched, one_process):
    cfg = an.AnalyzeConfig(batch_size=16, shuffles=2, seed=5, device="cpu")
    torchrun(
        "analyze",
        str(stitched),
        "--cka",
        "--batch-size",
        "16",
        "--shuffles",
        "2",
        "--seed",
        "5",
        "--device",
        "cpu",
        "--quiet",
    )
    with Store.writer(one_process) as s:
        expected = run_cka(s, cfg)
    with Store.open(stitched) as s:
        got = s.get_result("cka", cka_params(s, cfg))
    assert got is not None and got["_params"] == expected.params
    np.testing.assert_allclose(got["matrix"], expected["matrix"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got["shuffle_std"], expected["shuffle_std"], rtol=0, atol=1e-12)
    # per-batch terms land in their global slot and null sums add up: the statistics do not depend on the ranks
    for name in ("ci_low", "ci_high", "p_value"):
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-12, err_msg=name)


def test_streaming_under_two_processes_sums_the_shards_to_the_one_process_cka(tmp_path, one_process):
    from vitsee.analyses.heads import heads_params, run_heads

    path = tmp_path / "streamed.h5"
    torchrun("extract", str(path), *RUN, "--streaming", "--heads")
    cfg = an.AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", ci=0, permutations=0)  # a stream has no statistics
    with Store.writer(one_process) as s:
        expected = run_cka(s, cfg)
        expected_heads = run_heads(s, VIT, RESNET, cfg)
    with Store.open(path) as s:
        assert s.streaming and s.complete
        got = s.get_result("cka", cka_params(s, cfg))
        got_heads = s.get_result("heads", heads_params(s, VIT, RESNET, cfg))
        np.testing.assert_array_equal(
            s.stat(VIT, "skip_ratio_attn"), Store.open(one_process).stat(VIT, "skip_ratio_attn")
        )
    np.testing.assert_allclose(got["matrix"], expected["matrix"], rtol=0, atol=1e-12)
    # each shard's head-level CKA sums are added up too (rank 0's batches then rank 1's: the sum order differs)
    np.testing.assert_allclose(got_heads["cka"], expected_heads["cka"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got_heads["distance_px"], expected_heads["distance_px"])


def test_a_zoo_streamed_as_grams_under_two_processes_gives_the_one_process_cka(tmp_path, one_process):
    path = tmp_path / "grams.h5"
    torchrun("extract", str(path), *RUN, "--grams")
    cfg = an.AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", ci=0, permutations=0)
    with Store.writer(one_process) as s:
        expected = run_cka(s, cfg)
    with Store.open(path) as s:
        assert s.streaming and s.complete and s.shard_files
        got = s.get_result("cka", cka_params(s, cfg))
    # every batch's Grams are the same whichever rank made them, and the sum runs over batches in order: bit for bit
    # at equal thread counts (test_zoo_extract.py); the ranks pick their own, so here to rounding
    np.testing.assert_allclose(got["matrix"], expected["matrix"], rtol=0, atol=1e-12)


def _copy_shards(stitched: Path, folder: Path) -> list[Path]:
    source = stitched.with_name("stitched.h5.shards")
    target = folder / "again.h5.shards"
    shutil.copytree(source, target)
    return [shard_path(folder / "again.h5", r, 2) for r in range(2)]


def _cfg(path: Path) -> ExtractConfig:
    return ExtractConfig(
        store=path, models=[VIT, RESNET], dataset="synthetic", n_images=48, batch_size=16, img_size=IMG
    )


def test_an_incomplete_or_missing_shard_is_an_error_naming_it_never_filled(stitched, tmp_path):
    paths = _copy_shards(stitched, tmp_path)
    with h5py.File(paths[1], "r+", locking=False) as f:
        f[f"models/{RESNET}/done"][1] = 0  # its last batch never finished
    with pytest.raises(
        VitseeError, match=r"rank-00001-of-00002.h5 is incomplete \(test_resnet@random:0: 16 of 32 rows\)"
    ):
        shards.stitch(tmp_path / "again.h5", paths, _cfg(tmp_path / "again.h5"), [VIT, RESNET])
    paths[1].unlink()
    with pytest.raises(VitseeError, match="rank-00001-of-00002.h5 is missing"):
        shards.stitch(tmp_path / "again.h5", paths, _cfg(tmp_path / "again.h5"), [VIT, RESNET])
    assert not (tmp_path / "again.h5").exists()


def test_a_store_stitched_again_from_complete_shards_equals_the_first(stitched, tmp_path):
    paths = _copy_shards(stitched, tmp_path)
    shards.stitch(tmp_path / "again.h5", paths, replace(_cfg(tmp_path / "again.h5")), [VIT, RESNET])
    got, expected = _datasets(tmp_path / "again.h5"), _datasets(stitched)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_shard_of_another_run_is_refused_at_stitching_and_at_opening(stitched, tmp_path):
    paths = _copy_shards(stitched, tmp_path)
    with h5py.File(paths[1], "r+", locking=False) as f:  # the same-named shard of a run over other images
        meta = json.loads(f.attrs["shard"])
        f.attrs["shard"] = json.dumps({**meta, "run_id": "0123456789abcdef"})
    with pytest.raises(VitseeError, match="rank-00001-of-00002.h5 is from another run"):
        shards.stitch(tmp_path / "again.h5", paths, _cfg(tmp_path / "again.h5"), [VIT, RESNET])
    moved = tmp_path / "moved"
    shutil.copytree(stitched.parent, moved)
    with h5py.File(moved / "stitched.h5.shards" / "rank-00001-of-00002.h5", "r+", locking=False) as f:
        meta = json.loads(f.attrs["shard"])
        f.attrs["shard"] = json.dumps({**meta, "run_id": "0123456789abcdef"})
    with pytest.raises(VitseeError, match="is not from the run that made"):
        Store.open(moved / "stitched.h5")


def test_a_truncated_shard_is_one_line_not_a_traceback(stitched, tmp_path, capsys):
    moved = tmp_path / "moved"
    shutil.copytree(stitched.parent, moved)
    shard = moved / "stitched.h5.shards" / "rank-00000-of-00002.h5"
    shard.write_bytes(shard.read_bytes()[:2000])
    code, _out, err = run_cli(["info", moved / "stitched.h5"], capsys)
    assert code == 2 and "truncated or damaged" in err and "rank-00000-of-00002.h5" in err

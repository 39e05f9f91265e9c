"""Training seeds: a split seed apart from the init seed, `vitsee train --seeds`, and a view's mean and spread over
the stores of several seeds (`vitsee.across_seeds`)."""

from __future__ import annotations

import numpy as np
import pytest

import vitsee
from conftest import run_cli
from vitsee.models.load import read_record
from vitsee.training.train import TrainConfig, parse_seeds, write_held_out

TINY = ["-m", "test_vit", "--model-arg", "patch_size=8", "--model-arg", "depth=2", "--img-size", "32"]
BASE = ["--dataset", "digits", "-n", "80", "--epochs", "1", "--batch-size", "32", "--device", "cpu", "-q"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


def _held_out(tmp_path, name: str, **kwargs) -> np.ndarray:
    cfg = TrainConfig(out=tmp_path / "w.safetensors", model="test_vit", dataset="digits", n_images=120, **kwargs)
    write_held_out(cfg, tmp_path / f"{name}.npz")
    return np.load(tmp_path / f"{name}.npz")["images"]


def test_a_split_seed_keeps_the_held_out_images_while_the_init_seed_moves(tmp_path):
    base = _held_out(tmp_path, "s0")
    same_split = _held_out(tmp_path, "s1-split0", seed=1, split_seed=0)
    old_way = _held_out(tmp_path, "s1", seed=1)  # --seed alone still moves the split, as before
    assert np.array_equal(base, same_split)
    assert not np.array_equal(base, old_way)


def test_seeds_trains_one_run_per_init_seed_on_one_split(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    code, _, err = run_cli(["train", out, *TINY, *BASE, "--seeds", "0,1", "--held-out", tmp_path / "t.npz"], capsys)
    assert code == 0, err
    records = [read_record(tmp_path / f"m-s{s}.safetensors") for s in (0, 1)]
    assert [r["init_seed"] for r in records] == [0, 1]
    assert records[0]["split"] == records[1]["split"] and records[0]["split"]["seed"] == 0
    from safetensors.numpy import load_file

    w0, w1 = (load_file(tmp_path / f"m-s{s}.safetensors") for s in (0, 1))
    assert any(not np.array_equal(w0[k], w1[k]) for k in w0)  # another init
    assert (tmp_path / "t.npz").exists() and not out.exists()
    code, _, err = run_cli(["train", out, *TINY, *BASE, "--seeds", "0,1"], capsys)  # done: kept, not trained again
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    "text, message",
    [("0,x", "'x' is not a seed"), ("1,1", "seed 1 is given twice"), (",", "names no seed")],
)
def test_a_bad_seed_list_is_one_line(tmp_path, capsys, text, message):
    code, _, err = run_cli(["train", tmp_path / "m.safetensors", *TINY, *BASE, "--seeds", text], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert parse_seeds("2,0") == [2, 0]


def _seed_stores(tmp_path, n_seeds: int = 3) -> list:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(64, 4))
    paths = []
    for s in range(n_seeds):
        r = np.random.default_rng(10 + s)
        layers = {f"l{i}": z @ r.normal(size=(4, 6)) + r.normal(size=(64, 6)) for i in range(3)}
        paths.append(vitsee.from_features(tmp_path / f"s{s}.h5", {f"net-s{s}": layers}).path)
    return paths


def test_across_seeds_is_the_mean_and_spread_of_each_seeds_own_view(tmp_path):
    paths = _seed_stores(tmp_path)
    runs = vitsee.across_seeds(paths, "cka:net", batch_size=32, progress=False)
    each = np.stack(
        [vitsee.open(p).cka(f"net-s{s}", batch_size=32, progress=False).values for s, p in enumerate(paths)]
    )
    np.testing.assert_array_equal(runs.values, each)
    np.testing.assert_allclose(runs.mean, each.mean(axis=0))
    np.testing.assert_allclose(runs.std, each.std(axis=0, ddof=1))
    assert runs.rows == ["l0", "l1", "l2"] and (runs.n_seeds == 3).all()
    table = runs.to_pandas()
    assert len(table) == 9 and set(table.columns) == {"row", "col", "mean", "std", "min", "max", "n_seeds"}


def test_across_seeds_refuses_one_store_or_views_that_do_not_line_up(tmp_path):
    paths = _seed_stores(tmp_path, 2)
    with pytest.raises(vitsee.VitseeError, match="at least two seeds"):
        vitsee.across_seeds(paths[:1], "cka:net")
    with pytest.raises(vitsee.VitseeError, match="3 view strings for 2 stores"):
        vitsee.across_seeds(paths, ["cka:net"] * 3)
    other = vitsee.from_features(tmp_path / "other.h5", {"net-s9": {"a": np.ones((64, 3)) * np.arange(64)[:, None]}})
    with pytest.raises(vitsee.VitseeError, match="other rows or columns"):
        vitsee.across_seeds([paths[0], other.path], "cka:net", progress=False)

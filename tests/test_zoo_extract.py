"""A zoo's extraction: many models over the same images in waves under a memory budget, the arrays of one pass bit for
bit; per-model Grams (--grams) whose CKA is `analyze --cka --shuffles 0`'s; resumable after kill -9; model lists
(--models-from, --models) with a plan of their weights before anything runs. One compute thread throughout, so values
match bit for bit."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import run_cli
from vitsee.analyses import driver as an
from vitsee.analyses.cka import cka_from_grams, run_cka
from vitsee.errors import VitseeError
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.store import Store, copy_store
from vitsee.threads import torch_threads
from vitsee.zoo.streamed import gram_bytes
from zoo_models import ZOO_IMG, zoo_models

SMALL = dict(dataset="synthetic", n_images=24, batch_size=8, img_size=ZOO_IMG, device="cpu", workers=0)
DRIVER = str(Path(__file__).with_name("zoo_driver.py"))


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, restored after


def _extract(path, **cfg):
    with torch_threads(1):
        return run_extraction(ExtractConfig(store=path, **{**SMALL, "models": zoo_models(), **cfg}))


@pytest.fixture(scope="module")
def one_pass(tmp_path_factory):
    path = tmp_path_factory.mktemp("zoo") / "one-pass.h5"
    result = _extract(path)
    assert not any("waves" in m for m in result.messages)  # they fit the default budget together: one pass
    return path


@pytest.fixture(scope="module")
def grams(tmp_path_factory):
    """The zoo streamed as Grams, a model at a time (a budget no two models fit)."""
    path = tmp_path_factory.mktemp("zoo") / "grams.h5"
    result = _extract(path, grams=True, memory_budget=1)
    assert any("they run in 7 waves of at most 1" in m for m in result.messages)
    return path


def _arrays(path) -> dict[str, np.ndarray]:
    """Every array a zoo store holds per model (activations or Grams, statistics, input, done, non-finite counts)."""
    out = {}
    with Store.open(path) as s:
        for key in s.models:
            group = s.model_group(key)
            group.visititems(
                lambda name, obj, key=key: (
                    out.__setitem__(f"{key}/{name}", obj[()]) if isinstance(obj, h5py.Dataset) else None
                )
            )
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _cka(path) -> dict:
    with Store.open(path) as s:
        [entry] = s.results("cka")
        return s.get_result("cka", entry["params"])


class TestWaves:
    def test_seven_models_a_wave_each_give_the_arrays_of_one_pass(self, one_pass, tmp_path):
        path = tmp_path / "waves.h5"
        result = _extract(path, memory_budget=1)
        assert "7 models take" in result.messages[1] and "they run in 7 waves of at most 1" in result.messages[1]
        _assert_same(_arrays(path), _arrays(one_pass))
        with Store.open(path) as s:
            assert s.models == zoo_models() and s.complete

    def test_no_more_than_one_wave_is_resident_while_the_images_run(self, tmp_path, monkeypatch):
        from vitsee.extraction import plan as extract_plan

        alive: list[weakref.ref] = []
        load = extract_plan.load_model

        def tracked(*args, **kwargs):
            loaded = load(*args, **kwargs)
            alive.append(weakref.ref(loaded.model))
            return loaded

        monkeypatch.setattr(extract_plan, "load_model", tracked)
        resident: list[int] = []

        def progress(event):
            if event.stage == "extract":
                resident.append(sum(ref() is not None for ref in alive))

        gc.disable()  # released models must be freed by reference counting alone: no cycle may hold one
        try:
            with torch_threads(1):
                run_extraction(
                    ExtractConfig(store=tmp_path / "w.h5", **{**SMALL, "models": zoo_models()}, memory_budget=1),
                    progress,
                )
        finally:
            gc.enable()
        assert len(alive) == 14  # each model: once to plan it, once for its wave
        assert resident and max(resident) == 1
        resident.clear()
        with torch_threads(1):
            run_extraction(ExtractConfig(store=tmp_path / "one.h5", **{**SMALL, "models": zoo_models()}), progress)
        assert min(resident) == 7  # everything fits: all resident, one pass, as before waves

    def test_waves_are_runs_of_models_whose_costs_fit_the_budget(self, tmp_path):
        from vitsee.extraction.plan import memory_budget, plan, waves, _release

        cfg = ExtractConfig(store=tmp_path / "p.h5", **{**SMALL, "models": zoo_models()})
        selection, plans, existing = plan(cfg, torch.device("cpu"), lambda _e: None)  # no budget: all stay loaded
        try:
            costs = [mp.cost for mp in plans]
            assert all(mp.resident for mp in plans) and all(
                mp.resident_bytes > 0 and mp.batch_bytes > 0 for mp in plans
            )
            budget = sorted(costs)[-1] + sorted(costs)[-2]  # the two largest fit together
            groups = waves(plans, budget)
            assert [mp for g in groups for mp in g] == plans and 1 < len(groups) < len(plans)
            assert all(sum(mp.cost for mp in g) <= budget for g in groups)
            # each wave is as long as the budget allows: the next model would not have fit
            assert all(sum(mp.cost for mp in g) + nxt[0].cost > budget for g, nxt in zip(groups, groups[1:]))
            assert [len(g) for g in waves(plans, 1)] == [1] * 7 and waves(plans, None) == [plans]
            assert (
                memory_budget(
                    ExtractConfig(store=tmp_path / "p.h5", models=["test_vit"], memory_budget=123), torch.device("cpu")
                )
                == 123
            )
        finally:
            _release(plans, existing)
        _, plans, existing = plan(cfg, torch.device("cpu"), lambda _e: None, budget=budget)
        _release(plans, existing)
        kept = [mp.resident for mp in plans]  # planning keeps a first run of models that fits, releases the rest
        assert kept == sorted(kept, reverse=True) and 0 < sum(kept) < 7

    def test_a_streaming_run_without_grams_needs_one_pass_and_says_the_way_out(self, tmp_path):
        with pytest.raises(
            VitseeError,
            match=r"over the memory budget of 1 B, and --streaming without --grams runs them "
            r"all in one pass: add --grams .* raise --memory-budget",
        ):
            _extract(tmp_path / "s.h5", streaming=True, memory_budget=1, models=zoo_models()[:2])
        assert not (tmp_path / "s.h5").exists()
        with pytest.raises(VitseeError, match="--heads streams head-level CKA in one pass"):
            ExtractConfig(store=tmp_path / "h.h5", models=zoo_models()[:2], grams=True, heads=True)


class TestGrams:
    def test_their_cka_is_analyze_cka_shuffles_0_with_the_same_batch_size_bit_for_bit(self, grams, one_pass, tmp_path):
        stored = copy_store(one_pass, tmp_path / "analyzed.h5")
        with Store.writer(stored) as s:
            want = run_cka(s, an.AnalyzeConfig(batch_size=8, shuffles=0, device="cpu", ci=0, permutations=0))
        got = _cka(grams)
        assert got["_params"] == want.params  # the same key: views and the app read it as any cached CKA
        np.testing.assert_array_equal(got["matrix"], want["matrix"])
        assert got["matrix"].shape == (43, 43)

    def test_the_store_keeps_4_n_b_bytes_per_layer_and_no_activations(self, grams):
        with Store.open(grams) as s:
            layers = sum(len(s.layers(m)) for m in s.models)
            sizes = []
            for m in s.models:
                group = s.model_group(m)
                assert "acts" not in group and "input" not in group
                sizes += [group["grams"][layer].nbytes for layer in s.layers(m)]
                assert group["grams"][s.layers(m)[0]].shape == (24, 8)
        assert sum(sizes) == gram_bytes(24, 8, layers) == 4 * 24 * 8 * 43

    def test_a_model_appended_later_streams_alone_and_its_new_pairs_come_from_the_grams(self, grams, tmp_path):
        zoo = zoo_models()
        path = tmp_path / "appended.h5"
        _extract(path, grams=True, models=zoo[:6])
        with pytest.raises(
            VitseeError, match=r"keeps Grams of batches of 8 images .*: add test_convnext@random:0 with --batch-size 8"
        ):
            _extract(path, grams=True, models=zoo[6:], batch_size=4)
        _extract(path, grams=True, models=zoo[6:])
        with Store.open(path) as s:
            assert s.models == [m for m in zoo] and (s.sidecar / "models").is_dir()
            columns = [(m, layer) for m in s.models for layer in s.layers(m)]
            new = [c for c in columns if c[0] == zoo[6]]
            others = [c for c in columns if c[0] != zoo[6]]
            with torch_threads(1):
                acc = cka_from_grams(s, new + others, cross_at=len(new))  # the new model's pairs only
            block = acc.result()[: len(new), len(new) :]
        result = [r for r in _results(path) if r["_params"]["models"] == zoo][0]  # cached when the zoo was complete
        want = _cka(grams)["matrix"]
        np.testing.assert_array_equal(result["matrix"], want)  # the appended zoo's CKA is the zoo's, bit for bit
        idx = np.array([columns.index(c) for c in new]), np.array([columns.index(c) for c in others])
        np.testing.assert_allclose(block, want[np.ix_(*idx)], rtol=0, atol=1e-12)

    def test_a_grams_store_takes_only_grams_runs(self, grams):
        with pytest.raises(VitseeError, match="keeps each layer's per-batch Grams .*add --grams"):
            _extract(grams, streaming=True)


def test_the_zoo_of_seven_families_equals_each_pairs_cka_computed_alone(one_pass, grams, tmp_path):
    """engine/zoo/summaries.py over a real zoo: the matrix from the joint CKA against each pair's CKA computed one
    pair at a time from the stored activations, and the intervals from the Grams' per-batch terms."""
    from vitsee.zoo import summaries as zoo
    from vitsee.analyses.cka import minibatch_cka

    stored = copy_store(one_pass, tmp_path / "analyzed.h5")
    with Store.writer(stored) as s:
        result = run_cka(s, an.AnalyzeConfig(batch_size=8, shuffles=0, device="cpu", ci=0, permutations=0))
        z = zoo.zoo_from_cka(result, families=[zoo.family_of_record(s.model_info(k)) for k in s.models])
        assert z.families == ["ViT", "DeiT", "Swin", "Mixer", "ResNet", "ResNetV2/BiT", "ConvNeXt"]
        for a, b in [(0, 1), (0, 4), (2, 3), (5, 6), (1, 6)]:
            ka, kb = s.models[a], s.models[b]
            alone = minibatch_cka(
                [s.activations(ka, x) for x in s.layers(ka)],
                [s.activations(kb, x) for x in s.layers(kb)],
                batch_size=8,
                device="cpu",
            )
            assert z.values[a, b] == pytest.approx(zoo.best_match_alignment(alone), abs=1e-12)
            assert tuple(z.correspondences[(ka, kb)].path) == tuple(zoo.monotone_match(alone))
    np.testing.assert_allclose(np.diag(z.values), 1.0, atol=1e-12)
    assert sorted(z.order) == list(range(7)) and np.array_equal(z.values, z.values.T)
    with Store.open(grams) as s:
        columns = [(m, layer) for m in s.models for layer in s.layers(m)]
        acc = cka_from_grams(s, columns, batch_slots=True)
    zi = zoo.zoo_from_hsic(acc.hsic_sums.numpy(), columns, batch_hsic=acc.batch_hsic.numpy(), replicates=200)
    np.testing.assert_array_equal(zi.values, z.values)  # the Grams give the same CKA, so the same zoo
    off = ~np.eye(7, dtype=bool)
    assert np.all(zi.ci_low[off] <= zi.values[off]) and np.all(zi.values[off] <= zi.ci_high[off])
    assert "bootstrap over 3 batches" in zi.interval


@pytest.mark.parametrize(
    "text, size", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("2000", 2000), ("64MiB", 64 << 20)]
)
def test_memory_budgets_read_as_sizes(text, size):
    from vitsee.extraction.plan import parse_bytes

    assert parse_bytes(text) == size


def test_a_bad_memory_budget_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(["extract", tmp_path / "b.h5", "-m", "test_vit@random", "--memory-budget", "lots"], capsys)
    assert code == 2 and err.strip() == (
        "error: --memory-budget 'lots' is not a size: give bytes such as 4G, 512M or 2000000000"
    )


def _results(path) -> list[dict]:
    with Store.open(path) as s:
        return [s.get_result("cka", r["params"]) for r in s.results("cka")]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _complete_models(path) -> tuple[int, int]:
    """Returns (models with every batch done, models with some) of a store being written, read without its lock."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            done = [f["models"][k]["done"][:] for k in f["models"]]
    except (OSError, KeyError):
        return 0, 0
    return sum(bool(d.all()) for d in done), sum(bool(d.any()) for d in done)


def test_a_zoo_killed_mid_run_resumes_with_vitsee_extract_store_to_the_same_arrays(grams, tmp_path, capsys):
    store = tmp_path / "killed.h5"
    models = [w for m in zoo_models() for w in ("--model", m)]
    cmd = [
        sys.executable,
        DRIVER,
        "extract",
        str(store),
        *models,
        "--grams",
        "--memory-budget",
        "1",
        "--dataset",
        "synthetic",
        "--n-images",
        "24",
        "--batch-size",
        "8",
        "--img-size",
        str(ZOO_IMG),
        "--device",
        "cpu",
        "--workers",
        "0",
        "--threads",
        "1",
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    deadline = time.time() + 120
    while _complete_models(store)[0] < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    complete, started = _complete_models(store)
    assert 2 <= complete < 7, f"the kill should land mid-zoo, landed with {complete} of 7 models complete"
    assert started - complete <= 1  # a kill loses at most the model in flight (its unfinished batches)

    code, _, err = run_cli(["extract", store, "--threads", "1"], capsys)  # the run the store records, resumed
    assert code == 0, err
    assert err.startswith(f"resuming {store}: ") and "streaming Grams" in err.splitlines()[0]
    _assert_same(_arrays(store), _arrays(grams))
    np.testing.assert_array_equal(_cka(store)["matrix"], _cka(grams)["matrix"])


# --- model lists ---------------------------------------------------------------------------------------------


LIST_ARGS = [
    "--dataset",
    "synthetic",
    "--n-images",
    "8",
    "--batch-size",
    "8",
    "--img-size",
    "64",
    "--device",
    "cpu",
    "--workers",
    "0",
    "--threads",
    "1",
]


@pytest.fixture
def weights_file(tmp_path) -> Path:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(5)
    model = timm.create_model("test_resnet")
    (tmp_path / "weights").mkdir()
    path = tmp_path / "weights" / "resnet.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding test_vit.r160_in1k weights made here, and no other."""
    import huggingface_hub.constants as hub
    import timm
    from safetensors.torch import save_file

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--timm--test_vit.r160_in1k"
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in timm.create_model("test_vit").state_dict().items()},
        str(repo / "snapshots" / ("0" * 40) / "model.safetensors"),
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


class TestModelLists:
    def test_a_list_file_runs_its_models_after_a_plan_of_their_weights(self, tmp_path, weights_file, capsys):
        listing = tmp_path / "zoo.txt"
        listing.write_text(
            "# three models\n\ntest_vit@random:0   # a baseline\ntest_resnet@weights/resnet.safetensors\n"
            "test_convnext@random:1\ntest_vit@random:0\n"
        )
        code, _, err = run_cli(["extract", tmp_path / "z.h5", "--models-from", listing, *LIST_ARGS], capsys)
        assert code == 0, err
        lines = err.splitlines()
        assert lines[0] == "3 model(s): 1 from local files, 2 random init (1 given twice, listed once)"
        assert lines[1].split() == ["test_vit@random:0", "random", "seed", "0"]
        assert lines[2].split() == [f"test_resnet@{weights_file}", "file", str(weights_file)]
        with Store.open(tmp_path / "z.h5") as s:
            assert s.models == ["test_vit@random:0", "test_resnet@file:resnet", "test_convnext@random:1"] and s.complete
            assert s.model_info("test_resnet@file:resnet")["weights"]["path"] == str(weights_file)

    def test_a_model_that_cannot_be_had_is_one_line_naming_it_and_the_ways_out(self, tmp_path, capsys):
        listing = tmp_path / "zoo.txt"
        listing.write_text("test_vit@random:0\ntest_resnet@/nowhere/resnet.safetensors\n")
        code, _, err = run_cli(["extract", tmp_path / "z.h5", "--models-from", listing, "--quiet", *LIST_ARGS], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "z.h5").exists()
        assert err.strip() == (
            f"error: test_resnet@/nowhere/resnet.safetensors ({listing} line 2) cannot be had: weights "
            "file /nowhere/resnet.safetensors does not exist; fix the path, or pass --skip-missing to "
            "leave out what cannot be had"
        )
        code, _, err = run_cli(
            ["extract", tmp_path / "z.h5", "--models-from", listing, "--skip-missing", *LIST_ARGS], capsys
        )
        assert code == 0, err
        assert "left out (--skip-missing): test_resnet@/nowhere/resnet.safetensors" in err
        with Store.open(tmp_path / "z.h5") as s:
            assert s.models == ["test_vit@random:0"]

    @pytest.mark.parametrize(
        "content, says",
        [
            ("# nothing but a comment\n\n", "lists no model: write one spec per line, NAME[.TAG][@WEIGHTS]"),
            ("test_vitt@random\n", "unknown model 'test_vitt': did you mean test_vit"),
            (None, "does not exist: give a file with one model spec per line"),
        ],
    )
    def test_bad_list_files_are_one_line(self, tmp_path, capsys, content, says):
        listing = tmp_path / "zoo.txt"
        if content is not None:
            listing.write_text(content)
        code, _, err = run_cli(["extract", tmp_path / "z.h5", "--models-from", listing, *LIST_ARGS], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and says in err

    def test_a_pattern_lists_timms_pretrained_names_cached_or_not(self, tmp_path, hub_cache, capsys):
        code, _, err = run_cli(["extract", tmp_path / "p.h5", "--models", "test_vit*", *LIST_ARGS], capsys)
        assert code == 2
        lines = err.splitlines()
        assert lines[0] == "3 model(s): 1 weights cached here, 2 cannot be had"
        assert {tuple(line.split()[:2]) for line in lines[1:4]} == {
            ("test_vit2.r160_in1k", "missing"),
            ("test_vit3.r160_in1k", "missing"),
            ("test_vit.r160_in1k", "cached"),
        }
        assert lines[-1].startswith(
            "error: test_vit2.r160_in1k (--models 'test_vit*') cannot be had: not in the local "
            "cache, and HF_HUB_OFFLINE is set (and 1 more); use test_vit2.r160_in1k@random[:SEED]"
        )
        code, _, err = run_cli(
            ["extract", tmp_path / "p.h5", "--models", "test_vit*", "--skip-missing", *LIST_ARGS], capsys
        )
        assert code == 0, err
        with Store.open(tmp_path / "p.h5") as s:
            assert (
                s.models == ["test_vit.r160_in1k"]
                and s.model_info("test_vit.r160_in1k")["weights"]["kind"] == "pretrained"
            )
        code, _, err = run_cli(["extract", tmp_path / "q.h5", "--models", "nothing_like_it*", *LIST_ARGS], capsys)
        assert code == 2 and err.strip() == (
            "error: --models 'nothing_like_it*' matches no timm model with pretrained "
            "weights: see `vitsee models 'nothing_like_it*' --pretrained`, or use a wider "
            "pattern such as 'vit_*'"
        )

    def test_with_network_uncached_weights_would_be_downloaded_and_an_unreachable_hub_says_so(
        self, tmp_path, monkeypatch
    ):
        import huggingface_hub.constants as hub

        from vitsee.models.load import model_list

        server = socket.create_server(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hub, "ENDPOINT", endpoint)
        monkeypatch.setattr(hub, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
        try:
            listed = model_list(["test_vit", "test_resnet@random"])
        finally:
            server.close()
        assert [(e.status, e.detail) for e in listed.entries] == [
            ("download", f"from 127.0.0.1:{endpoint.rsplit(':', 1)[1]}"),
            ("random", "seed 0"),
        ]
        listed = model_list(["test_vit"])  # the port is closed now: nothing answers there
        assert listed.entries[0].status == "missing" and "cannot be reached" in listed.entries[0].detail

"""`vitsee.extract` and `vitsee.train`: the CLI's commands as functions, with the same names, defaults, results and
one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import vitsee
from conftest import IMG, RESNET, VIT, run_cli
from vitsee.store import Store as EngineStore
from vitsee.zoo.streamed import keeps_grams, read_gram

EXTRACT = {"dataset": "synthetic", "n_images": 8, "batch_size": 4, "img_size": IMG, "device": "cpu", "workers": 0}
EXTRACT_CLI = [
    "--dataset",
    "synthetic",
    "-n",
    "8",
    "--batch-size",
    "4",
    "--img-size",
    str(IMG),
    "--device",
    "cpu",
    "--workers",
    "0",
    "-q",
]
TRAIN = {
    "model_args": {"patch_size": 8},
    "img_size": 32,
    "dataset": "digits",
    "n_images": 60,
    "epochs": 1,
    "device": "cpu",
}
TRAIN_CLI = [
    "-m",
    "test_vit",
    "--model-arg",
    "patch_size=8",
    "--img-size",
    "32",
    "--dataset",
    "digits",
    "-n",
    "60",
    "--epochs",
    "1",
    "--device",
    "cpu",
    "-q",
]


class TestExtract:
    def test_extract_writes_the_store_vitsee_extract_writes(self, tmp_path, capsys):
        threads = torch.get_num_threads()
        store = vitsee.extract(tmp_path / "lib.h5", models=VIT, **EXTRACT, threads=1, progress=False)
        assert torch.get_num_threads() == threads  # the run's thread count is given back
        assert capsys.readouterr().err == ""
        code, _, err = run_cli(["extract", tmp_path / "cli.h5", "-m", VIT, *EXTRACT_CLI, "--threads", "1"], capsys)
        assert code == 0, err
        assert isinstance(store, vitsee.Store) and store.models == [VIT]
        with EngineStore.open(store.path) as mine, EngineStore.open(tmp_path / "cli.h5") as theirs:
            assert mine.layers(VIT) == theirs.layers(VIT) and mine.complete
            assert mine.run_config() == {**theirs.run_config()}
            for layer in mine.layers(VIT):
                assert np.array_equal(mine.activations(VIT, layer), theirs.activations(VIT, layer))

    def test_a_zoo_of_grams_is_the_store_vitsee_extract_grams_writes(self, tmp_path, capsys):
        """grams and memory_budget as --grams and --memory-budget: the same streamed Grams, waves of one model each
        (a budget below any model), and the zoo from them. One thread each: a forward pass's float sums follow the
        thread count."""
        models = [VIT, RESNET]
        lib = vitsee.extract(
            tmp_path / "lib.h5", models, **EXTRACT, grams=True, memory_budget=1, threads=1, progress=False
        )
        cli = [
            "extract",
            tmp_path / "cli.h5",
            "-m",
            VIT,
            "-m",
            RESNET,
            *EXTRACT_CLI,
            "--grams",
            "--memory-budget",
            "1",
            "--threads",
            "1",
        ]
        code, _, err = run_cli(cli, capsys)
        assert code == 0, err
        with EngineStore.open(lib.path) as mine, EngineStore.open(tmp_path / "cli.h5") as theirs:
            assert mine.run_config() == theirs.run_config() and mine.run_config()["grams"]
            assert keeps_grams(mine) and mine.streaming and mine.models == models
            for model in models:
                for layer in mine.layers(model):
                    for batch in range(2):
                        assert np.array_equal(
                            read_gram(mine, model, layer, batch), read_gram(theirs, model, layer, batch)
                        )
        zoo = lib.zoo()
        assert zoo.rows == models and zoo.values.shape == (2, 2) and np.isfinite(zoo.values).all()
        assert np.array_equal(zoo.values, vitsee.open(tmp_path / "cli.h5").zoo().values)
        with pytest.raises(vitsee.VitseeError, match="--memory-budget 'lots' is not a size"):
            vitsee.extract(tmp_path / "x.h5", [VIT], **EXTRACT, grams=True, memory_budget="lots", progress=False)

    def test_extract_without_models_resumes_the_recorded_run(self, tmp_path):
        path = tmp_path / "run.h5"
        vitsee.extract(path, [VIT], **EXTRACT, progress=False)
        again = vitsee.extract(path, progress=False)  # complete: nothing to do
        assert again.models == [VIT] and again.info()["complete"]
        with pytest.raises(vitsee.VitseeError, match="--n-images"):
            vitsee.extract(path, n_images=16, progress=False)  # contradicts the record, as the CLI says

    def test_extract_draws_a_bar_and_names_the_plan(self, tmp_path, capsys):
        vitsee.extract(tmp_path / "run.h5", [VIT], **EXTRACT)
        err = capsys.readouterr()
        assert "extract" in err.err and "8/8" in err.err and "expected size on disk" in err.out + err.err

    @pytest.mark.parametrize("case", ["unknown model", "existing store", "too few images", "bad dtype"])
    def test_a_bad_run_is_the_line_vitsee_extract_prints(self, case, tmp_path, capsys):
        path = tmp_path / "run.h5"
        models, options, cli = [VIT], dict(EXTRACT), []
        if case == "unknown model":
            models = ["no_such_model@random"]
        elif case == "existing store":
            path.write_bytes(b"keep")
        elif case == "too few images":
            options["n_images"], cli = 2, ["-n", "2"]
        else:
            options["dtype"], cli = "float8", ["--dtype", "float8"]
        with pytest.raises(vitsee.VitseeError) as caught:
            vitsee.extract(path, models, **options, progress=False)
        code, _, err = run_cli(["extract", path, "-m", models[0], *EXTRACT_CLI, *cli], capsys)
        assert code == 2 and err.strip() == f"error: {caught.value}"
        assert case != "existing store" or path.read_bytes() == b"keep"


class TestTrain:
    def test_train_writes_the_weights_vitsee_train_writes(self, tmp_path, capsys):
        out = vitsee.train(
            tmp_path / "lib.safetensors", "test_vit", **TRAIN, held_out=tmp_path / "test.npz", progress=False
        )
        assert out == tmp_path / "lib.safetensors" and (tmp_path / "test.npz").exists()
        code, _, err = run_cli(["train", tmp_path / "cli.safetensors", *TRAIN_CLI], capsys)
        assert code == 0, err
        mine, theirs = load_file(out), load_file(tmp_path / "cli.safetensors")
        assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
        store = vitsee.extract(
            tmp_path / "s.h5",
            [f"test_vit@{out}"],
            dataset=f"npz:{tmp_path / 'test.npz'}",
            device="cpu",
            workers=0,
            progress=False,
        )
        assert store.info()["models"][store.models[0]]["weights"]["trained"].startswith("digits (48 images, 1 epochs")

    def test_train_draws_a_bar_per_epoch_and_a_line_when_it_ends(self, tmp_path, capsys):
        vitsee.train(tmp_path / "w.safetensors", "test_vit", **{**TRAIN, "epochs": 2})
        out = capsys.readouterr()
        lines = [line for line in (out.out + out.err).splitlines() if line.startswith("epoch ") and "test acc" in line]
        assert [line.split()[1] for line in lines] == ["1/2", "2/2"]

    @pytest.mark.parametrize("case", ["held-out not npz", "unknown block", "bad model arg"])
    def test_a_bad_run_is_the_line_vitsee_train_prints(self, case, tmp_path, capsys):
        options, cli = dict(TRAIN), []
        if case == "held-out not npz":
            options["held_out"], cli = tmp_path / "test.csv", ["--held-out", tmp_path / "test.csv"]
        elif case == "unknown block":
            options["no_skip"], cli = ["blocks.9"], ["--no-skip", "blocks.9"]
        else:
            options["model_args"], cli = ["patch_size"], ["--model-arg", "patch_size"]
        with pytest.raises(vitsee.VitseeError) as caught:
            vitsee.train(tmp_path / "m.safetensors", "test_vit", **options, progress=False)
        code, _, err = run_cli(["train", tmp_path / "m.safetensors", *TRAIN_CLI, *cli], capsys)
        assert code == 2 and err.strip() == f"error: {caught.value}"
        assert not (tmp_path / "m.safetensors").exists()

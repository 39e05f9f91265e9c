"""Pretrained weights come from the local Hugging Face cache when they are there; nothing is substituted."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import timm
import torch

from vitsee.errors import VitseeError
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.models.load import cached_pretrained_file, list_models, load_model, parse_model_spec
from vitsee.store import Store


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding test_vit.r160_in1k weights that this test made (seed 77)."""
    import huggingface_hub.constants as hub
    from safetensors.torch import save_file

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    torch.manual_seed(77)
    source = timm.create_model("test_vit").eval()
    snapshot = tmp_path / "hub" / "models--timm--test_vit.r160_in1k" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(snapshot / "model.safetensors"))
    (tmp_path / "hub" / "models--timm--test_vit.r160_in1k" / "refs").mkdir()
    (tmp_path / "hub" / "models--timm--test_vit.r160_in1k" / "refs" / "main").write_text("0" * 40)
    return source, snapshot / "model.safetensors"


def test_pretrained_weights_load_from_the_local_hub_cache(hub_cache, tmp_path):
    source, weights = hub_cache
    assert cached_pretrained_file("test_vit.r160_in1k") == str(weights)
    row = next(r for r in list_models("test_vit") if r["name"] == "test_vit.r160_in1k")
    assert row["cached"] and row["family"] == "vit"
    store = tmp_path / "pre.h5"
    run_extraction(
        ExtractConfig(
            store=store, models=["test_vit"], dataset="samples", n_images=4, batch_size=4, device="cpu", workers=0
        )
    )
    with Store.open(store) as s:
        (key,) = s.models
        assert key == "test_vit.r160_in1k"  # the default tag is filled in and recorded
        w = s.model_info(key)["weights"]
        assert w["kind"] == "pretrained" and w["source"] == "timm/test_vit.r160_in1k"
        assert w["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
        x = torch.from_numpy(s.model_input(key))
        with torch.no_grad():
            expected = source.forward_features(x).numpy()
        np.testing.assert_allclose(s.activations(key, "norm"), expected, rtol=3e-3, atol=3e-3)


def test_pretrained_weights_that_are_not_cached_fail_without_fallback(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(VitseeError, match=r"test_vit.r160_in1k are not in the local cache.*@random.*HF_HOME"):
        load_model("test_vit")


def test_random_init_is_seeded_and_recorded():
    a, b, c = load_model("test_resnet@random:5"), load_model("test_resnet@random:5"), load_model("test_resnet@random:6")
    wa, wb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    wc = dict(c.model.named_parameters())
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)
    assert a.weights["kind"] == "random" and a.weights["seed"] == 5 and a.key == "test_resnet@random:5"


def test_spec_parsing():
    spec = parse_model_spec("vit_base_patch16_224.augreg_in21k")
    assert (spec.name, spec.tag, spec.weights) == ("vit_base_patch16_224", "augreg_in21k", "pretrained")
    assert parse_model_spec("resnet18@random").seed == 0
    assert parse_model_spec("resnet18@random:42").key == "resnet18@random:42"


def test_vit_built_small_reports_the_size_it_was_built_for():
    loaded = load_model("vit_tiny_patch16_224@random", img_size=32)
    assert loaded.data_config["input_size"] == (3, 32, 32)  # timm's resolve_model_data_config says 224
    assert loaded.grid_size == (2, 2) and loaded.num_prefix_tokens == 1
    cnn = load_model("test_resnet@random", img_size=48)
    assert cnn.data_config["input_size"] == (3, 48, 48) and cnn.family == "resnet"


@pytest.fixture
def silent_hub(tmp_path, monkeypatch):
    """A local server that accepts connections and never answers, set as the Hub endpoint the way HF_ENDPOINT
    sets it (huggingface_hub reads the variable once, at import); yields the list of (connection, time)."""
    import socket
    import threading
    import time

    import huggingface_hub.constants as hub

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append((conn, time.perf_counter()))  # held open, never answered

    threading.Thread(target=accept, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setattr(hub, "ENDPOINT", endpoint)
    monkeypatch.setattr(hub, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("VITSEE_HUB_TIMEOUT", "1")
    yield accepted
    server.close()
    for conn, _ in accepted:
        conn.close()


def test_a_hub_that_accepts_and_stays_silent_is_one_line_after_the_bound(silent_hub, tmp_path, capsys):
    import time

    from conftest import run_cli

    code, _, err = run_cli(
        [
            "extract",
            tmp_path / "s.h5",
            "--model",
            "test_vit",
            "--dataset",
            "digits",
            "--n-images",
            "8",
            "--device",
            "cpu",
            "--workers",
            "0",
            "--quiet",
        ],
        capsys,
    )
    said = time.perf_counter()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "127.0.0.1" in lines[0] and "did not answer within 1 s" in lines[0]
    assert "HF_HUB_OFFLINE=1" in lines[0] and "test_vit.r160_in1k@/path/to/weights.safetensors" in lines[0]
    assert silent_hub, "vitsee never asked the endpoint"
    assert 0.9 < said - silent_hub[0][1] < 3  # the bound and a little: not timm's minutes of retries
    assert not (tmp_path / "s.h5").exists()


def test_the_hub_wait_is_bounded_by_a_positive_number_of_seconds(monkeypatch):
    from vitsee.models.load import HUB_TIMEOUT_S, hub_timeout_s

    monkeypatch.delenv("VITSEE_HUB_TIMEOUT", raising=False)
    assert hub_timeout_s() == HUB_TIMEOUT_S == 30
    monkeypatch.setenv("VITSEE_HUB_TIMEOUT", "2.5")
    assert hub_timeout_s() == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("VITSEE_HUB_TIMEOUT", bad)
        with pytest.raises(VitseeError, match=f"VITSEE_HUB_TIMEOUT='{bad}' is not a positive number of seconds"):
            hub_timeout_s()


def test_a_weights_file_whose_pickle_would_run_code_is_refused_before_it_runs(tmp_path):
    import os

    marker = tmp_path / "ran"

    class Crafted:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "crafted.pth"
    torch.save({"state_dict": Crafted()}, path)
    with pytest.raises(VitseeError, match=r"cannot read weights file .*crafted.pth .*UnpicklingError"):
        load_model(f"test_vit@{path}")
    assert not marker.exists()  # torch.load(weights_only=True) refused the call instead of making it

"""Compute threads: the cores this process may use, less those other processes keep busy."""

import pytest
import torch

from vitsee import threads
from vitsee.errors import VitseeError
from vitsee.threads import compute_threads, set_compute_threads


@pytest.fixture
def machine(monkeypatch):
    """Return a function that makes the process see `affinity` CPU ids and per-CPU load percentages `load`."""
    samples = []

    def configure(affinity, load):
        monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(affinity))

        def cpu_percent(interval=None, percpu=False):
            samples.append(interval)
            assert percpu  # one figure per CPU, not the machine's average
            return list(load)

        monkeypatch.setattr(threads.psutil, "cpu_percent", cpu_percent)
        return samples

    return configure


def test_an_idle_machine_gets_one_thread_per_usable_core(machine):
    samples = machine(affinity={0, 1, 2, 3}, load=[3.0, 0.0, 10.0, 1.0])
    assert compute_threads() == 4
    assert samples == [threads.SAMPLE_S]  # it looked at the load over a sample, not a stale average


def test_cores_outside_the_affinity_mask_are_not_counted(machine):
    machine(affinity={2, 5}, load=[0.0] * 8)  # taskset -c 2,5 on an idle 8-core machine
    assert compute_threads() == 2


def test_a_core_busy_with_another_process_is_left_to_it(machine):
    machine(affinity={0, 1}, load=[100.0, 4.0])
    assert compute_threads() == 1
    machine(affinity={0, 1, 2, 3}, load=[99.0, 2.0, 60.0, 49.0])  # 49% is not busy enough to give up
    assert compute_threads() == 2


def test_busy_cores_outside_the_mask_do_not_cost_threads(machine):
    machine(affinity={0, 1}, load=[0.0, 0.0, 100.0, 100.0])
    assert compute_threads() == 2


def test_every_core_busy_still_leaves_one_thread(machine):
    machine(affinity={0, 1}, load=[100.0, 100.0])
    assert compute_threads() == 1


def test_a_requested_count_overrides_the_choice_without_sampling(machine):
    samples = machine(affinity={0, 1}, load=[100.0, 100.0])
    assert compute_threads(3) == 3
    assert samples == []


@pytest.mark.parametrize("requested", [0, -2])
def test_fewer_than_one_thread_is_a_user_error(requested):
    with pytest.raises(VitseeError, match=rf"--threads {requested} must be at least 1"):
        compute_threads(requested)


def test_set_compute_threads_sets_torch(machine):
    machine(affinity={0, 1, 2}, load=[100.0, 0.0, 0.0])
    before = torch.get_num_threads()
    try:
        assert set_compute_threads() == 2
        assert torch.get_num_threads() == 2
        assert set_compute_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_real_machine_gives_between_one_and_its_usable_cores():
    assert 1 <= compute_threads(sample_s=0.05) <= len(threads.usable_cpus())


def test_analyze_takes_threads_and_refuses_zero_in_one_line(tiny_store, tmp_path, capsys):
    import shutil

    from conftest import run_cli

    store = tmp_path / "copy.h5"  # the shared store stays without cached results
    shutil.copy(tiny_store, store)
    before = torch.get_num_threads()
    try:
        code, _, err = run_cli(["analyze", store, "--skip", "--threads", "0", "-q"], capsys)
        assert (
            code == 2
            and err.strip().startswith("error: --threads 0 must be at least 1")
            and len(err.strip().splitlines()) == 1
        )
        code, _, _ = run_cli(["analyze", store, "--skip", "--threads", "1", "-q"], capsys)
        assert code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_task_workers_count_every_usable_core_busy_or_not_unless_threads_are_asked_for(machine, monkeypatch):
    monkeypatch.setattr(threads, "_TASK_WORKERS", [])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert threads.task_workers() == 3  # never set: torch's threads
        machine(affinity={0, 1, 2}, load=[100.0, 0.0, 0.0])
        assert set_compute_threads() == 2 and threads.task_workers() == 3  # the busy core takes what it can
        assert set_compute_threads(1) == 1 and threads.task_workers() == 1  # --threads 1: one of each
    finally:
        torch.set_num_threads(before)


def _cached_arrays(store) -> dict:
    """Returns {analysis/id/array: values} of every cached result of a store, read with h5py."""
    import h5py
    import numpy as np

    out = {}
    for p in sorted((store.parent / (store.name + ".d") / "results").rglob("*.h5")):
        with h5py.File(p, "r") as f:
            f.visititems(
                lambda name, obj: (
                    out.__setitem__(f"{p.parent.name}/{p.stem}/{name}", np.asarray(obj[()]))
                    if isinstance(obj, h5py.Dataset)
                    else None
                )
            )
    return out


def test_a_rerun_with_another_thread_count_caches_the_same_arrays_bit_for_bit(tiny_store, tmp_path, capsys):
    """CKA (with its bootstrap and permutation null) and the spatial maps: the pair products summed in another
    order on two of torch's threads (up to 7.8e-15 apart); every product now runs on one thread each."""
    from conftest import run_cli
    from vitsee.store import copy_store

    before = torch.get_num_threads()
    arrays = {}
    try:
        for n in (1, 2, 3):
            store = copy_store(tiny_store, tmp_path / f"threads-{n}.h5")
            code, _, err = run_cli(["analyze", store, "--cka", "--spatial", "--threads", str(n), "-q"], capsys)
            assert code == 0, err
            arrays[n] = _cached_arrays(store)
    finally:
        torch.set_num_threads(before)
    assert arrays[1].keys() == arrays[2].keys() == arrays[3].keys() and len(arrays[1]) > 10
    for name, value in arrays[1].items():
        if "cka/" in name or "spatial/" in name:
            for n in (2, 3):
                other = arrays[n][name]
                same = (
                    value.tolist() == other.tolist() if value.dtype.kind == "O" else value.tobytes() == other.tobytes()
                )
                assert value.dtype == other.dtype and value.shape == other.shape and same, (name, n)

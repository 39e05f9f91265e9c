"""How many CPU threads torch computes with: the cores this process may use that nobody else is using.

torch starts one intra-op thread per core of the machine. On a shared machine (a login node, a laptop, CI)
some cores are busy with other processes, and torch's threads then wait on each other at every parallel
region: all-pairs CKA that takes 0.39 s with one thread took 2.6-4.7 s with two while another process kept one
of the two cores busy (issue 10). So a run starts with as many threads as cores are free: the cores in this
process's affinity mask (taskset, cgroups, Slurm) less those another process kept busy over a short sample.
Work that splits into independent tasks (a CKA batch's layer Grams, the probes' layer fits) runs them on
`task_workers()` threads instead, one torch thread each, busy cores included: a worker takes the next task when
it comes free, so a busy core costs only what it cannot give.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

from vitsee.errors import VitseeError

SAMPLE_S = 0.2  # long enough to see a spinning neighbour, short enough not to delay a run
BUSY_PERCENT = 50.0  # a core this loaded over the sample is taken


def usable_cpus() -> list[int]:
    """Return the ids of the CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return list(range(os.cpu_count() or 1))


def busy_cpus(cpus: list[int], sample_s: float = SAMPLE_S) -> list[int]:
    """Return those of `cpus` that were at least BUSY_PERCENT loaded over the next sample_s seconds."""
    load = psutil.cpu_percent(interval=sample_s, percpu=True)  # one entry per CPU id
    return [cpu for cpu in cpus if cpu < len(load) and load[cpu] >= BUSY_PERCENT]


def compute_threads(requested: int | None = None, sample_s: float = SAMPLE_S) -> int:
    """Return the number of compute threads for a run: `requested`, else the usable cores that are free (>= 1)."""
    if requested is not None:
        if requested < 1:
            raise VitseeError(f"--threads {requested} must be at least 1; leave it out to use the free cores")
        return int(requested)
    cpus = usable_cpus()
    return max(1, len(cpus) - len(busy_cpus(cpus, sample_s)))


def set_compute_threads(requested: int | None = None) -> int:
    """Return the number of threads torch now computes with, after setting it by `compute_threads` (and the
    number of task workers, see task_workers)."""
    threads = compute_threads(requested)
    torch.set_num_threads(threads)
    _TASK_WORKERS[:] = [threads if requested is not None else len(usable_cpus())]
    return threads


_TASK_WORKERS: list[int] = []  # set by set_compute_threads


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with n torch threads, then restore the count (torch's setting is process-wide)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def task_workers() -> int:
    """Return how many independent tasks to run at once on CPU, one torch thread each (a CKA batch's layer
    Grams, the probes' layer fits): after set_compute_threads without a request, every usable core, busy or
    not; after --threads N, N; where set_compute_threads was never called, torch's thread count.

    Unlike torch's threads, which split each product evenly and then wait for the slowest, workers take the next
    task as they come free: one sharing a core with another process just takes fewer, and only the last task
    of a batch waits for it. With one of 2 cores busy, all-pairs CKA took 2.85 s this way against 3.67 s on
    the one free core and 4.91 s with torch's 2 threads (benchmarks/cka.py --busy-core).
    """
    return _TASK_WORKERS[0] if _TASK_WORKERS else torch.get_num_threads()

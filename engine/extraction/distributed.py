"""torchrun: one process per device, each with its share of the work, and results that do not depend on how
many processes there were.

`torchrun --nproc-per-node G [--nnodes N ...] --no-python vitsee extract|analyze ...` starts G x N copies of
the command with WORLD_SIZE / RANK / LOCAL_RANK set. The CLI notices (extraction and the analyses themselves never
import this module) and calls `extract_sharded` or `analyze_sharded`:
- extract: rank r takes a contiguous range of whole batches (batches are cut from the run's images by global
  index, so a batch holds the same images for any number of processes) and extracts it into its own shard,
  STORE.shards/rank-0000r-of-0000W.h5, a store of the same layout over its rows, resumable like any store.
  Once every rank is done, rank 0 checks every shard is complete and stitches them into STORE with HDF5
  virtual datasets (`shards.stitch`);
- analyze: the CKA batches are dealt out round-robin, each rank accumulates its share, the per-shuffle HSIC
  sums are summed with one all_reduce and rank 0 caches the result; the other analyses run on rank 0.
The store and its shards must be on a file system every node sees. Processes talk over NCCL on CUDA and
gloo on CPU.
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from vitsee.errors import VitseeError


@dataclass(frozen=True)
class Rank:
    """Where this process sits in a torchrun launch."""

    rank: int
    world: int
    local_rank: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def current() -> Rank | None:
    """Returns this process's place in a torchrun launch of more than one process, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    try:
        return Rank(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    except (KeyError, ValueError):
        raise VitseeError(
            f"WORLD_SIZE={world} but RANK/LOCAL_RANK are not set: "
            "launch with torchrun (or set them), or unset WORLD_SIZE"
        ) from None


def is_secondary() -> bool:
    """True in every torchrun process but rank 0 (they stay quiet; rank 0 reports)."""
    rank = current()
    return rank is not None and not rank.main


def rank_device(rank: Rank, name: str) -> str:
    """Returns the device a rank uses: its own GPU (cuda:LOCAL_RANK) for auto/cuda, else what was asked."""
    if name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{rank.local_rank}"
    if name == "cuda":
        raise VitseeError("--device cuda but no CUDA GPU is visible to torch: use --device cpu (or auto)")
    return "cpu" if name == "auto" else name


def init(rank: Rank, device: str) -> None:
    """Joins the process group (NCCL for CUDA, gloo for CPU) unless already in one."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(device))
    try:
        dist.init_process_group(backend, rank=rank.rank, world_size=rank.world, timeout=timedelta(hours=2))
    except ValueError as exc:  # MASTER_ADDR / MASTER_PORT missing
        raise VitseeError(
            f"cannot join the torchrun process group ({exc}): launch with torchrun, which sets them"
        ) from exc


def shutdown() -> None:
    """Leaves the process group and frees it now, while Python is fully alive.

    destroy_process_group drops the group, but the gloo worker threads live until the group object is
    collected; left to the collection at interpreter exit, a worker still releasing a finished
    collective's tensors finds the interpreter gone and the process aborts after its work is done.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


def agree(error: BaseException | None, what: str) -> None:
    """Raises on every rank if any rank failed at `what` (naming them), so no rank waits for a dead one.

    Every rank must call it at the same point; the failing ranks re-raise their own error.
    """
    outcomes = gather(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [(r, msg) for r, msg in enumerate(outcomes) if msg is not None]
    if failed:
        r, msg = failed[0]
        raise VitseeError(
            f"{what} failed on rank{'s' if len(failed) > 1 else ''} {', '.join(str(f[0]) for f in failed)} "
            f"(rank {r}: {msg}): fix it and rerun the same torchrun command"
        )


def gather(value) -> list:
    """Returns every rank's value (any picklable object), in rank order."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sums a tensor over all ranks, in place, and returns it."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


# --- extract ----------------------------------------------------------------------------------------


def batch_range(n_batches: int, rank: Rank) -> tuple[int, int]:
    """Returns rank's contiguous share [first, stop) of n_batches, sizes differing by at most one."""
    return n_batches * rank.rank // rank.world, n_batches * (rank.rank + 1) // rank.world


def shard_path(store: Path, rank: int, world: int) -> Path:
    """Returns where a rank's shard of the store lives: STORE.shards/rank-0000r-of-0000W.h5."""
    store = Path(store)
    return store.with_name(store.name + ".shards") / f"rank-{rank:05d}-of-{world:05d}.h5"


def extract_sharded(cfg, progress=None, cancel: threading.Event | None = None):
    """Runs this rank's share of an extraction into its shard; rank 0 then stitches the store."""
    from vitsee.extraction import shards
    from vitsee.data import open_dataset, select_indices
    from vitsee.extraction.extract import run_extraction
    from vitsee.extraction.plan import ExtractResult, Shard

    rank = current()
    assert rank is not None
    device = rank_device(rank, cfg.device)
    init(rank, device)
    try:
        store = Path(cfg.store)
        error: BaseException | None = None
        try:
            n = len(select_indices(len(open_dataset(cfg.dataset)), cfg.n_images, cfg.shuffle_seed))
            n_batches = -(-n // cfg.batch_size)
            if n_batches < rank.world:
                raise VitseeError(
                    f"{n} images in batches of {cfg.batch_size} make {n_batches} batch(es) for {rank.world} processes: "
                    "use a smaller --batch-size or fewer processes"
                )
            todo = shards.models_to_extract(cfg)
            first, stop = batch_range(n_batches, rank)
            shard = Shard(
                rank.rank,
                rank.world,
                first,
                stop,
                first * cfg.batch_size,
                min(stop * cfg.batch_size, n),
                run_id=shards.run_id(cfg, rank.world),
            )
        except BaseException as exc:
            error = exc
        agree(error, "planning the extraction")
        if not todo:
            return ExtractResult(store, [], 0, 0.0, 0, messages=[f"{store}: every model is already extracted"])
        path = shard_path(store, rank.rank, rank.world)
        result, error = None, None
        try:
            path.parent.mkdir(exist_ok=True)
            sub = replace(cfg, store=path, models=todo, device=device, shard=shard)
            result = run_extraction(sub, progress if rank.main else None, cancel)
        except BaseException as exc:
            error = exc
        agree(error, f"extracting {path.name}")
        if any(gather(result.cancelled)):  # the finished shards wait for the rerun to complete the rest
            return replace(result, store=store, cancelled=True)
        error = None
        if rank.main:
            try:
                shards.stitch(store, [shard_path(store, r, rank.world) for r in range(rank.world)], cfg, todo)
            except BaseException as exc:
                error = exc
        agree(error, f"stitching {store.name}")
        counts = gather((result.images_processed, result.bytes_written, result.seconds))
        return replace(
            result,
            store=store,
            models=todo,
            images_processed=sum(c[0] for c in counts),
            bytes_written=sum(c[1] for c in counts),
            seconds=max(c[2] for c in counts),
        )
    finally:
        shutdown()


def analyze_sharded(path, which, cfg, progress=None) -> list[str]:
    """Under torchrun: every rank accumulates its share of the CKA batches, the HSIC sums are all-reduced
    and rank 0 caches the result, then runs the rest as one process would (the CKA is cached by then)."""
    from vitsee.analyses.base import check_ready, save_result
    from vitsee.analyses.cka import LinearCKA, cka_params, compute_cka, finish_cka
    from vitsee.analyses.driver import check_names, run_analyses
    from vitsee.store import Store

    check_names(which)
    cka = LinearCKA.name  # the one analysis shared out: its minibatches
    rank = current()
    assert rank is not None
    device = rank_device(rank, cfg.device)
    init(rank, device)
    try:
        cfg = replace(cfg, device=device)
        store, compute, params, error = None, False, {}, None
        try:
            store = Store.writer(path) if rank.main else Store.open(path)
            check_ready(store, store.models)
            params = cka_params(store, cfg)
            compute = (
                (which is None or cka in which)
                and not store.streaming
                and (cfg.recompute or store.get_result(cka, params) is None)
            )
        except BaseException as exc:
            error = exc
        try:
            agree(error, f"opening {path}")
            if compute:
                out = compute_cka(
                    store, params, torch.device(device), progress if rank.main else None, share=(rank.rank, rank.world)
                )  # batches dealt out round-robin
                states = all_reduce_sum(out["states"])
                if rank.main:
                    save_result(store, cka, params, finish_cka(states, out["columns"], params))
        finally:
            if store is not None:
                store.close()
        if not rank.main:
            return [cka] if compute else []
        return run_analyses(path, which, cfg, progress)
    finally:
        shutdown()

"""A training checkpoint that is data only: tensors in a safetensors file, everything else plain JSON beside them.

A pickle can run any code when it is read (`torch.load(..., weights_only=False)` of a crafted OUT.ckpt ran a shell
command), so a checkpoint holds no pickle. `write` walks the run's state (model, optimiser, scheduler, RNG states,
history: nested dicts, lists and tuples of numbers, strings, tensors and numpy arrays) and stores:
- every tensor under a name of its own in the safetensors file (a header of JSON, then raw bytes);
- the rest as one JSON document in the file's metadata under STATE_KEY, each tensor replaced by {"tensor": NAME},
  and what JSON has no word for tagged: {"tuple": [...]} (Python's RNG state is one), {"items": [[key, value],
  ...]} for a dict whose keys are not all strings (the optimiser's state is keyed by parameter number),
  {"dict": {...}} for the others, {"ndarray": {"dtype", "shape", "data"}} for numpy's (NumPy's RNG state);
- the sha256 of the tensors under DIGEST_KEY, checked on reading: a checkpoint damaged on disk is refused, never
  resumed from with a changed weight.
`read` rebuilds exactly that state and nothing else: a JSON value becomes a number, a string, a list, a tuple, a
dict or a tensor named in the file; any other tag, a missing tensor or a file that is not this format is a
VitseeError saying to delete the checkpoint (training then starts over). A checkpoint of the old pickle format is
recognised by its first bytes and refused the same way, never unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitsee.errors import VitseeError, brief

FORMAT = "vitsee-checkpoint-1"
STATE_KEY = "vitsee_checkpoint"
DIGEST_KEY = "sha256"  # of the tensors (tensors_digest)
MAX_DEPTH = 64  # the run's state nests 6 deep; a crafted document nested deeper is refused, not recursed into
# first bytes of what torch.save writes (a zip archive) and of a bare pickle (protocol 2-5 opcode): the old format
PICKLE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def write(state: dict, path: str | Path) -> None:
    """Writes state (see the module) to path as a safetensors file with the rest of it as JSON metadata."""
    tensors: dict[str, torch.Tensor] = {}
    document = _encode(state, "", tensors)
    metadata = {
        "format": FORMAT,
        STATE_KEY: json.dumps(document, allow_nan=True, separators=(",", ":")),
        DIGEST_KEY: tensors_digest(tensors),
    }
    save_tensors(tensors, path, metadata)


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """Returns the sha256 of the tensors' names, dtypes, shapes and bytes in name order: a checkpoint keeps it, so a
    flipped byte of a weight is found on resume (safetensors checks only that the file covers its header)."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str]) -> None:
    """Writes tensors and metadata to path as a safetensors file, into path itself: safetensors' save_file writes a
    temporary of its own beside path (`.tmpXXXXXX`), which a kill leaves behind and nothing would remove; the
    callers write path under a temporary name of theirs that the next run removes (train.remove_dead_temporaries)."""
    from safetensors.torch import save

    data = save(tensors, metadata=metadata)  # the file's bytes: one copy of the tensors in memory while written
    with open(path, "wb") as fh:
        fh.write(data)


def read(path: str | Path) -> dict:
    """Returns the state a checkpoint holds (tensors on the CPU); a VitseeError naming the way out for any file that
    is not a whole checkpoint of this format (nothing in it is ever run)."""
    from safetensors import safe_open

    path = Path(path)
    way_out = f"delete it (`rm {path}`): training then starts over"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise VitseeError(f"cannot read checkpoint {path} ({brief(exc)}): {way_out}") from None
    if head.startswith(PICKLE_MAGIC):
        raise VitseeError(
            f"checkpoint {path} is a pickle (the format of vitsee before it refused to unpickle, which can run code): "
            f"it is not read; {way_out}"
        )
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            if metadata.get("format") != FORMAT or STATE_KEY not in metadata:
                raise ValueError(f"no {FORMAT} record in its metadata")
            tensors = {name: f.get_tensor(name) for name in f.keys()}
            if metadata.get(DIGEST_KEY) != tensors_digest(tensors):
                raise ValueError("its tensors are not those it was written with (their sha256 differs)")
            document = json.loads(metadata[STATE_KEY])
            return _decode(document, lambda name: _tensor(tensors, name), 0)
    except VitseeError:
        raise
    except Exception as exc:  # whatever a damaged or crafted file makes a parser raise
        raise VitseeError(f"checkpoint {path} is damaged or not vitsee's ({brief(exc)}): {way_out}") from None


def _tensor(tensors: dict[str, torch.Tensor], name: Any) -> torch.Tensor:
    if not isinstance(name, str) or name not in tensors:
        raise ValueError(f"it names a tensor {str(name)[:40]!r} it does not hold")
    return tensors[name]


def _encode(value: Any, where: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Returns value as JSON, its tensors moved into `tensors` under their path in the state."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        name = where or "tensor"
        if name in tensors:  # paths are unique; a clash would lose a tensor
            raise ValueError(f"two tensors at {name}")
        tensors[name] = value.detach().to("cpu").contiguous().clone()  # clone: safetensors refuses shared storage
        return {"tensor": name}
    if isinstance(value, np.ndarray):
        return {"ndarray": {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return [_encode(v, f"{where}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, f"{where}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"dict": {k: _encode(v, f"{where}.{k}" if where else k, tensors) for k, v in value.items()}}
        return {
            "items": [[_encode(k, "", {}), _encode(v, f"{where}.{k}", tensors)] for k, v in value.items()]
        }  # keys are numbers here (the optimiser's parameter indices), never tensors
    raise TypeError(f"a checkpoint holds tensors and plain data, not {type(value).__name__} (at {where or 'top'})")


def _decode(value: Any, tensor, depth: int) -> Any:
    """Returns the state a JSON document encodes (see `_encode`); a ValueError for anything else."""
    if depth > MAX_DEPTH:
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, tensor, depth + 1) for v in value]
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"unknown value {str(value)[:40]!r}")
    ((tag, body),) = value.items()
    if tag == "tensor":
        return tensor(body)
    if tag == "tuple" and isinstance(body, list):
        return tuple(_decode(v, tensor, depth + 1) for v in body)
    if tag == "dict" and isinstance(body, dict):
        return {k: _decode(v, tensor, depth + 1) for k, v in body.items()}
    if tag == "items" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
        out = {}
        for k, v in body:
            if not isinstance(k, (int, float, str, bool)) and k is not None:
                raise ValueError("a dict key that is not a number or a string")
            out[k] = _decode(v, tensor, depth + 1)
        return out
    if tag == "ndarray" and isinstance(body, dict):
        dtype = np.dtype(str(body.get("dtype")))
        if dtype.kind not in "biuf":  # numbers only: an object dtype would be a way back to Python objects
            raise ValueError(f"an array of {dtype}")
        return np.asarray(body.get("data"), dtype=dtype).reshape([int(s) for s in body.get("shape")])
    raise ValueError(f"unknown value tagged {str(tag)[:40]!r}")

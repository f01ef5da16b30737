"""Moving payloads between processes: large arrays through shared memory, not pickled pipes.

``pack`` replaces every numpy array of at least ``SHM_THRESHOLD`` bytes inside a payload (nested
dicts, lists, tuples and dataclasses such as ``contract.options.RequestInput``) with a ``ShmRef``
to a fresh POSIX shared-memory segment; the pickled message stays small. The receiver's
``unpack`` copies the data out. The coordinator sees every message (it routes them) and owns
the segments' lifetime: it unlinks a request's segments when the request finishes, fails or is
aborted.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, fields, is_dataclass, replace
from multiprocessing import shared_memory
from typing import Any

import numpy as np

SHM_THRESHOLD = 16 * 1024  # bytes; smaller arrays are cheaper to pickle
_prefix = "omni"


def set_prefix(prefix: str) -> None:
    """Name segments ``<prefix>_<random>`` so one engine can find (and sweep) its own."""
    global _prefix
    _prefix = prefix


@dataclass(frozen=True, slots=True)
class ShmRef:
    name: str
    shape: tuple[int, ...]
    dtype: str


def _to_shm(arr: np.ndarray, prefix: str) -> ShmRef:
    arr = np.ascontiguousarray(arr)
    name = f"{prefix}_{secrets.token_hex(8)}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(arr.nbytes, 1))
    try:
        np.ndarray(arr.shape, arr.dtype, buffer=shm.buf)[...] = arr
    finally:
        shm.close()
    return ShmRef(name, tuple(arr.shape), arr.dtype.str)


def _from_shm(ref: ShmRef, unlink: bool) -> np.ndarray:
    shm = shared_memory.SharedMemory(name=ref.name)
    try:
        out = np.ndarray(ref.shape, np.dtype(ref.dtype), buffer=shm.buf).copy()
    finally:
        shm.close()
        if unlink:
            shm.unlink()
    return out


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__ == "torch" and type(obj).__name__ == "Tensor"


def _tensor_to_numpy(t: Any) -> np.ndarray:
    """Torch tensors travel as arrays (no torch pickling); bfloat16, which numpy lacks, as
    float32 (exact). The receiver casts to its own device and dtype."""
    t = t.detach()
    if t.is_floating_point() and t.element_size() == 2 and str(t.dtype) != "torch.float16":
        t = t.float()
    return t.cpu().numpy()


def nbytes(obj: Any) -> int:
    """Bytes of the arrays and tensors inside a payload (nested dicts, lists, tuples and
    dataclasses, as ``pack`` walks them)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if _is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(nbytes(v) for v in obj)
    if is_dataclass(obj) and not isinstance(obj, type):
        return sum(nbytes(getattr(obj, f.name)) for f in fields(obj))
    return 0


def pack(obj: Any, prefix: str | None = None) -> Any:
    prefix = prefix or _prefix
    if _is_tensor(obj):
        obj = _tensor_to_numpy(obj)
    if isinstance(obj, np.ndarray):
        return _to_shm(obj, prefix) if obj.nbytes >= SHM_THRESHOLD else obj
    if isinstance(obj, dict):
        return {k: pack(v, prefix) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(pack(v, prefix) for v in obj)
    if is_dataclass(obj) and not isinstance(obj, type):
        return replace(obj, **{f.name: pack(getattr(obj, f.name), prefix) for f in fields(obj)})
    return obj


def unpack(obj: Any, unlink: bool = False) -> Any:
    """Copy shared arrays back into the payload. Segments are unlinked by their owner (the
    coordinator, at the end of the request) unless ``unlink``: one payload may go to several
    stages."""
    if isinstance(obj, ShmRef):
        return _from_shm(obj, unlink)
    if isinstance(obj, dict):
        return {k: unpack(v, unlink) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(unpack(v, unlink) for v in obj)
    if is_dataclass(obj) and not isinstance(obj, type):
        return replace(obj, **{f.name: unpack(getattr(obj, f.name), unlink) for f in fields(obj)})
    return obj


def refs(obj: Any, out: list[str] | None = None) -> list[str]:
    """Names of the shared-memory segments a payload points at."""
    out = [] if out is None else out
    if isinstance(obj, ShmRef):
        out.append(obj.name)
    elif isinstance(obj, dict):
        for v in obj.values():
            refs(v, out)
    elif isinstance(obj, list | tuple):
        for v in obj:
            refs(v, out)
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            refs(getattr(obj, f.name), out)
    return out


def release(names: list[str] | set[str]) -> None:
    """Unlink segments whose receiver never read them (abort, failure); already gone is fine."""
    for name in names:
        try:
            shm = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            continue
        shm.close()
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()


def sweep(prefix: str) -> int:
    """Unlink every segment named ``<prefix>_*`` (after stage processes died or stopped)."""
    import os

    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith(prefix + "_")]
    except OSError:
        return 0
    release(names)
    return len(names)

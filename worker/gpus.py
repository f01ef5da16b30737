"""What GPUs this node has: NVML first, then torch, else none (CPU only).

Returns ``(name, total_bytes)`` per GPU in node-local index order, restricted to
``CUDA_VISIBLE_DEVICES`` when it is set, so the planner sees what the worker may use.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence

log = logging.getLogger(__name__)

GpuInfo = tuple[str, int]


def _visible(indices: Sequence[int]) -> list[int]:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(indices)
    wanted: list[int] = []
    for item in raw.split(","):
        item = item.strip()
        if item.isdigit() and int(item) in indices:
            wanted.append(int(item))
        elif item:
            # UUIDs or MIG ids: NVML numbering no longer applies; trust torch instead.
            raise LookupError(f"CUDA_VISIBLE_DEVICES entry {item!r} is not an index")
    return wanted


def from_nvml() -> list[GpuInfo] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: not an error on a CPU host
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        found: list[GpuInfo] = []
        for index in _visible(range(count)):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            found.append((str(name), int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return found
    except LookupError as exc:
        log.debug("NVML: %s", exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def from_torch() -> list[GpuInfo] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return [
        (torch.cuda.get_device_name(i), int(torch.cuda.get_device_properties(i).total_memory))
        for i in range(torch.cuda.device_count())
    ]


def detect() -> tuple[list[GpuInfo], str]:
    """The node's GPUs and which method found them ("nvml", "torch" or "none")."""
    found = from_nvml()
    if found:
        return found, "nvml"
    found = from_torch()
    if found:
        return found, "torch"
    return [], "none"

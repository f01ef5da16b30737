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


# The oldest Linux driver of each CUDA major version torch can be built for (NVIDIA's CUDA
# toolkit release notes, "CUDA Toolkit and Minimum Required Driver Version"): a torch built for
# CUDA 13 needs an R580 driver, as the GPU lock's SGLang 0.5.23 stack is (docs/install.md)
DRIVER_FLOOR = {12: "525.60.13", 13: "580.65.06"}
GPU_LOCK = "deploy/gpu/uv.lock (uv sync --frozen --project deploy/gpu)"

_PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                  "available": available, "count": count,
                  "warning": " ".join(str(w.message) for w in caught)}))
"""


def cuda_problem(needed: int) -> str | None:
    """Why torch in this environment cannot use the ``needed`` GPUs a plan placed stages on,
    or None when it can. Asked of a short child process: CUDA initialised in the worker's own
    process would be inherited, broken, by the stage processes it forks."""
    import json
    import subprocess
    import sys

    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
        )
        probe = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return f"torch could not be asked about CUDA: {exc}"
    if probe["available"] and probe["count"] >= needed:
        return None
    driver, driver_cuda = _driver()
    return explain_cuda(probe["torch"], probe["cuda"], probe["count"], needed, driver,
                        driver_cuda, probe["warning"])  # fmt: skip


def _driver() -> tuple[str | None, int | None]:
    """The NVIDIA driver's version and the newest CUDA it supports (e.g. 12020 for 12.2)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None, None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return (version.decode() if isinstance(version, bytes) else str(version)), cuda
    except Exception:
        return None, None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def explain_cuda(
    torch_version: str,
    torch_cuda: str | None,
    visible: int,
    needed: int,
    driver: str | None,
    driver_cuda: int | None,
    warning: str = "",
) -> str:
    """The worker's start-up error when torch cannot use the GPUs its plan needs: the driver
    found, the driver needed, the lock to install."""
    head = f"the plan places stages on {needed} GPU(s), but torch {torch_version} "
    if torch_cuda is None:
        return (
            head + "is a CPU build (this environment was installed from uv.lock, the CPU "
            f"hosts' lock). A GPU host installs {GPU_LOCK}; or run this node's stages on the "
            "CPU: --gpus cpu"
        )
    major = int(torch_cuda.split(".")[0])
    floor = DRIVER_FLOOR.get(major, f"one for CUDA {major}")
    found = "no NVIDIA driver was found (NVML)" if driver is None else f"the driver is {driver}"
    if driver_cuda is not None:
        found += f", which supports CUDA up to {driver_cuda // 1000}.{driver_cuda % 1000 // 10}"
    too_old = driver_cuda is not None and driver_cuda // 1000 < major
    if too_old or driver is None:
        why = (
            f"is built for CUDA {torch_cuda}, which needs driver {floor} or newer: {found}. "
            f"Upgrade the driver (R{floor.split('.')[0]}+), or on a data-center GPU install "
            f"NVIDIA's forward-compatibility package cuda-compat-{major}-0 and put its "
            f"libraries first (LD_LIBRARY_PATH=/usr/local/cuda-{major}.0/compat). The lock: "
            f"{GPU_LOCK}; docs/install.md, GPU hosts"
        )
    else:
        why = (
            f"(CUDA {torch_cuda}) sees {visible} GPU(s); {found}. Check CUDA_VISIBLE_DEVICES "
            "and that the GPUs are not held in exclusive mode by another process"
        )
    return head + why + (f" (torch: {warning.strip()})" if warning.strip() else "")

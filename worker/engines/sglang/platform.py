"""The out-of-tree SGLang platform that runs SGLang's engine on a CPU without ``sgl_kernel``.

SGLang's own CPU platform (``SGLANG_USE_CPU_ENGINE=1``) needs ``sgl_kernel``'s CPU build, which
needs AVX512/AMX (it fails at import, ``kernels/ops/kvcache/cache_move.py:10`` in 0.5.23); without
any platform the rotary embedding reaches for ``vllm._custom_ops``
(``layers/rotary_embedding/base.py:122-140``). This platform declares the CPU as an
out-of-tree device with SGLang's torch-native paths: ``torch_native`` attention, the ``native``
dispatch key (layers take their ``forward_native``: MoE, norms, rope), the pytorch sampling
backend, no graphs, no triton kernels, no pynccl. The scheduler, KV pool, radix cache, chunked
prefill, sampler and grammar backend are SGLang's, unchanged, as on a GPU host; the attention
over the pool and the decoder stack's per-step body are not: the vendor layer's CPU replacements
(``cpu_attention.py``, ``cpu_stack.py``, each citing the SGLang code it stands in for) run
there, where a GPU host runs SGLang's kernels, model classes and CUDA graphs.

It is found through the ``sglang.srt.platforms`` entry point (pyproject.toml); ``activate``
returns None on a CUDA host, where SGLang's CUDA platform and kernels apply.
"""

from __future__ import annotations

from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform


class OmniCpuPlatform(CpuDeviceMixin, SRTPlatform):
    _enum = PlatformEnum.OOT
    capabilities = PlatformCapabilities()  # no triton, graphs, piecewise graphs or pynccl

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_dispatch_key_name(self) -> str:
        return "native"

    def is_pin_memory_available(self, device: object = None) -> bool:
        return False


def activate() -> str | None:
    """The entry point SGLang calls: this platform where no GPU is, else none."""
    import torch

    if torch.cuda.is_available():
        return None
    return f"{__name__}.OmniCpuPlatform"

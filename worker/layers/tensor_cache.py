"""A bounded map of tensors kept in host memory, least recently used out first: what a stage
keeps so as not to compute it again (the Qwen3-Omni encoders' outputs per clip or image, the
thinker's hidden states at the media runs of spoken replies' prompts). Keys are content
digests, so an entry is never stale, it only ages out; ``hits`` and ``misses`` count lookups
(tests and logs read them)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class TensorCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[bytes, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Any:
        """What was put under ``key`` (a tensor or a tuple of them, on the CPU); None."""
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: Any) -> None:
        """Keep ``value`` (a tensor or a tuple of them, copied to host memory) under ``key``;
        nothing where it alone would exceed the bound."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        size = _nbytes(value)
        if size > self.max_bytes:
            return
        self._entries[key] = _host_copy(value)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= _nbytes(old)


def _nbytes(value: Any) -> int:
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value)
    return int(value.numel() * value.element_size())


def _host_copy(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_host_copy(v) for v in value)
    return value.detach().to("cpu", copy=True)

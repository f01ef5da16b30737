"""What a cloned voice costs to compute, computed once per voice: a bounded LRU in the stage
that computes it (the reference codes in preprocessing, the speaker embedding in the talker's
stage).

Entries are keyed by the voice's content (the sha256 of its stored audio, sent by the speech
API as ``voice_key``), never by its name: a replaced voice has another key, and a deleted one is
refused by the API before any stage runs, so a stale entry is never used; it only waits to be
evicted. ``computed`` and ``hits`` count what the cache did (tests and logs read them)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

VOICE_CACHE_ENTRIES = 256  # a few KB each (codes of seconds of speech, one x-vector)


class VoiceCache:
    def __init__(self, capacity: int = VOICE_CACHE_ENTRIES) -> None:
        if capacity < 1:
            raise ValueError("a voice cache holds at least one voice")
        self.capacity = capacity
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self.computed = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str | None, compute: Callable[[], Any]) -> Any:
        """The cached value of ``key``, or ``compute()`` stored under it (no key: computed and
        not stored, e.g. reference audio that is not an uploaded voice)."""
        if key is not None and key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key]
        value = compute()
        self.computed += 1
        if key is not None:
            self._entries[key] = value
            if len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return value

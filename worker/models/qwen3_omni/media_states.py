"""The thinker's hidden states at the media positions of talker-bound prompts, kept so that a
spoken reply can reuse a cached prefix that holds media.

The talker reads a prompt's audio, image and video positions by the thinker's hidden states at
``accept_hidden_layer``; a prefix served from SGLang's radix cache has none to give. So the
states of each media run of a talker-bound prompt are kept here, keyed by the prompt up to the
run's end (token ids, with each media run's content hash in place of its placeholders, as the
radix cache keys it): a later prompt that starts the same way finds them. Talker-bound prompts
with media share a prefix namespace of their own, so a match only reaches prompts whose runs
were kept; one that finds a run missing (evicted, or its request cancelled before its prompt
was done) is computed again whole. Bounded in bytes, least recently used out first; kept in
host memory.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Any

MediaRun = tuple[int, int, bytes]  # first and last position (inclusive), key


def media_runs(ids: list[int], multimodal: Any) -> list[MediaRun]:
    """Each media run of a prompt (SGLang's ``MultimodalInputs`` items, one run each) with the
    key of the prompt up to its end."""
    keyed = array("q", ids)
    spans = []
    for item in multimodal.mm_items:
        for start, end in item.offsets:
            keyed[start : end + 1] = array("q", [int(item.pad_value)] * (end - start + 1))
            spans.append((start, end))
    runs: list[MediaRun] = []
    h = hashlib.blake2b(digest_size=16)
    at = 0
    for start, end in sorted(spans):
        h.update(keyed[at : end + 1].tobytes())
        at = end + 1
        runs.append((start, end, h.copy().digest()))
    return runs


class MediaStates:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._runs: OrderedDict[bytes, Any] = OrderedDict()

    def get(self, key: bytes) -> Any:
        states = self._runs.get(key)
        if states is not None:
            self._runs.move_to_end(key)
        return states

    def put(self, key: bytes, states: Any) -> None:
        """Keep ``states`` (a tensor, copied to host memory) under ``key``."""
        if key in self._runs:
            self._runs.move_to_end(key)
            return
        kept = states.detach().to("cpu", copy=True)
        self._runs[key] = kept
        self.bytes += kept.numel() * kept.element_size()
        while self.bytes > self.max_bytes and self._runs:
            _, old = self._runs.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()

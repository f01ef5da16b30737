"""The thinker's hidden states at the media positions of talker-bound prompts, kept so that a
spoken reply can reuse a cached prefix that holds media.

The talker reads a prompt's audio, image and video positions by the thinker's hidden states at
``accept_hidden_layer``; a prefix served from SGLang's radix cache has none to give. So the
states of each media run of a talker-bound prompt are kept, keyed by the prompt up to the
run's end (token ids, with each media run's content hash in place of its placeholders, as the
radix cache keys it): a later prompt that starts the same way finds them. Talker-bound prompts
with media share a prefix namespace of their own, so a match only reaches prompts whose runs
were kept; one that finds a run missing (evicted, or its request cancelled before its prompt
was done) is computed again whole. The states are kept in a ``worker.layers.tensor_cache``
(``engine.media_state_bytes``).
"""

from __future__ import annotations

import hashlib
from array import array
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

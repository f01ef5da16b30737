"""What a chat's messages tell the router, read in one pass over them: the input modalities
they carry (the worker must take them) and, for the cache-aware policy (router.prefix), the
prompt's prefix as chained block hashes; a text completion's prompt likewise (``read_prompt``).

Blocks, in the order the chat template writes them: the tools, then each message's role and
its content in blocks of ``BLOCK_CHARS`` (1,024) characters, each media part (audio, image,
video) one block hashed by its content (so that a turn that repeats an earlier clip or image
matches it). A block's hash covers everything before it: "a worker holds block k" means "it
holds the prompt up to block k". Each block carries an estimate of its tokens (the router does
not tokenize), which sizes the policy's record and its metrics only. This runs for every chat:
the common message (a role and a short string) costs one hash.
"""

from __future__ import annotations

import orjson

from fleet.records import Modality

BLOCK_CHARS = 1024
BLOCK_IDS = 256  # a completion prompt's token ids per block
_COMPLETION = hash("completion")  # where a completion prompt's chain starts
MEDIA_BYTES_PER_TOKEN = 1024  # an encoded clip or image: a rough size of what it costs
# (chained hash, estimated tokens) per prompt block; a text block's tokens are a quarter of its
# characters plus one (English-like text: the estimate only sizes the record and its metrics)
Blocks = list[tuple[int, int]]

INPUT_PART_MODALITY = {
    "input_audio": Modality.AUDIO,
    "audio_url": Modality.AUDIO,
    "image_url": Modality.IMAGE,
    "input_image": Modality.IMAGE,
    "video_url": Modality.VIDEO,
    "input_video": Modality.VIDEO,
}


def read_messages(doc: dict, hashing: bool) -> tuple[set[Modality] | None, Blocks | None]:
    """The modalities beyond text in ``doc["messages"]`` (None: text only), and the prompt's
    blocks if ``hashing`` (None: not asked, or no messages)."""
    messages = doc.get("messages")
    if type(messages) is not list:
        return None, None
    inputs: set[Modality] | None = None
    blocks: Blocks | None = [] if hashing and messages else None
    h = 0
    if blocks is not None:
        tools = doc.get("tools")
        if tools:  # the template writes them before the first message
            h = _opaque(blocks, h, "tools", tools)
    for message in messages:
        if type(message) is not dict:
            hashing = False  # the worker refuses the request: nothing after it can be cached
            continue
        content = message.get("content")
        if type(content) is str:
            if not hashing:
                continue
            n = len(content)
            if n <= BLOCK_CHARS and len(message) == 2:  # a role and a short text: one block
                h = hash((h, message.get("role"), content))
                blocks.append((h, (n >> 2) + 1))  # type: ignore[union-attr]
                continue
        elif type(content) is list:
            inputs = _modalities(content, inputs)
        if not hashing:
            continue
        # a name or a tool call id is part of what the template writes: folded into the
        # message's first block
        h = hash((h, message.get("role"), message.get("name"), message.get("tool_call_id")))
        if type(content) is str:
            h = _text(blocks, h, content)  # type: ignore[arg-type]
        elif type(content) is list:
            h = _parts(blocks, h, content)  # type: ignore[arg-type]
        calls = message.get("tool_calls")
        if calls:
            h = _opaque(blocks, h, "tool_calls", calls)  # type: ignore[arg-type]
    return inputs, blocks


def read_response_inputs(doc: dict) -> set[Modality] | None:
    """The modalities beyond text in a Responses request's ``input`` items (None: text only;
    the prompt is not placed by prefix: with ``previous_response_id`` most of it is in Redis)."""
    items = doc.get("input")
    if type(items) is not list:
        return None
    inputs: set[Modality] | None = None
    for item in items:
        if type(item) is dict and type(item.get("content")) is list:
            inputs = _modalities(item["content"], inputs)
    return inputs


def read_prompt(doc: dict) -> Blocks | None:
    """A text completion's prompt as blocks (the first prompt of several: a request is placed
    whole): its text in blocks of ``BLOCK_CHARS``, token ids in blocks of ``BLOCK_IDS``, in a
    hash space of their own (a chat's template writes other tokens). None: no prompt."""
    prompt = doc.get("prompt")
    if type(prompt) is list and prompt and type(prompt[0]) in (str, list):
        prompt = prompt[0]
    if type(prompt) is str:
        blocks: Blocks = []
        _text(blocks, _COMPLETION, prompt)
        return blocks or None
    if type(prompt) is not list or not prompt:
        return None
    blocks, h = [], _COMPLETION
    for i in range(0, len(prompt), BLOCK_IDS):
        ids = prompt[i : i + BLOCK_IDS]
        h = hash((h, orjson.dumps(ids)))
        blocks.append((h, len(ids)))
    return blocks


def _modalities(parts: list, inputs: set[Modality] | None) -> set[Modality] | None:
    for part in parts:
        kind = part.get("type") if type(part) is dict else None
        # any JSON value may stand here; only a string names a modality
        modality = INPUT_PART_MODALITY.get(kind) if type(kind) is str else None
        if modality is not None:
            inputs = (inputs or {Modality.TEXT}) | {modality}
    return inputs


def _parts(blocks: Blocks, h: int, parts: list) -> int:
    for part in parts:
        if type(part) is not dict:
            break
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            h = _text(blocks, h, text if type(text) is str else "")
        elif type(kind) is str:
            h = _media(blocks, h, kind, part.get(kind))
    return h


def _text(blocks: Blocks, h: int, text: str) -> int:
    for i in range(0, len(text), BLOCK_CHARS):
        chunk = text[i : i + BLOCK_CHARS]
        h = hash((h, chunk))
        blocks.append((h, (len(chunk) >> 2) + 1))
    return h


def _media(blocks: Blocks, h: int, kind: str, value: object) -> int:
    """One block for a media part, hashed by its content: the base64 data or the URL."""
    if isinstance(value, dict):
        value = value.get("data") or value.get("url") or orjson.dumps(value)
    data = value if isinstance(value, (str, bytes)) else orjson.dumps(value)
    h = hash((h, kind, data))
    blocks.append((h, max(1, len(data) // MEDIA_BYTES_PER_TOKEN)))
    return h


def _opaque(blocks: Blocks, h: int, what: str, value: object) -> int:
    data = orjson.dumps(value)
    h = hash((h, what, data))
    blocks.append((h, (len(data) >> 2) + 1))
    return h

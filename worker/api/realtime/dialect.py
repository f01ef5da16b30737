"""The beta protocol (``OpenAI-Beta: realtime=v1``, the SDK's ``client.beta.realtime``): the
same events under their beta names, with beta content types. The server speaks GA otherwise."""

from __future__ import annotations

BETA_HEADER_VALUE = "realtime=v1"

_BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
_GA_ONLY = frozenset({"conversation.item.done"})
_BETA_CONTENT = {"output_audio": "audio", "output_text": "text"}


def wants_beta(header: str | None) -> bool:
    return header is not None and BETA_HEADER_VALUE in header.replace(" ", "").split(",")


def _beta_item(item: dict) -> dict:
    if "content" not in item:  # a function call or its output
        return item
    content = [
        {**c, "type": _BETA_CONTENT.get(c.get("type"), c.get("type"))}
        for c in item.get("content", [])
    ]
    return {**item, "content": content}


def to_beta(event: dict) -> dict | None:
    """The beta form of a GA server event; None for events beta clients never get."""
    kind = event["type"]
    if kind in _GA_ONLY:
        return None
    out = {**event, "type": _BETA_NAMES.get(kind, kind)}
    if "item" in out:
        out["item"] = _beta_item(out["item"])
    if isinstance(out.get("response"), dict):
        response = dict(out["response"])
        response["output"] = [_beta_item(i) for i in response.get("output") or []]
        modalities = response.pop("output_modalities", None)
        if modalities is not None:
            response["modalities"] = ["text", "audio"] if "audio" in modalities else ["text"]
        out["response"] = response
    return out

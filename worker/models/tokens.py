"""One-value views of a transformers tokenizer: one token's id, one id's token, a chat rendered
as text. The tokenizer's own annotations cover batches and token ids too (``int | list[int]``,
``str | list[str] | BatchEncoding``...); these say what a single-value call returns, and raise
if a tokenizer ever answers otherwise instead of letting a list or ``None`` travel on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise KeyError(f"the tokenizer has no id for {token!r}")
    return found


def token_text(tokenizer: PreTrainedTokenizerBase, token: int) -> str:
    found = tokenizer.convert_ids_to_tokens(token)
    if not isinstance(found, str):
        raise KeyError(f"the tokenizer has no token {token}")
    return found


def decoded_text(tokenizer: PreTrainedTokenizerBase, ids: list[int], **options: Any) -> str:
    """``ids`` decoded into one string (``options``: e.g. ``skip_special_tokens``)."""
    text = tokenizer.decode(ids, **options)
    if not isinstance(text, str):
        raise TypeError(f"the tokenizer decoded {type(text).__name__}, not text")
    return text


def chat_text(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], **options: Any
) -> str:
    """The chat template applied to ``messages`` without tokenizing (``options``: e.g.
    ``add_generation_prompt``, ``chat_template``)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, **options)
    if not isinstance(text, str):
        raise TypeError(f"the chat template rendered {type(text).__name__}, not text")
    return text

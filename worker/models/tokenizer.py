"""A deterministic byte-level tokenizer built in code (no download), saved like a real one.

Ids 0..255 are the bytes of UTF-8 text, specials follow. It is an ordinary ``tokenizers``
byte-level BPE without merges, saved with ``save_pretrained`` so that the stages load it through
``AutoTokenizer.from_pretrained`` exactly like a real checkpoint's tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",  # 256: padding
    "<|im_start|>",  # 257
    "<|im_end|>",  # 258: end of turn (eos)
    "<|audio|>",  # 259: placeholder the thinker replaces by audio-encoder embeddings
    "<|audio_start|>",  # 260
    "<|audio_end|>",  # 261
]

# ChatML, as the Qwen family uses it.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_byte_tokenizer(
    out_dir: Path,
    specials: Sequence[str] = SPECIAL_TOKENS,
    words: Sequence[str] = (),
    chat_template: str | None = CHAT_TEMPLATE,
    extra_special_tokens: dict[str, str] | None = None,
) -> None:
    """Write tokenizer.json + tokenizer_config.json for the byte-level vocabulary: ids 0..255
    the bytes, then ``specials``, then ``words`` (whole words as one token each, as a real
    vocabulary has them, e.g. Qwen's role names)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    if words:
        tok.add_tokens([AddedToken(t, normalized=False) for t in words])
    kwargs: dict = {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    if extra_special_tokens:
        kwargs["extra_special_tokens"] = extra_special_tokens
    PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs).save_pretrained(out_dir)

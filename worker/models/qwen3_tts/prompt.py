"""Qwen3-TTS's talker prompt, built as the model defines it (``PromptBuilder.build``): optional
instruction turn, the assistant role, codec control codes (think/nothink, language, speaker),
then the text, either all at once (non-streaming text input) or one text token per generated
frame (streaming text input, the ``trailing`` embeddings, which ``extend`` grows as a streamed
text arrives); and a cloned voice's speaker embedding (``speaker_embedding``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from worker.models.qwen3_tts import follows_instructions
from worker.models.qwen3_tts.modeling import Qwen3TTSModel, speaker_mel

log = logging.getLogger(__name__)


class TTSInputError(ValueError):
    """The request cannot be voiced by this checkpoint (unknown speaker, language...)."""


def read_config(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "config.json").read_text())


@dataclass
class Prompt:
    embeds: torch.Tensor  # (1, T, H)
    trailing: torch.Tensor  # (1, N, H): added to the inputs of the first N steps
    pad: torch.Tensor  # (1, 1, H): added after those
    # streamed text: the trailing text is still growing (``PromptBuilder.extend``) and ends
    # with ``eos`` once the text is complete
    eos: torch.Tensor | None = None
    text_done: bool = True
    # The request text's tokens that the prompt holds, in ``embeds`` or ``trailing``: every
    # one of a whole text's, the ones arrived of a streamed text. ``extend`` gives only those
    # past them, so that the talker reads each text position once.
    text: list[int] = field(default_factory=list)
    text_in_embeds: int = 0  # positions of the request text (and its end) in ``embeds``
    trailing_text: tuple[int, int] = (0, 0)  # ``trailing``'s span of them

    def ready(self, frames: int) -> bool:
        """Whether the talker has what the step after ``frames`` frames adds to its input."""
        return self.text_done or frames < self.trailing.shape[1]

    def text_read(self, frames: int) -> int:
        """The request text's positions (its tokens, then end-of-text) the talker has read
        after ``frames`` steps: its prompt's, then one of ``trailing`` per step."""
        start, end = self.trailing_text
        return self.text_in_embeds + max(0, min(frames, end) - start)


class PromptBuilder:
    def __init__(self, model: Qwen3TTSModel, tokenizer: Any) -> None:
        self.model = model
        self.talker = model.talker
        self.tok = tokenizer
        self.cfg = model.config
        self.tc = model.config["talker_config"]

    @property
    def speakers(self) -> list[str]:
        return sorted((self.tc.get("spk_id") or {}).keys())

    @property
    def languages(self) -> list[str]:
        known = (self.tc.get("codec_language_id") or {}).keys()
        return ["auto", *sorted(k for k in known if "dialect" not in k)]

    def ids(self, text: str) -> torch.Tensor:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return torch.tensor([ids], dtype=torch.long, device=self._device)

    @property
    def _device(self):
        return self.talker.codec_head.weight.device

    def text_ids(self, text: str) -> torch.Tensor:
        return self.ids(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def text_tokens(self, text: str, complete: bool = True) -> list[int]:
        """The tokens of ``text`` as the prompt holds them. Of text still arriving, only its
        complete words (up to its last whitespace): the tokens of a word cut in two may differ
        from the whole word's, and those of complete words are the start of the whole text's."""
        if not complete:
            cut = max((i for i, ch in enumerate(text) if ch.isspace()), default=0)
            text = text[:cut]
            if not text.strip():
                return []
        return self.text_ids(text)[0, 3:-5].tolist()

    @torch.inference_mode()
    def extend(self, prompt: Prompt, tokens: list[int], done: bool) -> None:
        """A streamed text as far as it has come (``text_tokens``) for the talker to read, one
        token per frame: the tokens past those the prompt holds, then end-of-text once
        ``done``. A prompt whose text is complete (a whole text's) takes nothing more."""
        if prompt.text_done:
            return
        held = len(prompt.text)
        if tokens[:held] != prompt.text:  # (what the talker read cannot be taken back)
            log.warning("a streamed text tokenized apart from its start: its start is kept")
        new = tokens[held:]
        pieces = [prompt.trailing]
        if new:
            pieces.append(self.talker.text_embed(torch.tensor([new], device=self._device)))
        if done and prompt.eos is not None:
            pieces.append(prompt.eos)
        start, end = prompt.trailing_text
        prompt.trailing = torch.cat(pieces, dim=1)
        prompt.trailing_text = (start, end + len(new) + int(done and prompt.eos is not None))
        prompt.text += new
        prompt.text_done = done

    @torch.inference_mode()
    def build(
        self,
        text: str,
        *,
        language: str = "auto",
        speaker: str | None = None,
        instruct: str | None = None,
        speaker_embedding: torch.Tensor | None = None,
        ref_text: str | None = None,
        ref_codes: torch.Tensor | None = None,
        non_streaming: bool = True,
        text_done: bool = True,
        tokens: list[int] | None = None,
    ) -> Prompt:
        """``tokens``: the text's tokens (``text_tokens``) where they are known already.
        ``text_done`` False: they are the start of a streamed text (the model's streaming-text
        mode: ``non_streaming`` False, no reference codes), and ``extend`` adds the rest as it
        comes."""
        t, tc, dev = self.talker, self.tc, self._device
        if not text_done and (non_streaming or ref_codes is not None):
            raise ValueError("a streamed text is read in streaming-text mode, without ref_codes")

        def codec(ids: list[int]) -> torch.Tensor:
            return t.codec_embed(torch.tensor([ids], dtype=torch.long, device=dev))

        lang = (language or "auto").lower()
        langs = tc.get("codec_language_id") or {}
        if lang != "auto" and lang not in langs:
            raise TTSInputError(f"unknown language {language!r}; known: {self.languages}")
        lang_id = None if lang == "auto" else langs[lang]
        spk_vec = None
        if speaker_embedding is not None:
            spk_vec = speaker_embedding.to(dev, t.codec_head.weight.dtype).view(1, 1, -1)
        elif speaker:  # (a name preprocessing checked: one of ``spk_id``)
            spk_vec = codec([tc["spk_id"][speaker]])
            dialect = (tc.get("spk_is_dialect") or {}).get(speaker)
            if lang in ("chinese", "auto") and dialect:
                lang_id = langs[dialect]
        if tokens is None:
            ids = self.text_ids(text)
        else:  # the same around the given tokens: 3 before (role), 5 after (end, next role)
            frame = self.text_ids("")
            given = torch.tensor([tokens], dtype=torch.long, device=dev)
            ids = torch.cat([frame[:, :3], given, frame[:, 3:]], dim=1)
        if ids.shape[1] <= 8:
            raise TTSInputError("the text has no words to speak")
        special = torch.tensor(
            [
                [
                    self.cfg["tts_bos_token_id"],
                    self.cfg["tts_eos_token_id"],
                    self.cfg["tts_pad_token_id"],
                ]
            ],
            device=dev,
        )
        bos_e, eos_e, pad_e = t.text_embed(special).chunk(3, dim=1)
        if lang_id is None:
            ctrl = [tc["codec_nothink_id"], tc["codec_think_bos_id"], tc["codec_think_eos_id"]]
        else:
            ctrl = [
                tc["codec_think_id"],
                tc["codec_think_bos_id"],
                lang_id,
                tc["codec_think_eos_id"],
            ]
        parts = [codec(ctrl)]
        if spk_vec is not None:
            parts.append(spk_vec)
        parts.append(codec([tc["codec_pad_id"], tc["codec_bos_id"]]))
        codec_in = torch.cat(parts, dim=1)
        n = codec_in.shape[1]
        head = torch.cat([pad_e.expand(-1, n - 2, -1), bos_e], dim=1) + codec_in[:, :-1]
        pieces = []
        # as the package, which drops them where they are not followed (the API refuses such a
        # request before it gets here: worker.api.speech)
        if instruct and follows_instructions(self.cfg):
            pieces.append(t.text_embed(self.ids(f"<|im_start|>user\n{instruct}<|im_end|>\n")))
        pieces += [t.text_embed(ids[:, :3]), head]
        body = ids[:, 3:-5]
        words = body.shape[1]  # the request text's tokens (end-of-text follows them)
        in_embeds, trailing_text = words + 1, (0, 0)  # where the talker reads them
        if ref_codes is not None:
            if not ref_text:
                raise TTSInputError("voice cloning with reference codes needs the reference text")
            ref_ids = self.ids(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[:, 3:-2]
            text_e = torch.cat([t.text_embed(torch.cat([ref_ids, body], dim=1)), eos_e], dim=1)
            frames = ref_codes.to(dev).long()
            codec_e = torch.cat(
                [codec([tc["codec_bos_id"]]), t.frame_embed(frames).transpose(0, 1)], 1
            )
            tl, cl = text_e.shape[1], codec_e.shape[1]
            if non_streaming:
                icl = text_e + codec([tc["codec_pad_id"]] * tl)
                pieces.append(torch.cat([icl, codec_e + pad_e], dim=1))
                trailing = pad_e
            elif tl > cl:
                pieces.append(text_e[:, :cl] + codec_e)
                trailing = text_e[:, cl:]
                ref_len = ref_ids.shape[1]  # (text_e: the reference's tokens, then the text's)
                in_embeds = max(0, cl - ref_len)
                trailing_text = (max(0, ref_len - cl), tl - cl)
            else:
                pieces.append(torch.cat([text_e] + [pad_e] * (cl - tl), dim=1) + codec_e)
                trailing = pad_e
        elif non_streaming:
            all_text = torch.cat([t.text_embed(body), eos_e], dim=1)
            pieces.append(all_text + codec([tc["codec_pad_id"]] * all_text.shape[1]))
            pieces.append(pad_e + codec([tc["codec_bos_id"]]))
            trailing = pad_e
        else:
            pieces.append(t.text_embed(ids[:, 3:4]) + codec_in[:, -1:])
            rest = [t.text_embed(ids[:, 4:-5])]
            trailing = torch.cat([*rest, eos_e] if text_done else rest, dim=1)
            in_embeds, trailing_text = 1, (0, trailing.shape[1])
        return Prompt(
            torch.cat(pieces, dim=1),
            trailing,
            pad_e,
            eos_e,
            text_done,
            text=body[0].tolist(),
            text_in_embeds=in_embeds,
            trailing_text=trailing_text,
        )


def speaker_embedding(model: Qwen3TTSModel, wav24k: torch.Tensor) -> torch.Tensor:
    """The x-vector of 24 kHz mono audio (Base checkpoints)."""
    if model.speaker_encoder is None:
        raise TTSInputError("this checkpoint has no speaker encoder (voice cloning needs Base)")
    enc = model.speaker_encoder
    dtype = next(enc.parameters()).dtype
    dev = next(enc.parameters()).device
    with torch.inference_mode():
        return enc(speaker_mel(wav24k.to(dev)).to(dtype))[0]

"""Qwen3-TTS's three stages: preprocessing (CPU) -> tts_engine (talker) => vocoder.

* ``preprocessing`` checks the request against the checkpoint (speaker, language, text) and,
  for a cloned voice on a Base checkpoint, turns its reference audio into what the model takes:
  the 24 kHz waveform (for the speaker encoder) and, with a reference transcript, the reference
  codes from the speech tokenizer's encoder (component ``speech_tokenizer`` / ``encoder``).
* ``tts_engine`` (component: the root model, talker + speaker encoder) builds each talker prompt
  and steps all running requests together, one frame each per step, streaming every frame on.
* ``vocoder`` (``speech_tokenizer`` / ``decoder``) decodes frames as they come, each layer
  keeping its state between steps, in the package's blocks (300 frames, 25 before each), in
  steps that ramp up (1, 2, 4, ... frames up to ``chunk_frames``: the first audio needs one
  talker step): the streamed waveform is the package's decode at any length, at the cost of
  one decode of each frame (``worker.stages.vocoder``).

A request's options arrive typed (``RequestInput.speech``: language, instructions, reference
text, and ``voice_key``: an uploaded voice's content hash, under which its reference codes and
speaker embedding are computed once, ``voice_cache``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.contract.options import RequestInput, SpeechOptions
from worker.layers.stage_weights import torch_dtype
from worker.models.qwen3_tts import DESIGNED_VOICE, VOICE_DESIGN, VOICE_RATE
from worker.models.qwen3_tts.voice_cache import VoiceCache
from worker.stages.base import (
    CHUNK,
    DONE,
    END,
    FINAL,
    INVALID,
    Output,
    RequestMeta,
    RequestPreprocessor,
    StageExecutor,
    check_prompt,
)
from worker.stages.payloads import CodeFrames, SpokenText, TextPiece
from worker.stages.vocoder import ConvPart, StreamedDecoder, VocoderExecutor


class TTSPreprocess(RequestPreprocessor[RequestInput]):
    def load(self) -> None:
        import torch

        from worker.layers.module_weights import load_stage_weights
        from worker.models.qwen3_tts.codec import SpeechTokenizer, mimi_name

        self.torch = torch
        self.config = json.loads((self.ctx.checkpoint / "config.json").read_text())
        self.tc = self.config["talker_config"]
        self.encoder = None
        self.voice_codes = VoiceCache()  # reference codes per uploaded voice
        comp = self.ctx.stage.component
        if comp is not None and comp.module == "encoder":
            st_dir = self.ctx.checkpoint / comp.config_dir
            cfg = json.loads((st_dir / "config.json").read_text())
            st = SpeechTokenizer(cfg, with_encoder=True, with_decoder=False)
            assert st.encoder is not None  # built with_encoder
            load_stage_weights(
                st.encoder,
                self.ctx,
                st_dir,
                prefix="encoder.",
                device=self.ctx.device,
                dtype=torch_dtype(self.ctx.dtype),
                component=comp,
                rename=mimi_name,
            )
            self.encoder = st.eval()

    def warmup(self) -> None:
        if self.encoder is not None:
            self.encoder.encode(self.torch.zeros(1920))

    def prepare(self, req: RequestInput) -> dict[str, Any]:
        if req.kind != "speech":
            raise ValueError("this model only speaks: send text to /v1/audio/speech")
        text = req.text
        if not text.strip() and not req.text_follows:
            raise ValueError("input text is empty")
        opts = req.speech or SpeechOptions()
        lang = (opts.language or "auto").lower()
        langs = self.tc.get("codec_language_id") or {}
        if lang != "auto" and (lang not in langs or "dialect" in lang):
            known = ["auto", *sorted(k for k in langs if "dialect" not in k)]
            raise ValueError(f"unknown language {opts.language!r}; known: {known}")
        out: dict[str, Any] = {"text": text, "language": lang, "text_follows": req.text_follows}
        if opts.instructions:
            out["instruct"] = opts.instructions
        wav = req.voice_audio
        spk = {k.lower() for k in (self.tc.get("spk_id") or {})}
        voice = (req.voice or "").lower()
        if wav is None:
            if self.config.get("tts_model_type") == VOICE_DESIGN:
                if voice != DESIGNED_VOICE:
                    raise ValueError(
                        f"unknown voice {req.voice!r}: this VoiceDesign model speaks in the "
                        f"voice its instructions describe; name it {DESIGNED_VOICE!r}"
                    )
                return out  # no speaker: the instructions design the voice
            if self.config.get("tts_model_type") == "base":
                raise ValueError(
                    "this Base checkpoint has no built-in voices: upload a reference voice "
                    "(POST /v1/audio/voices) and name it"
                )
            if voice not in spk:
                raise ValueError(f"unknown voice {req.voice!r}; built in: {sorted(spk)}")
            out["speaker"] = voice
            return out
        if self.config.get("tts_model_type") != "base":
            raise ValueError(
                "uploaded voices need a Base checkpoint (voice cloning); this one has the "
                f"built-in voices {sorted(spk)}"
            )
        wav = np.asarray(wav, dtype=np.float32)
        if wav.size < VOICE_RATE // 10:
            raise ValueError("the voice's reference audio is shorter than 0.1 s")
        if not np.isfinite(wav).all() or float(np.abs(wav).max()) < 1e-4:
            raise ValueError("the voice's reference audio is silent")
        out["ref_wav"] = wav
        key = opts.voice_key
        if key:
            out["voice_key"] = key
        ref_text = (opts.ref_text or "").strip()
        if ref_text and self.encoder is not None:
            out["ref_text"] = ref_text
            out["ref_codes"] = self.voice_codes.get(key, lambda: self._encode(wav))
        return out

    def _encode(self, wav: np.ndarray) -> np.ndarray:
        if self.encoder is None:
            raise RuntimeError(f"stage {self.ctx.name} has no speech tokenizer encoder")
        codes = self.encoder.encode(self.torch.from_numpy(wav).to(self.ctx.device))
        return codes.cpu().numpy().astype(np.int64)


@dataclass
class _Req:
    rid: str
    meta: RequestMeta
    payload: dict[str, Any]
    engine_req: Any = None
    prompt_tokens: int = 0
    kv_need: int = 0  # KV positions it holds once admitted: its prompt and its frame budget
    prompt: Any = None  # its talker prompt, built once (also while it waits for room)
    max_new: int = 0
    frames: int = 0
    started: float = field(default_factory=time.monotonic)
    # streamed text (``text_follows``): what arrived so far, and whether it is complete (its
    # prompt knows which of its tokens the talker has: ``Prompt.text``)
    text: str = ""
    text_done: bool = True


def frame_budget(spec_max_new: int, generation_config: dict[str, Any]) -> int:
    """The most first codes a reply may have: the spec's cap, within the checkpoint's own
    ``max_new_tokens`` (the package's default)."""
    return min(spec_max_new, int(generation_config.get("max_new_tokens") or spec_max_new))


class TTSEngineExecutor(StageExecutor):
    def load(self) -> None:
        import torch
        from transformers import AutoTokenizer

        from worker.models.qwen3_tts.engine import PromptBuilder, checkpoint_sampling
        from worker.models.qwen3_tts.talker_sglang import SGLangTalkerEngine
        from worker.stages.generation_config import read_generation_config

        self.torch = torch
        ck = self.ctx.checkpoint
        self.engine = SGLangTalkerEngine(self.ctx)
        # the talker's parts beside its decoder: what prompts and x-vectors are built with
        self.model = self.engine.tts
        self.builder = PromptBuilder(self.model, AutoTokenizer.from_pretrained(ck))
        defaults = read_generation_config(ck)
        self.sampling = checkpoint_sampling(defaults)
        self.max_new = frame_budget(self.ctx.stage.engine.max_new_tokens, defaults)
        self.max_running = self.ctx.max_running_requests
        self.context = self.ctx.stage.engine.context_length
        # the plan's KV pool (0: none): an admitted request holds its prompt's positions and
        # its whole frame budget, so running requests never run out of room mid-utterance
        self.kv_tokens = self.ctx.kv_tokens
        self.pending: list[_Req] = []
        self.running: dict[str, _Req] = {}
        self.voice_embeddings = VoiceCache()  # speaker embedding per uploaded voice

    def warmup(self) -> None:
        speakers = self.builder.speakers
        payload: dict[str, Any] = {"text": "hi", "language": "auto"}
        if speakers:
            payload["speaker"] = speakers[0]
        elif self.builder.cfg.get("tts_model_type") == VOICE_DESIGN:
            payload["instruct"] = "A calm voice."
        else:
            payload["ref_wav"] = np.sin(np.arange(4800, dtype=np.float32) / 7.0) * 0.1
        self.start(
            "warmup", RequestMeta("speech", frozenset({"audio"})), {"preprocessing": payload}
        )
        self.pending[0].payload["max_new"] = 3
        while self.pending or self.running:
            self.step()

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        p = inputs["preprocessing"]
        streamed = bool(p.get("text_follows"))
        self.pending.append(_Req(rid, meta, p, text=p["text"], text_done=not streamed))

    def feed(self, rid: str, src: str, data: Any) -> None:
        """More of a streamed text (from the request: ``GenerationRequest.text_stream``)."""
        r = self._find(rid)
        if r is not None:
            piece: TextPiece = data
            r.text += piece.text
            self._give(r)

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        r = self._find(rid)
        if r is not None:
            r.text_done = True
            self._give(r)

    def _find(self, rid: str) -> _Req | None:
        return self.running.get(rid) or next((r for r in self.pending if r.rid == rid), None)

    def _give(self, r: _Req) -> None:
        """A running request's talker gets the streamed text's new complete words: those past
        the ones its prompt holds (a whole text's prompt holds them all, and takes none)."""
        if r.engine_req is None or r.prompt.text_done:
            return
        self.builder.extend(r.prompt, self.builder.text_tokens(r.text, r.text_done), r.text_done)

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        r = self.running.pop(rid, None)
        if r is not None:
            self.engine.abort(r.engine_req)

    def next_deadline(self) -> float | None:
        """Now while a request can be admitted, stepped or finished; None while every one
        waits for its streamed text."""
        if len(self.running) < self.max_running and any(map(self._admissible, self.pending)):
            return 0.0
        if any(self._steppable(r) or r.engine_req.done for r in self.running.values()):
            return 0.0
        return None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.running)

    def _kv_free(self) -> int:
        if not self.kv_tokens:
            return 1 << 62
        return self.kv_tokens - sum(r.kv_need for r in self.running.values())

    def _admissible(self, r: _Req) -> bool:
        """Its text is complete, or has a complete word to start with."""
        return r.text_done or bool(self.builder.text_tokens(r.text, False))

    @staticmethod
    def _steppable(r: _Req) -> bool:
        req = r.engine_req
        return not req.done and req.prompt.ready(req.frames)

    def _admit(self, r: _Req) -> list[Output]:
        """Start ``r`` where the KV pool has room for it (none: it waits, its prompt built)."""
        from worker.models.qwen3_tts.engine import TalkerRequest

        if r.prompt is None:
            refused = self._build(r)
            if refused:
                return refused
        if r.kv_need > self._kv_free():
            return []  # the caller puts it back: it waits for room
        sampling = self.sampling.with_request(r.meta.speech_sampling)
        r.engine_req = TalkerRequest(r.rid, r.prompt, r.max_new, sampling)
        self._give(r)  # (streamed text that came while it waited)
        self.engine.prefill(r.engine_req)
        self.running[r.rid] = r
        ref_codes = r.payload.get("ref_codes")
        if ref_codes is not None:
            # The reference codes precede the new ones in the decode (as the model decodes a
            # clone: reference + generated, the reference's share of the samples cut off).
            return [(CHUNK, r.rid, CodeFrames(np.asarray(ref_codes, dtype=np.int64), True))]
        return []

    def _build(self, r: _Req) -> list[Output]:
        """``r``'s talker prompt and frame budget; the refusal where it cannot have them."""
        from worker.models.qwen3_tts.engine import TTSInputError, speaker_embedding

        torch = self.torch
        p = r.payload
        try:
            spk_emb = None
            if p.get("ref_wav") is not None:
                wav = torch.from_numpy(np.asarray(p["ref_wav"]))
                spk_emb = self.voice_embeddings.get(
                    p.get("voice_key"), lambda: speaker_embedding(self.model, wav)
                )
            ref_codes = p.get("ref_codes")
            streamed = bool(p.get("text_follows"))
            if streamed and ref_codes is not None:
                raise TTSInputError(
                    "streamed text is read in the model's streaming-text mode, which a voice "
                    "cloned from its transcript does not use: upload it without one"
                )
            prompt = self.builder.build(
                r.text,
                tokens=self.builder.text_tokens(r.text, r.text_done) if streamed else None,
                language=p.get("language", "auto"),
                speaker=p.get("speaker"),
                instruct=p.get("instruct"),
                speaker_embedding=spk_emb,
                ref_text=p.get("ref_text"),
                ref_codes=None if ref_codes is None else torch.from_numpy(np.asarray(ref_codes)),
                # as the package's defaults: built-in voices take the text at once
                # (generate_custom_voice), clones one text token per frame (generate_voice_clone);
                # streamed text is read one token per frame as it comes
                non_streaming=p.get("ref_wav") is None and not streamed,
                text_done=r.text_done,
            )
        except TTSInputError as exc:
            return [(INVALID, r.rid, f"{self.ctx.name}: {exc}")]
        r.prompt_tokens = int(prompt.embeds.shape[1])
        try:
            check_prompt(r.prompt_tokens, self.context, self.kv_tokens)
        except ValueError as exc:
            return [(INVALID, r.rid, f"{self.ctx.name}: {exc}")]
        room = min(self.context, self.kv_tokens or self.context)
        max_new = int(p.get("max_new") or self.max_new)
        if r.meta.max_tokens is not None:  # (a realtime response's max_output_tokens, in frames:
            max_new = min(max_new, r.meta.max_tokens + 1)  # the last first code gets none)
        r.max_new = max(1, min(max_new, room - r.prompt_tokens))
        r.kv_need = r.prompt_tokens + r.max_new
        r.prompt = prompt
        return []

    def step(self) -> list[Output]:
        outs: list[Output] = []
        waiting = []
        while self.pending and len(self.running) < self.max_running:
            r = self.pending.pop(0)
            if not self._admissible(r):
                waiting.append(r)
            elif r.kv_need > self._kv_free():
                waiting.append(r)
                break  # first come, first served: it waits for room in the KV pool
            else:
                outs += self._admit(r)
                if r.engine_req is None and r.kv_need:
                    waiting.append(r)  # built, but no room yet
                    break
        self.pending[:0] = waiting
        # (a request reading streamed text sits out a step its next word has not reached)
        live = [r for r in self.running.values() if self._steppable(r)]
        if live:
            for req, f in self.engine.step([r.engine_req for r in live]):
                r = self.running[req.rid]
                r.frames += 1
                outs.append((CHUNK, r.rid, CodeFrames(f.cpu().numpy()[None].astype(np.int64))))
        for r in list(self.running.values()):
            if r.engine_req.done:
                del self.running[r.rid]
                eos = r.engine_req.token == self.engine.eos
                info = {
                    "finish_reason": "stop" if eos else "length",
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.frames,
                    "text_tokens_read": r.prompt.text_read(r.engine_req.frames),
                }
                if "words" in r.meta.outputs:  # what the aligner times the audio against
                    outs.append((FINAL, r.rid, SpokenText(r.text)))
                outs += [(END, r.rid, info), (DONE, r.rid, info)]
        return outs


class TTSVocoderExecutor(VocoderExecutor):
    """The speech tokenizer's decoder, streamed (``worker.stages.vocoder``) in the package's
    blocks (``SpeechDecoder.chunked``: 300 frames, each with 25 before it)."""

    def load(self) -> None:
        import torch

        from worker.layers.module_weights import load_stage_weights
        from worker.models.qwen3_tts.codec import SpeechDecoder

        comp = self.ctx.stage.component
        st_dir = self.ctx.checkpoint / (comp.config_dir if comp else "speech_tokenizer")
        cfg = json.loads((st_dir / "config.json").read_text())
        with torch.device("meta"):
            dec = SpeechDecoder(cfg["decoder_config"])
        load_stage_weights(
            dec,
            self.ctx,
            st_dir,
            prefix="decoder.",
            device=self.ctx.device,
            dtype=torch_dtype(self.ctx.dtype),
            component=comp,
        )
        self.model = dec.eval()
        front, convs = dec.streamed()
        schedule = self.streaming_schedule(dec.total_upsample)
        self.decoder = StreamedDecoder(front, ConvPart(convs), schedule, self.ctx.device)
        self.init_streams()

    def warmup(self) -> None:
        import torch

        groups = self.model.num_quantizers
        with torch.inference_mode():
            wav = self.model(torch.zeros(1, groups, 2, dtype=torch.long, device=self.ctx.device))
        if wav.shape[-1] != 2 * self.model.total_upsample:  # (no lag: every sample streams)
            raise RuntimeError(f"the decoder gave {wav.shape[-1]} samples for 2 frames")

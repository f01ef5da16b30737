"""Qwen3-TTS's preprocessing (CPU): the request checked against the checkpoint (voice, language,
text) and, for a cloned voice on a Base checkpoint, its reference audio turned into what the
model takes: the 24 kHz waveform (for the speaker encoder) and, with a reference transcript,
the reference codes from the speech tokenizer's encoder (component ``speech_tokenizer`` /
``encoder``). What it hands the talker is a ``TalkerInput``.

A request's options arrive typed (``RequestInput.speech``: language, instructions, reference
text, and ``voice_key``: an uploaded voice's content hash, under which its reference codes are
computed once, ``voice_cache``).
"""

from __future__ import annotations

import json

import numpy as np

from worker.contract.options import RequestInput, SpeechOptions
from worker.layers.stage_weights import torch_dtype
from worker.models.qwen3_tts import DESIGNED_VOICE, VOICE_DESIGN, VOICE_RATE
from worker.models.qwen3_tts.payloads import TalkerInput
from worker.models.qwen3_tts.voice_cache import VoiceCache
from worker.stages.base import RequestPreprocessor


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

    def prepare(self, req: RequestInput) -> TalkerInput:
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
        out = TalkerInput(text, lang, req.text_follows, opts.instructions or None)
        wav = req.voice_audio
        # the voice as the checkpoint names it (the API matched it against the pipeline's
        # built-in voices and the uploaded ones: this is the check of what the checkpoint takes)
        spk = set(self.tc.get("spk_id") or {})
        voice = req.voice or ""
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
            out.speaker = voice
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
        out.ref_wav = wav
        key = opts.voice_key
        out.voice_key = key or None
        ref_text = (opts.ref_text or "").strip()
        if ref_text and self.encoder is not None:
            out.ref_text = ref_text
            out.ref_codes = self.voice_codes.get(key, lambda: self._encode(wav))
        return out

    def _encode(self, wav: np.ndarray) -> np.ndarray:
        if self.encoder is None:
            raise RuntimeError(f"stage {self.ctx.name} has no speech tokenizer encoder")
        codes = self.encoder.encode(self.torch.from_numpy(wav).to(self.ctx.device))
        return codes.cpu().numpy().astype(np.int64)

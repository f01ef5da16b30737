"""Qwen3-TTS-12Hz (``model_type: qwen3_tts``): CustomVoice and Base, written for omni-fleet.

``modeling`` holds the talker, its code predictor and the speaker encoder; ``codec`` the 12 Hz
speech tokenizer (decoder; Mimi encoder for reference codes); ``engine`` the prompt and the
batched greedy steps; the stage executors live in ``stages``.
"""

from __future__ import annotations

MODEL_TYPE = "qwen3_tts"

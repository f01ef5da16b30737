"""What a model family is to the rest of the worker: one ``Family`` record, exported as
``FAMILY`` by the family's package and listed once in ``worker.models.registry``.

The API, the runtime and the checkpoint builder ask this record, never the family's folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from worker.contract.stage_context import StageContext
from worker.stages.base import StageExecutor


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    model_type: str  # the checkpoint config.json's
    make_executor: Callable[[StageContext], StageExecutor]
    # speech: Qwen3-TTS's options (language, instructions) and voices cloned from uploads,
    # whose reference audio reaches the stages at this rate (Hz); None: built-in voices only
    speech_options: bool = False
    voice_rate: int | None = None
    # speech: text streamed in as it is written (the model's streaming-text mode)
    streams_text: bool = False
    # transcription: timed clips with the language the model wrote (segments), and word
    # timestamps where the spec has an aligner stage
    timed_transcripts: bool = False
    # translation: audio in any language to English text (Qwen3-Omni's thinker does it when
    # asked in words; Qwen3-ASR writes what it hears)
    translates: bool = False
    # the module that builds the family's embedded tiny checkpoint from a config folder
    # (``is_tiny(config_dir)``, ``build_checkpoint(config_dir, out, seed)``); imported when a
    # checkpoint is built (it imports transformers' or the family's model classes)
    tiny_builder: str = ""
    # the built-in voices a component's config.json names, where the family names them its own
    # way (None from it: the common keys, ``speaker_id`` / ``spk_id``)
    speakers_of: Callable[[dict], list[str] | None] | None = None
    # speech: whether a component's config.json follows a request's ``instructions`` (None: every
    # checkpoint of a family with speech options does); the API refuses them where one does not
    follows_instructions: Callable[[dict], bool] | None = None
    # the checkpoints that do, named in that refusal
    instructed: str = ""
    # speech: the built-in voice of a checkpoint that designs its voice from words (the
    # request's instructions: Qwen3-TTS VoiceDesign), None for the others; a voice created
    # from a prompt (OpenAI's ``type: "prompt"``) is spoken as that voice with its prompt
    designed_voice_of: Callable[[dict], str | None] | None = None

"""What a checkpoint says of its voices, read from its components' config.json files: the
built-in voices (speakers) and whether it follows a request's ``instructions``. Read once when
the pipeline is made; the API asks the pipeline."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.spec import ModelSpec, resolve_model_dir
from worker.models.family import Family
from worker.models.registry import family_of


@dataclass(frozen=True)
class CheckpointVoices:
    speakers: list[str]
    follows_instructions: bool
    designed_voice: str | None = None  # Family.designed_voice_of: the voice words design


def checkpoint_voices(spec: ModelSpec, spec_path: Path) -> CheckpointVoices:
    root = resolve_model_dir(spec, spec_path)
    family = family_of(root)
    configs = _component_configs(spec, root)
    follows = family.follows_instructions
    designed = family.designed_voice_of
    designs = [v for v in map(designed, configs) if v is not None] if designed else []
    return CheckpointVoices(
        speakers=_read_speakers(family, configs),
        follows_instructions=family.speech_options
        and (follows is None or all(follows(cfg) for cfg in configs)),
        designed_voice=designs[0] if designs else None,
    )


def _component_configs(spec: ModelSpec, root: Path) -> list[dict]:
    """The config.json of each stage's component (one that cannot be read is left out)."""
    configs = []
    for stage in spec.stages.values():
        if stage.component is None:
            continue
        path = root / stage.component.config_dir / "config.json"
        try:
            configs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return configs


def _read_speakers(family: Family, configs: list[dict]) -> list[str]:
    """Built-in voices: those a component config names (``speaker_id``, as Qwen3-Omni's talker
    has, or ``spk_id``; or as the family reads them)."""
    names: list[str] = []
    for cfg in configs:
        speakers = family.speakers_of(cfg) if family.speakers_of else None
        if speakers is None:
            # Qwen3-Omni keeps its speakers in the talker's nested config; Qwen3-TTS
            # CustomVoice names them ``spk_id``
            talker = cfg.get("talker_config") or {}
            speakers = cfg.get("speaker_id") or talker.get("speaker_id") or talker.get("spk_id")
        for name in speakers or {}:
            if name not in names:
                names.append(name)
    return names

"""Qwen3-TTS's three stage executors in this process (preprocessing, the talker, the vocoder),
driven as the stage host drives them: shared by the stage-level TTS tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from planner.spec import ModelSpec
from worker.contract.options import RequestInput
from worker.contract.stage_context import StageContext
from worker.models.checkpoint import resolve_checkpoint
from worker.models.registry import make_executor
from worker.stages.base import DONE, FINAL, OUT, REQUEST_INPUT, RequestMeta


@contextmanager
def loaded_stages(spec_path: Path, cache: Path) -> Iterator[dict]:
    """The spec's preprocessing, tts_engine (its talker on SGLang) and vocoder, loaded (the
    checkpoint built once), closed at the end: SGLang runs one engine at a time in a process."""
    spec = ModelSpec.model_validate(yaml.safe_load(spec_path.read_text()))
    ck = resolve_checkpoint(spec, spec_path, cache, log=lambda _: None)
    out = {}
    try:
        for name in ("preprocessing", "tts_engine", "vocoder"):
            ex = make_executor(StageContext(name, spec, spec.stages[name], ck, "cpu", 4))
            ex.load()
            out[name] = ex
        yield out
    finally:
        for ex in out.values():
            ex.close()


def start(
    stages: dict, rid: str, meta: RequestMeta, request: RequestInput, frames: int, vocoder: bool
) -> None:
    """A request through preprocessing, then started on the talker with at most ``frames``
    frames (and on the vocoder)."""
    stages["preprocessing"].start(rid, meta, {REQUEST_INPUT: request})
    ((kind, _, payload),) = stages["preprocessing"].step()
    assert kind == FINAL, payload
    payload.max_new = frames
    stages["tts_engine"].start(rid, meta, {"preprocessing": payload})
    if vocoder:
        stages["vocoder"].start(rid, meta, {})


def step(stages: dict, rid: str, pcm: list[bytes]) -> tuple[bool, bool]:
    """One talker step if it has one to take (the host does not step a talker that waits),
    its frames decoded at once: (a frame came, the request is done); audio appended to pcm."""
    talker, vocoder = stages["tts_engine"], stages["vocoder"]
    frame = done = False
    if talker.next_deadline() is not None:
        for kind, _, data in talker.step():
            if kind == "chunk":
                frame |= not data.context
                vocoder.feed(rid, "tts_engine", data)
            elif kind == "end":
                vocoder.end_stream(rid, "tts_engine", data)
    while vocoder.next_deadline() is not None:
        for kind, _, data in vocoder.step():
            if kind == OUT:
                pcm.append(data[1].tobytes())
            done |= kind == DONE
    return frame, done

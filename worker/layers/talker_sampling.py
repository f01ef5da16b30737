"""How a talker picks a frame's codes: its first code by the talker's settings, the others (the
code predictor's, one pass each) by the sub-talker's, as the official packages' ``generate``
does: the repetition penalty over the reply's first codes (transformers' processor), then
temperature, top-k and top-p (its warpers), one draw.

Each checkpoint says how its talkers sample (Qwen3-TTS: ``generation_config.json``; Qwen3-Omni:
its ``talker_*`` generation settings and the code predictor's config); a request may override
the talker's (``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``), and
``temperature: 0`` makes both greedy, as the reference tests decode. Every request draws from a
generator of its own, seeded by its ``seed`` (or a random one), first code then the predictor's
codes, frame after frame: the same request gives the same codes in any batch, on any worker of
one build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.contract.sampling import SamplerState, Sampling, generator, pick


@dataclass(frozen=True, slots=True)
class TalkerSampling:
    talker: Sampling  # a frame's first code
    subtalker: Sampling  # the code predictor's codes

    def with_request(self, request: Sampling | None) -> TalkerSampling:
        """These defaults under a request's settings: its temperature, top-p, top-k and
        repetition penalty replace the talker's, ``temperature: 0`` makes both greedy, its seed
        seeds both."""
        if request is None:
            return self
        seed = request.seed
        if request.temperature == 0:
            return TalkerSampling(
                dataclasses.replace(self.talker, temperature=0.0, seed=seed),
                dataclasses.replace(self.subtalker, temperature=0.0, seed=seed),
            )
        t = self.talker
        return TalkerSampling(
            dataclasses.replace(
                t,
                temperature=_given(request.temperature, t.temperature),
                top_p=_given(request.top_p, t.top_p),
                top_k=_given(request.top_k, t.top_k),
                repetition_penalty=_given(request.repetition_penalty, t.repetition_penalty),
                seed=seed,
            ),
            dataclasses.replace(self.subtalker, seed=seed),
        )

    def states(self, torch: Any, device: Any) -> tuple[SamplerState, SamplerState]:
        """A request's sampler states for its first codes and its predictor's codes, drawing
        from one generator (none when both are greedy). The repetition penalty counts only the
        reply's first codes: the talker's prompt is embeddings, as in ``generate``."""
        talker, sub = SamplerState.of(self.talker, []), SamplerState.of(self.subtalker, [])
        if not (self.talker.greedy and self.subtalker.greedy):
            talker.generator = sub.generator = generator(torch, self.talker.seed, device)
        return talker, sub


def pick_codes(torch: Any, logits: Any, states: list[SamplerState]) -> list[int]:
    """Each row's code (the sampler's ``pick``), counted for the row's repetition penalty."""
    codes = pick(torch, logits, states)
    for state, code in zip(states, codes, strict=True):
        state.add(code)
    return codes


def predictor_choice(torch: Any, states: list[SamplerState]) -> Callable[[Any], Any] | None:
    """How a code predictor's passes pick for these rows' samplers: logits (rows x vocab) ->
    codes; None when every row is greedy (the argmax)."""
    if all(s.sampling.greedy for s in states):
        return None

    def choose(logits: Any) -> Any:
        return torch.tensor(pick(torch, logits.float(), states), device=logits.device)

    return choose


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def sampled(
    temperature: float, top_k: int | None, top_p: float | None, penalty: float | None = None
) -> Sampling:
    """A checkpoint's sampling settings (``temperature`` 0: greedy) as a ``Sampling``."""
    return Sampling(
        temperature=temperature,
        top_k=top_k or None,
        top_p=None if top_p is None or top_p >= 1.0 else top_p,
        repetition_penalty=None if penalty in (None, 1.0) else penalty,
    )

"""Choosing the next token from a decoder's logits, per request: greedy, or sampled with the
OpenAI and vLLM/SGLang fields, in the order transformers' ``generate`` applies them.

0. ``logit_bias`` (OpenAI's): added to the logits of the tokens it names;
1. ``repetition_penalty`` (transformers' ``RepetitionPenaltyLogitsProcessor``): the logit of
   every token already in the prompt or the reply is divided by it (multiplied, if negative);
2. ``frequency_penalty`` / ``presence_penalty`` (OpenAI's): each token's logit is lowered by
   ``frequency x its count in the reply + presence x (count > 0)``;
3. ``temperature`` (0: greedy, the argmax after 1 and 2);
4. ``top_k``, then ``top_p`` (the smallest set whose probability reaches it), then ``min_p``
   (tokens under ``min_p x`` the top probability go);
5. one draw from a generator of the request's own: with a ``seed`` the same request draws the
   same tokens on every worker of a build (float rounding aside); without one, a random seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Sampling:
    """A request's decoding settings (None: the default, which is no change)."""

    temperature: float | None = None  # None or 0: greedy
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)

    @property
    def greedy(self) -> bool:
        return not self.temperature


@dataclass(slots=True)
class SamplerState:
    """One request's sampling state: its settings, its generator and what it has said."""

    sampling: Sampling
    generator: Any = None  # a torch.Generator, made on the first draw
    counts: dict[int, int] = field(default_factory=dict)  # reply token -> times generated
    seen: set[int] = field(default_factory=set)  # prompt and reply tokens

    @classmethod
    def of(cls, sampling: Sampling | None, prompt: list[int]) -> SamplerState:
        s = sampling or Sampling()
        return cls(s, seen=set(prompt) if s.repetition_penalty not in (None, 1.0) else set())

    def add(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.sampling.repetition_penalty not in (None, 1.0):
            self.seen.add(token)


def logprobs(torch: Any, logits: Any, tokens: list[int], top: int) -> list[tuple]:
    """Per row: (the chosen token's log probability, the ``top`` most likely tokens with
    theirs), from the model's distribution (the logits before sampling settings, as vLLM
    reports them by default)."""
    lp = logits.float().log_softmax(-1)
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if top:
        values, ids = lp.topk(top, dim=-1)
        alts = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(),
                                                             strict=True)]  # fmt: skip
    else:
        alts = [[] for _ in tokens]
    return [(c, a) for c, a in zip(chosen, alts, strict=True)]


def pick(torch: Any, logits: Any, states: list[SamplerState]) -> list[int]:
    """The next token of each row of ``logits`` (rows x vocab, float32)."""
    if all(s.sampling.greedy and not _penalised(s.sampling) for s in states):
        return logits.argmax(dim=-1).tolist()
    return [_pick_row(torch, logits[i], s) for i, s in enumerate(states)]


def _penalised(s: Sampling) -> bool:
    return bool(
        s.presence_penalty or s.frequency_penalty or s.logit_bias
    ) or s.repetition_penalty not in (None, 1.0)


def _pick_row(torch: Any, row: Any, state: SamplerState) -> int:
    s = state.sampling
    row = penalise(torch, row, state)
    if s.greedy:
        return int(row.argmax())
    probs = filtered_probs(torch, row, s)
    if state.generator is None:
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        state.generator = torch.Generator(device=row.device).manual_seed(seed)
    return int(torch.multinomial(probs, 1, generator=state.generator))


def penalise(torch: Any, row: Any, state: SamplerState) -> Any:
    s = state.sampling
    if s.logit_bias:
        known = [(t, b) for t, b in s.logit_bias if 0 <= t < row.shape[-1]]
        if known:
            row = row.clone()
            ids = torch.tensor([t for t, _ in known], device=row.device)
            row[ids] += torch.tensor([b for _, b in known], device=row.device, dtype=row.dtype)
    if s.repetition_penalty not in (None, 1.0) and state.seen:
        ids = torch.tensor(sorted(state.seen), device=row.device)
        picked = row[ids]
        penalty = float(s.repetition_penalty)
        row = row.clone()
        row[ids] = torch.where(picked < 0, picked * penalty, picked / penalty)
    if (s.presence_penalty or s.frequency_penalty) and state.counts:
        ids = torch.tensor(list(state.counts), device=row.device)
        counts = torch.tensor(list(state.counts.values()), device=row.device, dtype=row.dtype)
        row = row.clone()
        row[ids] -= (s.frequency_penalty or 0.0) * counts + (s.presence_penalty or 0.0)
    return row


def filtered_probs(torch: Any, row: Any, s: Sampling) -> Any:
    """Temperature, top-k, top-p and min-p, as transformers' warpers apply them: the
    distribution one draw is made from."""
    row = row / float(s.temperature or 1.0)
    if s.top_k is not None and 0 < s.top_k < row.shape[-1]:
        kth = torch.topk(row, s.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1.0:
        ordered, order = torch.sort(row, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - s.top_p
        drop[-1] = False  # the most likely token always stays
        row = row.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    probs = row.softmax(-1)
    if s.min_p is not None and s.min_p > 0:
        probs = probs.masked_fill(probs < s.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs

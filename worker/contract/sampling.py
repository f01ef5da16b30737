"""A request's sampling settings (``Sampling``: what the API takes, SGLang's sampler honours),
and the project's own sampler, which picks the talkers' codes in their models
(``worker.layers.talker_sampling``): greedy, or sampled with the OpenAI and vLLM/SGLang fields,
in the order transformers' ``generate`` applies them.

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

The rows of a batch are filtered together (each with its own settings) and drawn together:
each row's generator gives it one uniform number, which picks the token where the row's
cumulative distribution passes it (inverse transform sampling), so one row's draws never
depend on its batchmates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
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

    def under(self, defaults: dict[str, Any], bias: tuple[tuple[int, float], ...] = ()) -> Sampling:
        """These settings, with what they leave unset taken from ``defaults`` (a checkpoint's:
        ``generation_config.sampling_defaults``) and ``bias`` added to ``logit_bias`` (the
        checkpoint's suppressed tokens, where the engine takes no list of them)."""
        unset = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        if bias:
            unset["logit_bias"] = self.logit_bias + bias
        return replace(self, **unset) if unset else self


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


def pick(torch: Any, logits: Any, states: list[SamplerState]) -> list[int]:
    """The next token of each row of ``logits`` (rows x vocab, float32)."""
    if all(s.sampling.greedy and not _penalised(s.sampling) for s in states):
        return logits.argmax(dim=-1).tolist()
    rows = torch.stack(
        [penalise(torch, logits[i], s) if _penalised(s.sampling) else logits[i]
         for i, s in enumerate(states)]
    )  # fmt: skip
    out = rows.argmax(dim=-1)
    drawn = [i for i, s in enumerate(states) if not s.sampling.greedy]
    if drawn:
        probs = filtered_rows(torch, rows[drawn], [states[i].sampling for i in drawn])
        cdf = probs.cumsum(dim=-1)
        u = torch.cat([_uniform(torch, states[i], rows.device) for i in drawn])
        # the first token whose cumulative probability exceeds u (of the row's total, which
        # rounding keeps from 1): a token of probability 0 is never drawn
        picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
        out[drawn] = picked.clamp_(max=cdf.shape[-1] - 1)  # (u x total rounded up to total)
    return out.tolist()


def _uniform(torch: Any, state: SamplerState, device: Any) -> Any:
    """One number in [0, 1) from the request's own generator (made on its first draw: seeded
    by its ``seed``, else at random)."""
    if state.generator is None:
        state.generator = generator(torch, state.sampling.seed, device)
    return torch.rand(1, device=device, generator=state.generator)


def generator(torch: Any, seed: int | None, device: Any) -> Any:
    """A request's own generator, seeded by its ``seed`` (None: a random one)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    return torch.Generator(device=device).manual_seed(seed)


def _penalised(s: Sampling) -> bool:
    return bool(
        s.presence_penalty or s.frequency_penalty or s.logit_bias
    ) or s.repetition_penalty not in (None, 1.0)


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
    """One row's distribution (``filtered_rows`` of one row)."""
    return filtered_rows(torch, row[None], [s])[0]


def filtered_rows(torch: Any, rows: Any, settings: list[Sampling]) -> Any:
    """Temperature, top-k, top-p and min-p, each row by its own settings, as transformers'
    warpers apply them: the distributions the draws are made from (rows x vocab)."""
    vocab = rows.shape[-1]
    dev = rows.device
    temps = torch.tensor([float(s.temperature or 1.0) for s in settings], device=dev)
    rows = rows / temps[:, None]
    ks = [s.top_k if s.top_k is not None and 0 < s.top_k < vocab else vocab for s in settings]
    if min(ks) < vocab:
        values = torch.topk(rows, max(ks), dim=-1).values
        kth = values.gather(1, torch.tensor(ks, device=dev)[:, None] - 1)
        rows = rows.masked_fill(rows < kth, float("-inf"))
    ps = [s.top_p if s.top_p is not None and s.top_p < 1.0 else 1.0 for s in settings]
    if min(ps) < 1.0:
        ordered, order = torch.sort(rows, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - torch.tensor(ps, device=dev)[:, None]
        drop[:, -1] = False  # the most likely token always stays
        drop[torch.tensor(ps, device=dev) >= 1.0] = False  # (rows without top-p)
        rows = rows.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    probs = rows.softmax(-1)
    mins = [s.min_p if s.min_p is not None and s.min_p > 0 else 0.0 for s in settings]
    if max(mins) > 0:
        floor = torch.tensor(mins, device=dev)[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs

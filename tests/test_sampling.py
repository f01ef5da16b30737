"""The thinker's sampler (worker.stages.sampling) against transformers' own logits processors
and warpers, and the decode stage's stop texts: what the OpenAI sampling fields do."""

from __future__ import annotations

import pytest
import torch

from worker.stages.decode import _scan, _Text
from worker.stages.sampling import SamplerState, Sampling, filtered_probs, penalise, pick


def logits(seed: int = 0, vocab: int = 64) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    "s",
    [
        Sampling(temperature=0.7),
        Sampling(temperature=1.3, top_k=5),
        Sampling(temperature=1.0, top_p=0.8),
        Sampling(temperature=0.9, min_p=0.1),
        Sampling(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
    ],
)
def test_the_distribution_is_transformers_warpers(s: Sampling) -> None:
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    row = logits(1)
    scores = row[None].clone()
    ids = torch.zeros(1, 1, dtype=torch.long)
    warpers = [TemperatureLogitsWarper(s.temperature)]
    if s.top_k:
        warpers.append(TopKLogitsWarper(s.top_k))
    if s.top_p:
        warpers.append(TopPLogitsWarper(s.top_p))
    if s.min_p:
        warpers.append(MinPLogitsWarper(s.min_p))
    for w in warpers:
        scores = w(ids, scores)
    torch.testing.assert_close(filtered_probs(torch, row, s), scores.softmax(-1)[0])


def test_penalties_are_transformers_and_openais() -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    row = logits(2)
    prompt = [3, 7, 7, 11]
    state = SamplerState.of(Sampling(temperature=1, repetition_penalty=1.3), prompt)
    for t in (5, 5, 9):
        state.add(t)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(
        torch.tensor([[*prompt, 5, 5, 9]]), row[None].clone()
    )[0]
    torch.testing.assert_close(penalise(torch, row, state), expected)
    state = SamplerState.of(Sampling(frequency_penalty=0.5, presence_penalty=0.25), prompt)
    for t in (5, 5, 9):
        state.add(t)
    got = penalise(torch, row, state)
    assert got[5] == pytest.approx(float(row[5]) - 2 * 0.5 - 0.25)
    assert got[9] == pytest.approx(float(row[9]) - 0.5 - 0.25)
    assert got[3] == row[3]  # the prompt counts for the repetition penalty only


def test_greedy_and_seeds() -> None:
    rows = torch.stack([logits(s) for s in range(4)])
    greedy = [SamplerState.of(Sampling(temperature=0), []) for _ in range(4)]
    assert pick(torch, rows, greedy) == rows.argmax(-1).tolist()

    def draws(seed: int | None) -> list[int]:
        state = SamplerState.of(Sampling(temperature=1.0, seed=seed), [])
        return [pick(torch, rows[:1], [state])[0] for _ in range(24)]

    assert draws(7) == draws(7)  # a seed reproduces the draws
    assert len({tuple(draws(s)) for s in range(4)}) == 4  # four seeds, four sequences
    assert draws(None) != draws(None)


def test_stop_texts_cut_the_reply_and_hold_back_what_may_begin_one() -> None:
    t = _Text(("END", "\n\n"))
    assert _scan(t, "Hello E") == ("Hello ", False) and t.held == "E"
    assert _scan(t, "N") == ("", False) and t.held == "EN"
    assert _scan(t, "Dless") == ("", True)  # the reply ends before the stop text
    t = _Text(("END",))
    assert _scan(t, "An EX") == ("An EX", False)  # not a stop text after all
    assert _scan(t, "it\n\nEND") == ("it\n\n", True)
    t = _Text(("ab", "b"))
    assert _scan(t, "xab") == ("x", True)  # the earliest stop text wins

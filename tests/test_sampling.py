"""The thinker's sampler (worker.contract.sampling) against transformers' own logits processors
and warpers, and the decode stage's stop texts: what the OpenAI sampling fields do."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from worker.contract.sampling import (
    SamplerState,
    Sampling,
    filtered_probs,
    filtered_rows,
    penalise,
    pick,
)
from worker.stages.decode import _scan, _Text


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

    def draws(seed: int | None, n: int = 24) -> list[int]:
        state = SamplerState.of(Sampling(temperature=1.0, seed=seed), [])
        return [pick(torch, rows[:1], [state])[0] for _ in range(n)]

    assert draws(7) == draws(7)  # a seed reproduces the draws
    assert len({tuple(draws(s)) for s in range(4)}) == 4  # four seeds, four sequences
    # (the row's top token has p = 0.93: 24 draws each are all that token 3.5 % of the time)
    assert draws(None, 256) != draws(None, 256)


def test_a_batch_is_filtered_and_drawn_row_by_row() -> None:
    """Rows with their own settings filtered together equal each filtered alone; a row's draws
    are the same beside any batchmates; the draws follow the row's distribution."""
    rows = torch.stack([logits(s) for s in range(4)])
    settings = [
        Sampling(temperature=0.7, top_k=5),
        Sampling(temperature=1.2, top_p=0.8),
        Sampling(temperature=1.0, min_p=0.1),
        Sampling(temperature=0.9),
    ]
    batched = filtered_rows(torch, rows, settings)
    for row, s, got in zip(rows, settings, batched, strict=True):
        torch.testing.assert_close(got, filtered_probs(torch, row, s))

    def draws(batchmates: int, n: int = 40) -> list[int]:
        states = [SamplerState.of(replace(s, seed=9 + i), []) for i, s in enumerate(settings)]
        picked = [pick(torch, rows[: batchmates + 1], states[: batchmates + 1]) for _ in range(n)]
        return [p[0] for p in picked]

    assert draws(0) == draws(1) == draws(3)
    state = SamplerState.of(Sampling(temperature=1.2, seed=5), [])
    counts = torch.bincount(
        torch.tensor([pick(torch, rows[1:2], [state])[0] for _ in range(4000)]), minlength=64
    )
    expected = filtered_probs(torch, rows[1], Sampling(temperature=1.2))
    assert (counts / 4000 - expected).abs().max() < 0.03


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


def test_a_talkers_first_codes_are_drawn_as_the_official_generate_draws_them() -> None:
    """Qwen3-TTS's talker: the checkpoint's settings (its generation_config.json) and the masks
    of its engine give the distribution of the official package's ``generate``, whose
    processors are transformers': repetition penalty over the reply's codes, end-of-speech
    forbidden for two codes, the control codes suppressed, then temperature, top-k, top-p."""
    import json
    from pathlib import Path

    from transformers.generation.logits_process import (
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from worker.models.qwen3_tts.talker import checkpoint_sampling
    from worker.models.qwen3_tts.talker_sglang import FirstCodes

    hf = Path(__file__).resolve().parents[1] / "configs" / "hf"
    config = json.loads((hf / "Qwen--Qwen3-TTS-12Hz-1.7B-CustomVoice" / "config.json").read_text())
    gen = json.loads(
        (hf / "Qwen--Qwen3-TTS-12Hz-1.7B-CustomVoice" / "generation_config.json").read_text()
    )
    engine = FirstCodes(config["talker_config"])
    tc = config["talker_config"]
    vocab, eos = tc["vocab_size"], tc["codec_eos_token_id"]
    sampling = checkpoint_sampling(gen)
    s = sampling.talker
    assert (s.temperature, s.top_k, s.repetition_penalty) == (0.9, 50, 1.05)
    assert sampling.subtalker.temperature == 0.9 and sampling.subtalker.top_k == 50
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 4
    row[eos] = row.max() + 1  # the likeliest, were it not forbidden at first
    processors = [
        RepetitionPenaltyLogitsProcessor(gen["repetition_penalty"]),
        MinNewTokensLengthLogitsProcessor(0, 2, eos),
        SuppressTokensLogitsProcessor([i for i in range(vocab - 1024, vocab) if i != eos]),
        TemperatureLogitsWarper(gen["temperature"]),
        TopKLogitsWarper(gen["top_k"]),
        TopPLogitsWarper(gen["top_p"]),
    ]
    for generated in ([], [17], [17, 17, 402, 9]):
        ids = torch.tensor([generated], dtype=torch.long)
        scores = row[None].clone()
        for p in processors:
            scores = p(ids, scores)
        state = SamplerState.of(s, [])
        for code in generated:
            state.add(code)
        masked = engine.masked(row[None], [generated])[0]
        ours = filtered_probs(torch, penalise(torch, masked, state), s)
        torch.testing.assert_close(ours, scores.softmax(-1)[0])
        assert (ours[eos] == 0) == (len(generated) < 2)


def test_qwen3_omni_talker_samples_as_its_checkpoint_and_a_request_overrides_it() -> None:
    """The released Qwen3-Omni's talker samples by its ``talker_*`` generation settings and its
    code predictor decodes greedily (its config's ``do_sample``); a request's fields replace the
    talker's, ``temperature: 0`` makes both greedy, and its seed seeds one generator for both."""
    import json
    from pathlib import Path

    from transformers import Qwen3OmniMoeConfig

    from worker.models.qwen3_omni.talker import checkpoint_sampling

    directory = Path(__file__).resolve().parents[1] / "configs/hf/Qwen--Qwen3-Omni-30B-A3B-Instruct"
    config = Qwen3OmniMoeConfig.from_pretrained(directory)
    defaults = checkpoint_sampling(
        config, json.loads((directory / "generation_config.json").read_text())
    )
    t, sub = defaults.talker, defaults.subtalker
    assert (t.temperature, t.top_k, t.top_p, t.repetition_penalty) == (0.9, 50, None, 1.05)
    assert sub.greedy
    asked = defaults.with_request(Sampling(temperature=0.5, top_k=7, seed=3))
    assert (asked.talker.temperature, asked.talker.top_k, asked.talker.seed) == (0.5, 7, 3)
    assert asked.subtalker.greedy and asked.subtalker.seed == 3
    greedy = defaults.with_request(Sampling(temperature=0))
    assert greedy.talker.greedy and greedy.talker.repetition_penalty == 1.05
    first, rest = asked.states(torch, "cpu")
    assert first.generator is rest.generator is not None
    assert greedy.states(torch, "cpu")[0].generator is None

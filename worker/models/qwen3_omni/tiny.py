"""The embedded default: a tiny Qwen3-Omni with the real classes, MoE included, at toy sizes.

``configs/hf/tiny-omni/config.json`` is an ordinary ``Qwen3OmniMoeForConditionalGeneration``
config (thinker with audio tower and vision encoder, talker with code predictor, code2wav).
On first use the worker builds it with seeded random weights and writes an ordinary checkpoint
directory: sharded safetensors with an index, a byte-level tokenizer with Qwen3-Omni's special
tokens and chat template, and the processor's configs. From then on it is served exactly like
the 30 B checkpoint. Its text and audio are meaningless; its computation is the real one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SPECIAL_TOKENS = [  # ids 256.. in this order; the tiny configs name these ids
    "<|endoftext|>",  # 256
    "<|im_start|>",  # 257
    "<|im_end|>",  # 258
    "<|audio_start|>",  # 259
    "<|audio_end|>",  # 260
    "<|audio_pad|>",  # 261
    "<|vision_start|>",  # 262
    "<|vision_end|>",  # 263
    "<|image_pad|>",  # 264
    "<|video_pad|>",  # 265
    "<tts_pad>",  # 266
    "<tts_text_bos>",  # 267
    "<tts_text_eod>",  # 268
]
# Role names are one token each, as in Qwen's vocabulary: the talker finds the user and
# assistant turns by the token after <|im_start|>.
ROLE_TOKENS = ["user", "assistant", "system"]  # 269, 270, 271

# Qwen3-Omni's chat layout: audio, image and video parts become their placeholder spans, which
# the processor expands to one token per encoder output. With ``tools``, Qwen's function-calling
# layout: a system turn that lists them in <tools> and says how to call them, an assistant's
# calls as <tool_call> blocks, and tool results as <tool_response> blocks in a user turn.
CHAT_TEMPLATE = "".join(
    (
        # a message's content: its text, its media parts' placeholder spans
        r"{%- macro render(content) %}",
        r"{%- if content is string %}{{ content }}",
        r"{%- else %}{%- for p in content %}",
        r"{%- if p['type'] == 'text' %}{{ p['text'] }}",
        r"{%- elif p['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>",
        r"{%- elif p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>",
        r"{%- elif p['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>",
        r"{%- endif %}{%- endfor %}{%- endif %}",
        r"{%- endmacro %}",
        # tools: a system turn (the client's system message first) listing them
        r"{%- set ns = namespace(first=0) %}",
        r"{%- if tools %}<|im_start|>system{{ '\n' }}",
        r"{%- if messages[0]['role'] == 'system' %}{{ render(messages[0]['content']) }}",
        r"{{ '\n\n' }}{%- set ns.first = 1 %}{%- endif %}",
        r"{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}",
        r"{{ 'You are provided with function signatures within <tools></tools> XML tags:\n' }}",
        r"<tools>{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{%- endfor %}",
        r"{{ '\n</tools>\n\nFor each function call, return a json object with function ' }}",
        r"{{ 'name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}",
        r"""{{ '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}""",
        r"<|im_end|>{{ '\n' }}",
        r"{%- endif %}",
        r"{%- for m in messages[ns.first:] %}",
        # tool results: consecutive ones in one user turn
        r"{%- if m['role'] == 'tool' %}",
        r"{%- if loop.first or loop.previtem['role'] != 'tool' %}<|im_start|>user{%- endif %}",
        r"{{ '\n<tool_response>\n' }}{{ render(m['content']) }}{{ '\n</tool_response>' }}",
        r"{%- if loop.last or loop.nextitem['role'] != 'tool' %}<|im_end|>{{ '\n' }}{%- endif %}",
        r"{%- else %}<|im_start|>{{ m['role'] }}{{ render(m['content']) }}",
        # an assistant's calls
        r"{%- for call in m['tool_calls'] or [] %}",
        r"""{{ '\n<tool_call>\n{"name": "' }}{{ call['function']['name'] }}""",
        r"""{{ '", "arguments": ' }}""",
        r"{%- if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}",
        r"{%- else %}{{ call['function']['arguments'] | tojson }}{%- endif %}",
        r"{{ '}\n</tool_call>' }}{%- endfor %}",
        r"<|im_end|>{{ '\n' }}",
        r"{%- endif %}",
        r"{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}",
    )
)


def build_tokenizer(out_dir: Path) -> None:
    """A byte-level tokenizer with Qwen3-Omni's special tokens and chat template, saved like a
    real one so that ``AutoTokenizer.from_pretrained`` loads it."""
    from worker.models.tokenizer import build_byte_tokenizer

    build_byte_tokenizer(
        out_dir,
        SPECIAL_TOKENS,
        ROLE_TOKENS,
        CHAT_TEMPLATE,
        extra_special_tokens={
            "audio_token": "<|audio_pad|>",
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )


def build_checkpoint(config_dir: Path, out: Path, seed: int) -> None:
    """Seeded random weights for ``config_dir/config.json``, saved as a sharded checkpoint with
    tokenizer and processor files."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerConfig,
        Qwen3OmniMoeTalkerTextConfig,
    )

    config = Qwen3OmniMoeConfig.from_pretrained(config_dir)
    # Sub-configs are annotated as the constructors take them (dict, config or None); a built
    # config holds config objects and the talker's speaker table.
    talker_config = config.talker_config
    assert isinstance(talker_config, Qwen3OmniMoeTalkerConfig)
    talker_text = talker_config.text_config
    assert isinstance(talker_text, Qwen3OmniMoeTalkerTextConfig)
    speakers = talker_config.speaker_id
    assert speakers is not None
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    _initialise_talker_experts(model.talker, talker_text.initializer_range)
    _calibrate_code2wav(model.code2wav)
    _printable_thinker(model.thinker.lm_head, config.im_end_token_id)
    _distinct_speakers(model.talker, speakers.values())
    # Small shards: the tiny checkpoint goes through the index like a 35 B one does.
    model.save_pretrained(out, max_shard_size="1MB")
    build_tokenizer(out)
    # the processor's files; not the seed file: the result is an ordinary checkpoint
    for extra in config_dir.iterdir():
        skip = ("config.json", "seeded_weights.json")
        if extra.is_file() and extra.name not in skip and not (out / extra.name).exists():
            shutil.copyfile(extra, out / extra.name)


def _initialise_talker_experts(talker, std: float) -> None:
    """transformers' ``_init_weights`` initialises the thinker's fused experts but not the
    talker's: left alone they hold whatever memory ``torch.empty`` returned, so the checkpoint
    (and every voice) would differ from build to build and machine to machine. Draw them, and
    the talker's router (left at zero, which ties every expert), from the seeded generator."""
    import torch

    with torch.no_grad():
        for layer in talker.model.layers:
            moe = layer.mlp
            if hasattr(moe, "experts"):
                for weight in (moe.experts.gate_up_proj, moe.experts.down_proj, moe.gate.weight):
                    weight.normal_(0.0, std)


def _printable_thinker(lm_head, end_of_turn: int) -> None:
    """A random thinker babbles bytes that form no UTF-8 and ids no tokenizer knows; zero the
    output rows of everything but printable ASCII and newline (end-of-turn at half weight), so
    the toy model writes readable (meaningless) text that streams in many deltas."""
    import torch

    keep = torch.zeros(lm_head.weight.shape[0], dtype=torch.bool)
    keep[32:127] = True
    keep[10] = True
    with torch.no_grad():
        end = lm_head.weight[end_of_turn].clone()
        lm_head.weight[~keep] = 0.0
        lm_head.weight[end_of_turn] = 0.5 * end  # replies end now and then, not at once


def _distinct_speakers(talker, speaker_ids) -> None:
    """A random speaker row is one input among many in the talker's prompt and barely moves its
    argmax; scale the speakers' rows up so the toy model's built-in voices sound different."""
    import torch

    rows = torch.tensor(list(speaker_ids))
    with torch.no_grad():
        talker.get_input_embeddings().weight[rows] *= 8.0


def _calibrate_code2wav(code2wav) -> None:
    """Random code2wav weights clip or whisper; scale its last convolution to an audible level
    (the output is clamped to [-1, 1], so the scale is found in a few passes)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    cfg = code2wav.config
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 24), generator=gen)
    conv = code2wav.decoder[-1].conv
    with torch.no_grad():
        for _ in range(3):
            rms = code2wav(codes).float().pow(2).mean().sqrt().item()
            scale = 0.1 / max(rms, 1e-12)
            conv.weight.mul_(scale)
            conv.bias.mul_(scale)


def is_tiny(config_dir: Path) -> bool:
    try:
        return json.loads((config_dir / "config.json").read_text()).get("model_type") == (
            "qwen3_omni_moe"
        )
    except (OSError, ValueError):
        return False

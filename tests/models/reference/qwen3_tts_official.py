"""Runs inside the reference venv (scripts/reference/venv.sh): the official ``qwen-tts`` package.

    python qwen3_tts_official.py build CONFIG_DIR OUT SEED
        a tiny checkpoint built WITH THE OFFICIAL CLASSES and written by their save_pretrained:
        Qwen3TTSForConditionalGeneration (talker, code predictor, speaker encoder on Base) at the
        root, Qwen3TTSTokenizerV2Model (Mimi encoder + 12 Hz decoder) under speech_tokenizer/,
        the Qwen2 tokenizer + Qwen3TTSProcessor files and generation_config.json.
    python qwen3_tts_official.py generate CHECKPOINT REQUESTS.json OUT.npz
        greedy generation through Qwen3TTSModel (generate_custom_voice, generate_voice_design /
        generate_voice_clone):
        per request the talker codes, the waveform and (cloning) the reference codes and the
        speaker embedding.

Never imported by omni-fleet: it only touches the official package, torch and numpy.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

# Tiny byte-level vocabulary: ids 0..255 are bytes, then these, in this order. The tiny
# configs name these ids (im_start 257, im_end 258, tts_pad 259, tts_bos 260, tts_eos 261).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
]
ROLE_TOKENS = ["assistant", "user", "system"]  # 262, 263, 264: one token each, as in Qwen's


def _register():
    from qwen_tts.core.models import (
        Qwen3TTSConfig,
        Qwen3TTSForConditionalGeneration,
        Qwen3TTSProcessor,
    )
    from transformers import AutoConfig, AutoModel, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig)
    AutoModel.register(Qwen3TTSConfig, Qwen3TTSForConditionalGeneration)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor)


def _perturb(module: torch.nn.Module, gen: torch.Generator, std: float) -> None:
    """Seeded noise on every float parameter and buffer: zero-initialised codebooks, snake
    activations and layer scales become random too, so every tensor matters to the output."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point() or name.endswith("initialized"):
                continue
            if name.endswith(("cluster_usage",)):
                t.copy_(1.0 + torch.rand(t.shape, generator=gen))
                continue
            t.add_(torch.randn(t.shape, generator=gen) * std)


def build_tokenizer(out: Path) -> None:
    from qwen_tts.core.models import Qwen3TTSProcessor
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, normalized=False) for t in ROLE_TOKENS])
    fast = Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        bos_token=None,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    Qwen3TTSProcessor(tokenizer=fast).save_pretrained(out)


def build(config_dir: Path, out: Path, seed: int) -> None:
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import EncodecFeatureExtractor

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config = Qwen3TTSConfig(**json.loads((config_dir / "config.json").read_text()))
    model = Qwen3TTSForConditionalGeneration(config).eval()
    _perturb(model, gen, 0.02)
    model.save_pretrained(tmp)

    st_cfg = Qwen3TTSTokenizerV2Config(
        **json.loads((config_dir / "speech_tokenizer" / "config.json").read_text())
    )
    codec = Qwen3TTSTokenizerV2Model(st_cfg).eval()
    _perturb(codec, gen, 0.05)
    _calibrate(codec, gen)
    codec.save_pretrained(tmp / "speech_tokenizer")
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(
        tmp / "speech_tokenizer"
    )
    build_tokenizer(tmp)
    # The weights are save_pretrained's; config.json is the published layout (the package's own
    # save_pretrained writes a speaker_encoder_config that its Qwen3TTSConfig cannot read back,
    # so the published checkpoints carry hand-written configs: so do these).
    for name in ("config.json", "generation_config.json", "speech_tokenizer/config.json"):
        shutil.copyfile(config_dir / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _calibrate(codec, gen: torch.Generator) -> None:
    """Scale the decoder's last convolution so random codes give an audible, unclipped level."""
    dec = codec.decoder
    codes = torch.randint(
        0, dec.config.codebook_size, (1, dec.config.num_quantizers, 20), generator=gen
    )
    conv = dec.decoder[-1].conv
    with torch.no_grad():
        for _ in range(3):
            rms = dec(codes).float().pow(2).mean().sqrt().item()
            scale = 0.1 / max(rms, 1e-12)
            conv.weight.mul_(scale)
            conv.bias.mul_(scale)


def generate(checkpoint: Path, requests_path: Path, out: Path) -> None:
    from qwen_tts import Qwen3TTSModel

    _register()
    tts = Qwen3TTSModel.from_pretrained(str(checkpoint), dtype=torch.float32, device_map="cpu")
    requests = json.loads(requests_path.read_text())
    result: dict[str, np.ndarray] = {}
    for i, req in enumerate(requests):
        common = dict(
            do_sample=False,
            subtalker_dosample=False,
            max_new_tokens=req["max_new_tokens"],
        )
        if req.get("ref_audio") is not None:
            wav_ref = np.load(req["ref_audio"]).astype(np.float32)
            items = tts.create_voice_clone_prompt(
                ref_audio=(wav_ref, int(req["ref_sr"])),
                ref_text=req.get("ref_text"),
                x_vector_only_mode=bool(req.get("x_vector_only", False)),
            )
            item = items[0]
            if item.ref_code is not None:
                result[f"{i}.ref_code"] = item.ref_code.cpu().numpy()
            result[f"{i}.spk"] = item.ref_spk_embedding.float().cpu().numpy()
            codes = _capture_codes(tts)
            wavs, sr = tts.generate_voice_clone(
                text=req["text"],
                language=req.get("language", "Auto"),
                voice_clone_prompt=items,
                non_streaming_mode=bool(req.get("non_streaming_mode", False)),
                **common,
            )
        elif req.get("design"):
            codes = _capture_codes(tts)
            wavs, sr = tts.generate_voice_design(
                text=req["text"],
                instruct=req["instruct"],
                language=req.get("language", "Auto"),
                non_streaming_mode=bool(req.get("non_streaming_mode", True)),
                **common,
            )
        else:
            codes = _capture_codes(tts)
            wavs, sr = tts.generate_custom_voice(
                text=req["text"],
                speaker=req["speaker"],
                language=req.get("language", "Auto"),
                instruct=req.get("instruct"),
                non_streaming_mode=bool(req.get("non_streaming_mode", True)),
                **common,
            )
        result[f"{i}.codes"] = codes[-1].cpu().numpy()
        result[f"{i}.wav"] = np.asarray(wavs[0], dtype=np.float32)
        result[f"{i}.sr"] = np.asarray(sr)
    np.savez(out, **result)


def _capture_codes(tts) -> list:
    """The talker codes of the next generate call (what the package decodes, before any
    reference codes are prepended)."""
    captured: list = []
    model = tts.model
    original = type(model).generate

    def wrapped(self, *args, **kwargs):
        codes_list, hidden = original(self, *args, **kwargs)
        captured.append(codes_list[0])
        model.generate = original.__get__(model)
        return codes_list, hidden

    model.generate = wrapped.__get__(model)
    return captured


def bench(checkpoint: Path, n: int, max_new_tokens: int, out: Path) -> None:
    """The package's own speed: ``n`` requests one at a time (what it offers: no server, no
    batching across callers), after one warm-up request."""
    import time

    from qwen_tts import Qwen3TTSModel

    _register()
    tts = Qwen3TTSModel.from_pretrained(str(checkpoint), dtype=torch.float32, device_map="cpu")
    speakers = sorted(tts.model.get_supported_speakers())
    kw = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=max_new_tokens)
    tts.generate_custom_voice(text="warm up", speaker=speakers[0], language="Auto", **kw)
    t0 = time.perf_counter()
    seconds = 0.0
    for i in range(n):
        wavs, sr = tts.generate_custom_voice(
            text=f"Request number {i} of the benchmark.", speaker=speakers[i % len(speakers)],
            language="English", **kw,
        )  # fmt: skip
        seconds += len(wavs[0]) / sr
    wall = time.perf_counter() - t0
    out.write_text(json.dumps({"requests": n, "audio_seconds": seconds, "wall_seconds": wall}))


def jobs(path: Path) -> None:
    """Several builds and generations in one process (the package imports once)."""
    for job in json.loads(path.read_text()):
        if job["cmd"] == "bench":
            bench(Path(job["checkpoint"]), job["n"], job["max_new_tokens"], Path(job["out"]))
        elif job["cmd"] == "build":
            build(Path(job["config_dir"]), Path(job["out"]), int(job["seed"]))
        else:
            generate(Path(job["checkpoint"]), Path(job["requests"]), Path(job["out"]))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "jobs":
        jobs(Path(sys.argv[2]))
    elif cmd == "build":
        build(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "generate":
        generate(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {cmd}")

"""Runs inside the reference venv (scripts/reference/venv.sh): the official ``qwen-asr`` package.

    python qwen3_asr_official.py jobs JOBS.json
        {"cmd": "build", "config_dir", "out", "seed"}: a tiny checkpoint built with the official
        Qwen3ASRForConditionalGeneration and written by its save_pretrained, with a byte-level
        Qwen2 tokenizer (the audio and role tokens the tiny configs name), a chat template and
        the Whisper feature extractor: Qwen3ASRProcessor.save_pretrained.
        {"cmd": "generate", "checkpoint", "requests", "out"}: Qwen3ASRModel.transcribe on each
        request's 16 kHz audio (greedy), recording the generated token ids and the parsed
        language and text. A request's "max_chunk_seconds" lowers the package's cut limit
        (MAX_ASR_INPUT_SECONDS, 1200 s) so that cutting long audio near pauses is checked on
        short audio; every chunk's offset, prompt and tokens are recorded.
        {"cmd": "align", "checkpoint", "requests": [{"audio": [...], "text": [...],
        "language": [...]}], "out"}: Qwen3ForcedAligner.align (one batch per request).
        A "generate" request with "timestamps" transcribes with the checkpoint's
        forced_aligner/ (return_time_stamps: 180 s chunks, words offset per chunk).
        {"cmd": "split", "audio", "max_seconds": [...], "out"}: the package's own
        split_audio_into_chunks at each limit (offsets and lengths of the chunks).

Never imported by omni-fleet.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

SPECIAL_TOKENS = [
    "<|endoftext|>",  # 256
    "<|im_start|>",  # 257
    "<|im_end|>",  # 258
    "<|audio_start|>",  # 259
    "<|audio_end|>",  # 260
    "<|audio_pad|>",  # 261
    "<asr_text>",  # 262
]
ROLE_TOKENS = ["system", "user", "assistant"]  # 263..265
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _register():
    from qwen_asr.core.transformers_backend import (
        Qwen3ASRConfig,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )
    from transformers import AutoConfig, AutoModel, AutoProcessor

    AutoConfig.register("qwen3_asr", Qwen3ASRConfig)
    AutoModel.register(Qwen3ASRConfig, Qwen3ASRForConditionalGeneration)
    AutoProcessor.register(Qwen3ASRConfig, Qwen3ASRProcessor)
    _window_the_audio_encoder()


def _window_the_audio_encoder() -> None:
    """The audio encoder attends within 8 s blocks (``n_window_infer``: its ``cu_seqlens``),
    as the package's flash-attention and vLLM paths compute it; its transformers backend never
    hands the block mask it builds (``_prepare_attention_mask``) to sdpa/eager, so on CPU every
    clip over 8 s would attend across blocks. The layers get the package's own mask here."""
    from qwen_asr.core.transformers_backend import modeling_qwen3_asr as mod

    layer = mod.Qwen3ASRAudioEncoderLayer
    if getattr(layer, "_omni_windowed", False):
        return
    forward = layer.forward

    def windowed(self, hidden_states, cu_seqlens, attention_mask=None, **kwargs):
        if attention_mask is None:
            attention_mask = mod.Qwen3ASRAudioEncoder._prepare_attention_mask(
                self.self_attn, hidden_states, cu_seqlens
            )
        return forward(self, hidden_states, cu_seqlens, attention_mask, **kwargs)

    layer.forward = windowed
    layer._omni_windowed = True


def build(config_dir: Path, out: Path, seed: int) -> None:
    from qwen_asr.core.transformers_backend import (
        Qwen3ASRConfig,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast, WhisperFeatureExtractor
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = Qwen3ASRConfig(**json.loads((config_dir / "config.json").read_text()))
    model = Qwen3ASRForConditionalGeneration(config).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(tmp)

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    config_json = json.loads((config_dir / "config.json").read_text())
    timestamps = ["<timestamp>"] if "timestamp_token_id" in config_json else []
    tok.add_special_tokens(SPECIAL_TOKENS + timestamps)
    tok.add_tokens([AddedToken(t, normalized=False) for t in ROLE_TOKENS])
    fast = Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        bos_token=None,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        extra_special_tokens={
            "audio_token": "<|audio_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
    )
    fe = WhisperFeatureExtractor(
        **{
            k: v
            for k, v in json.loads((config_dir / "preprocessor_config.json").read_text()).items()
            if k not in ("processor_class", "feature_extractor_type")
        }
    )
    processor = Qwen3ASRProcessor(feature_extractor=fe, tokenizer=fast, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(tmp)
    shutil.copyfile(config_dir / "config.json", tmp / "config.json")
    if (config_dir / "forced_aligner" / "config.json").is_file():
        build(config_dir / "forced_aligner", tmp / "forced_aligner", seed + 1)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def generate(checkpoint: Path, requests_path: Path, out: Path) -> None:
    import qwen_asr.inference.qwen3_asr as package
    from qwen_asr import Qwen3ASRModel
    from qwen_asr.inference.utils import split_audio_into_chunks

    _register()
    requests = json.loads(requests_path.read_text())
    result: dict = {}
    for i, req in enumerate(requests):
        package.MAX_ASR_INPUT_SECONDS = req.get("max_chunk_seconds") or 1200
        aligner = {}
        if req.get("timestamps"):
            aligner = {
                "forced_aligner": str(checkpoint / "forced_aligner"),
                "forced_aligner_kwargs": {"dtype": torch.float32, "device_map": "cpu"},
            }
        asr = Qwen3ASRModel.from_pretrained(
            str(checkpoint), dtype=torch.float32, device_map="cpu",
            max_new_tokens=req["max_new_tokens"], **aligner,
        )  # fmt: skip
        captured = []
        original = asr.model.generate

        def wrapped(*args, _orig=original, _cap=captured, **kwargs):
            res = _orig(*args, **kwargs)
            _cap.append((kwargs["input_ids"].shape[1], res.sequences))
            return res

        asr.model.generate = wrapped
        wav = np.load(req["audio"]).astype(np.float32)
        res = asr.transcribe(
            audio=(wav, 16000), language=req.get("language"),
            return_time_stamps=bool(req.get("timestamps")),
        )  # fmt: skip
        if req.get("timestamps"):
            stamps = res[0].time_stamps.items if res[0].time_stamps else []
            result[f"{i}.words"] = np.asarray(json.dumps(
                [[w.text, w.start_time, w.end_time] for w in stamps]))  # fmt: skip
        prompt_len, seqs = captured[-1]
        result[f"{i}.tokens"] = seqs[0, prompt_len:].cpu().numpy()
        result[f"{i}.prompt"] = seqs[0, :prompt_len].cpu().numpy()
        result[f"{i}.text"] = np.asarray(res[0].text)
        result[f"{i}.language"] = np.asarray(res[0].language)
        chunks = split_audio_into_chunks(wav, 16000, package.MAX_ASR_INPUT_SECONDS)
        result[f"{i}.offsets"] = np.asarray([off for _, off in chunks])
        pad = asr.processor.tokenizer.pad_token_id
        for j, row in enumerate(seqs):  # left-padded batch of the chunks
            prompt = row[:prompt_len]
            result[f"{i}.chunk{j}.prompt"] = prompt[prompt != pad].cpu().numpy()
            gen = row[prompt_len:].tolist()
            stop = next((k for k, t in enumerate(gen) if t in EOS), len(gen) - 1)
            result[f"{i}.chunk{j}.tokens"] = np.asarray(gen[: stop + 1])
    np.savez(out, **result)


EOS = (151645, 151643, 258)  # <|im_end|>, <|endoftext|> (real vocabulary), <|im_end|> (tiny)


def align(checkpoint: Path, requests: list[dict], out: Path) -> None:
    """Qwen3ForcedAligner.align on given transcripts: [word, start, end] per word."""
    from qwen_asr.inference.qwen3_forced_aligner import Qwen3ForcedAligner

    _register()
    aligner = Qwen3ForcedAligner.from_pretrained(
        str(checkpoint), dtype=torch.float32, device_map="cpu"
    )
    result = {}
    for i, req in enumerate(requests):
        wavs = [(np.load(a).astype(np.float32), 16000) for a in req["audio"]]
        found = aligner.align(audio=wavs, text=req["text"], language=req["language"])
        words = [[[w.text, w.start_time, w.end_time] for w in r.items] for r in found]
        result[str(i)] = np.asarray(json.dumps(words))
    np.savez(out, **result)


def split(audio: Path, limits: list[float], out: Path) -> None:
    from qwen_asr.inference.utils import split_audio_into_chunks

    wav = np.load(audio).astype(np.float32)
    result = {}
    for limit in limits:
        chunks = split_audio_into_chunks(wav, 16000, limit)
        result[f"{limit}.offsets"] = np.asarray([off for _, off in chunks])
        result[f"{limit}.lengths"] = np.asarray([c.size for c, _ in chunks])
    np.savez(out, **result)


def bench(checkpoint: Path, audio: Path, n: int, max_new_tokens: int, out: Path) -> None:
    """The package's own speed: ``n`` transcriptions one at a time, after one warm-up."""
    import time

    from qwen_asr import Qwen3ASRModel

    _register()
    asr = Qwen3ASRModel.from_pretrained(
        str(checkpoint), dtype=torch.float32, device_map="cpu", max_new_tokens=max_new_tokens
    )
    wav = np.load(audio).astype(np.float32)
    asr.transcribe(audio=(wav, 16000))
    t0 = time.perf_counter()
    for _ in range(n):
        asr.transcribe(audio=(wav, 16000))
    wall = time.perf_counter() - t0
    seconds = n * wav.size / 16000
    out.write_text(json.dumps({"requests": n, "audio_seconds": seconds, "wall_seconds": wall}))


def jobs(path: Path) -> None:
    for job in json.loads(path.read_text()):
        if job["cmd"] == "bench":
            bench(Path(job["checkpoint"]), Path(job["audio"]), job["n"], job["max_new_tokens"],
                  Path(job["out"]))  # fmt: skip
        elif job["cmd"] == "align":
            align(Path(job["checkpoint"]), job["requests"], Path(job["out"]))
        elif job["cmd"] == "split":
            split(Path(job["audio"]), job["max_seconds"], Path(job["out"]))
        elif job["cmd"] == "build":
            build(Path(job["config_dir"]), Path(job["out"]), int(job["seed"]))
        else:
            generate(Path(job["checkpoint"]), Path(job["requests"]), Path(job["out"]))


if __name__ == "__main__":
    jobs(Path(sys.argv[2]))

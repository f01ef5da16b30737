"""Shared by the Qwen3-TTS tests: the reference venv, tiny checkpoints built by the official
``qwen-tts`` classes, the official package's greedy output, and specs serving a checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from tests.models.waveforms import assert_same_waveform

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "configs" / "hf"
OFFICIAL = REPO / "tests" / "models" / "reference" / "qwen3_tts_official.py"
CACHE = Path(os.environ.get("OMNI_REFERENCE_CACHE", Path.home() / ".cache" / "omni-fleet"))
SEED = 7


def reference_python() -> Path:
    """The reference venv's python (scripts/reference/venv.sh builds it once, ~3 min)."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "reference" / "venv.sh")],
        env={**os.environ, "OMNI_PROJECT_PYTHON": sys.executable},  # its torch, shared
        check=True,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    return Path(out.stdout.strip().splitlines()[-1]) / "bin" / "python"


def _digest(config_dir: Path, script: Path = OFFICIAL) -> str:
    h = hashlib.sha256(script.read_bytes())
    for p in sorted(config_dir.rglob("*.json")):
        h.update(p.relative_to(config_dir).as_posix().encode() + p.read_bytes())
    return h.hexdigest()[:12]


def run_official(jobs: list[dict], tmp: Path, script: Path = OFFICIAL) -> None:
    if not jobs:
        return
    path = tmp / f"jobs-{len(list(tmp.glob('jobs-*.json')))}.json"
    path.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [str(reference_python()), str(script), "jobs", str(path)],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def official_checkpoints(names: list[str], tmp: Path, script: Path = OFFICIAL) -> dict[str, Path]:
    """Tiny checkpoints written by the official classes' save_pretrained, cached by config."""
    out, jobs = {}, []
    for name in names:
        cfg = HF / name
        dst = CACHE / "reference-checkpoints" / f"{name}-{_digest(cfg, script)}"
        out[name] = dst
        if not (dst / "config.json").is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            jobs.append({"cmd": "build", "config_dir": str(cfg), "out": str(dst), "seed": SEED})
    run_official(jobs, tmp, script)
    return out


def official_generate(
    runs: dict[str, list[dict]], checkpoints: dict[str, Path], tmp: Path, script: Path = OFFICIAL
) -> dict[str, dict]:
    """Per checkpoint name: the official package's results for its requests (one process)."""
    jobs = []
    for name, requests in runs.items():
        (tmp / f"{name}.req.json").write_text(json.dumps(requests))
        jobs.append(
            {
                "cmd": "generate",
                "checkpoint": str(checkpoints[name]),
                "requests": str(tmp / f"{name}.req.json"),
                "out": str(tmp / f"{name}.out.npz"),
            }
        )
    run_official(jobs, tmp, script)
    return {name: dict(np.load(tmp / f"{name}.out.npz")) for name in runs}


def spec_for(
    spec_name: str,
    checkpoint: Path,
    tmp: Path,
    max_new_tokens: int,
    served_as: str | None = None,
    tree: Path = REPO,
) -> Path:
    """The embedded spec (``tree``'s, this repository's by default) served from ``checkpoint``
    instead of its seeded tiny weights (under the model name ``served_as``, if given)."""
    spec = yaml.safe_load((tree / "configs" / "models" / f"{spec_name}.yaml").read_text())
    spec["model_dir"] = str(checkpoint)
    if served_as:
        spec["name"] = served_as
    spec["stages"]["tts_engine"]["engine"]["max_new_tokens"] = max_new_tokens
    path = tmp / f"{spec_name}-{checkpoint.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def to_int16(wav: np.ndarray) -> np.ndarray:
    return np.clip(np.round(np.asarray(wav, np.float64) * 32767.0), -32768, 32767).astype(np.int16)


FRAME = 1920  # 24 kHz samples per 12 Hz frame


def reference_audio() -> tuple[bytes, np.ndarray]:
    """1.3 s of a decaying tone with noise as a 24 kHz wav, and the samples the worker stores."""
    import io

    import soundfile as sf

    from worker.api import audio

    rate = 24_000
    t = np.arange(int(rate * 1.3)) / rate
    noise = np.random.default_rng(0).standard_normal(t.size)
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) * np.exp(-t) + 0.05 * noise
    buf = io.BytesIO()
    sf.write(buf, wav.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    data = buf.getvalue()
    stored = audio.from_pcm16(
        audio.to_pcm16(audio.decode_audio(data, max_seconds=60, target_rate=rate))
    )
    return data, stored


def assert_same_speech(pcm: np.ndarray, wav: np.ndarray, what: str) -> None:
    """``pcm`` (int16) is the package's waveform ``wav`` within two int16 steps (the vocoder
    decodes a stream in growing windows: float rounding differs from one pass); otherwise the
    failure names the first frame that differs and its SNR."""
    assert_same_waveform(pcm, to_int16(wav), FRAME, f"{what} (against the package)")

"""Worker pieces without a worker process: settings and flags, GPU visibility, audio codecs,
and registration against a real Redis that goes away and comes back."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import redis
import soundfile as sf
from pydantic import ValidationError
from worker_fakes import FakePipeline

from fleet.errors import OmniError
from fleet.records import WorkerRecord, WorkerStatus
from fleet.redis_server import RedisServer
from fleet.store import FleetStore, connect
from planner.spec import ModelSpec
from worker import gpus
from worker.api import audio
from worker.cli import split_overrides
from worker.registration import Registrar
from worker.service import WorkerService
from worker.settings import WorkerSettings


def test_every_flag_is_also_an_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_DRAIN_TIMEOUT", "7")
    monkeypatch.setenv("OMNI_WORKER_TOKEN", "tok")
    monkeypatch.setenv("OMNI_PORT", "9001")
    s = WorkerSettings(_cli_parse_args=["--port", "9002"])
    assert s.drain_timeout == 7 and s.port == 9002  # the flag wins over the variable
    assert s.token is not None and s.token.get_secret_value() == "tok"


@pytest.mark.parametrize(
    "args",
    [
        ["--load-interval", "0.6"],  # slower than 2 Hz
        ["--heartbeat-interval", "3", "--heartbeat-ttl", "3"],  # expires between heartbeats
        ["--port", "70000"],
        ["--no-such-flag", "1"],
    ],
)
def test_bad_settings_are_refused(args: list[str]) -> None:
    with pytest.raises((ValidationError, SystemExit)):
        WorkerSettings(_cli_parse_args=args)


def test_spec_overrides_are_split_from_worker_flags() -> None:
    rest, overrides = split_overrides(
        [
            "--port",
            "1",
            "--thinker.dtype",
            "fp32",
            "--talker.engine.max_new_tokens=9",
            "--node",
            "n",
        ]
    )
    assert rest == ["--port", "1", "--node", "n"]
    assert overrides == ["thinker.dtype=fp32", "talker.engine.max_new_tokens=9"]


def test_cuda_visible_devices_restricts_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert gpus._visible(range(4)) == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus._visible(range(4)) == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus._visible(range(2)) == [0, 1]
    found, method = gpus.detect()
    assert method in ("nvml", "torch", "none") and (method == "none") == (found == [])


def test_audio_decode_resamples_downmixes_and_validates() -> None:
    buf = io.BytesIO()
    stereo = np.stack([np.full(4800, 0.5), np.full(4800, -0.1)], axis=1).astype(np.float32)
    sf.write(buf, stereo, 48_000, format="WAV", subtype="FLOAT")
    mono = audio.decode_audio(buf.getvalue(), max_seconds=1.0)
    assert mono.dtype == np.float32 and mono.size == 1600
    assert np.allclose(mono, 0.2, atol=1e-6)
    for bad in (b"", b"RIFF\x00\x00", b"\x00" * 100):
        with pytest.raises(OmniError) as err:
            audio.decode_audio(bad, max_seconds=1.0)
        assert err.value.code == "invalid_audio"
    with pytest.raises(OmniError) as err:
        audio.decode_audio(buf.getvalue(), max_seconds=0.05)
    assert err.value.code == "audio_too_long"
    nan = io.BytesIO()
    sf.write(nan, np.full(100, np.nan, dtype=np.float32), 16_000, format="WAV", subtype="FLOAT")
    with pytest.raises(OmniError):
        audio.decode_audio(nan.getvalue(), max_seconds=1.0)


def test_wav_encoding_round_trips() -> None:
    pcm = (np.arange(-500, 500, dtype="<i2") * 30).tobytes()
    data, rate = sf.read(io.BytesIO(audio.encode(pcm, "wav")), dtype="int16")
    assert rate == 24_000 and data.tobytes() == pcm
    assert audio.encode(pcm, "pcm") == pcm
    assert audio.wav_header(None)[4:8] == b"\xff\xff\xff\xff"


SPEC = ModelSpec.model_validate(
    {
        "name": "fake-omni",
        "model_dir": ".",
        "capabilities": {"endpoints": ["chat"]},
        "entry": "thinker",
        "stages": {"thinker": {"executor": "autoregressive", "terminal": True}},
    }
)


async def test_registration_survives_a_redis_restart() -> None:
    with RedisServer() as server:
        sync = redis.Redis.from_url(server.url)
        pubsub = sync.pubsub(ignore_subscribe_messages=True)
        store = FleetStore(connect(server.url), "reg")
        pubsub.subscribe(store.keys.events)
        service = WorkerService(WorkerSettings(_cli_parse_args=[]), SPEC, FakePipeline(), "r1")
        record = WorkerRecord(id="r1", url="http://127.0.0.1:1", node="n", model="fake-omni",
                              served_models=["fake-omni"])  # fmt: skip
        reg = Registrar(store, record, service, heartbeat_interval=0.1, ttl=1.0,
                        load_interval=0.1)  # fmt: skip
        await reg.set_status(WorkerStatus.STARTING)
        await reg.set_status(WorkerStatus.READY)
        assert json.loads(sync.get(store.keys.worker("r1")))["status"] == "ready"

        server.stop()
        await reg.heartbeat_once()  # does not raise: Redis down never stops the worker
        assert reg.redis_up is False
        server.start()  # same port, empty
        sync = redis.Redis.from_url(server.url)
        pubsub = sync.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(store.keys.events)
        pubsub.get_message(timeout=1)
        for _ in range(50):  # the client reconnects on its own; bounded
            await reg.heartbeat_once()
            if reg.redis_up:
                break
            await asyncio.sleep(0.1)
        assert reg.redis_up
        assert json.loads(sync.get(store.keys.worker("r1")))["status"] == "ready"
        assert sync.sismember(store.keys.workers, "r1")
        kinds = []
        while (message := pubsub.get_message(timeout=0.5)) is not None:
            kinds.append(json.loads(message["data"])["kind"])
        assert kinds == ["joined", "ready"]
        await reg.deregister()
        assert sync.get(store.keys.worker("r1")) is None
        await store.close()


def test_stop_tokens_follow_the_checkpoints_generation_config(tmp_path) -> None:
    """eos_token_id (an int or a list) and suppress_tokens from generation_config.json, as
    transformers' generate reads them; the family's own turn end always stops (the Omni thinker
    stopped on <|im_end|> only)."""
    import json

    import torch

    from worker.layers.generation_config import stop_tokens

    assert stop_tokens(tmp_path, config_eos=7).eos == {7}  # no file: the model config's
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [3, 5], "suppress_tokens": [1, 99]})
    )
    stops = stop_tokens(tmp_path, config_eos=7, always=(9,))
    assert stops.eos == {3, 5, 9} and stops.suppress == (1, 99)
    mask = stops.suppress_mask(torch, 10, "cpu")
    assert mask.tolist() == [i == 1 for i in range(10)]  # 99 is past the vocabulary
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 4}))
    assert stop_tokens(tmp_path, config_eos=7).eos == {4}


def test_asking_whether_xgrammar_is_there_does_not_import_it() -> None:
    """A chat request asks; the import takes seconds (worker.contract.grammar.preload does it at
    start-up)."""
    probe = (
        "import sys; from worker.contract import grammar; "
        "assert grammar.available(); assert 'xgrammar' not in sys.modules; "
        "grammar.preload(); assert 'xgrammar' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_fused_decoder_is_bit_for_bit_the_decoder_layers() -> None:
    """The code predictor's passes (``FusedDecoder``: fused projections, one-op norms) give
    exactly what the ``Decoder``'s modules give, over a two-position prefill and one-position
    steps with their caches, for grouped and plain attention; and ``rms_norm``'s one op is the
    reference's steps on fp32."""
    import torch

    from worker.layers.qwen3_decoder import (
        Decoder,
        DecoderShape,
        FusedDecoder,
        KVCache,
        init_random,
        rms_norm,
        rope_cos_sin,
    )

    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    w = 1 + 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(1))
    manual = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(rms_norm(x, w, 1e-6), manual)
    for kv_heads in (2, 4):
        shape = DecoderShape(48, 96, 2, 4, kv_heads, 12, 1e-6, 10_000.0)
        decoder = Decoder(shape)
        init_random(decoder, 5)
        fused = FusedDecoder(decoder)
        gen = torch.Generator().manual_seed(kv_heads)
        b = 3
        pos = torch.arange(6)[None].expand(b, -1)
        cos, sin = rope_cos_sin(pos, shape.head_dim, shape.rope_theta, torch.float32)
        with torch.inference_mode():
            caches = [[None, None] for _ in range(shape.num_layers)]
            mine = KVCache.empty(shape.num_layers)
            x = torch.randn(b, 2, 48, generator=gen)
            for t0, t in ((0, 2), (2, 1), (3, 1), (4, 1)):
                if t0:
                    x = torch.randn(b, 1, 48, generator=gen)
                c, s = cos[:, t0 : t0 + t], sin[:, t0 : t0 + t]
                want = x
                for layer, lc in zip(decoder.layers, mine.layers, strict=True):
                    want = layer(want, c, s, None, lc)
                want = decoder.norm(want)
                got = fused.run(x, c[:, None], s[:, None], caches)
                assert torch.equal(got, want), (kv_heads, t0)


def test_the_cuda_check_names_the_driver_found_and_the_driver_needed() -> None:
    from worker.gpus import explain_cuda

    old = explain_cuda("2.14.1+cu130", "13.0", 0, 2, "535.216.03", 12020)
    assert "torch 2.14.1+cu130 is built for CUDA 13.0, which needs driver 580.65.06" in old
    assert "the driver is 535.216.03, which supports CUDA up to 12.2" in old
    assert "cuda-compat-13-0" in old and "deploy/gpu/uv.lock" in old
    none = explain_cuda("2.14.1+cu130", "13.0", 0, 1, None, None)
    assert "no NVIDIA driver was found" in none
    cpu = explain_cuda("2.13.0+cpu", None, 0, 1, "580.95.05", 13000)
    assert "is a CPU build" in cpu and "--gpus cpu" in cpu
    fewer = explain_cuda("2.14.1+cu130", "13.0", 1, 2, "580.95.05", 13000)
    assert "sees 1 GPU(s)" in fewer and "CUDA_VISIBLE_DEVICES" in fewer

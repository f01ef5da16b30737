"""omni-bench: its player on streams with known gaps, its settings, and a whole run against
the live fleet (real Redis, workers and routers) that writes the JSON and the HTML report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from bench.omnibench.loadgen import LevelResult
from bench.omnibench.playback import audible, play
from bench.omnibench.report import held_level, summarize
from bench.omnibench.settings import BenchSettings
from bench.omnibench.workloads import Sample
from tests.reliability.fleet import Fleet

REPO = Path(__file__).resolve().parents[1]


def test_a_stream_faster_than_real_time_never_underruns() -> None:
    # 0.1 s of audio every 0.05 s
    chunks = [(0.05 * i, 0.1) for i in range(20)]
    assert play(chunks).underruns == 0
    assert play(chunks).audio_s == pytest.approx(2.0)


def test_a_stream_slower_than_real_time_underruns_at_every_late_chunk() -> None:
    # 0.1 s of audio every 0.3 s: each chunk after the first comes 0.2 s after the last ran out
    playback = play([(0.3 * i, 0.1) for i in range(5)])
    assert playback.underruns == 4
    assert playback.stall_s == pytest.approx(4 * 0.2)


def test_a_gap_shorter_than_the_buffered_audio_is_no_underrun() -> None:
    # 1 s of audio at once, then a 0.8 s gap: the player still has 0.2 s left
    chunks = [(0.0, 1.0), (0.8, 0.5)]
    assert play(chunks).underruns == 0
    # a 1.5 s gap runs it dry for 0.5 s, once; the rest comes in time again
    playback = play([(0.0, 1.0), (1.5, 0.5), (1.7, 0.5)])
    assert (playback.underruns, round(playback.stall_s, 6)) == (1, 0.5)
    # a chunk within the slack (20 ms) of the end of the audio before it is in time
    assert play([(0.0, 0.1), (0.115, 0.1)]).underruns == 0
    assert play([(0.0, 0.1), (0.125, 0.1)]).underruns == 1


def test_the_first_audible_chunk_skips_silence() -> None:
    assert not audible(bytes(480))
    assert not audible(b"\x10\x00" * 10)  # 16/32768: -66 dBFS
    assert audible(b"\x00\x00" * 9 + b"\x00\x01")  # 256/32768: -42 dBFS
    assert not audible(b"\x00")  # half a sample


def _row(level: float, p95: float, ok: float = 100.0, underrun: float | None = 0.0) -> dict:
    return {"level": level, "first_output_s": {"p95": p95}, "success_pct": ok,
            "underrun_pct": underrun}  # fmt: skip


def test_held_level_is_the_last_level_within_twice_the_idle_fleets_p95() -> None:
    idle = _row(0, 0.1)
    assert held_level(idle, [_row(1, 0.1), _row(2, 0.15), _row(4, 0.19), _row(8, 0.5)]) == 4
    assert held_level(idle, [_row(1, 0.1), _row(2, 0.12, underrun=5.0), _row(4, 0.1)]) == 1
    assert held_level(idle, [_row(1, 0.1), _row(2, 0.1, ok=99.0)]) == 1
    assert held_level(idle, [_row(1, 0.1, ok=50.0)]) is None
    # against the idle fleet, not the lightest level: a first level already loaded fails
    assert held_level(idle, [_row(1, 0.25), _row(2, 0.3)]) is None
    assert held_level(_row(0, None), [_row(1, 0.1)]) is None  # type: ignore[arg-type]


def test_a_silent_reply_is_not_a_success() -> None:
    """Answered with nothing in it: a column of its own, out of the success rate (so the level
    is not held), its end-to-end time kept, no first output."""
    spoke = Sample("speech", 1.0, 0, 0.0, ok=True, e2e_s=0.5, first_audio_s=0.2, audio_s=1.0)
    silent = Sample("speech", 1.0, 1, 0.0, ok=True, e2e_s=0.3, empty=True)
    failed = Sample("speech", 1.0, 2, 0.0, error="http_500")
    row = summarize(LevelResult(1.0, 1.0, [spoke, silent, failed]), "speech")
    assert (row["requests"], row["succeeded"], row["silent"]) == (3, 1, 1)
    assert row["success_pct"] == pytest.approx(100 / 3) and row["errors"] == {"http_500": 1}
    assert row["first_output_s"]["p95"] == 0.2 and row["e2e_s"]["p50"] == pytest.approx(0.4)
    idle = summarize(LevelResult(0.0, 1.0, [spoke]), "speech")
    assert held_level(idle, [summarize(LevelResult(1.0, 1.0, [spoke, silent]), "speech")]) is None
    assert held_level(idle, [summarize(LevelResult(1.0, 1.0, [spoke, spoke]), "speech")]) == 1


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rate", "1"], "either --url"),
        (["--url", "http://h:1", "--local-workers", "1", "--rate", "1"], "either --url"),
        (["--url", "http://h:1"], "either --rate"),
        (["--url", "http://h:1", "--rate", "1", "--concurrency", "2"], "either --rate"),
        (["--url", "http://h:1", "--rate", "0"], "above 0"),
        (["--url", "http://h:1", "--rate", "1", "--workload", "dance"], "workload 'dance'"),
        (["--url", "http://h:1", "--rate", "1", "--workload", "chat:-1"], "positive number"),
        (["--url", "ftp://h", "--rate", "1"], "http://HOST:PORT"),
    ],
)
def test_settings_refuse_what_cannot_run(argv: list[str], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        BenchSettings(**_parse(argv))


def _parse(argv: list[str]) -> dict:
    from pydantic_settings import CliApp

    return CliApp.run(BenchSettings, cli_args=argv).model_dump()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_against_the_fleet_writes_every_figure(omni_fleet: Fleet, tmp_path: Path) -> None:
    """Every workload, open loop at two rates, through a real router with its API key."""
    out = tmp_path / "bench"
    argv = [
        sys.executable, "-m", "bench.omnibench.cli", "--url", omni_fleet.routers[0].url,
        "--api-key", omni_fleet.api_key, "--workload", "chat:2", "--workload", "speech",
        "--workload", "transcription", "--workload", "realtime", "--rate", "2", "--rate", "4",
        "--requests", "8", "--warmup", "1", "--idle", "1", "--max-tokens", "16", "--out", str(out),
        "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    for kind in ("chat", "speech", "transcription", "realtime"):
        assert f"{kind} (tiny-omni)" in done.stdout
    results = orjson.loads((out / "results.json").read_bytes())
    assert results["loop"] == "open" and results["levels"] == [2.0, 4.0]
    requests = results["requests"]
    assert len(requests) == 16 and all(r["ok"] for r in requests), requests
    # the idle fleet first: one request of each workload, alone
    assert sorted(r["kind"] for r in results["idle_requests"]) == sorted(results["summary"])
    # the same seeded sequence of workloads at both levels
    assert [r["kind"] for r in requests[:8]] == [r["kind"] for r in requests[8:]]
    for kind, rows in results["summary"].items():
        for row in rows:
            if not row["requests"]:
                continue
            # every request answered; silent ones (nothing in them) are not successes
            assert row["succeeded"] + row["silent"] == row["requests"] and not row["errors"]
            if not row["succeeded"]:
                continue  # the tiny model said nothing each time: no latency to check
            assert row["throughput_rps"] > 0
            assert row["e2e_s"]["p95"] >= row["e2e_s"]["p50"] > 0
            assert row["first_output_s"]["p95"] > 0
            if kind == "chat":
                assert row["tpot_s"]["p50"] > 0 and row["output_tokens_per_s"] > 0
            if kind in ("speech", "realtime"):
                assert row["underrun_pct"] is not None and row["audio_s_per_s"] > 0
            if kind in ("speech", "transcription", "realtime"):
                assert row["rtf"]["p50"] > 0
    spoken = [r for r in requests if r["kind"] in ("speech", "realtime") and not r["empty"]]
    assert len(spoken) >= 4, requests  # random weights may say nothing, but not most times
    for r in spoken:
        assert 0 < r["first_audio_s"] <= r["e2e_s"] and r["audio_s"] > 0 and r["rtf"] > 0
    for r in requests:
        if r["kind"] == "chat" and not r["empty"]:
            assert 0 < r["first_token_s"] <= r["e2e_s"] and r["output_tokens"] >= 1
    html = (out / "report.html").read_text()
    assert "Plotly.newPlot" in html and "plotly.js" in html.lower()
    for title in ("Latency distributions per level", "Throughput against offered load",
                  "p95 latency against offered load"):  # fmt: skip
        assert title in html


def test_an_unknown_model_is_refused_before_any_load(omni_fleet: Fleet, tmp_path: Path) -> None:
    from bench.omnibench.cli import main

    code = main(["--url", omni_fleet.routers[0].url, "--api-key", omni_fleet.api_key,
                 "--model", "no-such-model", "--rate", "1", "--out", str(tmp_path)])  # fmt: skip
    assert code == 1
    assert not (tmp_path / "results.json").exists()

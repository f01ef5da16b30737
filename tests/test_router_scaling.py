"""The scaling signal (router/scaling.py): its rules on a hand-made fleet view, its settings,
and on the live fleet (real Redis, workers, routers): it rises under load and falls back when
the load stops, in Redis and on the routers' /metrics."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from pydantic import ValidationError

from fleet.records import LoadReport, ScaleSignal, WorkerRecord, WorkerStatus
from router.scaling import Scaler
from router.settings import RouterSettings
from router.view import FleetView
from tests.reliability.fleet import KEYS, MODEL, Fleet, wait_until

Workers = dict[str, tuple[str, WorkerStatus, int, float | None]]  # model, status, load, TTFA


def _view(settings: RouterSettings, workers: Workers) -> FleetView:
    view = FleetView(settings)
    for worker_id, (model, status, in_flight, ttfa_ms) in workers.items():
        record = WorkerRecord(
            id=worker_id, url=f"http://10.0.0.{len(view.workers) + 1}:8000", node="n",
            model=model, served_models=[model], status=status,
        )  # fmt: skip
        view.upsert(record).update_load(
            LoadReport(worker_id=worker_id, in_flight=in_flight, ttfa_ms=ttfa_ms)
        )
    return view


def _settings(*argv: str) -> RouterSettings:
    return RouterSettings(redis_url="redis://127.0.0.1:1", **_flags(argv))


def _flags(argv: tuple[str, ...]) -> dict:
    out: dict = {}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        key = flag.removeprefix("--").replace("-", "_")
        if key in ("scale_in_flight", "scale_first_output_s"):
            out.setdefault(key, []).append(value)
        else:
            out[key] = value
    return out


def _signals(settings: RouterSettings, workers: Workers) -> dict[str, ScaleSignal]:
    return {s.model: s for s in Scaler(settings, _view(settings, workers)).compute()}


R, D, S = WorkerStatus.READY, WorkerStatus.DRAINING, WorkerStatus.STARTING


def test_load_asks_for_in_flight_over_the_target_per_worker() -> None:
    settings = _settings("--scale-in-flight", "4")
    got = _signals(settings, {"a": ("m", R, 7, 50.0), "b": ("m", R, 6, 60.0)})["m"]
    assert (got.desired_replicas, got.reason, got.ready_replicas, got.in_flight) == (
        4, "load", 2, 13,
    )  # fmt: skip
    assert got.first_output_s == pytest.approx(0.06)
    # a draining worker's requests count as load, not as a replica; a starting one is neither
    workers = {"a": ("m", R, 1, None), "b": ("m", D, 8, None), "c": ("m", S, 0, None)}
    got = _signals(settings, workers)
    assert (got["m"].desired_replicas, got["m"].ready_replicas, got["m"].in_flight) == (3, 1, 9)


def test_an_idle_model_keeps_the_minimum_and_the_maximum_caps_the_signal() -> None:
    got = _signals(_settings(), {"a": ("m", R, 0, None), "b": ("m", R, 0, None)})["m"]
    assert (got.desired_replicas, got.reason) == (1, "minimum")
    got = _signals(_settings("--scale-min-replicas", "0"), {"a": ("m", R, 0, None)})["m"]
    assert got.desired_replicas == 0
    busy = {"a": ("m", R, 500, None)}
    assert _signals(_settings("--scale-max-replicas", "5"), busy)["m"].desired_replicas == 5


def test_slow_first_output_scales_the_ready_workers_up_by_how_far_above_target() -> None:
    settings = _settings("--scale-first-output-s", "0.5")
    got = _signals(settings, {"a": ("m", R, 1, 900.0), "b": ("m", R, 1, 300.0)})["m"]
    assert (got.desired_replicas, got.reason) == (4, "latency")  # ceil(2 x 0.9 / 0.5)
    # under the target the latency rule says nothing: load decides
    got = _signals(settings, {"a": ("m", R, 9, 100.0)})["m"]
    assert (got.desired_replicas, got.reason) == (2, "load")


def test_each_model_has_its_own_signal_and_targets() -> None:
    settings = _settings("--scale-in-flight", "8", "--scale-in-flight", "tts=2")
    got = _signals(settings, {"a": ("tts", R, 6, None), "b": ("omni", R, 6, None)})
    assert got["tts"].desired_replicas == 3 and got["omni"].desired_replicas == 1
    # a model's own target alone: the others keep the default (8 requests a worker)
    settings = _settings("--scale-in-flight", "tts=2")
    got = _signals(settings, {"a": ("tts", R, 6, None), "b": ("omni", R, 17, None)})
    assert got["tts"].desired_replicas == 3 and got["omni"].desired_replicas == 3


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--scale-in-flight", "0"), "above 0"),
        (("--scale-in-flight", "tts="), "MODEL=NUMBER"),
        (("--scale-first-output-s", "=2"), "MODEL=NUMBER"),
        (("--scale-min-replicas", "9", "--scale-max-replicas", "3"), "above --scale-max"),
    ],
)
def test_settings_refuse_a_bad_target(argv: tuple[str, ...], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        _settings(*argv)


def _desired(fleet: Fleet) -> int:
    raw = fleet.redis_client().hget(KEYS.scale, MODEL)
    return ScaleSignal.model_validate_json(raw).desired_replicas if raw else -1


def _metric(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    line = f'omni_router_scale_desired_replicas{{model="{MODEL}"}} '
    return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_signal_rises_under_load_and_falls_when_it_stops(omni_fleet: Fleet) -> None:
    """Twelve streams at once through the routers (each worker should hold 2: ROUTER_ARGS):
    the signal in Redis and on /metrics goes above the idle minimum, then back to it."""
    wait_until(lambda: _desired(omni_fleet) == 1, 30, "an idle fleet's signal of 1")
    stop = threading.Event()
    peak = 0

    def user(i: int) -> None:
        url = omni_fleet.routers[i % 2].url + "/v1/audio/speech"
        body = {"model": MODEL, "input": "A long sentence for the talker to say. " * 6,
                "voice": "chelsie", "response_format": "pcm", "stream": True}  # fmt: skip
        with httpx.Client(headers=omni_fleet.auth, timeout=120) as client:
            while not stop.is_set():
                with client.stream("POST", url, json=body) as response:
                    assert response.status_code == 200
                    for _ in response.iter_bytes():
                        pass

    users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(12)]
    for t in users:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and peak < 4:
            peak = max(peak, _desired(omni_fleet))
            time.sleep(0.2)
        assert peak >= 4, f"the signal peaked at {peak} under twelve streams"
        assert max(_metric(r.url) for r in omni_fleet.routers) >= 2
    finally:
        stop.set()
        for t in users:
            t.join(120)
    wait_until(lambda: _desired(omni_fleet) == 1, 30, "the signal back to 1 after the load")
    wait_until(lambda: all(_metric(r.url) == 1 for r in omni_fleet.routers), 10, "/metrics at 1")

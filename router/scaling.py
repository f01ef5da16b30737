"""The signal to scale on: per model, the workers it needs, from the load its workers report.

Two rules, the larger wins (then clamped to ``--scale-min-replicas`` .. ``--scale-max-replicas``):

- **load**: the requests its workers hold (queued and running, from their load reports) over the
  requests one worker should hold, ``--scale-in-flight`` (a model's own value, or the default);
- **latency**: when the slowest ready worker's recent p50 time to first audio (first token for a
  text model) is above ``--scale-first-output-s``, the ready workers times how far above.
  Under the target this rule says nothing: a fast fleet does not shrink below its load.

This is the rule of Kubernetes' HPA (desired = ceil(current x metric / target)); scale-down
damping is the autoscaler's (HPA's stabilization window, KEDA's cooldown), not done twice here.
Each router computes it every ``--scale-interval-s`` from its own view of the fleet, publishes
it in Redis (``FleetKeys.scale``) and exports it on /metrics; routers with the same view write
the same values.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict

from redis.exceptions import RedisError

from fleet.records import ScaleSignal, WorkerStatus
from fleet.store import FleetStore
from router.settings import RouterSettings
from router.view import FleetView, WorkerState

log = logging.getLogger("omni.router.scaling")


def per_model(entries: list[str]) -> tuple[float, dict[str, float]]:
    """``["8", "tiny-qwen3-tts=4"]`` -> (8.0, {"tiny-qwen3-tts": 4.0}): the default and the
    models' own values (settings have validated the shape and put a default first)."""
    default, models = math.nan, {}
    for entry in entries:
        model, _, value = entry.rpartition("=")
        if model:
            models[model] = float(value)
        else:
            default = float(value)
    return default, models


def _first_output_s(worker: WorkerState) -> float | None:
    load = worker.fresh_load()
    if load is None:
        return None
    ms = load.ttfa_ms if load.ttfa_ms is not None else load.ttft_ms
    return None if ms is None else ms / 1000


def _in_flight(worker: WorkerState) -> int:
    load = worker.fresh_load()
    return load.in_flight if load is not None else worker.in_flight


class Scaler:
    def __init__(self, settings: RouterSettings, view: FleetView) -> None:
        self.settings = settings
        self.view = view
        self.in_flight_target = per_model(settings.scale_in_flight)
        self.latency_target = per_model(settings.scale_first_output_s)
        self.signals: list[ScaleSignal] = []  # the latest, for /metrics

    def target(self, model: str) -> tuple[float, float]:
        """(requests one worker should hold, seconds to first output it should keep under)"""
        (in_flight, models), (seconds, latency) = self.in_flight_target, self.latency_target
        return models.get(model, in_flight), latency.get(model, seconds)

    def compute(self) -> list[ScaleSignal]:
        by_model: dict[str, list[WorkerState]] = defaultdict(list)
        for worker in self.view.workers.values():
            if not worker.static:
                by_model[worker.record.model].append(worker)
        self.signals = [self._signal(model, ws) for model, ws in sorted(by_model.items())]
        return self.signals

    def _signal(self, model: str, workers: list[WorkerState]) -> ScaleSignal:
        ready = [w for w in workers if w.routable]
        serving = [
            w for w in workers if w.record.status in (WorkerStatus.READY, WorkerStatus.DRAINING)
        ]
        in_flight = sum(_in_flight(w) for w in serving)
        latencies = [s for w in ready if (s := _first_output_s(w)) is not None]
        slowest = max(latencies, default=None)
        per_worker, target_s = self.target(model)
        by_load = math.ceil(in_flight / per_worker)
        by_latency = (
            math.ceil(len(ready) * slowest / target_s)
            if slowest is not None and slowest > target_s
            else 0
        )
        low, high = self.settings.scale_min_replicas, self.settings.scale_max_replicas
        desired, reason = max((by_load, "load"), (by_latency, "latency"), (low, "minimum"))
        return ScaleSignal(
            model=model,
            desired_replicas=min(desired, high),
            ready_replicas=len(ready),
            in_flight=in_flight,
            first_output_s=slowest,
            reason=reason,
        )

    async def run(self, store: FleetStore) -> None:
        """Compute and publish every interval; a Redis error is logged and retried."""
        interval = self.settings.scale_interval_s
        ttl_ms = int(max(10 * interval, 30.0) * 1000)
        while True:
            signals = self.compute()
            try:
                await store.publish_scale(signals, ttl_ms)
            except (RedisError, OSError) as exc:  # Redis down: /metrics still shows it
                log.debug("scale signal not published: %s", exc)
            await asyncio.sleep(interval)

"""Selection policies: pick one worker among the eligible ones."""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Callable, Sequence

from fleet.records import LoadReport
from router.classify import StageClass
from router.settings import Policy
from router.view import WorkerState

# Stages that bound each request class (names from the model specs' stage graphs). Other stages
# still count, at a lower weight: they are shared, but not the bottleneck of this class.
PRIMARY_STAGES = {
    StageClass.TEXT: frozenset({"thinker", "asr", "llm", "decode"}),
    StageClass.SPEECH: frozenset({"talker", "code2wav", "vocoder", "tts_engine"}),
}
SECONDARY_WEIGHT = 0.25

_rng = random.Random()
_recency = itertools.count(1)

Chooser = Callable[[Sequence[WorkerState], str, str | None], WorkerState]


def load_score(worker: WorkerState, stage_class: str) -> float:
    """Router's own in-flight count plus the worker's reported load on the stages this request
    class uses, relative to the worker's capacity. Lower is better."""
    score = float(worker.in_flight)
    load = worker.fresh_load()
    if load is not None:
        score += reported_load(load, stage_class)
    return score / worker.capacity


def reported_load(load: LoadReport, stage_class: str) -> float:
    """The worker's own measure of its load on the stages this request class uses: queue
    depth and busy fraction, primary stages at full weight; its in-flight count without them."""
    if not (load.queue_depth or load.busy):
        return float(load.in_flight)
    primary = PRIMARY_STAGES[stage_class]
    total = 0.0
    for stage, depth in load.queue_depth.items():
        total += depth if stage in primary else SECONDARY_WEIGHT * depth
    for stage, busy in load.busy.items():
        total += busy if stage in primary else SECONDARY_WEIGHT * busy
    return total


def choose_load(workers: Sequence[WorkerState], stage_class: str, key: str | None) -> WorkerState:
    """Power of two choices: two distinct random candidates, the lower score wins."""
    n = len(workers)
    if n == 1:
        return workers[0]
    i = int(_rng.random() * n)
    j = int(_rng.random() * (n - 1))
    if j >= i:
        j += 1
    a, b = workers[i], workers[j]
    sa, sb = load_score(a, stage_class), load_score(b, stage_class)
    if sa == sb:  # equal queues: the one that has been answering faster
        return a if a.latency <= b.latency else b
    return a if sa < sb else b


def choose_least_inflight(
    workers: Sequence[WorkerState], stage_class: str, key: str | None
) -> WorkerState:
    best = min(w.in_flight / w.capacity for w in workers)
    ties = [w for w in workers if w.in_flight / w.capacity == best]
    return ties[0] if len(ties) == 1 else _rng.choice(ties)


def choose_round_robin(
    workers: Sequence[WorkerState], stage_class: str, key: str | None
) -> WorkerState:
    """The least recently picked candidate: candidate sets that change (a model served by some
    workers only) never lock into a shared modulo phase."""
    chosen = min(workers, key=_last_picked)
    chosen.last_picked = next(_recency)
    return chosen


def _last_picked(worker: WorkerState) -> int:
    return worker.last_picked


def choose_random(workers: Sequence[WorkerState], stage_class: str, key: str | None) -> WorkerState:
    return workers[int(_rng.random() * len(workers))]


def rendezvous_weight(key: str, worker_id: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose_hash(workers: Sequence[WorkerState], stage_class: str, key: str | None) -> WorkerState:
    """Rendezvous (highest random weight) hashing of the session key: a worker joining or
    leaving moves only the keys that it wins or held."""
    if key is None:
        return choose_random(workers, stage_class, key)
    return max(workers, key=lambda w: rendezvous_weight(key, w.id))


CHOOSERS: dict[Policy, Chooser] = {
    # cache_aware: a chat with a prompt goes through router.prefix; the rest by load
    Policy.CACHE_AWARE: choose_load,
    Policy.LOAD: choose_load,
    Policy.LEAST_INFLIGHT: choose_least_inflight,
    Policy.ROUND_ROBIN: choose_round_robin,
    Policy.RANDOM: choose_random,
    Policy.HASH: choose_hash,
}


def reported_requests(load: LoadReport, stage_class: str) -> float:
    """The requests the worker holds on the stages this request class uses: queue depths,
    primary stages at full weight; its in-flight count without them. Not its busy fractions,
    which are time, not requests: a worker stays busy for about a second after its last
    request has ended, and a session's next request would be moved off it at idle load."""
    if not load.queue_depth:
        return float(load.in_flight)
    primary = PRIMARY_STAGES[stage_class]
    return sum(d if s in primary else SECONDARY_WEIGHT * d for s, d in load.queue_depth.items())


def placement_load(worker: WorkerState, stage_class: str, reports: bool = True) -> float:
    """Requests on the worker as well as this router knows: its own in-flight count, or the
    worker's fresh report when that says more (the report counts every router's requests,
    this one's included, so the two are not added)."""
    own = float(worker.in_flight)
    load = worker.fresh_load() if reports else None
    return own if load is None else max(own, reported_requests(load, stage_class))


def over_bound(
    worker: WorkerState,
    workers: Sequence[WorkerState],
    stage_class: str,
    bound: float,
    reports: bool = True,
    slack: int = 0,
) -> bool:
    """Bounded load (consistent hashing with bounded loads, Mirrokni et al.): is ``worker``,
    with this request placed on it, above ``ceil(bound x mean)`` of the fleet's load counted
    with this request, plus ``slack`` requests? The ceiling gives integer slack, so that at low
    load one extra request never moves a session. ``reports=False`` decides on this router's
    own counts only."""
    if len(workers) < 2:
        return False
    total = sum(placement_load(w, stage_class, reports) / w.capacity for w in workers)
    mean = (total + 1 / worker.capacity) / len(workers)
    mine = placement_load(worker, stage_class, reports) + 1
    return mine > math.ceil(bound * mean * worker.capacity - 1e-9) + slack

"""Session affinity: session key -> worker, bound in Redis so every router process agrees.

One Redis round trip for a known session (GETEX slides the TTL), two for a new one (the atomic
bind-if-absent, so racing routers agree on the first writer). A new binding whose first request
the worker refuses (status 400 and up) is removed again, so refused requests leave none behind.
A binding moves only when its worker cannot take the request (gone, draining, unhealthy, full)
or is above the bounded-load limit; moves are compare-and-set, counted in Redis and in metrics,
and logged as a periodic summary. Without Redis (static fleet, or Redis unreachable) the key
is rendezvous-hashed over the eligible workers instead.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from router.discovery import Discovery
from router.metrics import AffinityOutcome
from router.policies import Chooser, choose_hash, over_bound
from router.settings import RouterSettings
from router.view import WorkerState

log = logging.getLogger("omni.router.affinity")
# how long a bounded-load move waits for the bound worker's next load report (they come
# several times a second); without one it decides on this router's own counts
_REPORT_WAIT_S = 1.0
# delete a binding only if it still names the worker that refused the session's first request
_UNBIND = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


class Affinity:
    def __init__(self, settings: RouterSettings, discovery: Discovery | None) -> None:
        self.discovery = discovery
        self.ttl_ms = int(settings.session_ttl_s * 1000)
        self.bound = settings.affinity_bound
        self.summary_every_s = settings.move_log_interval_s
        self.moves: Counter[str] = Counter()  # since the last summary line
        self.summary_at = time.monotonic()
        self._unbind: AsyncScript | None = None  # registered on first use

    async def resolve(
        self,
        key: str,
        capable: Sequence[WorkerState],
        open_: Sequence[WorkerState],
        choose: Chooser,
        stage_class: str,
    ) -> tuple[WorkerState, AffinityOutcome]:
        """The worker for this session's request. ``capable``: routable workers that serve the
        request; ``open_``: those of them with capacity left (non-empty). A new session (outcome
        NEW) is bound here; the caller calls ``unbind`` if the worker refuses its request."""
        discovery = self.discovery
        if discovery is None or not discovery.up:
            return choose_hash(open_, stage_class, key), AffinityOutcome.HASHED
        store = discovery.store
        arrived = time.time()  # wall clock: load reports are stamped by the worker's clock
        try:
            bound_id = await store.lookup_session(key, self.ttl_ms)
            outcome = AffinityOutcome.HIT
            if bound_id is None:
                proposal = choose(open_, stage_class, key)
                bound_id = await store.bind_session(key, proposal.id, self.ttl_ms)
                outcome = AffinityOutcome.NEW
            by_id = {w.id: w for w in open_}
            worker = by_id.get(bound_id)
            if worker is None:
                reason = AffinityOutcome.MOVED_INELIGIBLE
                if any(w.id == bound_id for w in capable):
                    reason = AffinityOutcome.MOVED_BOUNDED_LOAD  # alive but full
            elif await self._over_bound(worker, capable, stage_class, arrived):
                others = [w for w in open_ if w is not worker]
                target = choose(others, stage_class, key) if others else None
                if target is None or over_bound(target, capable, stage_class, self.bound):
                    return worker, outcome
                reason = AffinityOutcome.MOVED_BOUNDED_LOAD
            else:
                return worker, outcome
            # move the binding: only if nobody moved it meanwhile
            candidates = [w for w in open_ if w.id != bound_id] or list(open_)
            target = choose(candidates, stage_class, key)
            now_id = await store.move_session(key, bound_id, target.id, self.ttl_ms)
            self.moves[reason.value] += 1
            return by_id.get(now_id, target), reason
        except (RedisError, OSError, TimeoutError) as exc:
            discovery.mark_down(exc)
            return choose_hash(open_, stage_class, key), AffinityOutcome.HASHED

    async def _over_bound(
        self,
        worker: WorkerState,
        capable: Sequence[WorkerState],
        stage_class: str,
        arrived: float,
    ) -> bool:
        """Is the bound worker over the load bound, judged on a load report made after this
        request arrived? An older report may still count requests that have ended since (the
        session's own previous request among them), so it never moves a session alone."""
        if not over_bound(worker, capable, stage_class, self.bound):
            return False
        if worker.fresh_load() is None:
            return True  # decided on this router's own counts: nothing stale in them
        if await worker.report_after(arrived, _REPORT_WAIT_S):
            return over_bound(worker, capable, stage_class, self.bound)
        return over_bound(worker, capable, stage_class, self.bound, reports=False)

    async def follow(self, key: str, bound_id: str, worker_id: str) -> None:
        """The session's bound worker refused the connection (died before the router saw it
        go) and ``worker_id`` took the session: the binding follows it (unless it has moved
        since), so that the session's next connection goes there too."""
        discovery = self.discovery
        if discovery is None or not discovery.up:
            return
        try:
            await discovery.store.move_session(key, bound_id, worker_id, self.ttl_ms)
        except (RedisError, OSError, TimeoutError) as exc:
            discovery.mark_down(exc)
            return
        self.moves[AffinityOutcome.MOVED_INELIGIBLE.value] += 1

    async def unbind(self, key: str, worker_id: str) -> None:
        """The worker refused the first request of a session bound to it just now: remove the
        binding (unless it has moved since), so that refused requests cost no Redis memory."""
        discovery = self.discovery
        if discovery is None or not discovery.up:
            return
        store = discovery.store
        try:
            if self._unbind is None:
                self._unbind = store.redis.register_script(_UNBIND)
            await self._unbind(keys=[store.keys.affinity(key)], args=[worker_id])
        except (RedisError, OSError, TimeoutError) as exc:
            discovery.mark_down(exc)

    def log_summary(self, now: float) -> None:
        """One INFO line per interval for the session moves in it (not one line per move)."""
        if now - self.summary_at < self.summary_every_s:
            return
        self.summary_at = now
        if self.moves:
            counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.moves.items()))
            log.info("sessions moved in the last %gs: %s", self.summary_every_s, counts)
            self.moves.clear()

"""Session affinity: session key -> worker, bound in Redis so every router process agrees.

One Redis round trip for a known session (GETEX slides the TTL), two for a new one (the atomic
bind-if-absent, so racing routers agree on the first writer). A binding moves only when its
worker cannot take the request (gone, draining, unhealthy, full) or is above the bounded-load
limit; moves are compare-and-set, counted in Redis and in metrics. Without Redis (static fleet,
or Redis unreachable) the key is rendezvous-hashed over the eligible workers instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from redis.exceptions import RedisError

from router.discovery import Discovery
from router.metrics import AffinityOutcome
from router.policies import Chooser, choose_hash, over_bound
from router.settings import RouterSettings
from router.view import WorkerState

log = logging.getLogger("omni.router.affinity")


class Affinity:
    def __init__(self, settings: RouterSettings, discovery: Discovery | None) -> None:
        self.discovery = discovery
        self.ttl_ms = int(settings.session_ttl_s * 1000)
        self.bound = settings.affinity_bound

    async def resolve(
        self,
        key: str,
        capable: Sequence[WorkerState],
        open_: Sequence[WorkerState],
        choose: Chooser,
        stage_class: str,
    ) -> tuple[WorkerState, AffinityOutcome]:
        """The worker for this session's request. ``capable``: routable workers that serve the
        request; ``open_``: those of them with capacity left (non-empty)."""
        discovery = self.discovery
        if discovery is None or not discovery.up:
            return choose_hash(open_, stage_class, key), AffinityOutcome.HASHED
        store = discovery.store
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
            elif over_bound(worker, capable, stage_class, self.bound):
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
            log.info("session moved %s -> %s (%s)", bound_id, now_id, reason.value)
            return by_id.get(now_id, target), reason
        except (RedisError, OSError, TimeoutError) as exc:
            discovery.mark_down(exc)
            return choose_hash(open_, stage_class, key), AffinityOutcome.HASHED

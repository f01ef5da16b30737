"""Eligibility and admission: which workers may take this request, or why none may."""

from __future__ import annotations

from fleet.errors import ErrorCode, OmniError
from router.classify import Classified
from router.metrics import PolicyOutcome
from router.view import FleetView, WorkerState


class Rejected(OmniError):
    """A request the fleet cannot take, with the policy outcome the router counts it under."""

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        outcome: PolicyOutcome,
        param: str | None = None,
    ) -> None:
        super().__init__(status, code, message, param)
        self.outcome = outcome


class Admission:
    """Filters the fleet view per request. Capability and routability results are cached per
    view version (any membership, status or health change bumps it); capacity is checked live."""

    def __init__(self, view: FleetView, max_in_flight: int, retry_after_s: int) -> None:
        self.view = view
        self.max_in_flight = max_in_flight
        self.retry_after = str(retry_after_s)
        self._cache: dict[tuple, list[WorkerState]] = {}
        self._cache_version = -1

    def capable(self, c: Classified) -> list[WorkerState]:
        """Routable workers that serve the request's model, endpoint, modalities, stream mode."""
        view = self.view
        if view.version != self._cache_version:
            self._cache.clear()
            self._cache_version = view.version
        key = (c.endpoint, c.model, c.inputs, c.outputs, c.stream)
        found = self._cache.get(key)
        if found is None:
            found = [w for w in view.workers.values() if w.routable and _serves(w, c)]
            self._cache[key] = found
        return found

    def admit(self, c: Classified, in_flight: int) -> tuple[list[WorkerState], list[WorkerState]]:
        """(capable workers, those with capacity left); raises ``Rejected`` when the request
        cannot be admitted."""
        if in_flight >= self.max_in_flight:
            raise Rejected(
                429,
                ErrorCode.RATE_LIMITED,
                f"router is at its in-flight limit ({self.max_in_flight})",
                PolicyOutcome.GLOBAL_LIMIT,
            )
        capable = self.capable(c)
        if not capable:
            raise self._why_none(c)
        open_ = [w for w in capable if w.has_capacity()]
        if not open_:
            raise Rejected(
                429,
                ErrorCode.OVERLOADED,
                f"all {len(capable)} eligible workers are at capacity",
                PolicyOutcome.OVER_CAPACITY,
            )
        return capable, open_

    def _why_none(self, c: Classified) -> Rejected:
        workers = list(self.view.workers.values())
        if c.model is not None:
            known = self.view.known_models()
            if known is not None and c.model not in known:
                return Rejected(
                    404,
                    ErrorCode.MODEL_NOT_FOUND,
                    f"model {c.model!r} is not served by this fleet"
                    + (f" (served: {', '.join(sorted(known))})" if known else ""),
                    PolicyOutcome.NO_ELIGIBLE,
                    param="model",
                )
        if not workers:
            reason = "no workers are registered"
        else:
            serving = [
                w for w in workers if w.models is None or c.model is None or c.model in w.models
            ]
            with_endpoint = [w for w in serving if c.endpoint in w.endpoints]
            capable = [w for w in with_endpoint if _modalities_ok(w, c)]
            if not with_endpoint:
                # not a passing state: no registered worker of any status offers it
                return Rejected(
                    404,
                    ErrorCode.ENDPOINT_NOT_SERVED,
                    f"no worker serves endpoint {c.endpoint.value!r}" + _for_model(c),
                    PolicyOutcome.NO_ELIGIBLE,
                )
            elif not capable:
                reason = "no worker supports the requested modalities or stream mode" + _for_model(
                    c
                )
            else:
                states = sorted({_state(w) for w in capable})
                reason = f"no routable worker{_for_model(c)}: {len(capable)} capable, " + ", ".join(
                    states
                )
        return Rejected(503, ErrorCode.NO_ELIGIBLE_WORKER, reason, PolicyOutcome.NO_ELIGIBLE)


def _serves(w: WorkerState, c: Classified) -> bool:
    return (
        c.endpoint in w.endpoints
        and (w.models is None or c.model is None or c.model in w.models)
        and _modalities_ok(w, c)
    )


def _modalities_ok(w: WorkerState, c: Classified) -> bool:
    return (
        c.inputs <= w.input_modalities
        and c.outputs <= w.output_modalities
        and (w.streaming or not c.stream)
    )


def _for_model(c: Classified) -> str:
    return f" for model {c.model!r}" if c.model else ""


def _state(w: WorkerState) -> str:
    if w.record.status.value != "ready":
        return w.record.status.value
    if w.load is not None and not w.load.healthy:
        return "reports unhealthy"
    if not w.health.healthy:
        return "failing health probes"
    return f"circuit {w.health.breaker.value}"

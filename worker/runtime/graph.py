"""Per-request routing over the spec's stage graph.

A request activates a subset of stages: stages with ``only_for_output`` run only when the request
asks for one of those outputs (a text-only chat skips talker and vocoder). Final payloads follow
``next`` edges, chunks follow ``stream_to`` edges, both only between active stages. A stage
starts once all its required inputs arrived (``wait_for`` if given, else every active stage
with a ``next`` edge to it); the request is finished when every active terminal is done.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.spec import ModelSpec
from worker.stages.messages import REQUEST_INPUT


@dataclass(frozen=True, slots=True)
class Route:
    active: tuple[str, ...]  # spec order
    next_targets: dict[str, tuple[str, ...]]
    stream_targets: dict[str, tuple[str, ...]]
    required: dict[str, frozenset[str]]
    stream_sources: dict[str, tuple[str, ...]]
    terminals: frozenset[str]


def route(spec: ModelSpec, outputs: frozenset[str]) -> Route:
    active = tuple(
        name
        for name, s in spec.stages.items()
        if not s.only_for_output or outputs & set(s.only_for_output)
    )
    act = set(active)
    nxt = {n: tuple(t for t in spec.stages[n].next if t in act) for n in active}
    stm = {n: tuple(t for t in spec.stages[n].stream_to if t in act) for n in active}
    required: dict[str, frozenset[str]] = {}
    sources: dict[str, tuple[str, ...]] = {}
    for n in active:
        s = spec.stages[n]
        if s.wait_for:
            req = frozenset(w for w in s.wait_for if w in act)
        else:
            req = frozenset(src for src in active if n in nxt[src])
        if n == spec.entry:
            req = req | {REQUEST_INPUT}
        required[n] = req
        sources[n] = tuple(src for src in active if n in stm[src])
    terminals = frozenset(n for n in active if spec.stages[n].terminal)
    if not terminals:
        raise ValueError(f"no active terminal stage for outputs {sorted(outputs)}")
    for n in active:
        if n != spec.entry and not required[n] and not sources[n]:
            raise ValueError(f"stage {n!r} is active for {sorted(outputs)} but gets no input")
    return Route(active, nxt, stm, required, sources, terminals)

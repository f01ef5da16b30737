"""Offered load, level by level.

Open loop: requests arrive as a Poisson process at ``rate`` per second whatever the server does
(a slow server faces a growing queue, as in production). Closed loop: ``concurrency`` users,
each sending its next request when the last one ends. Every level replays the same seeded
sequence of (workload, prompt), so levels differ only in load; open-loop arrival gaps have
their own seeded stream.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import httpx
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from bench.omnibench.prompts import Prompt
from bench.omnibench.workloads import Kind, Sample, Target, measure


class Loop(StrEnum):
    OPEN = "open"  # level = requests per second
    CLOSED = "closed"  # level = concurrent users


@dataclass(frozen=True)
class Plan:
    target: Target
    mix: dict[Kind, float]  # workload -> weight
    prompts: list[Prompt]
    loop: Loop
    levels: list[float]
    duration_s: float  # a level sends for this long ...
    requests: int  # ... or exactly this many requests, when > 0
    warmup: int
    idle: int  # requests of each workload sent one at a time to the idle fleet
    seed: int
    timeout_s: float


def sequence(plan: Plan, n: int) -> list[tuple[Kind, Prompt]]:
    """The first ``n`` requests of every level: the same for each."""
    rng = random.Random(plan.seed)
    kinds, weights = list(plan.mix), list(plan.mix.values())
    return [(rng.choices(kinds, weights)[0], rng.choice(plan.prompts)) for _ in range(n)]


def expected_requests(plan: Plan, level: float) -> int | None:
    if plan.requests:
        return plan.requests
    return round(level * plan.duration_s) if plan.loop is Loop.OPEN else None


async def _open(
    plan: Plan, client: httpx.AsyncClient, level: float, on_done: Callable[[object], None]
) -> list[Sample]:
    gaps = random.Random(plan.seed + 1)
    limit = plan.requests or None
    todo = sequence(plan, limit or max(1, int(level * plan.duration_s * 3) + 16))
    tasks: list[asyncio.Task[Sample]] = []
    start = time.perf_counter()
    at = 0.0
    for i, (kind, prompt) in enumerate(todo):
        if limit is None and at > plan.duration_s:
            break
        wait = start + at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        sample = Sample(kind.value, level, i, sent_s=time.perf_counter() - start)
        task = asyncio.create_task(measure(client, plan.target, kind, prompt, sample))
        task.add_done_callback(on_done)
        tasks.append(task)
        at += gaps.expovariate(level)
    return list(await asyncio.gather(*tasks))


async def _closed(
    plan: Plan, client: httpx.AsyncClient, level: float, on_done: Callable[[object], None]
) -> list[Sample]:
    users = int(level)
    limit = plan.requests or None
    todo = sequence(plan, limit or 100_000)
    samples: list[Sample] = []
    start = time.perf_counter()
    next_index = 0

    async def user() -> None:
        nonlocal next_index
        while next_index < len(todo) and (limit or time.perf_counter() - start < plan.duration_s):
            i = next_index
            next_index += 1
            kind, prompt = todo[i]
            sample = Sample(kind.value, level, i, sent_s=time.perf_counter() - start)
            samples.append(await measure(client, plan.target, kind, prompt, sample))
            on_done(None)

    await asyncio.gather(*(user() for _ in range(users)))
    return sorted(samples, key=lambda s: s.index)


@dataclass(frozen=True)
class LevelResult:
    level: float
    wall_s: float  # first request sent -> last reply ended
    samples: list[Sample]


@dataclass(frozen=True)
class Measured:
    idle: LevelResult  # each workload alone on the idle fleet (level 0)
    levels: list[LevelResult]


async def _idle(plan: Plan, client: httpx.AsyncClient) -> LevelResult:
    """``plan.idle`` requests of each workload, one at a time: what the fleet does unloaded,
    with prompts of the levels' own sequence."""
    todo = sequence(plan, 10_000)
    samples: list[Sample] = []
    start = time.perf_counter()
    for kind in plan.mix:
        for prompt in [p for k, p in todo if k is kind][: plan.idle]:
            sample = Sample(kind.value, 0.0, len(samples), sent_s=time.perf_counter() - start)
            samples.append(await measure(client, plan.target, kind, prompt, sample))
    return LevelResult(0.0, time.perf_counter() - start, samples)


async def run(plan: Plan, progress: bool = True) -> Measured:
    """Warm up, measure the idle fleet, then every level in turn; a progress bar per level on a
    terminal."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(plan.timeout_s, connect=30.0)
    results = []
    async with httpx.AsyncClient(
        base_url=plan.target.base_url, headers=plan.target.headers, limits=limits,
        timeout=timeout,
    ) as client:  # fmt: skip
        for i, (kind, prompt) in enumerate(sequence(plan, plan.warmup)):
            await measure(client, plan.target, kind, prompt, Sample(kind.value, 0.0, i, 0.0))
        idle = await _idle(plan, client)
        columns = (
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(),
        )  # fmt: skip
        with Progress(*columns, disable=not progress, transient=False) as bar:
            for level in plan.levels:
                unit = "req/s" if plan.loop is Loop.OPEN else "users"
                task = bar.add_task(f"{level:g} {unit}", total=expected_requests(plan, level))
                run_level = _open if plan.loop is Loop.OPEN else _closed
                start = time.perf_counter()

                def advance(_: object, task: TaskID = task) -> None:
                    bar.advance(task)

                samples = await run_level(plan, client, level, advance)
                results.append(LevelResult(level, time.perf_counter() - start, samples))
                bar.update(task, total=len(samples), completed=len(samples))
    return Measured(idle, results)

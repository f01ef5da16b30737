"""A stream whose worker fails part way goes on from another worker, exactly: the router sends
the request again and relays only what follows what the client already has (router.http.proxy
``Resumed``). Against fake workers whose streams are a function of the request (as a real
worker's are, worker.api.replay) or are not (then the replay is refused as diverged)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.fakes.procs import FakeWorker, Router

CHAT = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "x"}]}
SPEECH = {"model": "fake-model", "input": "hello"}


def failovers(router: Router) -> dict[str, float]:
    """outcome -> count, over every route."""
    found: dict[str, float] = {}
    for m in re.finditer(
        r'omni_router_stream_failovers_total\{outcome="(\w+)",route="\w+"\} ([\d.]+)',
        router.metrics(),
    ):
        found[m[1]] = found.get(m[1], 0) + float(m[2])
    return found


def sse_events(router: Router, session: str = "s1") -> tuple[list[str], str]:
    with httpx.stream(
        "POST",
        router.url + "/v1/chat/completions",
        json=CHAT,
        headers={"x-session-id": session},
        timeout=20,
    ) as r:
        assert r.status_code == 200
        events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        return events, r.headers["x-omni-worker-id"]


def by_port(workers: list[FakeWorker], worker_id: str) -> FakeWorker:
    return next(w for w in workers if worker_id.endswith(f":{w.port}"))


@pytest.fixture(scope="module")
def replayable() -> Iterator[tuple[Router, list[FakeWorker]]]:
    args = ("--replayable", "--chunks", "8", "--chunk-delay-ms", "30", "--chunk-bytes", "3000")
    workers = [FakeWorker(f"rp{i}", *args) for i in range(3)]
    router = Router(*(a for w in workers for a in ("--worker", w.url)), name="router-failover")
    yield router, workers
    router.stop()
    for w in workers:
        w.stop()


def test_a_broken_sse_stream_resumes_on_another_worker_exactly(replayable) -> None:
    router, workers = replayable
    whole, served_by = sse_events(router)  # a session: the same worker each time (hashed)
    assert len(whole) == 9 and whole[-1] == "data: [DONE]"
    by_port(workers, served_by).control("break", {"after": 3})
    events, again = sse_events(router)
    assert again == served_by  # the head came from the first worker
    # the same stream, whole: every event once, in order, none of another request's
    assert len({orjson.loads(e[6:])["id"] for e in events[:-1]}) == 1, events
    assert [orjson.loads(e[6:])["i"] for e in events[:-1]] == list(range(8)), events
    assert events[-1] == "data: [DONE]"
    assert failovers(router) == {"resumed": 1.0}, router.metrics()
    replayed = re.search(r"omni_router_stream_replayed_bytes_total ([\d.]+)", router.metrics())
    assert replayed and float(replayed[1]) > 0


def test_a_broken_audio_stream_resumes_byte_for_byte(replayable) -> None:
    router, workers = replayable
    url = router.url + "/v1/audio/speech"
    pin = {"x-session-id": "s2"}
    r = httpx.post(url, json=SPEECH, headers=pin, timeout=20)
    whole, victim = r.content, by_port(workers, r.headers["x-omni-worker-id"])
    assert len(whole) == 8 * 3000
    before = failovers(router).get("resumed", 0)
    # the victim breaks after 3 chunks, one other worker after 5 (if the replay goes there
    # first, that is a second failover): the client still gets every byte once
    victim.control("break", {"after": 3})
    next(w for w in workers if w is not victim).control("break", {"after": 5})
    with httpx.stream("POST", url, json=SPEECH, headers=pin, timeout=20) as r:
        got = b"".join(r.iter_raw())
    assert got == whole
    assert failovers(router)["resumed"] in (before + 1, before + 2)
    for w in workers:
        w.control("break", {"after": None})


def test_failovers_are_bounded_then_the_stream_ends_with_its_error(replayable) -> None:
    router, workers = replayable
    before = failovers(router)
    for w in workers:
        w.control("break", {"after": 2})
    first = sum(w.stats()["requests"] for w in workers)
    events, _ = sse_events(router)
    # two failovers (the default) were used, and the third worker broke too: the error event
    assert [orjson.loads(e[6:]).get("i") for e in events[:2]] == [0, 1]
    assert orjson.loads(events[-1][6:])["error"]["code"] == "stream_interrupted"
    after = failovers(router)
    assert after.get("limit", 0) == before.get("limit", 0) + 1, after
    assert sum(w.stats()["requests"] for w in workers) - first == 3


def test_a_replay_that_differs_is_not_spliced_in() -> None:
    """Events with the worker's id and clock in them: another worker's replay is not the same
    stream, so the client gets the terminal error after what it had, never a mix."""
    workers = [FakeWorker(f"nr{i}", "--chunks", "6", "--chunk-delay-ms", "20") for i in range(2)]
    router = Router(*(a for w in workers for a in ("--worker", w.url)), name="router-diverge")
    try:
        workers[0].control("break", {"after": 3})
        workers[1].control("break", {"after": 3})
        events, _ = sse_events(router)
        assert len(events) == 4, events
        assert len({orjson.loads(e[6:])["worker"] for e in events[:3]}) == 1, events
        assert orjson.loads(events[-1][6:])["error"]["code"] == "stream_interrupted"
        assert failovers(router) == {"diverged": 1.0}
    finally:
        router.stop()
        for w in workers:
            w.stop()

"""The cache-aware policy: prompt blocks, the per-worker record, and real routers placing
stateless conversations on fake workers that report a prefix cache (the cached tokens that a
real engine reports are checked through the live fleet, tests/test_openai_sdk.py)."""

from __future__ import annotations

import base64
import gc
import re
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from fleet.records import Endpoint, WorkerRecord, WorkerStatus
from router.classify import Classified, classify_json
from router.metrics import PrefixOutcome
from router.prefix import BYTES_PER_ENTRY, PrefixIndex
from router.prompt import BLOCK_CHARS, Blocks, read_messages
from router.settings import RouterSettings
from router.view import FleetView, WorkerState
from tests.fakes.procs import FakeWorker, Router, wait_for

SYSTEM = "You are the assistant of a routing test. Answer in one sentence. " * 40  # ~2.6 KB


def conversation(n: int, turns: int) -> list[list[dict]]:
    """Each turn's whole message list, as a stateless client resends it."""
    messages: list[dict] = [{"role": "system", "content": f"[{n}] " + SYSTEM}]
    out = []
    for t in range(turns):
        messages = [*messages, {"role": "user", "content": f"Question {t} of {n}?"}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"Answer {t}."}]
    return out


def prompt_blocks(doc: dict) -> Blocks | None:
    return read_messages(doc, hashing=True)[1]


def blocks_of(messages: list[dict], **doc: object) -> list[int]:
    found = prompt_blocks({"messages": messages, **doc})
    assert found is not None
    return [h for h, _ in found]


# -- prompt blocks ---------------------------------------------------------------------------


def test_a_later_turn_extends_the_earlier_turns_blocks() -> None:
    first, second = conversation(0, 2)
    a, b = blocks_of(first), blocks_of(second)
    assert len(a) == -(-len(first[0]["content"]) // BLOCK_CHARS) + 1
    assert b[: len(a)] == a and len(b) > len(a)
    other = blocks_of(conversation(1, 1)[0])
    assert other[0] != a[0]  # another system prompt: no block in common
    # each block stands for everything before it: a changed role changes every later block
    assert blocks_of([{**first[0], "role": "user"}, first[1]])[-1] != a[-1]
    # the tools come first in the template: other tools, another prompt from the start
    assert blocks_of(first, tools=[{"type": "function", "function": {"name": "f"}}])[0] != a[0]


def test_media_parts_are_blocks_of_their_content() -> None:
    clip = base64.b64encode(b"RIFF" + bytes(range(256)) * 40).decode()

    def turn(data: str, text: str) -> list[dict]:
        part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        return [{"role": "user", "content": [part, {"type": "text", "text": text}]}]

    a, b = blocks_of(turn(clip, "What is said?")), blocks_of(turn(clip, "Who speaks?"))
    assert a[0] == b[0] and a[1] != b[1]  # the same clip matches; what follows it differs
    assert blocks_of(turn(clip[:-8] + "AAAAAAA=", "What is said?"))[0] != a[0]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u1"}}]}]
    assert blocks_of(image) != blocks_of([{**image[0], "content": [
        {"type": "image_url", "image_url": {"url": "u2"}}]}])  # fmt: skip


def test_a_chat_is_hashed_only_when_asked_a_spoken_one_with_media_apart() -> None:
    """A spoken reply's text prompt shares the text chats' chain (the worker's prefix cache
    serves both alike); one with media has a chain of its own (the worker caches those apart,
    keeping their media's hidden states for the talker)."""

    def blocks(body: bytes, prefixes: bool = True) -> object:
        return classify_json(Endpoint.CHAT, body, b"application/json", False, prefixes).blocks

    text = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    assert blocks(text) == prompt_blocks(orjson.loads(text)) and blocks(text, False) is None
    spoken = text.replace(b'"model":"m"', b'"model":"m","modalities":["text","audio"]')
    assert blocks(spoken) == blocks(text)
    image = b'{"type":"image_url","image_url":{"url":"u1"}}'
    with_image = text.replace(b'"content":"hi"', b'"content":[' + image + b"]")
    spoken_image = spoken.replace(b'"content":"hi"', b'"content":[' + image + b"]")
    seen, heard = blocks(with_image), blocks(spoken_image)
    assert isinstance(seen, list) and isinstance(heard, list) and len(seen) == len(heard)
    assert not {h for h, _ in seen} & {h for h, _ in heard}
    speech = b'{"model":"m","input":"hi","voice":"v"}'
    assert classify_json(Endpoint.SPEECH, speech, b"application/json", False, True).blocks is None
    assert prompt_blocks({"messages": []}) is None and prompt_blocks({"messages": "x"}) is None
    assert prompt_blocks({"messages": ["not a message"]}) == []


# -- the record ------------------------------------------------------------------------------


def _settings() -> RouterSettings:
    return RouterSettings(worker=["http://127.0.0.1:9"])


def _worker(view: FleetView, worker_id: str, tokens: int, started_at: float = 1.0) -> WorkerState:
    record = WorkerRecord(
        id=worker_id,
        url=f"http://127.0.0.1:{9000 + len(view.workers)}",
        node="n",
        model="m",
        served_models=["m"],
        status=WorkerStatus.READY,
        prefix_cache_tokens=tokens,
        started_at=started_at,
    )
    return view.upsert(record)


def _index(view: FleetView, max_blocks: int = 1 << 20) -> PrefixIndex:
    return PrefixIndex(view, bound=1.5, slack=2, max_blocks=max_blocks, static_tokens=0)


def _place(
    index: PrefixIndex, messages: list[dict], capable: list[WorkerState], open_: list[WorkerState]
) -> tuple[WorkerState, str]:
    c = Classified(Endpoint.CHAT, blocks=prompt_blocks({"messages": messages}))
    return index.place(c, capable, open_)


def test_the_longest_match_wins_and_a_restart_or_departure_forgets() -> None:
    view = FleetView(_settings())
    a, b, c = (_worker(view, i, 1 << 20) for i in "abc")
    index = _index(view)
    assert view.prefix_cache_tokens == 3 << 20
    one, two, three = conversation(0, 3)
    index.record(a, prompt_blocks({"messages": one}) or [])
    index.record(b, prompt_blocks({"messages": two}) or [])  # more of the third turn than a
    assert _place(index, three, [a, b, c], [a, b, c]) == (b, PrefixOutcome.HIT)
    assert _place(index, one, [a, b, c], [a, c]) == (a, PrefixOutcome.HIT)  # b is full
    # b restarts (a new incarnation): what it held is gone
    _worker(view, "b", 1 << 20, started_at=2.0)
    assert _place(index, three, [a, b, c], [a, b, c]) == (a, PrefixOutcome.HIT)
    assert index.describe(b)["blocks"] == 0
    view.remove("a")
    assert index.holders == {} and index.records == set()
    assert _place(index, three, [b, c], [b, c])[1] == PrefixOutcome.MISS
    # new prompts go to the worker with the fewest requests, and among equals to each in turn
    new = [conversation(n, 1)[0] for n in (7, 8, 9, 10)]
    assert len({_place(index, m, [b, c], [b, c])[0] for m in new[:2]}) == 2
    c.in_flight = 1
    assert {_place(index, m, [b, c], [b, c])[0] for m in new[2:]} == {b}


def test_a_workers_record_is_bounded_by_its_cache_and_drops_tails_first() -> None:
    view = FleetView(_settings())
    w = _worker(view, "a", 1000)  # about 15 blocks of 64 tokens
    index = _index(view)
    for n in range(40):
        index.record(w, prompt_blocks({"messages": conversation(n, 1)[0]}) or [])
    cache = w.prefix
    assert cache is not None
    assert cache.tokens <= 1000 and len(index.holders) == len(cache.blocks)
    recent = conversation(39, 1)[0]
    # the newest prompt's head is kept, the oldest prompts are gone
    assert (prompt_blocks({"messages": recent}) or [])[0][0] in cache.blocks
    assert _place(index, recent, [w], [w]) == (w, PrefixOutcome.HIT)
    assert _place(index, conversation(0, 1)[0], [w], [w])[1] == PrefixOutcome.MISS
    # the router's own bound on memory, over all workers
    small = _index(view, max_blocks=64)
    v = _worker(view, "b", 1 << 30)
    for n in range(40):
        small.record(v, prompt_blocks({"messages": conversation(n, 1)[0]}) or [])
    assert len(small.holders) <= 64


def test_the_memory_per_entry_is_what_the_gauge_reports() -> None:
    view = FleetView(_settings())
    workers = [_worker(view, i, 1 << 30) for i in "abc"]
    index = _index(view)
    prompts = [conversation(n, 1)[0] for n in range(600)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n, messages in enumerate(prompts):  # (each request's blocks are its own objects)
        blocks = prompt_blocks({"messages": messages}) or []
        index.record(workers[n % 3], blocks)
        index.record(workers[(n + 1) % 3], blocks)
    del blocks
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    entries = sum(len(r.blocks) for r in index.records)
    assert 0.5 * BYTES_PER_ENTRY < used / entries < 1.5 * BYTES_PER_ENTRY, used / entries
    print(f"{used / entries:.0f} bytes per entry")
    assert index.gauges()["prefix_memory_bytes"] == entries * BYTES_PER_ENTRY


# -- real routers, fake workers that report a prefix cache -----------------------------------


def _post(url: str, messages: list[dict], **headers: str) -> str:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "fake-model", "max_tokens": 4, "messages": messages},
        headers=headers,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return r.headers["x-omni-worker-id"]


def _lookups(router: Router) -> Counter[str]:
    found = re.findall(
        r'omni_router_prefix_lookups_total\{outcome="(\w+)",route="chat"\} (\d+)', router.metrics()
    )
    return Counter({outcome: int(float(n)) for outcome, n in found})


@pytest.fixture
def fleet(redis_url: str) -> Iterator[tuple[Router, dict[str, FakeWorker]]]:
    args = ("--prefix-cache-tokens", "65536")
    workers = {f"w{i}": FakeWorker(f"w{i}", *args, redis_url=redis_url) for i in (1, 2, 3)}
    router = Router("--redis-url", redis_url, name="router-prefix")
    try:
        wait_for(lambda: sum(w["routable"] for w in router.diagnostics()["workers"]) == 3, 10)
        yield router, workers
    finally:
        router.stop()
        for w in workers.values():
            w.stop()


@pytest.mark.timeout(120)
def test_stateless_conversations_return_where_their_prefix_is(
    fleet: tuple[Router, dict[str, FakeWorker]], redis_url: str
) -> None:
    router, workers = fleet
    talks = [conversation(n, 4) for n in range(6)]
    placed: dict[int, list[str]] = {n: [] for n in range(6)}
    for turn in range(4):
        for n, talk in enumerate(talks):
            placed[n].append(_post(router.url, talk[turn]))
    for n, where in placed.items():
        assert len(set(where)) == 1, (n, where)  # every follow-up where its first turn went
    per_worker = Counter(w for where in placed.values() for w in where)
    counts = [per_worker.get(w, 0) for w in workers]
    assert max(counts) <= 3 * min(counts) + 1, per_worker
    assert _lookups(router) == {"hit": 18, "miss": 6}
    policy = router.diagnostics()["counts"]["policy"]
    assert policy["prefix"] == 18 and policy["chosen"] == 6
    # the same with an audio clip in the first turn: a second conversation that opens with the
    # same clip goes where the clip was computed
    clip = base64.b64encode(bytes(range(256)) * 64).decode()
    audio = {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}
    first = [{"role": "user", "content": [audio, {"type": "text", "text": "What is said?"}]}]
    home = _post(router.url, first)
    follow = [*first, {"role": "assistant", "content": "Hello."},
              {"role": "user", "content": "And then?"}]  # fmt: skip
    assert _post(router.url, follow) == home
    again = [{"role": "user", "content": [audio, {"type": "text", "text": "Who speaks?"}]}]
    assert _post(router.url, again) == home
    # a session key wins over the cache: the session's binding decides
    before = _lookups(router)
    _post(router.url, talks[0][3], **{"x-session-id": "sess-1"})
    assert _lookups(router) == before
    # the dashboard's share: most of what went to each worker was expected cached there
    shares = {w["id"]: w["prefix"]["cached_share"] for w in router.diagnostics()["workers"]}
    assert all(s is not None and s > 0.5 for s in shares.values()), shares

    # a worker that restarts (same id, a new process) lost its cache: no longer preferred
    victim = placed[1][0]
    workers[victim].stop()
    wait_for(lambda: victim not in {w["id"] for w in router.diagnostics()["workers"]}, 10)
    workers[victim] = FakeWorker(victim, "--prefix-cache-tokens", "65536", redis_url=redis_url)
    wait_for(lambda: sum(w["routable"] for w in router.diagnostics()["workers"]) == 3, 10)
    before = _lookups(router)
    _post(router.url, [*talks[1][3], {"role": "assistant", "content": "x"},
                       {"role": "user", "content": "Once more?"}])  # fmt: skip
    assert _lookups(router) - before == Counter({"miss": 1})


@pytest.mark.timeout(120)
def test_a_hot_prefix_spreads_past_the_bound(redis_url: str) -> None:
    """Every request shares one long prompt and they come at once: the worker that holds it
    takes requests up to the bound, the rest go to the least loaded (which then hold it too)."""
    args = ("--prefix-cache-tokens", "65536", "--delay-ms", "300")
    workers = [FakeWorker(f"h{i}", *args, redis_url=redis_url) for i in (1, 2, 3)]
    router = Router("--redis-url", redis_url, name="router-hot")
    try:
        wait_for(lambda: sum(w["routable"] for w in router.diagnostics()["workers"]) == 3, 10)
        prompt = conversation(7, 1)[0]
        _post(router.url, prompt)  # computed once: held by one worker
        with ThreadPoolExecutor(24) as pool:
            placed = Counter(pool.map(lambda _: _post(router.url, prompt), range(24)))
        # (24 at once over 3 workers: mean 8; 1.5 x 8 + 2 slack = 14 each at most, the request
        # being placed counted with the mean)
        assert len(placed) >= 2 and max(placed.values()) <= 15, placed
        assert _lookups(router)["overloaded"] > 0
        # once the load is gone, the prompt stays with the workers that hold it
        time.sleep(0.5)
        assert _post(router.url, prompt) in placed
    finally:
        router.stop()
        for w in workers:
            w.stop()


@pytest.mark.timeout(60)
def test_workers_without_a_prefix_cache_are_placed_by_load(redis_url: str) -> None:
    workers = [FakeWorker(f"n{i}", redis_url=redis_url) for i in (1, 2)]
    router = Router("--redis-url", redis_url, name="router-plain")
    try:
        wait_for(lambda: sum(w["routable"] for w in router.diagnostics()["workers"]) == 2, 10)
        prompt = conversation(3, 1)[0]
        placed = Counter(_post(router.url, prompt) for _ in range(20))
        assert len(placed) == 2  # the same prompt, spread: nothing is cached anywhere
        assert not _lookups(router)
    finally:
        router.stop()
        for w in workers:
            w.stop()

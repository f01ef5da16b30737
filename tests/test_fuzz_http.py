"""Scenario 9: property-based fuzzing (hypothesis) of the router's and the worker's HTTP
surfaces on the live fleet. Requests are generated around the OpenAI request shapes (known
fields with values of any JSON type, unknown fields, random content types, methods and paths,
raw bytes) so that most of them reach deep into validation. Property: no 5xx on any generated
input, from the router itself or from a worker, and every error body is OpenAI-style.

Seeded (``derandomize``) and bounded, so CI sees the same examples on every run."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.fleet import MODEL, Fleet

# the first test on the live fleet also waits for it to start (minutes on a busy machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

short_text = st.text(max_size=12)
json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), short_text
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(short_text, inner, max_size=3)
    ),
    max_leaves=8,
)


def field(name: str, good: st.SearchStrategy) -> st.SearchStrategy:
    """A field that is usually well-formed, sometimes any JSON value."""
    return st.tuples(st.just(name), st.one_of(good, good, json_value))


content_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": short_text}),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["input_audio", "image_url", "audio_url", "video_url"]),
            "input_audio": st.fixed_dictionaries(
                {
                    "data": st.sampled_from(["", "AAAA", "UklGRg==", "%%%"]),
                    "format": st.sampled_from(["wav", "mp3", "exe"]),
                }
            ),
        }
    ),
    st.dictionaries(st.sampled_from(["type", "text", "x"]), json_value, max_size=2),
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
    optional={"content": st.one_of(short_text, st.lists(content_part, max_size=3), json_value)},
)
model = st.sampled_from([MODEL, MODEL, "gpt-4o", "", "tiny-omni\x00"])
chat_fields = [
    field("model", model),
    field("messages", st.lists(message, min_size=0, max_size=3)),
    field("stream", st.booleans()),
    field("max_tokens", st.integers(-2, 6)),
    field("modalities", st.lists(st.sampled_from(["text", "audio", "video"]), max_size=2)),
    field(
        "audio",
        st.fixed_dictionaries(
            {
                "voice": st.sampled_from(["chelsie", "nobody", ""]),
                "format": st.sampled_from(["wav", "pcm16", "mp9"]),
            }
        ),
    ),
    field("user", st.text(max_size=300)),
    field("temperature", st.floats(-1, 3)),
    field("stream_options", st.fixed_dictionaries({"include_usage": st.booleans()})),
    field("n", st.integers(0, 3)),
    field("unknown_field", json_value),
]
speech_fields = [
    field("model", model),
    field("input", short_text),
    field("voice", st.sampled_from(["chelsie", "nobody", ""])),
    field("response_format", st.sampled_from(["wav", "pcm", "mp3", "opus"])),
    field("stream", st.booleans()),
    field("stream_format", st.sampled_from(["audio", "sse", "x"])),
    field("speed", st.floats(0, 3)),
    field("user", short_text),
]


def body_of(fields: list) -> st.SearchStrategy:
    """A JSON object built from a subset of the fields; capped tokens keep examples cheap."""

    def build(pairs: list[tuple[str, object]]) -> dict:
        doc = dict(pairs)
        if isinstance(doc.get("max_tokens"), int) and doc["max_tokens"] > 6:
            doc["max_tokens"] = 6
        return doc

    return st.lists(st.one_of(*fields), max_size=len(fields), unique_by=lambda p: p[0]).map(build)


content_types = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "",
    ]
)
payload = st.one_of(
    body_of(chat_fields).map(orjson.dumps),
    body_of(speech_fields).map(orjson.dumps),
    json_value.map(orjson.dumps),
    st.binary(max_size=200),
    body_of(chat_fields).map(lambda d: orjson.dumps(d)[: max(1, len(orjson.dumps(d)) // 2)]),
)
paths = st.sampled_from(
    [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/audio/speech",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/voices",
        "/v1/audio/voices/chelsie",
        "/v1/audio/voices/%2e%2e%2fetc",
        "/v1/completions",
        "/v1/models",
        "/v1/models/tiny-omni",
        "/v1/realtime",
        "/v1/../diagnostics",
        "/v1/chat/completions?x=1&&=",
        "/health",
        "/nope",
    ]
)
methods = st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
extra_headers = st.dictionaries(
    st.sampled_from(["x-session-id", "x-omni-worker-id", "expect", "accept", "x-anything"]),
    # httpx refuses values with surrounding whitespace before they are sent
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(str.strip),
    max_size=2,
)


def assert_sane(resp: httpx.Response, where: str, request: str) -> None:
    assert resp.status_code < 500, (
        f"{where} answered {resp.status_code} to {request}: {resp.text[:300]} "
        f"(worker {resp.headers.get('x-omni-worker-id')})"
    )
    if resp.status_code >= 400 and resp.headers.get("content-type", "").startswith(
        "application/json"
    ):
        err = resp.json()["error"]
        assert err["code"] and err["message"], resp.text


def send(client: httpx.Client, base: str, method, path, ctype, body, headers, auth) -> None:
    hdrs = {**headers, **auth}
    if ctype:
        hdrs["content-type"] = ctype
    request = f"{method} {path} ctype={ctype!r} headers={headers!r} body={body[:300]!r}"
    resp = client.request(method, base + path, content=body, headers=hdrs)
    assert_sane(resp, base, request)


@pytest.fixture
def clients(omni_fleet: Fleet):
    with httpx.Client(timeout=60) as client:
        yield omni_fleet, client


def test_fuzz_router(clients) -> None:
    fleet, client = clients

    @FUZZ
    @given(method=methods, path=paths, ctype=content_types, body=payload, headers=extra_headers)
    def run(method, path, ctype, body, headers) -> None:
        send(client, fleet.routers[0].url, method, path, ctype, body, headers, fleet.auth)

    run()
    fleet.wait_idle(20)
    assert all(w["routable"] for w in fleet.diagnostics(fleet.routers[0])["workers"])


def test_fuzz_worker(clients) -> None:
    fleet, client = clients
    w = next(iter(fleet.workers.values()))

    @FUZZ
    @given(method=methods, path=paths, ctype=content_types, body=payload, headers=extra_headers)
    def run(method, path, ctype, body, headers) -> None:
        send(client, w.url, method, path, ctype, body, headers, fleet.worker_auth)

    run()
    fleet.wait_idle(20)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    head=st.one_of(
        st.binary(max_size=300),
        st.tuples(
            st.sampled_from([b"GET", b"POST", b"BREW", b"", b"G\x00T"]),
            st.sampled_from([b"/v1/chat/completions", b"*", b"http://x/", b"/\xff", b""]),
            st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1x", b""]),
            st.lists(st.binary(max_size=40), max_size=4),
        ).map(lambda t: b"%s %s %s\r\n%s\r\n\r\n" % (t[0], t[1], t[2], b"\r\n".join(t[3]))),
    )
)
def test_fuzz_router_http_parser(omni_fleet: Fleet, head: bytes) -> None:
    """Raw bytes at the router's HTTP parser: a 4xx (or a close), never a 5xx, never a crash."""
    port = int(omni_fleet.routers[1].url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while piece := sock.recv(65536):
                answer += piece
        except (TimeoutError, ConnectionResetError):
            pass
    status_line = answer.split(b"\r\n", 1)[0]
    assert not status_line.startswith(b"HTTP/1.1 5"), (head, answer[:300])
    assert httpx.get(omni_fleet.routers[1].url + "/live", timeout=5).status_code == 200

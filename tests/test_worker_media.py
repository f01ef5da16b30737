"""Image and video parts of chat requests: each kind of bad media is a clear 400 before any
stage sees it, and the worker serves on (an in-process worker over loopback HTTP)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from planner.spec import ModelSpec
from tests.test_worker_http import SPEC as TEXT_AUDIO_SPEC
from tests.test_worker_http import Running, serve_in_thread
from worker.settings import WorkerSettings

SPEC = ModelSpec.model_validate(
    {
        **TEXT_AUDIO_SPEC.model_dump(),
        "name": "fake-vision",
        "served_models": ["fake-vision"],
        "capabilities": {
            "endpoints": ["chat"],
            "input_modalities": ["text", "audio", "image", "video"],
            "output_modalities": ["text"],
        },
    }
)


@pytest.fixture(scope="module")
def worker() -> Iterator[Running]:
    settings = WorkerSettings(
        _cli_parse_args=[],
        max_body_bytes=8_000_000,
        fetch_media_bytes=2_000_000,
        fetch_media_timeout=1.0,
    )
    yield from serve_in_thread(settings, spec=SPEC)


@pytest.fixture(scope="module")
def no_fetch() -> Iterator[Running]:
    yield from serve_in_thread(WorkerSettings(_cli_parse_args=[], fetch_media=False), spec=SPEC)


@pytest.fixture(scope="module")
def media_server() -> Iterator[str]:
    """A loopback HTTP server: /cat.png, /clip.mp4, /huge.png (3 MB), /slow.png (stalls)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    files = {"/cat.png": png(40, 30), "/clip.mp4": mp4(frames=4), "/huge.png": b"x" * 3_000_000}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow.png":
                time.sleep(3)
            data = files.get(self.path)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def text_only() -> Iterator[Running]:
    yield from serve_in_thread(WorkerSettings(_cli_parse_args=[]))


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height)).save(buf, format="PNG")
    return buf.getvalue()


def mp4(frames: int, fps: int = 2, size: tuple[int, int] = (32, 32)) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for _ in range(frames):
            img = np.zeros((size[1], size[0], 3), np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


def url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def chat(w: Running, part: dict) -> httpx.Response:
    body = {
        "model": w.service.spec.name,
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": "what is it?"}]}],
    }
    return httpx.post(w.url + "/v1/chat/completions", json=body, timeout=30)


def image(u: str) -> dict:
    return {"type": "image_url", "image_url": {"url": u}}


def video(u: str) -> dict:
    return {"type": "video_url", "video_url": {"url": u}}


def refused(r: httpx.Response, words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["param"] == "messages.0.content.0"
    assert words in err["message"], err["message"]
    assert "0x" not in err["message"]  # no object reprs


@pytest.mark.parametrize(
    ("part", "words"),
    [
        (image(url("image/png", b"not a png at all")), "cannot be decoded"),
        (image(url("image/png", b"x" * 3_000_000)), "larger than"),
        (image(url("image/png", png(4097, 4097, "L"))), "exceeds"),
        (image(url("text/plain", b"hello")), "data:image/"),
        (image("data:image/png;base64,@@@@"), "not valid base64"),
        (video(url("video/mp4", b"\x00\x00\x00\x18ftypmp42garbage")), "cannot be decoded"),
        (video(url("video/mp4", mp4(frames=130, fps=2))), "exceeds 60 s"),
        (video(url("image/png", png(8, 8))), "data:video/"),
    ],
    ids=[
        "corrupt-image",
        "oversize-data-url",
        "huge-image",
        "not-an-image",
        "bad-base64",
        "corrupt-video",
        "long-video",
        "not-a-video",
    ],
)
def test_bad_media_is_a_clear_400_and_the_worker_serves_on(
    worker: Running, part: dict, words: str
) -> None:
    refused(chat(worker, part), words)
    ok = chat(worker, {"type": "text", "text": "still there?"})
    assert ok.status_code == 200, ok.text


def test_good_media_reaches_the_engine(worker: Running) -> None:
    assert chat(worker, image(url("image/png", png(40, 30)))).status_code == 200
    assert chat(worker, video(url("video/mp4", mp4(frames=4)))).status_code == 200


def test_a_model_without_vision_refuses_images_and_video(text_only: Running) -> None:
    refused(chat(text_only, image(url("image/png", png(8, 8)))), "takes no image input")
    refused(chat(text_only, video(url("video/mp4", mp4(frames=2)))), "takes no video input")


def test_media_urls_are_fetched_bounded_in_size_and_time(
    worker: Running, media_server: str
) -> None:
    assert chat(worker, image(media_server + "/cat.png")).status_code == 200
    assert chat(worker, video(media_server + "/clip.mp4")).status_code == 200
    refused(chat(worker, image(media_server + "/huge.png")), "larger than 2000000 bytes")
    refused(chat(worker, image(media_server + "/slow.png")), "took over 1 s")
    refused(chat(worker, image(media_server + "/missing.png")), "HTTP 404")


def test_fetching_can_be_turned_off(no_fetch: Running, media_server: str) -> None:
    refused(chat(no_fetch, image(media_server + "/cat.png")), "does not fetch image URLs")

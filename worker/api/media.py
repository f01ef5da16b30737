"""Where image and video bytes come from: a ``data:`` URL, or an ``http(s)`` URL that the worker
fetches (bounded in bytes and time, and off with ``--no-fetch-media``)."""

from __future__ import annotations

import base64
import binascii

import httpx

from fleet.errors import ErrorCode, OmniError
from worker.settings import WorkerSettings


def bad(message: str, param: str) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, message, param)


async def media_bytes(url: str, kind: str, settings: WorkerSettings, param: str) -> bytes:
    """The bytes of an ``image`` or ``video`` part's URL."""
    if url.startswith(("http://", "https://")):
        if not settings.fetch_media:
            raise bad(f"this worker does not fetch {kind} URLs; send a data: URL", param)
        return await _fetch(url, kind, settings, param)
    head, sep, data = url.partition(",")
    if not sep or not head.startswith(f"data:{kind}/") or not head.endswith(";base64"):
        raise bad(f"{kind}_url must be an http(s) URL or data:{kind}/<type>;base64,<data>", param)
    limit = settings.fetch_media_bytes
    if len(data) > limit * 4 // 3 + 4:
        raise bad(f"{kind} larger than {limit} bytes", param)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{kind}_url data is not valid base64", param) from None


async def _fetch(url: str, kind: str, settings: WorkerSettings, param: str) -> bytes:
    limit = settings.fetch_media_bytes
    chunks: list[bytes] = []
    size = 0
    try:
        async with (
            httpx.AsyncClient(
                timeout=settings.fetch_media_timeout, follow_redirects=True
            ) as client,
            client.stream("GET", url) as r,
        ):
            if r.status_code != 200:
                raise bad(f"fetching the {kind} URL: HTTP {r.status_code}", param)
            declared = r.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > limit:
                raise bad(f"{kind} at the URL is larger than {limit} bytes", param)
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise bad(f"{kind} at the URL is larger than {limit} bytes", param)
                chunks.append(chunk)
    except httpx.TimeoutException:
        raise bad(
            f"fetching the {kind} URL took over {settings.fetch_media_timeout:g} s", param
        ) from None
    except httpx.HTTPError as exc:
        raise bad(f"fetching the {kind} URL failed ({type(exc).__name__})", param) from None
    return b"".join(chunks)

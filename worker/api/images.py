"""Image inputs of chat requests: ``image_url`` parts with ``data:`` URLs, decoded with PIL.

Remote ``http(s)`` URLs are refused: the worker fetches nothing on a client's behalf (yet).
A decoded image is bounded in pixels before its pixels are decoded (PIL reads the size from
the header), so a small file cannot expand into gigabytes.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

from fleet.errors import ErrorCode, OmniError

MAX_PIXELS = 4096 * 4096
MAX_BYTES = 20 * 1024 * 1024


def _bad(message: str, param: str) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, message, param)


def decode_image_url(url: str, param: str) -> np.ndarray:
    """An RGB uint8 array (H, W, 3) from a ``data:image/...;base64,`` URL."""
    if url.startswith(("http://", "https://")):
        raise _bad("remote image URLs are not fetched by this worker; send a data: URL", param)
    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise _bad("image_url must be a data:image/<type>;base64,<data> URL", param)
    if len(data) > MAX_BYTES * 4 // 3 + 4:
        raise _bad(f"image larger than {MAX_BYTES // (1024 * 1024)} MB", param)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("image_url data is not valid base64", param) from None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.width * img.height > MAX_PIXELS:
                raise _bad(
                    f"image of {img.width}x{img.height} pixels exceeds {MAX_PIXELS} pixels", param
                )
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise _bad(f"image cannot be decoded ({type(exc).__name__})", param) from None

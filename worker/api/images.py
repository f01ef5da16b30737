"""Image inputs of chat requests: the bytes of an ``image_url`` part (see
:mod:`worker.api.media`) decoded with PIL. An image is bounded in pixels before its pixels are
decoded (PIL reads the size from the header), so a small file cannot expand into gigabytes.
"""

from __future__ import annotations

import io

import numpy as np

from worker.api.media import bad

MAX_PIXELS = 4096 * 4096


def decode_image(raw: bytes, param: str) -> np.ndarray:
    """An RGB uint8 array (H, W, 3)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.width * img.height > MAX_PIXELS:
                raise bad(
                    f"image of {img.width}x{img.height} pixels exceeds {MAX_PIXELS} pixels", param
                )
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise bad(f"image cannot be decoded ({type(exc).__name__})", param) from None

"""Image inputs of chat requests: the bytes of an ``image_url`` part (see
:mod:`worker.api.media`) decoded with PIL. An image is bounded in pixels before its pixels are
decoded (PIL reads the size from the header), so a small file cannot expand into gigabytes.
"""

from __future__ import annotations

import io

import numpy as np

from worker.api.media import bad

MAX_PIXELS = 4096 * 4096
LOW_DETAIL_SIDE = 512  # ``detail: "low"``: OpenAI's low-resolution 512x512 version of the image


def decode_image(raw: bytes, param: str, low_detail: bool = False) -> np.ndarray:
    """An RGB uint8 array (H, W, 3); with ``low_detail``, scaled down (aspect kept) to fit
    512x512 first, so the vision encoder sees fewer patches, as OpenAI's ``detail: "low"``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.width * img.height > MAX_PIXELS:
                raise bad(
                    f"image of {img.width}x{img.height} pixels exceeds {MAX_PIXELS} pixels", param
                )
            rgb = img.convert("RGB")
            if low_detail:
                rgb.thumbnail((LOW_DETAIL_SIDE, LOW_DETAIL_SIDE), Image.Resampling.BICUBIC)
            return np.asarray(rgb, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise bad(f"image cannot be decoded ({type(exc).__name__})", param) from None

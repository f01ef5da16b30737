"""The event loop the router runs on: uvloop where it is installed (its transports are what the
callback-driven relay is tuned for), asyncio's own otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop
    return uvloop.new_event_loop

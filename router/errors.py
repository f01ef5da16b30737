"""Error codes only the router gives (its HTTP front door's limits). They extend the shared
vocabulary in ``fleet.errors`` with the same OpenAI-style body and are just as stable."""

from __future__ import annotations

from enum import StrEnum

from fleet.errors import ErrorCode


class RouterErrorCode(StrEnum):
    URI_TOO_LONG = "uri_too_long"  # 414: the request line's target is over --max-url-bytes
    HEADERS_TOO_LARGE = "headers_too_large"  # 431: the header block is over --max-header-bytes
    TOO_MANY_CONNECTIONS = "too_many_connections"  # 503: the router's connection cap is reached
    ROUTER_EXHAUSTED = "router_exhausted"  # 503: the router itself is out of descriptors/memory
    ENDPOINT_NOT_SERVED = "endpoint_not_served"  # 404: no worker in the fleet serves this path


# every code a router response may carry (metrics labels come from this fixed list)
Code = ErrorCode | RouterErrorCode
ALL_CODES: tuple[Code, ...] = (*ErrorCode, *RouterErrorCode)

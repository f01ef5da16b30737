"""The router's own resources: its descriptor budget, the client-connection cap derived from
it, and telling the router's exhaustion (EMFILE, ENOBUFS ...) apart from a worker's fault."""

from __future__ import annotations

import errno
import resource

# errors that say "this process or host is out of something", not "the peer is broken"
_EXHAUSTION = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# a proxied request holds its client socket plus the worker connection and its peek duplicate
FDS_PER_CLIENT = 3
MIN_CONNECTIONS = 16


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one (as Go and nginx's worker_rlimit_nofile
    do); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_cap(max_connections: int, fd_reserve: int, fd_limit: int) -> int:
    """Client connections one router process accepts. An explicit ``max_connections`` is used
    as given; otherwise the descriptors left after the reserve, at ``FDS_PER_CLIENT`` each."""
    if max_connections:
        return max_connections
    return max(MIN_CONNECTIONS, (fd_limit - fd_reserve) // FDS_PER_CLIENT)


def is_exhaustion(exc: BaseException) -> bool:
    """True when an OSError is the router running out of descriptors or buffers."""
    return isinstance(exc, OSError) and exc.errno in _EXHAUSTION

"""Human-readable byte counts for messages and tables."""

from __future__ import annotations


def gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


def exact(n: int) -> str:
    """Exact bytes and GiB, for error messages: '2,345,678,901 B (2.18 GiB)'."""
    return f"{n:,} B ({gib(n)})"

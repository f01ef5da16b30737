"""Constrained decoding for ``response_format``: what a reply must be (``Grammar``), which
SGLang's grammar backend (xgrammar) compiles against the decoder's tokenizer and applies each
step (``worker.engines.sglang.engine``). Output is compact JSON (no free whitespace between
tokens), so a reply cannot wander in whitespace until its token limit. xgrammar comes with the
``worker`` extra (both locks install it); an install without it refuses a request with a
``response_format`` other than text."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from functools import lru_cache

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Grammar:
    """What a reply must be: ``json`` (any JSON object) or ``json_schema`` (``schema``, JSON
    text)."""

    kind: str
    schema: str = ""


def available() -> bool:
    """Whether xgrammar is installed: found, not imported (its import takes seconds, torch's
    with it, and a request that asks must not wait for them on the event loop)."""
    return _found() and not _unimportable


@lru_cache(maxsize=1)
def _found() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


_unimportable = False  # found, but its import failed (preload said why)


def preload() -> None:
    """Import xgrammar, where it is installed, before the first request that checks a schema
    needs it: the worker calls this in a thread during start-up. Imported on a request, it
    held the API's event loop for 2-2.6 s on two busy cores, heartbeats included, so that the
    worker's record expired and the routers dropped the worker (tests/reliability)."""
    global _unimportable
    if not available():
        return
    try:
        import xgrammar  # noqa: F401
    except ImportError as exc:
        _unimportable = True
        log.warning("xgrammar is installed but does not import (%s): response_format and "
                    "tools are refused", exc)  # fmt: skip


def check_schema(schema: dict) -> None:
    """ValueError when xgrammar cannot compile ``schema`` (before the request runs)."""
    import xgrammar as xgr

    try:
        xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    except Exception as exc:  # xgrammar raises RuntimeError for schemas it cannot take
        raise ValueError(str(exc)) from None

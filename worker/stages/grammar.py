"""Constrained decoding for ``response_format``: xgrammar (the grammar backend SGLang uses by
default) compiles a JSON schema, or JSON itself, against the decoder's tokenizer; each step,
the request's matcher masks the logits to the tokens that keep the output valid, and the token
picked advances it. Output is compact JSON (no free whitespace between tokens), so a reply
cannot wander in whitespace until its token limit. xgrammar comes with the ``worker`` extra
(both locks install it); an install without it refuses a request with a ``response_format``
other than text."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

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


class GrammarBackend:
    """One decoder's compiler (its tokenizer's vocabulary), compiled grammars cached."""

    def __init__(self, checkpoint: Path, vocab_size: int) -> None:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        self.xgr = xgr
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info)
        self._compiled = lru_cache(maxsize=64)(self._compile)

    def _compile(self, grammar: Grammar) -> Any:
        if grammar.kind == "json":
            return self.compiler.compile_builtin_json_grammar()
        return self.compiler.compile_json_schema(grammar.schema, any_whitespace=False)

    def matcher(self, grammar: Grammar) -> Matcher:
        return Matcher(self, self.xgr.GrammarMatcher(self._compiled(grammar)))


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, backend: GrammarBackend, matcher: Any) -> None:
        self.xgr = backend.xgr
        self.matcher = matcher
        self.bitmask = backend.xgr.allocate_token_bitmask(1, backend.info.vocab_size)

    def mask(self, row: Any) -> Any:
        """``row`` (vocab logits, float32) with the tokens the grammar forbids at -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        out = row[None].clone()
        self.xgr.apply_token_bitmask_inplace(out, self.bitmask.to(out.device))
        return out[0]

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise ValueError(f"token {token} does not fit the response format")

    @property
    def done(self) -> bool:
        return bool(self.matcher.is_terminated())

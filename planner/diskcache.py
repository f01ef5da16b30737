"""A small on-disk memo of meta-build results, so a fresh process need not import torch.

Entries are keyed by the config file's *content*, the query (what was counted), the installed
torch and transformers versions, and a digest of the planner's own counting code; any change
to one of them is a miss. Directory: ``$OMNI_PLAN_CACHE``, else
``$XDG_CACHE_HOME/omni-fleet/planner`` (``~/.cache/...``); ``OMNI_PLAN_CACHE=off`` disables it.
A corrupt or unwritable entry is ignored (the value is recomputed), never trusted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any


def _code(here: Path) -> list[Path]:
    """The code whose results are cached: the weight counter and every architecture it builds
    (a family's module in archs/ counts the moment it is there)."""
    return [here / "weights.py", *sorted((here / "archs").glob("*.py"))]


def cache_dir() -> Path | None:
    value = os.environ.get("OMNI_PLAN_CACHE", "")
    if value.lower() in ("off", "0", "false", "no"):
        return None
    if value:
        return Path(value).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "omni-fleet" / "planner"


@functools.lru_cache(maxsize=1)
def _environment() -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in _code(here):
        h.update(path.read_bytes())
    for dist in ("torch", "transformers"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()


def _key(config: Path, query: tuple) -> str:
    h = hashlib.sha256(_environment().encode())
    h.update(config.read_bytes())
    h.update(json.dumps(query).encode())
    return h.hexdigest()


def memo(config: Path, query: tuple, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` once per (config content, query, environment), remembered on disk."""
    root = cache_dir()
    if root is None:
        return compute()
    key = _key(config, query)
    entry = root / key[:2] / f"{key}.json"
    try:
        value = json.loads(entry.read_text())
        if isinstance(value, dict):
            return value
    except (OSError, ValueError):
        pass
    value = compute()
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, entry)
    except OSError:
        pass
    return value

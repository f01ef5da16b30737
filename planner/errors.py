"""Errors the planner raises before anything starts; each message says what to change."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PlannerError(ValueError):
    """Base class: a spec, override, inventory or architecture the planner cannot use."""


class SpecError(PlannerError):
    """The spec file (or a bare model directory) is invalid."""


class OverrideError(SpecError):
    """An override names an unknown stage/field, a graph field, or conflicts with another."""


class InventoryError(PlannerError):
    """The GPU inventory (``--gpus`` / ``--inventory``) is invalid."""


class ArchitectureError(PlannerError):
    """A model's architecture cannot be built on the meta device, so weights cannot be counted."""


def closest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' or '' when nothing is close."""
    names = sorted(choices)
    # A prefix ("tp" -> "tp_size") says more than edit distance on short names.
    prefixed = [n for n in names if n.startswith(name) or name.startswith(n)]
    match = prefixed[:1] or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def unknown(kind: str, name: str, choices: Iterable[str], where: str = "") -> str:
    """A uniform 'unknown X' message: the real names and the closest match."""
    names = sorted(choices)
    place = f" in {where}" if where else ""
    return f"unknown {kind} {name!r}{place}; {kind}s: {', '.join(names)}{closest(name, names)}"

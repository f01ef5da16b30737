"""Which checkpoint tensors belong to a stage: the one definition that ``omni-plan`` counts with
and that a stage process loads with.

A component names a dotted module of the model (``thinker``, ``thinker.model.audio_tower``) and
sub-modules it leaves to other stages (``exclude``, relative to the module). A tensor belongs to
the component when its checkpoint name lies under the module and under none of the exclusions.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.spec import ComponentSpec


def owns(component: ComponentSpec, name: str) -> bool:
    """Whether the checkpoint tensor ``name`` (e.g. ``thinker.lm_head.weight``) is the stage's."""
    rest = local_name(component, name)
    if rest is None:
        return False
    return not any(rest == ex or rest.startswith(ex + ".") for ex in component.exclude)


def local_name(component: ComponentSpec, name: str) -> str | None:
    """``name`` relative to the component's module; None when it lies outside the module."""
    if not component.module:
        return name
    prefix = component.module + "."
    return name[len(prefix) :] if name.startswith(prefix) else None


def owns_tensor(component: ComponentSpec, names: Iterable[str]) -> bool:
    """For a tensor reachable under several names (tied weights): it is the component's when
    one of its names lies under the module and none of them under an exclusion."""
    inside = [rest for rest in (local_name(component, n) for n in names) if rest is not None]
    return bool(inside) and not any(
        rest == ex or rest.startswith(ex + ".") for rest in inside for ex in component.exclude
    )

"""``--help`` of the daemons read like a well-kept CLI. pydantic-settings writes a flag's type
as its metavar (``{SecretStr,None}``, ``list[str]``, enum member names in upper case); here every
settings field gets a plain metavar (URL, N, SECONDS, PATH, or its lower-case choices) and a help
line of its description, its default and its ``OMNI_`` variable. The hook is pydantic-settings'
own ``add_argument_method``: parsing is untouched."""

from __future__ import annotations

import types
import typing
from argparse import ArgumentParser
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, CliSettingsSource

# words that make a number of seconds out of a float field's name
_SECONDS_WORDS = frozenset({"s", "seconds", "timeout", "interval", "ttl", "window", "grace"})


def cli_source(
    settings_cls: type[BaseSettings], prog: str, args: list[str] | bool
) -> CliSettingsSource[Any]:
    """The CLI source of ``settings_cls`` with plain metavars and one-line helps."""
    return CliSettingsSource(
        settings_cls,
        cli_prog_name=prog,
        cli_parse_args=args,
        add_argument_method=_add_argument_for(settings_cls),
    )


def _add_argument_for(settings_cls: type[BaseSettings]) -> Callable[..., Any]:
    fields = settings_cls.model_fields
    prefix = str(settings_cls.model_config.get("env_prefix") or "")

    def add_argument(parser: ArgumentParser, *names: str, **kwargs: Any) -> Any:
        name = kwargs.get("dest", "")
        field = fields.get(name)
        if field is not None:
            if "metavar" in kwargs:  # absent for an on/off flag
                kwargs["metavar"] = metavar(name, field)
            kwargs["help"] = help_line(name, field, prefix).replace("%", "%%")
        return parser.add_argument(*names, **kwargs)

    return add_argument


def env_name(name: str, field: FieldInfo, prefix: str) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("env"), str):
        return str(extra["env"])
    return (prefix + name).upper()


def metavar(name: str, field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("metavar"), str):
        return str(extra["metavar"])
    kind = _plain_type(field.annotation)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "{" + ",".join(str(m.value) for m in kind) + "}"
    if typing.get_origin(kind) is Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(kind)) + "}"
    words = name.split("_")
    if words[-1] == "url":
        return "URL"
    if words[-1] == "dir":
        return "DIR"
    if kind is Path or words[-1] in ("file", "path", "spec"):
        return "PATH"
    if kind is int:
        return "BYTES" if "bytes" in words else "N"
    if kind is float:
        return "SECONDS" if _SECONDS_WORDS & set(words) else "NUMBER"
    return words[-1].upper()  # host -> HOST, api_key -> KEY, gpus -> GPUS


def help_line(name: str, field: FieldInfo, prefix: str) -> str:
    parts = [field.description or ""]
    default = _default_text(field)
    if default is not None:
        parts.append(f"(default: {default})")
    env = env_name(name, field, prefix)
    listed = typing.get_origin(_plain_type(field.annotation, keep_list=True)) is list
    parts.append(f"[env: {env}, a JSON list]" if listed else f"[env: {env}]")
    return " ".join(p for p in parts if p)


def _default_text(field: FieldInfo) -> str | None:
    default = field.default
    if default is PydanticUndefined or default is None or isinstance(default, SecretStr):
        return None  # none, a factory's (described in words where it matters), or a secret
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, Enum):
        return str(default.value)
    return str(default)


def _plain_type(annotation: Any, keep_list: bool = False) -> Any:
    """``X | None`` -> X; ``list[X]`` -> X unless ``keep_list``; ``SecretStr`` -> str."""
    kind = annotation
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = args[0] if len(args) == 1 else kind
    if not keep_list and typing.get_origin(kind) is list:
        kind = typing.get_args(kind)[0]
    return str if kind is SecretStr else kind

"""Base of every daemon's settings: each field is a CLI flag and an ``OMNI_`` env variable."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def cli_settings(env_prefix: str = "OMNI_") -> SettingsConfigDict:
    """The configuration of every command's settings: strict (an unknown field is an error),
    kebab-case flags, on/off flags, lists as repeated flags."""
    return SettingsConfigDict(
        env_prefix=env_prefix,
        extra="forbid",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        cli_enforce_required=False,
        validate_default=True,
    )


class OmniSettings(BaseSettings):
    """Precedence: CLI flag > ``OMNI_<FIELD>`` environment variable > default.

    Subclasses add their own fields; ``--redis-url`` is ``OMNI_REDIS_URL`` and so on.
    """

    model_config = cli_settings()

    redis_url: SecretStr | None = Field(
        None, description="fleet state in Redis, e.g. redis://:PASSWORD@HOST:6379/0"
    )
    fleet: str = Field(
        "default",
        description="fleet name: routers and workers of one fleet share it (Redis key prefix)",
        json_schema_extra={"metavar": "NAME"},
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        "info", description="lowest level of log line written"
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, level: object) -> object:
        return level.lower() if isinstance(level, str) else level


def redacted_url(url: str) -> str:
    """``redis://user:pass@host`` -> ``redis://user:***@host`` for logs and diagnostics."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return f"{scheme}://{user}:***@{host}" if user else f"{scheme}://***@{host}"

"""Base of every daemon's settings: each field is a CLI flag and an ``OMNI_`` env variable."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class OmniSettings(BaseSettings):
    """Precedence: CLI flag > ``OMNI_<FIELD>`` environment variable > default.

    Subclasses add their own fields; ``--redis-url`` is ``OMNI_REDIS_URL`` and so on.
    """

    model_config = SettingsConfigDict(
        env_prefix="OMNI_",
        extra="forbid",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        cli_enforce_required=False,
        validate_default=True,
    )

    redis_url: SecretStr | None = None
    fleet: str = "default"
    log_level: str = "info"


def redacted_url(url: str) -> str:
    """``redis://user:pass@host`` -> ``redis://user:***@host`` for logs and diagnostics."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return f"{scheme}://{user}:***@{host}" if user else f"{scheme}://***@{host}"
